# Sourced by the scripts/device-*.sh scripts on the GPU machine: unpacks what scripts/device-pack.sh
# packed (or the pack $MINFER_PACK names) into a temporary directory, sets $B (its bin/), $OUT (logs; default ./device-logs), the library
# path (NVRTC from the CUDA toolkit under /usr/local, the packed libtinfo) and the kernel cache, and
# defines measure LABEL CMD…: runs CMD, then prints its wall time and peak resident set (getrusage of
# the child) to stderr.
R=$PWD
OUT=${OUT:-$R/device-logs}; mkdir -p "$OUT"
W=$(mktemp -d); tar -C "$W" -xJf "${MINFER_PACK:-.bin/minfer-gpu.tar.xz}"
NV=$(dirname "$(find /usr/local -name 'libnvrtc.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:$W/lib:${LD_LIBRARY_PATH:-}
export MINFER_FIXTURES=$R/.fixtures MINFER_CACHE_DIR=/tmp/minfer-kc MINFER_TEST_KERNEL_CACHE=/tmp/minfer-kc TMPDIR=/tmp
B=$W/bin
measure() {
  python3 -c 'import resource, subprocess, sys, time
t = time.time(); rc = subprocess.run(sys.argv[2:]).returncode
print(f"{sys.argv[1]}: wall {time.time() - t:.3f} s, peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} KiB, rc {rc}", file=sys.stderr)
sys.exit(rc)' "$@"
}
# requireKernelTrace SCRIPT: exits 1 (saying so in $OUT/trace.log) where the pack has no CUPTI kernel trace
# (bench/kernel_trace.cpp, built only where the toolkit has CUPTI); then makes /tmp/q7.gguf, the 7B-shaped model the
# trace scripts run, if missing.
requireKernelTrace() {
  if [ ! -f "$W/lib/libminfer-kernel-trace.so" ]; then
    echo "$1: the pack has no libminfer-kernel-trace.so (built without CUPTI)" | tee -a "$OUT/trace.log"
    exit 1
  fi
  [ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
}
