#!/usr/bin/env bash
# On a GPU machine with nvcc (sm_90a): builds bench/wgmma_bench.cu for a grid of Hopper matmul variants
# (tiles × stages × activation kind) on the 7B's matmul shapes plus odd shapes, runs each at the given
# token counts and prints one line per run (logs in $OUT, default ./wgmma-logs).
#   scripts/device-wgmma-variants.sh [token counts (default "128 512 2048")]
set -uo pipefail
cd "$(dirname "$0")/.."
TOKENS=(${1:-128 512 2048})
OUT=${OUT:-$PWD/wgmma-logs}; mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
W=$(mktemp -d)
shapes=(${WGMMA_SHAPES:-gate:18944:3584 down:3584:18944 q:3584:3584 k:512:3584 output:152064:3584 odd:1000:3616})
tiles=(${WGMMA_TILES:-128x128 128x256 64x128 128x64})
stages=(${WGMMA_STAGES:-4 6})
acts=(${WGMMA_ACTS:-0 1})
jobs=()
for sh in "${shapes[@]}"; do
  IFS=: read -r name n k <<<"$sh"
  for tile in "${tiles[@]}"; do
    for st in "${stages[@]}"; do
      for act in "${acts[@]}"; do jobs+=("$name-$tile-s$st-a$act $n $k ${tile%x*} ${tile#*x} $st $act"); done
    done
  done
done
build() {
  read -r id n k bm bn st act <<<"$1"
  local pitch=$(( (k * 2 + 15) / 16 * 16 ))
  "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -DMINFER_DEVICE_CODE -DWG_N=$n -DWG_K=$k \
    -DWG_W_PITCH=$pitch -DWG_BM=$bm -DWG_BN=$bn -DWG_STAGES=$st -DWG_ACT=$act -DWG_HAS_BIAS=0 -Xptxas -v \
    -o "$W/$id" bench/wgmma_bench.cu > "$OUT/build-$id.log" 2>&1 || echo "$id: build failed" >> "$OUT/failed.log"
}
export -f build; export NVCC W OUT
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -I{} bash -c 'build "$@"' _ {}
for j in "${jobs[@]}"; do
  id=${j%% *}
  [ -x "$W/$id" ] && timeout 120 "$W/$id" "$id" "${TOKENS[@]}"
done | tee "$OUT/variants.txt"
grep -h "registers\|spill\|wgmma\|C75" "$OUT"/build-*.log | sort | uniq -c | sort -rn | head -12 > "$OUT/resources.txt"
cat "$OUT/failed.log" 2>/dev/null
