#!/usr/bin/env bash
# A/B decode measurement in one machine session: the 7B-shaped model's tg128 and tg128 @ d4096 with the
# current pack (.bin/minfer-gpu.tar.xz, "new") and, where .bin/base.tar.xz exists, an earlier one ("base";
# e.g. a copy of the previous pack), each compiling its own artifact of the same GGUF, alternated in rounds so
# that drift in the machine's speed hits all alike. MINFER_AB_VARIANT (compile flags, e.g. --fuse-gemv=none;
# several sets separated by '|'): more artifacts compiled by the current pack with those flags, measured in the
# same rounds ("variant N"). MINFER_AB_PACKS: more packs, measured likewise. MINFER_AB_BENCH_VARIANT (minfer-bench flags, e.g. --logits-copy; several sets separated by
# '|'): more runs of the current pack on its own artifact with those flags ("bench variant N"). MINFER_AB_MODEL: the
# minfer-synth model (default qwen2-7b); MINFER_AB_DEPTH=0 leaves the tg128 @ d4096 rounds out. MINFER_AB_PARALLEL
# (e.g. 8,32,64): batched rounds instead (minfer-bench --parallel, 128 prompt + 128 generated tokens per sequence, as
# llama-batched-bench), no tg128 or depth rounds. Logs in $OUT/ab.log.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
names=() bins=() files=() flags=()
if [ -f .bin/base.tar.xz ]; then
  BW=$(mktemp -d); tar -C "$BW" -xJf .bin/base.tar.xz
  names+=(base); bins+=("$BW/bin"); files+=(/tmp/q7base.mfb); flags+=("")
fi
names+=(new); bins+=("$B"); files+=(/tmp/q7new.mfb); flags+=("")
# MINFER_AB_PACKS: more packs (paths in the checkout, e.g. .bin/variant.tar.xz), each compiling its own artifact.
j=0
for p in ${MINFER_AB_PACKS:-}; do
  PW=$(mktemp -d); tar -C "$PW" -xJf "$p"
  names+=("pack $p"); bins+=("$PW/bin"); files+=("/tmp/q7pack$j.mfb"); flags+=("")
  j=$((j + 1))
done
{
  model=${MINFER_AB_MODEL:-qwen2-7b}
  [ -f "/tmp/$model.gguf" ] || timeout 200 "$B/minfer-synth" "$model" --types q4_k_m -o "/tmp/$model.gguf"
  for i in "${!names[@]}"; do timeout 300 "${bins[$i]}/minfer-compile" "/tmp/$model.gguf" -o "${files[$i]}"; done
  IFS='|' read -r -a variants <<<"${MINFER_AB_VARIANT:-}"
  for j in "${!variants[@]}"; do
    # shellcheck disable=SC2086  # the flags are words
    timeout 300 "$B/minfer-compile" "/tmp/$model.gguf" -o "/tmp/q7var$j.mfb" ${variants[$j]}
    names+=("variant $j (${variants[$j]})"); bins+=("$B"); files+=("/tmp/q7var$j.mfb"); flags+=("")
  done
  IFS='|' read -r -a bench_variants <<<"${MINFER_AB_BENCH_VARIANT:-}"
  for j in "${!bench_variants[@]}"; do
    names+=("bench variant $j (${bench_variants[$j]})"); bins+=("$B"); files+=(/tmp/q7new.mfb); flags+=("${bench_variants[$j]}")
  done
  if [ -n "${MINFER_AB_PARALLEL:-}" ]; then
    for r in 1 2; do
      for i in "${!names[@]}"; do
        echo "== parallel round $r ${names[$i]}"
        # shellcheck disable=SC2086  # the flags are words
        timeout 200 "${bins[$i]}/minfer-bench" "${files[$i]}" --parallel "$MINFER_AB_PARALLEL" -p 128 -n 128 -r 2 ${flags[$i]}
      done
    done
  fi
  for r in $([ -n "${MINFER_AB_PARALLEL:-}" ] || echo 1 2 3); do
    for i in "${!names[@]}"; do
      echo "== round $r ${names[$i]}"
      # shellcheck disable=SC2086  # the flags are words
      timeout 120 "${bins[$i]}/minfer-bench" "${files[$i]}" -p 0 -n 128 -r 3 ${flags[$i]}
    done
  done
  for r in $([ "${MINFER_AB_DEPTH:-1}" = 0 ] || [ -n "${MINFER_AB_PARALLEL:-}" ] || echo 1 2); do
    for i in "${!names[@]}"; do
      echo "== depth round $r ${names[$i]}"
      # shellcheck disable=SC2086  # the flags are words
      timeout 120 "${bins[$i]}/minfer-bench" "${files[$i]}" -p 0 -n 128 -d 4096 -r 2 ${flags[$i]}
    done
  done
} > "$OUT/ab.log" 2>&1
echo "rc=$?" >> "$OUT/ab.log"
