#!/usr/bin/env bash
# Deployment figures of minfer and llama.cpp side by side on a GPU machine (issue 13): builds llama.cpp from the
# source tarball .bin/llama-src.tar.xz (an upstream commit, named in its COMMIT file; CUDA for this GPU only and
# without the FlashAttention kernels, to fit the build into one machine call; everything else at llama.cpp's
# defaults: a prompt of a few tokens and one generated token barely touch attention), makes the 7B-shaped GGUF with minfer-synth and its default artifact
# (`--target auto`), then times process start -> first token (-n 1) for both engines, interleaved: three runs
# with the page cache warm, three after dropping it (cold disk; needs root). Logs: $OUT/llama-deploy.log,
# $OUT/llama-build.log.
#   scripts/device-llama.sh            (after sourcing nothing: it sources device-common.sh itself)
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
L=/tmp/llama; mkdir -p "$L"
tar -C "$L" -xJf "$R/.bin/llama-src.tar.xz"
(
  cmake -S "$L/llama.cpp" -B "$L/b" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_FA=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc > "$OUT/llama-build.log" 2>&1 &&
  cmake --build "$L/b" -j "$(nproc)" --target llama-completion llama-bench >> "$OUT/llama-build.log" 2>&1
  echo "build rc=$?" >> "$OUT/llama-build.log"
) &
build=$!
drop_caches() { sync && echo 3 > /proc/sys/vm/drop_caches; }
minfer_first() {
  measure "minfer-$1" "$B/minfer-run" /tmp/q7.mfb -p "Once upon a time" -n 1 --temp 0 --device cuda > /dev/null
}
llama_first() {
  measure "llama-$1" "$L/b/bin/llama-completion" -m /tmp/q7.gguf -p "Once upon a time" -n 1 --temp 0 -ngl 99 \
    -no-cnv < /dev/null > /dev/null 2>> "$OUT/llama-completion.log"
}
{
  echo "llama.cpp commit $(cat "$L/COMMIT")"
  [ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
  [ -f /tmp/q7.mfb ] || measure compile timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb
  ls -la /tmp/q7.gguf /tmp/q7.mfb
  wait "$build"; tail -3 "$OUT/llama-build.log"
  [ -x "$L/b/bin/llama-completion" ] || { echo "llama.cpp did not build"; exit 1; }
  for i in 1 2 3; do minfer_first warm; llama_first warm; done
  if drop_caches 2>/dev/null; then
    for i in 1 2 3; do
      drop_caches; minfer_first cold
      drop_caches; llama_first cold
      drop_caches; measure cold-read-gguf cat /tmp/q7.gguf > /dev/null
    done
  else
    echo "cold: cannot write /proc/sys/vm/drop_caches here; cold-disk figures not measured"
  fi
  [ "${LLAMA_BENCH:-0}" = 1 ] && timeout 120 "$L/b/bin/llama-bench" -m /tmp/q7.gguf -p 512 -n 128 -r 3
} > "$OUT/llama-deploy.log" 2>&1
echo "rc=$?" >> "$OUT/llama-deploy.log"
