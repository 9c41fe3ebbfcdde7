#!/usr/bin/env bash
# Runs the GPU checks on a GPU machine from what scripts/device-pack.sh packed: the gpu-labelled suites
# (kernel parity, end to end vs CPU and goldens), compute-sanitizer (memcheck, racecheck) on one end-to-end
# case, the last-token prefill and the attention and MMQ kernel tests, stories260K on the GPU, and the
# 7B-shaped benchmark. Logs go to $OUT (default ./device-logs).
# Needs the CUDA toolkit's NVRTC library on the machine (found under /usr/local).
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
{ nvidia-smi -L; git -C "$R" rev-parse HEAD 2>/dev/null || true; } > "$OUT/env.log" 2>&1
timeout 60 "$B/test_cuda_arch" > "$OUT/arch.log" 2>&1; echo "rc=$?" >> "$OUT/arch.log"
timeout 200 "$B/test_cuda_kernels" > "$OUT/kernels.log" 2>&1; echo "rc=$?" >> "$OUT/kernels.log"
timeout 300 "$B/test_cuda_e2e" > "$OUT/e2e.log" 2>&1; echo "rc=$?" >> "$OUT/e2e.log"
timeout 200 "$B/test_cuda_swa" > "$OUT/swa.log" 2>&1; echo "rc=$?" >> "$OUT/swa.log"
for tool in memcheck racecheck; do
  MINFER_GOLDEN_FILTER=tiny-qwen2-Q4_K_M timeout 120 compute-sanitizer --tool $tool "$B/test_cuda_e2e" \
    -tc="GPU logits*,last-token*" > "$OUT/sanitizer-$tool.log" 2>&1; echo "rc=$?" >> "$OUT/sanitizer-$tool.log"
  timeout 200 compute-sanitizer --tool $tool "$B/test_cuda_kernels" -tc="attention*,mmq*" \
    > "$OUT/sanitizer-kernels-$tool.log" 2>&1; echo "rc=$?" >> "$OUT/sanitizer-kernels-$tool.log"
done
{ "$B/minfer-compile" .fixtures/models/stories260K.gguf -o /tmp/s.mfb &&
  "$B/minfer-run" /tmp/s.mfb -p "Once upon a time" -n 64 --temp 0 --device cuda; } > "$OUT/stories.log" 2>&1
if [ "${MINFER_DEVICE_BENCH:-1}" = 1 ]; then
  { timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf &&
    measure compile timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb &&
    ls -la /tmp/q7.gguf /tmp/q7.mfb &&
    { time timeout 60 "$B/minfer-run" /tmp/q7.mfb -p "Once upon a time" -n 16 --temp 0 --device cuda; } &&
    timeout 200 "$B/minfer-bench" /tmp/q7.mfb -p 512,2048 -n 128 -r 5 &&
    timeout 150 "$B/minfer-bench" /tmp/q7.mfb -p 0 -n 128 -d 4096 -r 3; } > "$OUT/bench.log" 2>&1
  echo "rc=$?" >> "$OUT/bench.log"
  # Deployment figures (issue 13): process start -> first token (-n 1) with the page cache warm, three
  # runs, each with its peak resident set (GNU time's "Maximum resident set size", KiB).
  for i in 1 2 3; do
    measure first-token "$B/minfer-run" /tmp/q7.mfb -p "Once upon a time" -n 1 --temp 0 --device cuda > /dev/null
  done > "$OUT/deploy.log" 2>&1
  echo "rc=$?" >> "$OUT/deploy.log"
fi
grep -H "rc=" "$OUT"/*.log
