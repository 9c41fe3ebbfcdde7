// Kernel uses per plan step: which kernel (family, shape, strides, tile) each step launches, and how.
//
// A KernelLaunch is one kernel use of a step: its KernelSpec and its launch record.
// A KernelSpec is one NVRTC compilation unit before the target arch is chosen: a kernel source under
// kernels/, its compile-time constants (-D NAME=VALUE, from the step's shape and the stride tables of
// its weights) and extra NVRTC flags. Its key is a readable string of those compile-time parameters
// only (STYLE.md "Specialization and caching"), e.g. mmq_i8_q4k_n3584_k3584_tm128_tn64; runtime sizes
// (n_tokens, pos0, kv_len) never enter it. Image keys append the arch: …_sm90.
// The launch record (schema Launch) is the kernel's whole calling convention: the typed arguments in
// parameter order and the kernel's LaunchRule. Every Weight argument carries the stride table its
// constants were generated from, so the verifier can check it against the plane bound at load.
//
// The op families live in compiler/codegen/ops/, one file per family beside its kernels/<family>.cuh
// (the table of which family serves which op: kernel_spec.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compiler/model/model_desc.h"
#include "kernels/common.cuh"
#include "compiler/planes/layout_planner.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

namespace minfer::codegen {

struct KernelSpec {
  std::string key;     // readable specialization key (no arch)
  std::string source;  // embedded kernel file, e.g. "kernels/mmq.cuh"
  std::string entry;   // extern "C" entry point, e.g. "minfer_mmq"
  std::vector<std::pair<std::string, std::string>> defines;  // compile-time constants, in order
  std::vector<std::string> flags;                            // extra NVRTC flags, e.g. "--fmad=false"
  // Tests only: compile this text instead of `#include "<source>"` (the embedded headers stay available).
  std::string inline_source;

  // Everything that makes two specs compile differently (dedupe key): source, defines, flags, text.
  std::string identity() const;
  // Value of define `name`, or "" when absent.
  std::string define(const std::string& name) const;
};

// One kernel argument of a launch record (schema KernelArg; which fields a kind uses is documented there).
struct KernelArgDesc {
  fb::ArgKind kind = fb::ArgKind::Null;
  std::string name;  // the kernel's parameter name
  uint32_t buffer = 0;
  fb::Access access = fb::Access::Read;
  uint32_t width = 0;
  uint32_t tensor = 0;
  StrideTable plane;  // Weight: the table the spec's constants were generated from
  uint32_t layer = 0;
  uint64_t bytes = 0;
  int32_t value = 0;
  uint32_t view_offset = 0, view_width = 0;  // Activation (1.4): a column view; width stays the row pitch
};

struct KernelLaunch {
  KernelSpec spec;
  std::vector<KernelArgDesc> args;  // in the kernel's parameter order
  kern::LaunchRule rule;
  // Small-batch launches only (schema Step.small_launches, Launch.min_rows / max_rows, 1.10): the calls of
  // min_rows ≤ n_tokens ≤ max_rows run this launch; 0 = no bound on that side (1, the step's small_rows).
  uint32_t min_rows = 0, max_rows = 0;
};

// Which plan a step belongs to: prefill, decode, or the load plan (run once after the upload).
enum class PlanVariant { kPrefill, kDecode, kLoad };

// The steps of `variant` in `plan`.
const std::vector<model::StepDesc>& planSteps(const model::ExecutionPlan& plan, PlanVariant variant);
// "prefill", "decode" or "load".
const char* planName(PlanVariant variant);

// The kernel uses of one plan step, in launch order. `layouts[i]` is the TensorLayout of desc.weights[i].
// Errors (naming the step index, its name and the numbers): a weight without the planes its kernel
// reads, buffer widths inconsistent with the step's shape (e.g. a MatMul input narrower than cols),
// head counts that do not divide, head_dim > 256, an unknown op kind.
llvm::Expected<std::vector<KernelLaunch>> launchesForStep(const model::ModelDescription& desc,
                                                          llvm::ArrayRef<planes::TensorLayout> layouts,
                                                          PlanVariant variant, size_t step_index);

// The device argmax over rows of the logits buffer (n_vocab wide): one row per token of the launch.
KernelLaunch argmaxLaunch(const model::ExecutionPlan& plan, uint32_t n_vocab);
// The device top-k of the last row of the logits buffer (n_vocab wide) after the repetition penalty: its
// request and result in the session's TopK slot, per-block lists in Scratch, one Counters word.
KernelLaunch topkLaunch(const model::ExecutionPlan& plan, uint32_t n_vocab);

// Tile of the prefill MMQ for a weight of n rows and k cols (kernels/mmq.cuh, mmqTileSupported):
// 128 × 64 for n ≥ 1024, else 64 × 64.
std::pair<unsigned, unsigned> chooseMmqTile(uint64_t n, uint64_t k);

// Splits of the decode attention over the KV length (kernels/attention.cuh ATT_SPLITS): one block per
// (kv head, split), about 256 blocks in all so that every SM of a large GPU has work at long contexts
// (16..128 splits, a power of two: 64 for 4 kv heads, 32 for 8).
unsigned attnDecodeSplits(unsigned n_head_kv);

// Short readable tag of a ggml type for keys: Q4_K → "q4k", Q8_0 → "q80", BF16 → "bf16".
std::string typeTag(uint32_t ggml_type);
// A float as a C++ literal that round-trips exactly ("1e-05f", "10000.0f").
std::string floatLiteral(float v);

}  // namespace minfer::codegen
