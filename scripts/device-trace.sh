#!/usr/bin/env bash
# Where a decode step's time goes, kernel by kernel, as the GPU ran them (overlaps included): the 7B-shaped
# model's tg128 and tg128 @ d4096 under the CUPTI kernel trace (bench/kernel_trace.cpp), summarised by
# scripts/kernel-trace-summary.py, beside the same runs untraced (the trace's own cost). Logs in $OUT.
# MINFER_TRACE_ARTIFACTS: the artifacts to trace (default /tmp/q7.mfb, compiled here if missing).
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
requireKernelTrace device-trace.sh
[ -f /tmp/q7.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb
for a in ${MINFER_TRACE_ARTIFACTS:-/tmp/q7.mfb}; do
  n=$(basename "$a" .mfb)
  {
    echo "== $a untraced"; timeout 120 "$B/minfer-bench" "$a" -p 0 -n 128 -r 3
    echo "== $a untraced, depth 4096"; timeout 120 "$B/minfer-bench" "$a" -p 0 -n 128 -d 4096 -r 2
    echo "== $a traced"
    CUDA_INJECTION64_PATH=$W/lib/libminfer-kernel-trace.so MINFER_KERNEL_TRACE=$OUT/trace-$n.csv \
      timeout 120 "$B/minfer-bench" "$a" -p 0 -n 128 -r 3; echo "rc=$?"
    echo "== $a traced, depth 4096"
    CUDA_INJECTION64_PATH=$W/lib/libminfer-kernel-trace.so MINFER_KERNEL_TRACE=$OUT/trace-$n-d4096.csv \
      timeout 120 "$B/minfer-bench" "$a" -p 0 -n 128 -d 4096 -r 2; echo "rc=$?"
  } >> "$OUT/trace.log" 2>&1
  for t in "$OUT/trace-$n.csv" "$OUT/trace-$n-d4096.csv"; do
    [ -f "$t" ] && python3 "$(dirname "$0")/kernel-trace-summary.py" "$t" > "${t%.csv}.txt" 2>&1
    [ -f "$t" ] && xz -T0 "$t"
  done
done
