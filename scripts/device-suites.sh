#!/usr/bin/env bash
# The GPU suites on a GPU machine from what scripts/device-pack.sh packed: test_cuda_kernels (its doctest
# -tc filter from MINFER_KERNEL_FILTER, default every case), test_cuda_e2e (MINFER_E2E_FILTER likewise), test_cuda_swa, then
# compute-sanitizer memcheck and racecheck on the kernel cases MINFER_SANITIZE_FILTER names (default: the
# fused decode kernels). MINFER_SUITES picks which of "kernels e2e swa memcheck racecheck" run (default all; their
# time limits add up to 1,000 s, more than one device call allows: split them over two calls). Logs in $OUT; the
# last line of each is rc=<exit status>.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
suites=" ${MINFER_SUITES:-kernels e2e swa memcheck racecheck} "
kf=${MINFER_KERNEL_FILTER:-*}
sf=${MINFER_SANITIZE_FILTER:-gemv_add_norm*,deferred*,gemv_qkv*,attention:*}
case $suites in *" kernels "*)
  timeout 200 "$B/test_cuda_kernels" -tc="$kf" > "$OUT/kernels.log" 2>&1; echo "rc=$?" >> "$OUT/kernels.log" ;;
esac
case $suites in *" e2e "*)
  timeout 300 "$B/test_cuda_e2e" -tc="${MINFER_E2E_FILTER:-*}" > "$OUT/e2e.log" 2>&1; echo "rc=$?" >> "$OUT/e2e.log" ;;
esac
case $suites in *" swa "*)
  timeout 200 "$B/test_cuda_swa" > "$OUT/swa.log" 2>&1; echo "rc=$?" >> "$OUT/swa.log" ;;
esac
for tool in memcheck racecheck; do
  case $suites in *" $tool "*)
    timeout 150 compute-sanitizer --tool $tool "$B/test_cuda_kernels" -tc="$sf" > "$OUT/sanitizer-$tool.log" 2>&1
    echo "rc=$?" >> "$OUT/sanitizer-$tool.log" ;;
  esac
done
grep -H -E "test cases:|ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$OUT"/*.log 2>/dev/null
