#!/usr/bin/env bash
# Decode measurements on a GPU machine from what scripts/device-pack.sh packed (issue 12): the GPU suites,
# then the 7B-shaped model's tg128 / tg128 @ d4096 / pp512 / pp128 with programmatic dependent launch on
# and off (--no-overlap), interleaved, and one --profile run of tg128 and pp512. Logs in $OUT/decode.log.
set -uo pipefail
R=$PWD
OUT=${OUT:-$R/device-logs}; mkdir -p "$OUT"
W=$(mktemp -d); tar -C "$W" -xJf .bin/minfer-gpu.tar.xz
NV=$(dirname "$(find /usr/local -name 'libnvrtc.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:$W/lib:${LD_LIBRARY_PATH:-}
export MINFER_FIXTURES=$R/.fixtures MINFER_CACHE_DIR=/tmp/minfer-kc MINFER_TEST_KERNEL_CACHE=/tmp/minfer-kc TMPDIR=/tmp
B=$W/bin
if [ "${MINFER_DEVICE_SUITES:-1}" = 1 ]; then
  timeout 200 "$B/test_cuda_kernels" > "$OUT/kernels.log" 2>&1; echo "rc=$?" >> "$OUT/kernels.log"
  timeout 200 "$B/test_cuda_e2e" > "$OUT/e2e.log" 2>&1; echo "rc=$?" >> "$OUT/e2e.log"
  MINFER_GOLDEN_FILTER=tiny-qwen2-Q4_K_M timeout 120 compute-sanitizer --tool memcheck "$B/test_cuda_e2e" \
    -tc="GPU logits*,decode graph*" > "$OUT/sanitizer-memcheck.log" 2>&1; echo "rc=$?" >> "$OUT/sanitizer-memcheck.log"
fi
{
  [ -f /tmp/q7.mfb ] || { timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf &&
    timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb; }
  for i in 1 2; do
    echo "== overlap on, round $i"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 128,512 -n 128 -r 5
    echo "== overlap off, round $i"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 128,512 -n 128 -r 5 --no-overlap
  done
  echo "== depth 4096, overlap on"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 0 -n 128 -d 4096 -r 3
  echo "== depth 4096, overlap off"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 0 -n 128 -d 4096 -r 3 --no-overlap
  echo "== profile"; timeout 120 "$B/minfer-bench" /tmp/q7.mfb -p 512 -n 128 -r 1 --profile
} > "$OUT/decode.log" 2>&1
echo "rc=$?" >> "$OUT/decode.log"
grep -H "rc=" "$OUT"/*.log
