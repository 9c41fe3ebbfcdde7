#!/usr/bin/env bash
# Where a batched decode step's time goes (issue 14): minfer-bench --parallel B on the 7B-shaped model under the
# CUPTI kernel trace (bench/kernel_trace.cpp) for each B of $MINFER_TRACE_PARALLEL (default "32 64"), each step's
# graph summarised by scripts/kernel-trace-summary.py; then Nsight Compute on mmq_blocks at the gate and down shapes
# (minfer-bench-gemv --mmq-blocks, each row count of $MINFER_NCU_ROWS, default "32 64"; empty: none). Logs in $OUT.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
requireKernelTrace device-batched-trace.sh
# This pack's own artifact (another script's /tmp/q7.mfb may come from another pack).
timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7-trace.mfb
for p in ${MINFER_TRACE_PARALLEL:-32 64}; do
  {
    echo "== --parallel $p traced"
    CUDA_INJECTION64_PATH=$W/lib/libminfer-kernel-trace.so MINFER_KERNEL_TRACE=$OUT/trace-p$p.csv \
      timeout 180 "$B/minfer-bench" /tmp/q7-trace.mfb --parallel "$p" -p 128 -n 128 -r 1; echo "rc=$?"
  } >> "$OUT/trace.log" 2>&1
  t=$OUT/trace-p$p.csv
  [ -f "$t" ] && python3 "$(dirname "$0")/kernel-trace-summary.py" "$t" > "${t%.csv}.txt" 2>&1 && rm -f "$t"
done
# Per shape and row count: the first kernel of the timed graph (after the one-row check launches of the smaller tiles).
for rows in ${MINFER_NCU_ROWS-32 64}; do
  for shape in gate down; do
    skip=1; [ "$rows" -gt 32 ] && skip=2
    timeout 240 ncu --clock-control none --kernel-name regex:minfer_mmq_blocks --launch-skip "$skip" --launch-count 1 \
      --set full --import-source yes "$B/minfer-bench-gemv" --shapes $shape --mmq-blocks "$rows" --reps 1 \
      > "$OUT/ncu-mmqb-$shape-$rows.log" 2>&1
    echo "rc=$?" >> "$OUT/ncu-mmqb-$shape-$rows.log"
  done
done
