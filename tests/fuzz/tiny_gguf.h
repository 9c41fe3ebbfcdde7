// Test helper: small writer-made llama / qwen2 GGUF models (valid, random weights) for the fuzz seed
// corpus and the fault tests, small enough to compile in well under a second.
//
// The model follows what compiler/model expects (model_desc.cpp): general.architecture, the
// <arch>.* hyperparameters (attention.key_length when head_dim ≠ n_embd / n_head), a SentencePiece
// vocabulary (<unk> <s> </s>, optionally the 256 byte tokens, then a few words), token_embd, per
// layer attn_norm, attn_q/k/v(+bias for qwen2)/output, ffn_norm, ffn_gate/up/down, output_norm,
// output. Weights come from makeRandomWeight (tests/runtime/weight_builder.h): valid blocks with
// finite scales.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/gguf/gguf_writer.h"
#include "kernels/block_formats.h"

namespace minfer::test {

struct TinyGgufSpec {
  std::string arch = "llama";  // "llama" or "qwen2" (adds attn_q/k/v biases)
  uint32_t n_embd = 32, n_layer = 1, n_head = 2, n_head_kv = 1, n_ff = 64;
  uint32_t head_dim = 0;       // 0: n_embd / n_head (no attention.key_length key)
  uint32_t n_ctx_train = 64;
  bool byte_tokens = true;     // the 256 "<0xXX>" tokens (n_vocab 3 + 256 + words)
  bool tied = false;           // no output.weight: the output projection reuses token_embd
  // Types: token_embd, attention q/k/v/output, ffn gate/up, ffn down, output. Column counts: n_embd
  // for all but ffn_down (n_ff); K-quants need 256 columns.
  GgmlType embd = GgmlType::Q8_0, attn = GgmlType::Q8_0, ffn = GgmlType::F16, down = GgmlType::Q4_0,
           output = GgmlType::Q8_0;
  uint64_t seed = 1;
};

// The model as a GgufWriter (callers may add or change keys before writing).
gguf::GgufWriter makeTinyGguf(const TinyGgufSpec& spec);

}  // namespace minfer::test
