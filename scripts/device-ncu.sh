#!/usr/bin/env bash
# Nsight Compute attribution of the decode GEMVs (issue 12) on a GPU machine, from what
# scripts/device-pack.sh packed: the gemv_blocks kernel on the 7B's gate and down shapes in
# minfer-bench-gemv (isolated, streaming from HBM), then the decode kernels of the real step
# (minfer-bench tg on the 7B, fused artifact) — speed of light, memory workload, occupancy, warp
# states, scheduler. --clock-control none (device/METHOD.md: clocks left alone). Logs in $OUT/ncu-*.log.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
timeout 240 ncu --clock-control none --kernel-name regex:minfer_gemv_blocks --launch-skip 40 --launch-count 4 $SECTIONS \
  "$B/minfer-bench-gemv" --shapes gate,down --reps 2 > "$OUT/ncu-gemv.log" 2>&1
echo "rc=$?" >> "$OUT/ncu-gemv.log"
[ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
[ -f /tmp/q7.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb
# Decode: skip the load plan and the prompt; one layer's kernels of a decode step.
timeout 300 ncu --clock-control none --kernel-name regex:"minfer_(gemv|attn|rms)" --launch-skip 600 --launch-count 9 $SECTIONS \
  "$B/minfer-bench" /tmp/q7.mfb -p 0 -n 8 -r 1 > "$OUT/ncu-decode.log" 2>&1
echo "rc=$?" >> "$OUT/ncu-decode.log"
grep -H "rc=" "$OUT"/ncu-*.log
