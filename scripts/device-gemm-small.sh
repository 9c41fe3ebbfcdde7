#!/usr/bin/env bash
# Builds and runs bench/gemm_small_bench.cu on a GPU machine for the matmul shapes of a 7B (qwen2-7b: hidden
# 3584, FFN 18944, 512-wide K/V, vocabulary 152064), as kI8 planes with groups of 32 and mins (Q4_K), one as
# groups of 16 (Q6_K) and one as a 4-bit kPacked plane (Q4_0-like); then small odd shapes (N not a multiple of 16 or
# of 128, K/32 not a multiple of the splits) for correctness. Prints one line per shape and row count.
#   scripts/device-gemm-small.sh [shape-index...]     (SB_VARIANTS="chunk:min_blocks:prefetch:m16_tiles …", SB_TARGET=blocks)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${TMPDIR:-/tmp}/gemm_small_bench
mkdir -p "$out"
splits() { python3 -c "
n,k=$1,$2; rb=(n+${SB_ROWS:-128}-1)//${SB_ROWS:-128}; kb=k//32; s=1
while s<32 and rb*s<${SB_TARGET:-528} and kb//(2*s)>=4: s*=2
print(s)"; }
shapes=("3584 3584 8 32 1 0" "512 3584 8 32 1 0" "18944 3584 8 32 1 0" "3584 18944 8 32 1 0" "3584 18944 8 16 0 0"
        "152064 3584 8 16 0 0" "3584 3584 4 32 0 -8"
        "200 352 4 32 0 -8" "211 512 8 16 1 0" "24 256 8 16 1 0" "520 4096 8 32 1 0" "136 1024 4 32 1 0")  # odd N
pick=("$@")
[ ${#pick[@]} -eq 0 ] && pick=($(seq 0 $((${#shapes[@]} - 1))))
variants=(${SB_VARIANTS:-4:1:0:2})
bins=()
for i in "${pick[@]}"; do
  read -r n k bits group has_min qoff <<<"${shapes[$i]}"
  pitch=$((bits == 8 ? k : k / 2)); spitch=$((k / group * 4))
  for v in "${variants[@]}"; do
    SB_ROWS=$((64 * $(cut -d: -f4 <<<"$v")))
    b="$out/b${i}_${v//:/_}_t${SB_TARGET:-528}"
    nvcc -O3 -std=c++17 -arch=sm_90 -I. -DSB_CHUNK=${v%%:*} -DSB_MIN_BLOCKS=$(cut -d: -f2 <<<"$v") -DSB_PREFETCH=$(cut -d: -f3 <<<"$v") -DSB_MT=$(cut -d: -f4 <<<"$v") -DSB_N=$n -DSB_K=$k -DSB_BITS=$bits \
      -DSB_GROUP=$group -DSB_HAS_MIN=$has_min -DSB_Q_OFFSET=$qoff -DSB_PITCH=$pitch -DSB_S_PITCH=$spitch \
      -DSB_M_PITCH=$spitch -DSB_HAS_BIAS=0 -DSB_SPLITS=$(splits $n $k) bench/gemm_small_bench.cu -o "$b" &
    bins+=("$b")
  done
done
wait
for b in "${bins[@]}"; do echo "== ${b##*/}"; "$b"; done
