#!/usr/bin/env bash
# A/B decode measurement in one machine session: the 7B-shaped model's tg128 and tg128 @ d4096 with the
# current pack (.bin/minfer-gpu.tar.xz, "new") and an earlier one (.bin/base.tar.xz, "base"; e.g. a copy
# of the previous pack), each compiling its own artifact of the same GGUF, alternated in rounds so that
# drift in the machine's speed hits both alike. MINFER_AB_VARIANT (compile flags, e.g. --fuse-gemv=none): a
# third artifact compiled by the current pack with those flags, measured in the same rounds ("variant").
# Logs in $OUT/ab.log.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
BW=$(mktemp -d); tar -C "$BW" -xJf .bin/base.tar.xz; BB=$BW/bin
{
  [ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
  timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7new.mfb
  timeout 120 "$BB/minfer-compile" /tmp/q7.gguf -o /tmp/q7base.mfb
  V=${MINFER_AB_VARIANT:-}
  # shellcheck disable=SC2086  # the flags are words
  [ -n "$V" ] && timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7var.mfb $V
  for i in 1 2 3; do
    echo "== round $i base"; timeout 120 "$BB/minfer-bench" /tmp/q7base.mfb -p 0 -n 128 -r 3
    echo "== round $i new"; timeout 120 "$B/minfer-bench" /tmp/q7new.mfb -p 0 -n 128 -r 3
    [ -n "$V" ] && { echo "== round $i variant ($V)"; timeout 120 "$B/minfer-bench" /tmp/q7var.mfb -p 0 -n 128 -r 3; }
  done
  for i in 1 2; do
    echo "== depth round $i base"; timeout 120 "$BB/minfer-bench" /tmp/q7base.mfb -p 0 -n 128 -d 4096 -r 2
    echo "== depth round $i new"; timeout 120 "$B/minfer-bench" /tmp/q7new.mfb -p 0 -n 128 -d 4096 -r 2
    [ -n "$V" ] && { echo "== depth round $i variant ($V)"; timeout 120 "$B/minfer-bench" /tmp/q7var.mfb -p 0 -n 128 -d 4096 -r 2; }
  done
} > "$OUT/ab.log" 2>&1
echo "rc=$?" >> "$OUT/ab.log"
