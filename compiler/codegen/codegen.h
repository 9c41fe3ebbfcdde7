// Kernel codegen: the kernel images an execution plan needs, compiled with NVRTC for each target arch.
//
// For every step of the prefill and decode plans, launchesForStep() names the kernel uses (kernel_spec.h:
// spec + launch record); identical specs (layers share shapes) are compiled once per arch; each
// (spec, arch) is looked up in the on-disk cache (kernel_cache.h) or compiled, in parallel on `jobs`
// threads. The result is deterministic whatever the thread count or cache state: images are ordered by
// first use (prefill steps, each followed by its paged launches, then decode steps likewise, then load steps, then argmax, then top-k), archs in the requested order.
//
// Launch records (Step.launches in the artifact): per kernel use, its arguments and launch rule and the
// image index of every target arch, in target order; a runtime takes the one of its chosen arch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_spec.h"
#include "compiler/model/model_desc.h"
#include "compiler/planes/layout_planner.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

namespace minfer::codegen {

struct CodegenOptions {
  std::vector<std::string> targets;  // e.g. {"sm_90"} or {"sm_80", "sm_86", "sm_89", "sm_90"}
  unsigned jobs = 0;                 // parallel NVRTC compilations; 0 = hardware concurrency
  std::string cache_dir;             // "" = KernelCache::defaultDirectory(); "off" = no cache
  // Launch fusion (schema Step.fused, ops/fusion.cpp): a QuantizeAct runs inside the launch of the
  // RmsNorm / SwiGlu / GeGlu / decode Attention that produces its input, an RmsNorm inside the residual
  // Add's before it, in decode the Attention's KV store into a q/k HeadRmsNorm + RoPE launch and the MoeRoute and
  // MoeFfn into the router MatMul's launches (router GEMV, top-k and slot sort in one launch, the combine in the
  // down launch); with fuse_qkv (the
  // default) also the decode q, k, v GEMVs with their RoPE and KV store in one launch (or, where a q/k HeadRmsNorm
  // sits between them and the RoPE, the three GEMVs alone in one launch),
  // with fuse_glu the decode gate|up GEMVs with their GLU (off by default: slower on the H200,
  // BENCHMARKS.md), with fuse_pair (the default) two decode GEMVs of one input (gate and up) in one launch.
  // fuse_qkv also gives the prefill q, k, v one small-batch launch (minfer_mmq_blocks3, ops/op_family.h
  // fusesMmqbSegments) for calls of kMmqbFromRows … kMmqbFusedMaxRows rows on sm_90a images (… kMmqbMaxRows with
  // wgmma_split_fused): each output as minfer_mmq_blocks writes it with the fused launch's split count (the 7B's: each
  // matrix's own), and for 33 … 64 rows in place of the Hopper f16 GEMM (both within the f16 GEMM's rounding of
  // weights and activations).
  // Off: every step launches its own kernels (the same results, bit for bit, where fuse_norm and the prefill fusions
  // do not apply).
  bool fuse_launches = true;
  bool fuse_qkv = true;
  bool fuse_glu = false;
  bool fuse_pair = true;
  // With fuse_norm (the default: tg128 +1.1% on the H200's 7B, BENCHMARKS.md) the decode o and down GEMVs with the
  // residual Add, RmsNorm and QuantizeAct after them in one launch that leaves the 1/rms to the GEMV chain reading
  // the norm (gemv_blocks.cuh GEMVB_NORM and GEMVB_RMS_EPS; ops/op_family.h planFusion): equal to the unfused steps
  // up to rounding, not bit for bit.
  bool fuse_norm = true;
  // With fuse_prefill_pair the prefill gate and up of a GLU (two matmuls of one input) as one small-batch launch too
  // (minfer_mmq_blocks2, as fuse_qkv's q, k, v): +5.6% / +4.3% / +4.7% aggregate decode at 8 / 32 / 64 sequences
  // on the H200's 7B (BENCHMARKS.md, issue 14); each output as minfer_mmq_blocks writes it with the pair's splits.
  bool fuse_prefill_pair = true;
  // With mmqb_wgmma (the default) and every target sm_90a, the small-batch mmq_blocks launches of 64-token tiles in
  // their warpgroup form (kernels/mmq_blocks.cuh MMQB_WGMMA, mmqbWarpgroupTile: Hopper's wgmma with the dequantized
  // weights in registers; its sums measured bit for bit mma.sync's on the H200); ignored for other targets (their plans
  // have no mmq_blocks launches, or no wgmma).
  bool mmqb_wgmma = true;
  // With mmqb_f16act (the default; with mmqb_wgmma, sm_90a) those warpgroup tiles take their activations as f16,
  // staged once per step by minfer_mmqb_f16_act in the MMA's k order, instead of converting the q8 values in every
  // thread block at every stage (kernels/mmq_blocks.cuh MMQB_F16ACT; the same values, so the same bits): the 7B's
  // aggregate decode at 64 sequences +3.4% on an H100, the staging launch included (BENCHMARKS.md, issue 14).
  bool mmqb_f16act = true;
  // With wgmma_split (the default) and every target sm_90a, the plain (unfused) prefill matmuls that have small-batch
  // launches on GGUF blocks and a kF16 plane (the 7B's o and down projections) take the Hopper f16 matmul for the
  // calls of 33 … 64 rows (kernels/wgmma_matmul.cuh, ops/op_family.h smallLaunchesForStep) on the 64 × 64 tile, split
  // over K (minfer_wgmma_matmul_split) where kern::wgmmaSplits gives more than one split with wgmma_split_min_stages
  // stages of 64 per split at least (0: kern::kWgmmaSplitMinStages, which splits the 7B's down in 3 and leaves its o
  // one split), instead of the prefill launch whose 56 weight tiles leave most of the 132 SMs idle. On an H100 the
  // split made o (3584 × 3584) slower at every count and down 10% faster at 3–4 splits, kernel alone; with that rule
  // the 7B's aggregate decode at 64 sequences +3.7% (BENCHMARKS.md, issue 14).
  bool wgmma_split = true;
  unsigned wgmma_split_min_stages = 0;
  // With wgmma_split_fused (sm_90a; with or without wgmma_split) the fused prefill q, k, v and gate and up likewise
  // (their mmq_blocks launches stop at 32 rows; past that one minfer_q8_to_f16 and each matmul's Hopper launch of the
  // split form's tile). Off by default, to be measured against the 64-token mmq_blocks tiles (BENCHMARKS.md, issue 14).
  bool wgmma_split_fused = false;
};

struct KernelImageData {
  std::string key;    // spec key + "_" + arch tag, e.g. "mmq_i8_q4k_n3584_k3584_tm128_tn64_sm90"
  std::string entry;  // e.g. "minfer_mmq"
  std::string arch;   // e.g. "sm_90"
  std::vector<uint8_t> cubin;
  std::string ptx;    // PTX text without a terminating NUL (the artifact segment adds one)
  std::string nvrtc_version;
  std::vector<std::string> options;  // NVRTC options, the -D constants included
};

struct CodegenStats {
  size_t kernel_uses = 0;    // kernels launched by all steps of both plans (+ argmax, top-k)
  size_t unique_specs = 0;   // after dedupe
  size_t images = 0;         // unique_specs × targets
  size_t cache_hits = 0;
  size_t compiled = 0;       // NVRTC compilations run
  unsigned cache_write_failures = 0;
  double seconds = 0;
};

// One kernel use as the artifact records it (schema Launch).
struct LaunchRecord {
  std::vector<KernelArgDesc> args;
  kern::LaunchRule rule;
  std::vector<uint32_t> images;  // index into KernelSet::images, one per target arch, in target order
  // Schema Launch.overlap: every kernel family starts with overlapPrologue() (kernels/common.cuh), so
  // every kernel may be launched while its predecessor still runs.
  bool overlap = true;
  uint32_t min_rows = 0, max_rows = 0;  // schema Launch.min_rows / max_rows (1.10): KernelLaunch's row range
};

struct KernelSet {
  std::vector<KernelImageData> images;
  std::vector<std::vector<LaunchRecord>> prefill;  // per prefill step: its kernel uses in launch order
  std::vector<std::vector<LaunchRecord>> decode;   // per decode step
  std::vector<std::vector<LaunchRecord>> load;     // per load step (ExpandBlocks)
  // Per step of prefill / decode: 1 when the step is fused into the previous step's launches (schema
  // Step.fused; its launch list is empty).
  std::vector<uint8_t> prefill_fused, decode_fused;
  // Per prefill / decode step: its paged launches (schema Step.paged_launches, 1.6), the kernels a batch
  // session runs instead of the step's launches: Rope and Attention steps that are not fused, the q
  // MatMul that runs the fused QKV GEMV, and the q HeadRmsNorm that runs the head-norm RoPE launch (with the
  // decode Attention's, when it is fused in) (ops/op_family.h pagedLaunchesForStep).
  std::vector<std::vector<LaunchRecord>> prefill_paged, decode_paged;
  // Per prefill step: its small-batch launches and the largest call they serve (schema Step.small_launches and
  // small_rows, 1.7; ops/op_family.h smallLaunchesForStep): empty and 0 on every step but a MatMul's.
  std::vector<std::vector<LaunchRecord>> prefill_small;
  std::vector<uint32_t> prefill_small_rows;
  LaunchRecord argmax;
  LaunchRecord topk;  // schema Artifact.topk (1.9)
  CodegenStats stats;
};

// True when every target is sm_90a (and there is one): the only images that may issue wgmma (the Hopper prefill plan,
// compile_model.h usesHopperPrefill; CodegenOptions::mmqb_wgmma).
bool sm90aTargetsOnly(const std::vector<std::string>& targets);

// Errors: an arch NVRTC cannot target (checkArch), a step the specializer rejects (kernel_spec.h),
// an NVRTC failure (its key, arch, options and log; the first failure in image order is reported).
llvm::Expected<KernelSet> generateKernels(const model::ModelDescription& desc,
                                          llvm::ArrayRef<planes::TensorLayout> layouts, const CodegenOptions& options);

}  // namespace minfer::codegen
