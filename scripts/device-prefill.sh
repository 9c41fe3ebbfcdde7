#!/usr/bin/env bash
# Prefill measurements on a GPU machine from what scripts/device-pack.sh packed (issue 15): the GPU suites
# (MINFER_DEVICE_SUITES=0 skips them; the golden cases run with both the sm_90 and the sm_90a plan), the
# sanitizers on the Hopper kernels, then the 7B-shaped model compiled for sm_90a (wgmma prefill) and for
# sm_90 (int8 mma.sync), pp128 / pp512 / pp2048 / tg128 interleaved, and pp8192 with --max-batch 8192.
# Logs in $OUT/prefill.log.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
if [ "${MINFER_DEVICE_SUITES:-1}" = 1 ]; then
  timeout 240 "$B/test_cuda_kernels" > "$OUT/kernels.log" 2>&1; echo "rc=$?" >> "$OUT/kernels.log"
  timeout 300 "$B/test_cuda_e2e" > "$OUT/e2e.log" 2>&1; echo "rc=$?" >> "$OUT/e2e.log"
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool "$B/test_cuda_kernels" -tc="wgmma*,expand_blocks*" \
      > "$OUT/sanitizer-kernels-$tool.log" 2>&1; echo "rc=$?" >> "$OUT/sanitizer-kernels-$tool.log"
  done
fi
{
  [ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
  [ -f /tmp/q7h.mfb ] || measure "compile sm_90a" timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7h.mfb --target sm_90a
  [ -f /tmp/q7m.mfb ] || measure "compile sm_90" timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7m.mfb --target sm_90
  for i in 1 2; do
    echo "== sm_90a (wgmma), round $i"; timeout 150 "$B/minfer-bench" /tmp/q7h.mfb -p 128,512,2048 -n 128 -r 5
    echo "== sm_90 (mma.sync), round $i"; timeout 150 "$B/minfer-bench" /tmp/q7m.mfb -p 128,512,2048 -n 128 -r 5
  done
  for i in 1 2; do
    echo "== first token, sm_90a"; measure "first token sm_90a" timeout 60 "$B/minfer-run" /tmp/q7h.mfb -p "Once upon a time" -n 1 --temp 0
    echo "== first token, sm_90"; measure "first token sm_90" timeout 60 "$B/minfer-run" /tmp/q7m.mfb -p "Once upon a time" -n 1 --temp 0
  done
  [ -f /tmp/q7h8k.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7h8k.mfb --target sm_90a --max-batch 8192
  echo "== pp8192, sm_90a"; timeout 200 "$B/minfer-bench" /tmp/q7h8k.mfb -p 8192 -n 0 -r 2
  echo "== profile, sm_90a"; timeout 120 "$B/minfer-bench" /tmp/q7h.mfb -p 512 -n 0 -r 1 --profile
} > "$OUT/prefill.log" 2>&1
echo "rc=$?" >> "$OUT/prefill.log"
grep -H "rc=" "$OUT"/*.log
