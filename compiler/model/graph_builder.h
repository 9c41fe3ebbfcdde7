// GraphBuilder: the shared blocks (embedding, RMSNorm, matmul, QKV, RoPE, attention, gated FFN,
// output head) that each architecture's forward pass in arch/<name>.cpp is written with, appending
// steps to the ModelDescription's plan (DESIGN.md §4; llama.cpp's llm_graph_context plays this role).
//
// Every block registers the GGUF tensors it reads through weight(), which checks presence, shape and
// type against the hyperparameters; finish() then refuses a GGUF with a tensor no block used. Tensor
// names are llama.cpp's: token_embd, blk.N.attn_norm, blk.N.attn_q/k/v(.bias), blk.N.attn_q_norm, ...
// Buffers hold one row per token; widths below are per row, f32 unless noted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/model/model_desc.h"

namespace minfer::model {

// A step operand: a whole buffer, or (format 1.4) a column range of one (schema ColumnView).
struct Operand {
  uint32_t buffer = 0;
  uint32_t offset = 0, width = 0;  // width 0: the whole buffer
};

// How embedding() lays out the q/k/v and FFN buffers.
struct ActivationOptions {
  // One (tokens, n_head·head_dim + 2·n_head_kv·head_dim) buffer `qkv` for the fused attn_qkv projection;
  // q, k and v are its column ranges (phi3). Otherwise three buffers.
  bool fused_qkv = false;
  // One (tokens, 2·n_ff) buffer `gate_up` for the fused ffn_up projection (gate columns, then up); no
  // separate up buffer (phi3).
  bool fused_gate_up = false;
};

// The activation buffers of a llama-like forward pass (ids into plan.buffers), made by embedding().
struct Activations {
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t ids = 0;           // (tokens), i32 token ids
  uint32_t x = 0, h = 0;      // (tokens, n_embd): the residual stream; a block's normed input or output
  Operand q;                  // (tokens, n_head * head_dim)
  Operand k, v;               // (tokens, n_head_kv * head_dim)
  uint32_t qkv = kNone;       // fused_qkv: (tokens, q | k | v), the buffer q, k and v are views of
  uint32_t attn = 0;          // (tokens, n_head * head_dim): attention output before attn_output
  uint32_t gate = 0;          // (tokens, n_ff): FFN gate projection; the GLU's output (ffn_down's input)
  uint32_t up = kNone;        // (tokens, n_ff): FFN up projection (kNone with fused_gate_up)
  uint32_t gate_up = kNone;   // fused_gate_up: (tokens, gate | up), 2·n_ff wide
  uint32_t logits = 0;        // (tokens, n_vocab)
  // Made by the first moeFfn (UINT32_MAX before):
  uint32_t router = UINT32_MAX;       // (tokens, n_expert): router logits
  uint32_t expert_ids = UINT32_MAX;   // (tokens, n_expert_used), i32: the chosen experts, by falling p
  uint32_t expert_w = UINT32_MAX;     // (tokens, n_expert_used): their weights
  uint32_t moe_out = UINT32_MAX;      // (tokens, n_embd): the MoE FFN's output
};

// Options of the q/k/v projection block: the architecture facts that change it.
struct QkvOptions {
  bool bias = false;       // blk.N.attn_q/k/v.bias [width], added to each projection (qwen2)
  bool head_norm = false;  // blk.N.attn_q_norm/attn_k_norm.weight [head_dim]: per-head RMSNorm (qwen3)
};

// Options of the RoPE block.
struct RopeOptions {
  // rope_freqs.weight [n_rot/2], f32, optional: per-pair frequency factors ff_i dividing θ_i (Llama
  // 3.1+ scaling as llama.cpp's converter writes it), shared by q and k of every layer.
  bool freq_factors = false;
  // This layer's freq base and freq scale instead of the config's (gemma3's local layers); 0: the config's.
  float freq_base = 0, freq_scale = 0;
  // LongRoPE (phi3): the per-pair factors of longRopeFactors() (rope_factors_long or _short.weight).
  bool long_rope = false;
};

// Options of the attention block (gemma2): schema Step.scale / softcap / window of the Attention step.
struct AttentionOptions {
  float scale = 0;      // query scale; 0: 1/sqrt(head_dim)
  float softcap = 0;    // scores s → softcap·tanh(s / softcap) before the mask and softmax; 0: none
  uint32_t window = 0;  // sliding window: key at pk visible from pq iff pq − pk < window; 0: none
};

// The activation of the gated FFN: SwiGLU (llama) or GELU-tanh (GeGLU, gemma).
enum class FfnActivation { kSilu, kGeluTanh };

// Options of one decoder layer (decoderLayer): its blocks' options and the gemma sandwich norms.
struct LayerOptions {
  QkvOptions qkv;
  RopeOptions rope;
  AttentionOptions attention;
  bool post_norms = false;  // post_attention_norm and post_ffw_norm on the branch outputs (gemma)
  FfnActivation activation = FfnActivation::kSilu;
  bool moe = false;               // the FFN is moeFfn (qwen3moe) instead of gatedFfn
  bool moe_norm_weights = true;   // moeFfn: renormalise the chosen experts' weights (build_moe_ffn's norm_w)
};

class GraphBuilder {
 public:
  // `desc.config` must be read already (hyperparameters, rope style); blocks append to desc.plan and
  // desc.weights. `file` must outlive `desc` (WeightDesc points into it).
  GraphBuilder(const gguf::GgufFile& file, ModelDescription& desc) : file_(file), desc_(desc) {}

