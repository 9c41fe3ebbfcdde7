#!/usr/bin/env bash
# Decode measurements on a GPU machine from what scripts/device-pack.sh packed (issue 12): the GPU suites
# (MINFER_DEVICE_SUITES=0 skips them), compute-sanitizer on the newer kernels (MINFER_DEVICE_SANITIZE=0
# skips it; the end-to-end memcheck only where the fixtures were carried), then the 7B-shaped model's pp128 / pp512 / tg128 and tg128 @ d4096
# with the default launch fusions, with the decode GEMV fusions too (--fuse-gemv) and without any (--no-fuse),
# interleaved, programmatic dependent launch off once (minfer-bench --no-overlap), and --profile runs
# (MINFER_DEVICE_BENCH=0 skips them). Logs in $OUT/decode.log.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
if [ "${MINFER_DEVICE_SUITES:-1}" = 1 ]; then
  timeout 200 "$B/test_cuda_kernels" > "$OUT/kernels.log" 2>&1; echo "rc=$?" >> "$OUT/kernels.log"
  timeout 300 "$B/test_cuda_e2e" > "$OUT/e2e.log" 2>&1; echo "rc=$?" >> "$OUT/e2e.log"
  timeout 200 "$B/test_cuda_swa" > "$OUT/swa.log" 2>&1; echo "rc=$?" >> "$OUT/swa.log"
fi
if [ "${MINFER_DEVICE_SANITIZE:-1}" = 1 ]; then
  if [ -d "$MINFER_FIXTURES/models" ]; then
    MINFER_GOLDEN_FILTER=tiny-qwen2-Q4_K_M timeout 120 compute-sanitizer --tool memcheck "$B/test_cuda_e2e" \
      -tc="GPU logits*,decode graph*" > "$OUT/sanitizer-memcheck.log" 2>&1; echo "rc=$?" >> "$OUT/sanitizer-memcheck.log"
  fi
  for tool in memcheck racecheck; do  # the kernels with fused outputs, views, experts and paged KV
    timeout 200 compute-sanitizer --tool $tool "$B/test_cuda_kernels" \
      -tc="rms_norm*,swiglu*,column*,moe*,gemv_*,attention*,rope_paged*,kv_store_paged*" \
      > "$OUT/sanitizer-kernels-$tool.log" 2>&1; echo "rc=$?" >> "$OUT/sanitizer-kernels-$tool.log"
  done
fi
[ "${MINFER_DEVICE_BENCH:-1}" = 1 ] || exit 0
{
  [ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
  [ -f /tmp/q7.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb
  [ -f /tmp/q7g.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7g.mfb --fuse-gemv
  [ -f /tmp/q7nf.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7nf.mfb --no-fuse
  for i in 1 2; do
    echo "== fused, overlap on, round $i"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 128,512 -n 128 -r 5
    echo "== with the GEMV fusions, overlap on, round $i"; timeout 120 "$B/minfer-bench" /tmp/q7g.mfb -p 128,512 -n 128 -r 5
    echo "== unfused, overlap on, round $i"; timeout 120 "$B/minfer-bench" /tmp/q7nf.mfb -p 128,512 -n 128 -r 5
  done
  echo "== fused, overlap off"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 128,512 -n 128 -r 5 --no-overlap
  echo "== depth 4096, fused, overlap on"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 0 -n 128 -d 4096 -r 3
  echo "== depth 4096, with the GEMV fusions, overlap on"; timeout 120 "$B/minfer-bench" /tmp/q7g.mfb -p 0 -n 128 -d 4096 -r 3
  echo "== depth 4096, unfused, overlap on"; timeout 120 "$B/minfer-bench" /tmp/q7nf.mfb -p 0 -n 128 -d 4096 -r 3
  echo "== profile"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 512 -n 128 -r 1 --profile
  echo "== profile with the GEMV fusions"; timeout 120 "$B/minfer-bench" /tmp/q7g.mfb -p 0 -n 128 -r 1 --profile
} > "$OUT/decode.log" 2>&1
echo "rc=$?" >> "$OUT/decode.log"
grep -H "rc=" "$OUT"/*.log
