// Kernel specializations: which kernel (family, shape, strides, tile) each plan step needs.
//
// A KernelSpec is one NVRTC compilation unit before the target arch is chosen: a kernel source under
// kernels/, its compile-time constants (-D NAME=VALUE, from the step's shape and the stride tables of
// its weights) and extra NVRTC flags. Its key is a readable string of those compile-time parameters
// only (STYLE.md "Specialization and caching"), e.g. mmq_i8_q4k_n3584_k3584_tm128_tn64; runtime sizes
// (n_tokens, pos0, kv_len) never enter it. Image keys append the arch: …_sm90.
//
// Which kernels serve which op (the runtime dispatches on the entry names; kernels/*.cuh document
// each launch ABI):
//   Embed        embed                             HeadRmsNorm  head_rms_norm
//   RmsNorm      rms_norm                          QuantizeAct  quantize_act
//   MatMul       quantized weights: prefill mmq (kI8), decode gemv (kPacked 4-bit, else kI8);
//                float weights: prefill dense_mm, decode dense_gemv
//   Rope         rope                              SwiGlu/Add   swiglu / add
//   Attention    prefill: kv_store, attn_prefill;  decode: kv_store, attn_decode, attn_combine
//   (not a step) argmax over the logits buffer, found by its entry name minfer_argmax.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compiler/model/model_desc.h"
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

enum class PlanVariant { kPrefill, kDecode };

// The specs of one plan step, in launch order. `layouts[i]` is the TensorLayout of desc.weights[i].
// Errors (naming the step index, its name and the numbers): a weight without the planes its kernel
// reads, buffer widths inconsistent with the step's shape (e.g. a MatMul input narrower than cols),
// head counts that do not divide, head_dim > 256, an unknown op kind.
llvm::Expected<std::vector<KernelSpec>> specsForStep(const model::ModelDescription& desc,
                                                     llvm::ArrayRef<planes::TensorLayout> layouts,
                                                     PlanVariant variant, size_t step_index);

// The device argmax over rows of the logits buffer (n_vocab wide).
KernelSpec argmaxSpec(uint32_t n_vocab);

// Tile of the prefill MMQ for a weight of n rows and k cols (kernels/mmq.cuh, mmqTileSupported):
// 128 × 64 for n ≥ 1024, else 64 × 64.
std::pair<unsigned, unsigned> chooseMmqTile(uint64_t n, uint64_t k);

// Splits of the decode attention over the KV length (kernels/attention.cuh ATT_SPLITS).
constexpr unsigned kAttnDecodeSplits = 32;

// Short readable tag of a ggml type for keys: Q4_K → "q4k", Q8_0 → "q80", BF16 → "bf16".
std::string typeTag(uint32_t ggml_type);
// A float as a C++ literal that round-trips exactly ("1e-05f", "10000.0f").
std::string floatLiteral(float v);

}  // namespace minfer::codegen
