// ModelDescription: what the compiler learns from a GGUF (hyperparameters, tokenizer, weights) and
// the lowering of its architecture into the flat execution plan of DESIGN.md §4.
//
// Supported architectures: the registry in architectures.h, one forward pass per arch/<name>.cpp
// (llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe). Architecture facts (q/k/v biases, q/k head norms) live in the
// plan's steps, not in ModelConfig. The math each plan step computes is documented in
// schema/artifact.fbs (OpKind) and, as formulas, in ../shared/fixtures/README.md §3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/planes/layout_planner.h"
#include "llvm/Support/Error.h"
#include "schema/artifact_generated.h"

namespace minfer::model {

struct ModelConfig {
  std::string architecture;
  std::string name;
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;
  uint32_t n_ff = 0;
  uint32_t n_vocab = 0;
  uint32_t n_ctx_train = 0;
  uint32_t n_rot = 0;
  fb::RopeStyle rope_style = fb::RopeStyle::Norm;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor (linear scaling)
  fb::RopeScaling rope_scaling = fb::RopeScaling::None;
  // ggml_rope_ext's YaRN parameters as llama.cpp derives them (model_desc.cpp readRopeScaling; schema Step).
  float rope_ext_factor = 0.0f, rope_attn_factor = 1.0f, rope_beta_fast = 32.0f, rope_beta_slow = 1.0f;
  uint32_t rope_n_ctx_orig = 0;
  float rms_norm_eps = 1e-5f;
  bool tied_embeddings = false;
  // The context the artifact is compiled for (describeModel's n_ctx; 0: any): schema
  // ModelConfig.n_ctx_max, the largest session context. LongRoPE chooses its factors from it.
  uint32_t n_ctx_max = 0;
  // Mixture of experts (llama.cpp's llama_model::load_hparams names and defaults): <arch>.expert_count,
  // expert_used_count (0: a dense model), expert_feed_forward_length (0: n_ff / n_expert_used, as
  // llama.cpp's load_tensors derives the expert width).
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
};

struct WeightDesc {
  std::string name;          // GGUF tensor name
  planes::TensorRole role;   // decides which planes the layout planner makes
  const gguf::TensorInfo* info;
  uint32_t experts = 1;      // expert axis of a 3-D expert tensor (GGUF ne[2]); 1: none (layout_planner.h)
};

struct BufferDesc {
  std::string name;
  uint32_t width;            // elements per token row
  fb::BufferType type;
};

// A column range of a buffer (schema ColumnView, format 1.4): row t of the operand is elements
// [offset, offset + width) of row t of the buffer.
struct ColumnView {
  uint32_t offset = 0, width = 0;
};

struct StepDesc {
  fb::OpKind op;
  std::vector<uint32_t> inputs, outputs, weights;  // buffer ids, buffer ids, WeightDesc indices
  int32_t layer = -1;
  float eps = 0;
  uint32_t n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  fb::RopeStyle rope_style = fb::RopeStyle::Norm;
  float rope_freq_base = 10000.0f, rope_freq_scale = 1.0f;
  float rope_ext_factor = 0.0f, rope_attn_factor = 1.0f, rope_beta_fast = 32.0f, rope_beta_slow = 1.0f;  // YaRN
  uint32_t rope_n_ctx_orig = 0;
  uint32_t rows = 0, cols = 0;
  std::string name;
  // Scale: factor and cap; Attention: query scale (0: 1/sqrt(head_dim)), logit cap (0: none) and
  // sliding window in positions (0: none). Schema Step.scale / softcap / window (1.3).
  float scale = 0, softcap = 0;
  uint32_t window = 0;
  // Attention with a window: the single-sequence KV cache of the layer as a ring of kv_ring positions
  // (schema Step.kv_ring, 1.6; ringLocalKvCaches); 0: n_ctx positions.
  uint32_t kv_ring = 0;
  // Column views of the operands (format 1.4; only ops with takesColumnViews): empty = whole buffers,
  // else one per inputs / outputs entry (a whole buffer as (0, its width)).
  std::vector<ColumnView> input_views, output_views;
  // MoeRoute / MoeFfn: experts of the layer, experts chosen per token, and (MoeRoute) whether the chosen
  // probabilities are renormalised to sum 1. Schema Step.n_expert / n_expert_used / moe_norm (1.4).
  uint32_t n_expert = 0, n_expert_used = 0;
  bool moe_norm = false;
};

struct ExecutionPlan {
  std::vector<BufferDesc> buffers;
  std::vector<StepDesc> prefill;
  std::vector<StepDesc> decode;
  std::vector<StepDesc> load;  // run once after the upload: ExpandBlocks per tensor with derived planes
  uint32_t input_ids = 0;
  uint32_t logits = 0;
  uint32_t max_batch = 0;
  uint64_t kv_bytes_per_token = 0;  // f16 K and V, all layers
  // Of which the layers with a ring KV cache (StepDesc::kv_ring), and Σ kv_ring × their bytes per position
  // (schema MemoryPlan, 1.8; set by ringLocalKvCaches).
  uint64_t kv_ring_bytes_per_token = 0, kv_ring_bytes = 0;
};

// Tokenizer metadata copied from the GGUF's tokenizer.* keys.
struct TokenizerDesc {
  bool present = false;
  fb::TokenizerModel model = fb::TokenizerModel::Spm;
  std::string model_name, pre, chat_template;
  std::vector<std::string_view> tokens, merges;
  std::vector<float> scores;
  std::vector<int32_t> token_types;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  int32_t eot_id = -1, eom_id = -1;  // tokenizer.ggml.eot_token_id / eom_token_id; -1 = none
  bool add_bos = false, add_eos = false, add_space_prefix = true;
};

struct ModelDescription {
  ModelConfig config;
  TokenizerDesc tokenizer;
  std::vector<WeightDesc> weights;
  ExecutionPlan plan;
};

// Reads hyperparameters and tokenizer, checks every expected tensor's presence, shape and type, and
// lowers the architecture into prefill and decode plans for batches of up to `max_batch` tokens.
// `n_ctx` is the context the artifact is compiled for (minfer-compile -c): 0 = the model's
// context_length for choices that depend on it (LongRoPE's factor set) and no limit otherwise; else
// the largest session context (config.n_ctx_max).
// Errors name the file, the key or tensor, and the numbers (expected vs found); unsupported
// architectures and tensor types list what is supported; max_batch must be in 1..kArtifactMaxBatch.
llvm::Expected<ModelDescription> describeModel(const gguf::GgufFile& file, uint32_t max_batch, uint32_t n_ctx = 0);

// Bounds the KV cache of every sliding-window Attention step (window > 0) of both plans: kv_ring = window +
// plan.max_batch − 1, the positions one step of up to max_batch tokens reads (llama.cpp's SWA cache keeps
// n_swa + n_ubatch cells likewise). A ring at least as large as the context is never used as one; rings past
// 2^30 positions are not made. Without this pass (minfer-compile --swa-full) every layer holds n_ctx positions.
void ringLocalKvCaches(ExecutionPlan& plan);

// The registry's names, comma-separated: "llama, qwen2, qwen3, gemma2, gemma3, phi3".
const char* supportedArchitectures();

}  // namespace minfer::model
