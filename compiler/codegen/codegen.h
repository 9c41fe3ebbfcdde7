// Kernel codegen: the kernel images an execution plan needs, compiled with NVRTC for each target arch.
//
// For every step of the prefill and decode plans, specsForStep() names the kernel specializations
// (kernel_spec.h); identical specs (layers share shapes) are compiled once per arch; each
// (spec, arch) is looked up in the on-disk cache (kernel_cache.h) or compiled, in parallel on `jobs`
// threads. The result is deterministic whatever the thread count or cache state: images are ordered by
// first use (prefill steps, then decode steps, then argmax), archs in the requested order.
//
// Step lists (Step.kernels_prefill / kernels_decode in the artifact): for each kernel the step launches,
// in launch order, the image index of every target arch, arch-major within the kernel:
//   [k0@arch0, k0@arch1, …, k1@arch0, k1@arch1, …]
// so a runtime keeps the entries whose image has its chosen arch and gets the kernels in launch order.
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
  size_t kernel_uses = 0;    // kernels launched by all steps of both plans (+ argmax)
  size_t unique_specs = 0;   // after dedupe
  size_t images = 0;         // unique_specs × targets
  size_t cache_hits = 0;
  size_t compiled = 0;       // NVRTC compilations run
  unsigned cache_write_failures = 0;
  double seconds = 0;
};

struct KernelSet {
  std::vector<KernelImageData> images;
  std::vector<std::vector<uint32_t>> prefill;  // per prefill step: image indices (see above)
  std::vector<std::vector<uint32_t>> decode;   // per decode step
  CodegenStats stats;
};

// Errors: an arch NVRTC cannot target (checkArch), a step the specializer rejects (kernel_spec.h),
// an NVRTC failure (its key, arch, options and log; the first failure in image order is reported).
llvm::Expected<KernelSet> generateKernels(const model::ModelDescription& desc,
                                          llvm::ArrayRef<planes::TensorLayout> layouts, const CodegenOptions& options);

}  // namespace minfer::codegen
