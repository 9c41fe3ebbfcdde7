#!/usr/bin/env bash
# Builds and runs bench/gemm_small_bench.cu for kernels/gemm_small_blocks.cuh (the small-batch matmul on the
# kBlocks plane) on a GPU machine, for the matmul shapes of a 7B Q4_K_M (qwen2-7b: q/o 3584², k/v 512 × 3584,
# gate/up 18944 × 3584, down 3584 × 18944 in Q4_K and Q6_K, the output head 152064 × 3584 in Q6_K), then small
# odd shapes (N not a multiple of 16 or 128, K/256 not a multiple of the splits) for correctness. Prints one line
# per shape, variant and row count (1, 8, 16, 32, 64): µs, GB/s of block bytes, max rel error vs float64.
#   scripts/device-gemm-small-blocks.sh [shape-index...]
#   SBB_VARIANTS="mt:lookahead:min_blocks:target …" (default "2:2:2:264", the header's defaults): m16 tiles per
#   warp (SBB_MT), super-blocks of L2 prefetch ahead of the loads (SBB_PREFETCH, 0 = none), blocks per SM for the
#   register bound (SBB_MIN_BLOCKS), blocks the split-K count aims for (kSbbTargetBlocks).
#   e.g. SBB_VARIANTS="2:2:2:264 1:2:3:264 2:0:2:264 2:4:2:264 2:2:2:132" scripts/device-gemm-small-blocks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=${TMPDIR:-/tmp}/gemm_small_blocks_bench
mkdir -p "$out"
# gemmSmallBlocksSplits(n, k) for rows per block $3 and target $4.
splits() { python3 -c "
n,k,rb_rows,target=$1,$2,$3,$4; rb=(n+rb_rows-1)//rb_rows; sb=k//256; s=max(min((target+rb-1)//rb,32,sb),1)
print(-(-sb//(-(-sb//s))))"; }
shapes=("3584 3584 12" "512 3584 12" "512 3584 14" "18944 3584 12" "3584 18944 12" "3584 18944 14" "3584 3584 14"
        "152064 3584 14"
        "328 768 12" "211 1280 14" "520 3584 14" "24 256 12")  # odd N, uneven splits
pick=("$@")
[ ${#pick[@]} -eq 0 ] && pick=($(seq 0 $((${#shapes[@]} - 1))))
variants=(${SBB_VARIANTS:-2:2:2:264})
bins=()
for i in "${pick[@]}"; do
  read -r n k type <<<"${shapes[$i]}"
  gp=$((type == 12 ? 144 : 224)); pitch=$((k / 256 * gp))
  for v in "${variants[@]}"; do
    IFS=: read -r mt prefetch minb target <<<"$v"
    b="$out/b${i}_${v//:/_}"
    "$NVCC" -O3 -std=c++17 -arch=sm_90 -I. -DSBB_MT=$mt -DSBB_PREFETCH=$prefetch -DSBB_MIN_BLOCKS=$minb \
      -DSBB_N=$n -DSBB_K=$k -DSBB_TYPE=$type -DSBB_PITCH=$pitch -DSBB_GROUP_PITCH=$gp -DSBB_HAS_BIAS=0 \
      -DSBB_SPLITS=$(splits $n $k $((64 * mt)) $target) bench/gemm_small_bench.cu -o "$b" &
    bins+=("$b")
  done
done
wait
for b in "${bins[@]}"; do echo "== ${b##*/}"; "$b"; done
