#!/usr/bin/env bash
# Deployment A/B figures on a GPU machine, run after scripts/device-run.sh (which leaves the 7B-shaped
# /tmp/q7.gguf and its compact artifact /tmp/q7.mfb). Logs go to $OUT/deploy-ab.log:
# - start -> first token (-n 1) with checksums verified (the default) and with --no-verify, interleaved;
# - the same with the page cache dropped before each run (cold disk; needs root and a writable
#   /proc/sys/vm/drop_caches), and the time to read the GGUF cold (what any loader must read at least);
# - the expanded plane form (--planes expanded): compile, size, and pp512/pp2048/tg128 interleaved with the
#   compact artifact.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
drop_caches() { sync && echo 3 > /proc/sys/vm/drop_caches; }
first_token() { measure "$1" "$B/minfer-run" /tmp/q7.mfb -p "Once upon a time" -n 1 --temp 0 --device cuda "${@:2}" > /dev/null; }
{
  [ -f /tmp/q7.mfb ] || { echo "no /tmp/q7.mfb: run scripts/device-run.sh first"; exit 1; }
  for i in 1 2 3; do first_token warm-verify; first_token warm-no-verify --no-verify; done
  if drop_caches 2>/dev/null; then
    for i in 1 2 3; do
      drop_caches; measure cold-read-gguf cat /tmp/q7.gguf > /dev/null
      drop_caches; measure cold-read-mfb cat /tmp/q7.mfb > /dev/null
      drop_caches; first_token cold-verify
      drop_caches; first_token cold-no-verify --no-verify
    done
  else
    echo "cold: cannot write /proc/sys/vm/drop_caches here; cold-disk figures not measured"
  fi
  measure compile-expanded timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7x.mfb --planes expanded &&
    ls -la /tmp/q7.gguf /tmp/q7.mfb /tmp/q7x.mfb
  for i in 1 2; do
    echo "== compact, round $i"; timeout 100 "$B/minfer-bench" /tmp/q7.mfb -p 512,2048 -n 128 -r 3
    echo "== expanded, round $i"; timeout 100 "$B/minfer-bench" /tmp/q7x.mfb -p 512,2048 -n 128 -r 3
  done
} > "$OUT/deploy-ab.log" 2>&1
echo "rc=$?" >> "$OUT/deploy-ab.log"
