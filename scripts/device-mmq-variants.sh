#!/usr/bin/env bash
# On a GPU machine with nvcc: builds bench/mmq_variants.cu for a grid of MMQ variants (pipeline stages ×
# tiles) on the 7B's matmul shapes and prints one timing line per variant (logs in $OUT, default ./mmq-logs).
#   scripts/device-mmq-variants.sh [tokens (default 512)]
set -uo pipefail
cd "$(dirname "$0")/.."
T=${1:-512}
OUT=${OUT:-$PWD/mmq-logs}; mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
W=$(mktemp -d)
shapes=("gate 18944 3584 32 1" "down 3584 18944 32 1" "output 152064 3584 16 0" "q 3584 3584 32 1" "k 512 3584 32 1")
stages=(${MMQ_VARIANT_STAGES:-3 4})
tiles=(${MMQ_VARIANT_TILES:-128x64 64x64 64x128 128x128 256x64})
jobs=()
for sh in "${shapes[@]}"; do
  read -r name n k g min <<<"$sh"
  for st in "${stages[@]}"; do
    for tile in "${tiles[@]}"; do
      tm=${tile%x*} tn=${tile#*x}
      jobs+=("$name-s$st-$tile $n $k $g $min $st $tm $tn")
    done
  done
done
build() {
  read -r id n k g min st tm tn <<<"$1"
  "$NVCC" -O3 -std=c++17 -arch=sm_90 -I. -DMINFER_DEVICE_CODE -DMMQ_N=$n -DMMQ_K=$k -DMMQ_GROUP=$g -DMMQ_HAS_MIN=$min \
    -DMMQ_HAS_BIAS=0 -DMMQ_Q_PITCH=$k -DMMQ_S_PITCH=$((k / g * 4)) -DMMQ_M_PITCH=$((min ? k / g * 4 : 0)) \
    -DMMQ_TM=$tm -DMMQ_TN=$tn -DMMQ_STAGES=$st -Xptxas -v -o "$W/$id" bench/mmq_variants.cu > "$OUT/build-$id.log" 2>&1 ||
    echo "$id: build failed" >> "$OUT/failed.log"
}
export -f build; export NVCC W OUT
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -I{} bash -c 'build "$@"' _ {}
for j in "${jobs[@]}"; do
  id=${j%% *}
  [ -x "$W/$id" ] && "$W/$id" "$T" "$id"
done | tee "$OUT/variants.txt"
grep -h "registers\|spill" "$OUT"/build-*.log | sort | uniq -c | sort -rn | head -5 > "$OUT/resources.txt"
cat "$OUT/failed.log" 2>/dev/null