  const ModelConfig& config() const { return desc_.config; }
  // The GGUF, for an architecture's own keys (the forward pass reads them as llama.cpp does).
  const gguf::GgufFile& file() const { return file_; }
  const Activations& act() const { return act_; }
  // Prefix of layer `layer`'s tensor and step names: "blk.<layer>.".
  static std::string layerPrefix(uint32_t layer);

  // Registers a GGUF tensor after checking its presence, shape (ne, ggml order; missing trailing dims
  // are 1) and type (supported; F32 for kVector). Returns its index into desc.weights, or UINT32_MAX
  // for an absent optional tensor. Errors name the file, the tensor, and the shapes or types.
  llvm::Expected<uint32_t> weight(const std::string& name, planes::TensorRole role, std::vector<uint64_t> ne,
                                  bool optional = false, bool* found = nullptr);
  // Appends a buffer of `width` elements per token row. Returns its id.
  uint32_t buffer(const char* name, uint32_t width, fb::BufferType type = fb::BufferType::F32);

  // token_embd.weight [n_embd, n_vocab]: sets n_vocab (≤ 2^24, equal to the tokenizer's size) and
  // tied_embeddings (no output.weight), makes the Activations buffers (laid out by `options`), and
  // appends the Embed step ids → x. Call first.
  llvm::Error embedding(ActivationOptions options = {});
  // RMSNorm of each row: out = in / sqrt(mean(in²) + eps) * <name>.weight [n_embd]. Step `name`.
  llvm::Error norm(const std::string& name, uint32_t in, uint32_t out);
  // out = <base>.weight · in (+ <base>.bias [rows]); <base>.weight is [cols, rows]. Step `base`.
  llvm::Error matmul(const std::string& base, uint32_t in, uint32_t out, uint32_t rows, uint32_t cols,
                     bool bias = false);
  // q, k, v = attn_q/k/v · in (+ biases), then, with head_norm, HeadRmsNorm of q and k in place. With
  // fused_qkv activations: one MatMul qkv = attn_qkv · in, attn_qkv.weight [n_embd, q + 2·kv] (rows q,
  // then k, then v: llama.cpp's create_tensor_qkv / build_qkv views); q, k and v are read as column
  // views of its output, never copied (no biases or head norms in this form).
  llvm::Error qkvProjection(uint32_t layer, uint32_t in, QkvOptions options);
  // RoPE of q and k in place: config's rope style, n_rot, freq base and scale (or options'), and with
  // options.freq_factors the rope_freqs.weight tensor when the GGUF has one (registered once; its
  // values must be finite and > 0). Errors: its shape, type or values.
  llvm::Error rope(uint32_t layer, RopeOptions options = {});
  // Causal GQA attention of q over the layer's KV cache (k, v appended) into attn, then
  // out = attn_output · attn.
  llvm::Error attention(uint32_t layer, uint32_t out, AttentionOptions options = {});
  // out = in·scale, then with softcap > 0 out = softcap·tanh(out / softcap) (out may equal in). Step `name`.
  void scale(const std::string& name, uint32_t in, uint32_t out, float scale, float softcap = 0);
  // acc += in. Step `name`.
  void residualAdd(const std::string& name, uint32_t acc, uint32_t in);
  // out = ffn_down · (act(ffn_gate · in) ⊙ (ffn_up · in)), act = silu (SwiGlu step) or GELU-tanh (GeGlu).
  // With fused_gate_up activations: gate_up = ffn_up · in, ffn_up.weight [n_embd, 2·n_ff] (rows gate,
  // then up: llama.cpp's LLM_FFN_SWIGLU on one tensor, ggml_swiglu's halves), and the GLU step reads its
  // two column views; no ffn_gate tensor.
  llvm::Error gatedFfn(uint32_t layer, uint32_t in, uint32_t out, FfnActivation act = FfnActivation::kSilu);
  // Mixture-of-experts FFN (llama.cpp's build_moe_ffn with softmax gating and SiLU): router logits
  // r = ffn_gate_inp · in [n_embd, n_expert] (MatMul), then MoeRoute (p = softmax(r), the
  // n_expert_used largest p, renormalised to sum 1 when `norm_weights`), then MoeFfn: out_t =
  // Σ_j w_j · ffn_down_exps_e(silu(ffn_gate_exps_e · in_t) ⊙ ffn_up_exps_e · in_t), e = ids_j, with
  // ffn_{gate,up}_exps [n_embd, n_ff_exp, n_expert], ffn_down_exps [n_ff_exp, n_embd, n_expert] planned
  // with an expert axis. n_ff_exp = config n_ff_exp, or n_ff / n_expert_used when 0. Output: act().moe_out.
  // Errors: no experts in the config; the tensors' shapes or types.
  llvm::Error moeFfn(uint32_t layer, uint32_t in, bool norm_weights);
  // One decoder layer on the residual stream x: x += attention(RoPE(qkv(RMSNorm(x)))) then
  // x += gatedFfn(RMSNorm(x)) (attn_norm, ffn_norm), the block llama, qwen2 and qwen3 share; with
  // options.post_norms each branch's output is RMS-normed before it is added (post_attention_norm,
  // post_ffw_norm: gemma2, gemma3); with options.moe the FFN is moeFfn (qwen3moe), its weights
  // renormalised per options.moe_norm_weights.
  llvm::Error decoderLayer(uint32_t layer, const LayerOptions& options);
  // h = RMSNorm(in; output_norm), logits = output · h; output tied to token_embd when output.weight is
  // absent (the Embed step's weight, planned for both uses).
  llvm::Error outputHead(uint32_t in);
  // Refuses a GGUF with a tensor no block registered (an architecture variant minfer does not know);
  // copies the prefill plan to decode.
  llvm::Error finish();
  // An error "<file>: <message>" for an architecture's own checks.
  llvm::Error error(const llvm::Twine& message) const;

