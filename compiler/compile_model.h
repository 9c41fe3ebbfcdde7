// compileModel: the whole GGUF → .mfb pipeline behind minfer-compile (DESIGN.md §1).
//
// read + validate GGUF → describe the model (config, tokenizer, plan) → plan each weight's planes →
// reserve segments → lay out the file → transform tensors one at a time (row-parallel) and stream
// their planes into the artifact → write the manifest and rename. Deterministic: the same GGUF and
// options give a byte-identical artifact whatever `jobs` is. Peak memory beyond the GGUF mapping is
// about one tensor's planes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compiler/planes/layout_planner.h"
#include "llvm/Support/Error.h"

namespace minfer {

struct CompileOptions {
  std::string input;                 // GGUF path
  std::string output;                // .mfb path (written to a temp file beside it, then renamed)
  uint32_t max_batch = 512;          // activation buffers are sized for this many tokens per step
  // The context the artifact is compiled for (minfer-compile -c): 0 = the model's context_length where a
  // choice depends on it (LongRoPE's long/short factors, model_desc.h) and no session limit; else the
  // largest session context (schema ModelConfig.n_ctx_max), ≤ 2^20.
  uint32_t n_ctx = 0;
  unsigned jobs = 0;                 // transform threads; 0 = all cores
  std::vector<std::string> targets;  // GPU archs for kernel images, e.g. {"sm_90"}; stored in the artifact
                                     // (empty: no kernel images, a CPU-only artifact). When every target is
                                     // sm_90a, quantized matmul weights get a kF16 plane at load and prefill
                                     // uses the Hopper wgmma matmul (usesHopperPrefill); else int8 mma.sync.
  std::string kernel_cache_dir;      // NVRTC image cache: "" = default (codegen/kernel_cache.h), "off" = none
  // Compact (default): quantized matmul weights store only their GGUF blocks, the other planes are
  // derived at load; expanded: every plane stored (compiler/planes/layout_planner.h).
  planes::PlaneForm plane_form = planes::PlaneForm::kCompact;
  // Launch fusion (codegen::CodegenOptions::fuse_launches, schema Step.fused); false: one launch set per step.
  bool fuse_launches = true;
  bool fuse_qkv = true;    // codegen::CodegenOptions::fuse_qkv (with fuse_launches)
  bool fuse_glu = false;   // codegen::CodegenOptions::fuse_glu (with fuse_launches)
  bool fuse_pair = true;   // codegen::CodegenOptions::fuse_pair (with fuse_launches)
  bool fuse_norm = true;   // codegen::CodegenOptions::fuse_norm (with fuse_launches)
  bool fuse_prefill_pair = true;   // codegen::CodegenOptions::fuse_prefill_pair (with fuse_launches)
  bool mmqb_wgmma = true;          // codegen::CodegenOptions::mmqb_wgmma
  bool mmqb_f16act = true;         // codegen::CodegenOptions::mmqb_f16act
  bool wgmma_split = true;         // codegen::CodegenOptions::wgmma_split
  bool wgmma_split_fused = false;  // codegen::CodegenOptions::wgmma_split_fused
  unsigned wgmma_split_min_stages = 0;  // codegen::CodegenOptions::wgmma_split_min_stages
  // Sliding-window layers keep n_ctx KV positions like the others (llama.cpp's --swa-full) instead of a ring
  // of window + max_batch − 1 (model::ringLocalKvCaches, schema Step.kv_ring).
  bool swa_full = false;
  // Called after each tensor: (tensors done, tensors total, source bytes done, source bytes total).
  std::function<void(size_t, size_t, uint64_t, uint64_t)> progress;
};

// True when every target is sm_90a (and there is one): the plan's prefill matmuls may use wgmma, whose
// images exist only for that arch.
bool usesHopperPrefill(const std::vector<std::string>& targets);

struct CompileSummary {
  size_t tensors = 0;
  size_t planes = 0;
  uint64_t source_bytes = 0;    // GGUF tensor data read
  uint64_t plane_bytes = 0;     // bytes of all planes written (the stored ones)
  uint64_t derived_bytes = 0;   // bytes of the derived planes the runtime materializes at load
  uint64_t artifact_bytes = 0;  // final file size
  size_t steps = 0;             // prefill plan steps
  size_t kernel_images = 0;     // kernel images (specializations × targets)
  size_t kernel_specs = 0;      // distinct specializations
  size_t kernel_cache_hits = 0; // images taken from the disk cache instead of NVRTC
  uint64_t kernel_bytes = 0;    // cubin + PTX bytes
  double kernel_seconds = 0;    // wall time of kernel codegen
};

// Errors: every GGUF validation error (gguf_reader.h), unsupported architecture or tensor type
// (model_desc.h), layout errors (layout_planner.h), kernel codegen errors (codegen/codegen.h: arch,
// NVRTC log with the image key), I/O errors of the artifact writer. On any error
// no file is left at `options.output` (a previous file there is untouched).
llvm::Expected<CompileSummary> compileModel(const CompileOptions& options);

}  // namespace minfer
