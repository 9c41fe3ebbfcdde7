#!/usr/bin/env bash
# The GPU suites on a GPU machine from what scripts/device-pack.sh packed: test_cuda_kernels (its doctest
# -tc filter from MINFER_KERNEL_FILTER, default every case), test_cuda_e2e, test_cuda_swa, then
# compute-sanitizer memcheck and racecheck on the kernel cases MINFER_SANITIZE_FILTER names (default: the
# fused decode kernels). Logs in $OUT; the last line of each is rc=<exit status>.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
kf=${MINFER_KERNEL_FILTER:-*}
timeout 200 "$B/test_cuda_kernels" -tc="$kf" > "$OUT/kernels.log" 2>&1; echo "rc=$?" >> "$OUT/kernels.log"
timeout 300 "$B/test_cuda_e2e" > "$OUT/e2e.log" 2>&1; echo "rc=$?" >> "$OUT/e2e.log"
timeout 200 "$B/test_cuda_swa" > "$OUT/swa.log" 2>&1; echo "rc=$?" >> "$OUT/swa.log"
sf=${MINFER_SANITIZE_FILTER:-gemv_add_norm*,gemv_qkv*,attention:*}
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool "$B/test_cuda_kernels" -tc="$sf" > "$OUT/sanitizer-$tool.log" 2>&1
  echo "rc=$?" >> "$OUT/sanitizer-$tool.log"
done
grep -H -E "test cases:|ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$OUT"/kernels.log "$OUT"/e2e.log "$OUT"/swa.log "$OUT"/sanitizer-*.log