  // LongRoPE (Phi-3/3.5 128k): the frequency factors llama.cpp's llama_model::get_rope_factors picks,
  // registered once: rope_factors_long.weight when the compiled context C (config.n_ctx_max, or
  // context_length when 0) exceeds n_ctx_orig_yarn (rope.scaling.original_context_length when the key
  // exists, else context_length), else rope_factors_short.weight. Each is optional, [n_rot/2] F32 with
  // finite values > 0; both are checked, the other set is left out of the artifact. With the short set
  // chosen, config.n_ctx_max becomes at most n_ctx_orig_yarn (a longer session would be llama.cpp's long
  // set). Returns the chosen tensor's index, or UINT32_MAX when it is absent. The cos/sin scale is
  // rope.scaling.attn_factor (config.rope_attn_factor), applied whichever set is chosen.
  llvm::Expected<uint32_t> longRopeFactors();

 private:
  // rope_freqs.weight's index into desc.weights (UINT32_MAX when absent), registered on first use.
  llvm::Expected<uint32_t> ropeFreqs();
  // weight()'s checks without registering: the tensor (nullptr for an absent optional one).
  llvm::Expected<const gguf::TensorInfo*> checkTensor(const std::string& name, planes::TensorRole role,
                                                      const std::vector<uint64_t>& ne, bool optional);
  // A frequency-factor tensor's values must be finite and > 0 (θ_i is divided by them).
  llvm::Error checkFactors(const gguf::TensorInfo& t) const;
  // Appends a step with operands; views are written only when some operand is a column range.
  void push(StepDesc step, std::initializer_list<Operand> inputs, std::initializer_list<Operand> outputs);

  const gguf::GgufFile& file_;
  ModelDescription& desc_;
  Activations act_;
  uint32_t embd_weight_ = 0;  // token_embd's index into desc.weights (the tied output reuses it)
  // rope_freqs' index into desc.weights once looked up: UINT32_MAX when absent; kNotLooked before.
  static constexpr uint64_t kNotLooked = UINT64_MAX;
  uint64_t rope_freqs_ = kNotLooked;
  uint64_t long_rope_ = kNotLooked;  // longRopeFactors()'s answer once looked up
  std::vector<const gguf::TensorInfo*> left_out_;  // read and checked, deliberately not in the artifact
};

}  // namespace minfer::model
