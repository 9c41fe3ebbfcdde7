// Synthetic models for minfer-synth: named model shapes, llama.cpp's tensor-type mixes, and random but
// valid weights generated deterministically from a seed, streamed into a GgufWriter.
//
// Tensor names and shapes follow llama.cpp (ne[0] = in_features, the contiguous row):
//   token_embd.weight [n_embd, n_vocab]            output.weight [n_embd, n_vocab]
//   blk.N.attn_q.weight [n_embd, n_head*head_dim]  blk.N.attn_k/v.weight [n_embd, n_head_kv*head_dim]
//   blk.N.attn_output.weight [n_head*head_dim, n_embd]
//   blk.N.ffn_gate/up.weight [n_embd, n_ff]        blk.N.ffn_down.weight [n_ff, n_embd]
//   blk.N.attn_norm/ffn_norm.weight, output_norm.weight [n_embd]; qwen2: blk.N.attn_q/k/v.bias
//   phi3 (fused): blk.N.attn_qkv.weight [n_embd, (n_head + 2·n_head_kv)·head_dim] instead of attn_q/k/v,
//   blk.N.ffn_up.weight [n_embd, 2·n_ff] (gate rows, then up) and no ffn_gate
//   qwen3moe: blk.N.attn_q_norm/attn_k_norm.weight [head_dim]; instead of ffn_gate/up/down the router
//   blk.N.ffn_gate_inp.weight [n_embd, n_expert] (F32 in every mix, as llama-quantize leaves it) and the
//   experts blk.N.ffn_gate_exps/ffn_up_exps.weight [n_embd, n_ff_exp, n_expert],
//   blk.N.ffn_down_exps.weight [n_ff_exp, n_embd, n_expert]
//   gemma2/gemma3: blk.N.post_attention_norm/post_ffw_norm.weight [n_embd] (the sandwich norms) and no
//   output.weight (the output head is token_embd, which llama-quantize then types as the output); gemma3
//   also blk.N.attn_q_norm/attn_k_norm.weight [head_dim]
//
// Weight values: float matrices ~ N(0, 0.02) (Irwin–Hall sum of four uniforms); norm weights
// 1 + N(0, 0.02); biases N(0, 0.02). Quantized blocks hold random quant bits with finite, normal
// half-precision scales chosen so that dequantized weights have a standard deviation of about 0.02
// too (activations stay bounded: no NaN/inf in a forward pass). Every block is a pure function of
// (seed, tensor name, block index) through splitmix64, so the output does not depend on the thread
// count or the chunking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "kernels/block_formats.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace minfer::synth {

struct ModelShape {
  std::string name;          // e.g. "qwen2-7b"
  std::string arch;          // GGUF general.architecture: llama, qwen2, phi3, qwen3moe, gemma2, gemma3
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t n_ff = 0;
  uint32_t n_vocab = 0;
  uint32_t n_ctx = 0;        // <arch>.context_length
  float rope_freq_base = 10000.0f;  // 0: no <arch>.rope.freq_base key (gemma2's converter writes none)
  float rms_eps = 1e-5f;
  bool qkv_bias = false;     // qwen2: attn_q/k/v.bias
  bool fused = false;        // phi3: fused attn_qkv and gate|up ffn_up (see the tensor list above)
  uint32_t head_dim = 0;     // 0: n_embd / n_head; else <arch>.attention.key_length / value_length
  bool qk_norm = false;      // qwen3moe, gemma3: attn_q_norm / attn_k_norm
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;  // > 0: a mixture-of-experts FFN (qwen3moe)
  // gemma2 / gemma3. Keys are written only when set, as llama.cpp's convert_hf_to_gguf.py writes them for
  // the real models; absent ones get llama.cpp's defaults (fixtures README §8.1, §8.7).
  bool post_norms = false;       // blk.N.post_attention_norm / post_ffw_norm
  bool tied_output = false;      // no output.weight
  uint32_t sliding_window = 0;   // > 0: <arch>.attention.sliding_window (tokens)
  float attn_softcap = 0.0f;     // > 0: <arch>.attn_logit_softcapping
  float final_softcap = 0.0f;    // > 0: <arch>.final_logit_softcapping
  float rope_scale_linear = 0.0f;  // > 0: <arch>.rope.scaling.type "linear" and rope.scaling.factor
  uint32_t headDim() const { return head_dim ? head_dim : n_embd / n_head; }
};

// Named shapes: tiny-llama, tiny-qwen2, qwen2-7b, llama3-8b, phi3-mini (Phi-3-mini-4k: 3072 wide, 32
// layers, 32 heads of 96, n_ff 8192, vocab 32064), qwen3-30b-a3b, gemma2-9b (Gemma 2 9B), gemma3-12b
// (Gemma 3 12B's text model); the values and their sources are beside each in synth_model.cpp.
// Error lists the known names.
llvm::Expected<ModelShape> modelShape(llvm::StringRef name);
std::vector<std::string> modelNames();

// Type mixes, named as llama.cpp's ftypes. Matrices: f32/f16/q8_0/q6_k use that type everywhere;
// q4_0 uses Q4_0 except output.weight Q6_K; q4_k_m is llama.cpp's Q4_K_M (see q4kmMoreBits).
// Norms and biases are always F32. (Matches llama-quantize's output; ../shared/fixtures README.)
enum class TypeMix { kF32, kF16, kQ8_0, kQ4_0, kQ6_K, kQ4_K_M };
llvm::Expected<TypeMix> parseTypeMix(llvm::StringRef name);
const char* typeMixName(TypeMix mix);
// llama_ftype stored as general.file_type: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q8_0 7, Q4_K_M 15, Q6_K 18.
uint32_t fileType(TypeMix mix);

// llama.cpp's "use more bits" rule of Q4_K_M for attn_v and ffn_down (ffn_down_exps too) of layer i of n:
// i < n/8, or i >= 7n/8, or (i - n/8) % 3 == 2 (integer division). Those layers get Q6_K. phi3's fused
// attn_qkv follows attn_v's rule (llama-quantize treats it so).
bool q4kmMoreBits(uint32_t layer, uint32_t n_layer);

enum class TensorKind { kMatrix, kNorm, kBias };

struct TensorPlan {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;  // ggml order
  TensorKind kind;
};

// Every tensor of the model, in file order, with its type under `mix`. Errors: a matrix whose row
// length is not a multiple of its type's block size.
llvm::Expected<std::vector<TensorPlan>> planTensors(const ModelShape& shape, TypeMix mix);

// Fills `out` (whole blocks of `type`) with blocks first_block, first_block + 1, ... of the tensor
// whose generator seed is `tensor_seed`. `threads` > 1 splits the blocks over that many threads.
void fillBlocks(GgmlType type, TensorKind kind, uint64_t tensor_seed, uint64_t first_block,
                llvm::MutableArrayRef<uint8_t> out, unsigned threads);
// Seed of one tensor's generator: a hash of the model seed and the tensor name.
uint64_t tensorSeed(uint64_t seed, llvm::StringRef name);

struct SynthOptions {
  ModelShape shape;
  TypeMix mix = TypeMix::kF32;
  uint64_t seed = 1;
  const gguf::GgufFile* vocab = nullptr;  // copy its tokenizer.* keys when given
  unsigned threads = 1;
};

// Puts metadata and streamed tensors into `writer` (nothing is generated until it writes). With a
// vocabulary file, n_vocab becomes its token count; `notes` receives a line saying so.
// Errors: a vocabulary file without tokenizer.ggml.tokens, or a shape the mix cannot quantize.
llvm::Error buildSynthModel(const SynthOptions& options, gguf::GgufWriter& writer, std::vector<std::string>* notes);
// buildSynthModel into a writer, then the file written at `path` (GgufWriter::write: a temporary file renamed over
// it, `path` untouched on failure). Errors: those two's.
llvm::Error writeSynthModel(const SynthOptions& options, llvm::StringRef path, std::vector<std::string>* notes);

// The built-in SentencePiece-style ("llama") vocabulary of n_vocab >= 260 tokens: <unk>, <s>, </s>,
// the 256 byte tokens <0x00>..<0xFF>, then generated pieces ("▁a", "a", "▁b", ...).
std::vector<std::string> builtinVocab(uint32_t n_vocab);

}  // namespace minfer::synth
