// Architecture mapping: GGUF metadata → ModelConfig and TokenizerDesc, then the registered
// architecture's forward pass (architectures.h) → the prefill/decode plans.
#include "compiler/model/model_desc.h"

#include <cmath>
#include <map>

#include "compiler/model/architectures.h"
#include "compiler/model/graph_builder.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "minfer/artifact.h"
#include "minfer/tokenizer.h"

namespace minfer::model {
namespace {

constexpr uint32_t kMaxReasonableDim = 1u << 20;     // per-dimension sanity bound (embedding, FFN, heads)
constexpr uint32_t kMaxReasonableLayers = 4096;

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

// general.architecture (which must be registered) and general.name.
llvm::Expected<const Architecture*> readArchitecture(const gguf::GgufFile& file, ModelConfig& c) {
  auto name = file.getString("general.architecture");
  if (!name) return name.takeError();
  c.architecture = std::string(*name);
  const Architecture* arch = findArchitecture(c.architecture);
  if (!arch)
    return makeError(llvm::formatv("{0}: unsupported architecture '{1}' (general.architecture); supported: {2}",
                                   file.fileName(), c.architecture, supportedArchitectures()));
  if (auto model_name = file.getString("general.name")) c.name = std::string(*model_name);
  else llvm::consumeError(model_name.takeError());
  return arch;
}

// <arch>.embedding_length, block_count, feed_forward_length, attention.head_count(_kv),
// context_length, attention.key_length: sizes, bounded before anything is sized from them.
llvm::Error readSizes(const gguf::GgufFile& file, ModelConfig& c) {
  const std::string p = c.architecture + ".";
  auto get = [&](const char* key, uint32_t* out) -> llvm::Error {
    auto v = file.getU32(p + key);
    if (!v) return v.takeError();
    *out = *v;
    return llvm::Error::success();
  };
  if (auto e = get("embedding_length", &c.n_embd)) return e;
  if (auto e = get("block_count", &c.n_layer)) return e;
  if (auto e = get("feed_forward_length", &c.n_ff)) return e;
  if (auto e = get("attention.head_count", &c.n_head)) return e;
  auto n_head_kv = file.getU32Or(p + "attention.head_count_kv", c.n_head);
  if (!n_head_kv) return n_head_kv.takeError();
  c.n_head_kv = *n_head_kv;
  auto ctx = file.getU32Or(p + "context_length", 2048);
  if (!ctx) return ctx.takeError();
  c.n_ctx_train = *ctx;
  if (c.n_embd == 0 || c.n_embd > kMaxReasonableDim || c.n_head == 0 || c.n_head > c.n_embd ||
      c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0 || c.n_layer == 0 || c.n_layer > kMaxReasonableLayers ||
      c.n_ff == 0 || c.n_ff > kMaxReasonableDim)
    return makeError(llvm::formatv("{0}: inconsistent hyperparameters: {1}embedding_length = {2}, block_count = "
                                   "{3}, feed_forward_length = {4}, attention.head_count = {5}, "
                                   "attention.head_count_kv = {6} (need non-zero sizes, head_count ≤ "
                                   "embedding_length, head_count a multiple of head_count_kv)",
                                   file.fileName(), p, c.n_embd, c.n_layer, c.n_ff, c.n_head, c.n_head_kv));
  // Mixture of experts: optional everywhere, 0 = dense (llama.cpp reads them for every architecture).
  for (auto [key, out] : {std::pair{"expert_count", &c.n_expert}, std::pair{"expert_used_count", &c.n_expert_used},
                          std::pair{"expert_feed_forward_length", &c.n_ff_exp}}) {
    auto v = file.getU32Or(p + key, 0);
    if (!v) return v.takeError();
    *out = *v;
  }
  if (c.n_expert > 4096 || c.n_expert_used > c.n_expert || (c.n_expert > 0 && c.n_expert_used == 0) ||
      c.n_ff_exp > kMaxReasonableDim)
    return makeError(llvm::formatv("{0}: inconsistent experts: {1}expert_count = {2}, expert_used_count = {3}, "
                                   "expert_feed_forward_length = {4} (need expert_count ≤ 4096, 1 ≤ "
                                   "expert_used_count ≤ expert_count when there are experts, width ≤ 2^20)",
                                   file.fileName(), p, c.n_expert, c.n_expert_used, c.n_ff_exp));
  auto key_length = file.getU32Or(p + "attention.key_length", c.n_embd / c.n_head);
  if (!key_length) return key_length.takeError();
  c.head_dim = *key_length;
  if (c.head_dim == 0 || c.head_dim % 2 != 0 || c.head_dim > 1024)
    return makeError(llvm::formatv("{0}: head dimension {1} must be even and in 2..1024", file.fileName(),
                                   c.head_dim));
  return llvm::Error::success();
}

// <arch>.rope.scaling.*, read as llama.cpp's llama_model::load_hparams reads them and llama_context
// derives ggml_rope_ext's parameters: the type defaults to "linear"; the factor is rope.scaling.factor,
// else the legacy rope.scale_linear, else 0; freq_scale = 1 / factor, and a factor of 0 means no
// scaling; type "none" never scales. attn_factor (rope.scaling.attn_factor, default 1) scales cos and
// sin whatever the type. Type "yarn" sets ext_factor = 1 and attn_factor = get_mscale(factor) /
// (1 + 0.1·ln factor) times the key's value, where get_mscale(s) = 1 + 0.1·ln s for s > 1, else 1 (the
// rope op multiplies by 1 + 0.1·ln(1/freq_scale) again: net 1 + 0.1·ln factor for factor > 1); its ramp
// uses rope.scaling.original_context_length (0 or absent: context_length) and beta_fast 32, beta_slow 1.
// llama.cpp reads rope.scaling.yarn_* and yarn_log_multiplier only for other architectures, so minfer
// does not read them either. Type "longrope" scales like "linear" in llama.cpp (its per-pair factors
// are tensors: GraphBuilder::longRopeFactors, phi3), and config.rope_scaling reads Linear or None for it.
// Any other type is refused.
llvm::Error readRopeScaling(const gguf::GgufFile& file, ModelConfig& c) {
  const std::string p = c.architecture + ".";
  const std::string type_key = p + "rope.scaling.type";
  std::string type = "linear";
  if (file.find(type_key)) {
    auto t = file.getString(type_key);
    if (!t) return t.takeError();
    type = std::string(*t);
  }
  if (type != "none" && type != "linear" && type != "yarn" && type != "longrope")
    return makeError(llvm::formatv("{0}: {1} = '{2}' is not a RoPE scaling type (supported: none, linear, yarn, "
                                   "longrope)",
                                   file.fileName(), type_key, type));
  std::string factor_key = p + "rope.scaling.factor";
  if (!file.find(factor_key) && file.find(p + "rope.scale_linear")) factor_key = p + "rope.scale_linear";
  auto factor = file.getF32Or(factor_key, 0.0f);
  if (!factor) return factor.takeError();
  if (!(*factor >= 0) || !std::isfinite(*factor))
    return makeError(llvm::formatv("{0}: {1} = {2} must be finite and ≥ 0 (0: no scaling)", file.fileName(),
                                   factor_key, llvm::format("%g", *factor)));
  const std::string attn_key = p + "rope.scaling.attn_factor";
  auto attn = file.getF32Or(attn_key, 1.0f);
  if (!attn) return attn.takeError();
  if (!(*attn > 0) || !std::isfinite(*attn))
    return makeError(llvm::formatv("{0}: {1} = {2} must be finite and > 0", file.fileName(), attn_key,
                                   llvm::format("%g", *attn)));
  c.rope_attn_factor = *attn;
  c.rope_scaling = fb::RopeScaling::None;
  c.rope_freq_scale = 1.0f;
  if (type == "yarn") {
    c.rope_scaling = fb::RopeScaling::Yarn;
    if (*factor != 0.0f) c.rope_freq_scale = 1.0f / *factor;
    const std::string orig_key = p + "rope.scaling.original_context_length";
    auto orig = file.getU32Or(orig_key, 0);
    if (!orig) return orig.takeError();
    c.rope_n_ctx_orig = *orig != 0 ? *orig : c.n_ctx_train;
    if (c.rope_n_ctx_orig == 0)
      return makeError(llvm::formatv("{0}: YaRN RoPE scaling needs the original context length, but {1} and "
                                     "{2}context_length are both 0",
                                     file.fileName(), orig_key, p));
    c.rope_ext_factor = 1.0f;
    const float s = 1.0f / c.rope_freq_scale;  // float, in llama_context's order
    const float mscale = s <= 1.0f ? 1.0f : 0.1f * std::log(s) + 1.0f;
    c.rope_attn_factor = mscale * (1.0f / (1.0f + 0.1f * std::log(s))) * *attn;
    return llvm::Error::success();
  }
  if (type == "none" || *factor == 0.0f) return llvm::Error::success();
  c.rope_scaling = fb::RopeScaling::Linear;
  c.rope_freq_scale = 1.0f / *factor;
  return llvm::Error::success();
}

// <arch>.rope.*, attention.layer_norm_rms_epsilon; the RoPE pairing is the architecture's fact.
llvm::Error readRopeAndNorm(const gguf::GgufFile& file, const ArchitectureFacts& facts, ModelConfig& c) {
  const std::string p = c.architecture + ".";
  auto n_rot = file.getU32Or(p + "rope.dimension_count", c.head_dim);
  if (!n_rot) return n_rot.takeError();
  c.n_rot = *n_rot;
  if (c.n_rot == 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    return makeError(llvm::formatv("{0}: {1}rope.dimension_count = {2} must be even and ≤ head dim {3}",
                                   file.fileName(), p, c.n_rot, c.head_dim));
  auto base = file.getF32Or(p + "rope.freq_base", 10000.0f);
  if (!base) return base.takeError();
  c.rope_freq_base = *base;
  auto eps = file.getF32Or(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return eps.takeError();
  c.rms_norm_eps = *eps;
  if (!(c.rope_freq_base > 0) || !std::isfinite(c.rope_freq_base) || !(c.rms_norm_eps >= 0) ||
      !std::isfinite(c.rms_norm_eps))
    return makeError(llvm::formatv("{0}: rope.freq_base = {1} and layer_norm_rms_epsilon = {2} must be finite and "
                                   "positive",
                                   file.fileName(), c.rope_freq_base, c.rms_norm_eps));
  c.rope_style = facts.rope_style;
  return readRopeScaling(file, c);
}

// Builds the runtime's tokenizer once, so a vocabulary it would refuse fails here, at compile time.
llvm::Error validateTokenizer(const gguf::GgufFile& file, const TokenizerDesc& t) {
  Vocabulary v;
  v.model = t.model_name;
  v.pre = t.pre;
  v.tokens.assign(t.tokens.begin(), t.tokens.end());
  v.scores = t.scores;
  v.token_types = t.token_types;
  v.merges.assign(t.merges.begin(), t.merges.end());
  v.bos_id = t.bos_id;
  v.eos_id = t.eos_id;
  v.unk_id = t.unk_id;
  v.pad_id = t.pad_id;
  v.eot_id = t.eot_id;
  v.eom_id = t.eom_id;
  v.add_bos = t.add_bos;
  v.add_eos = t.add_eos;
  v.add_space_prefix = t.add_space_prefix;
  Result<Tokenizer> tokenizer = Tokenizer::create(std::move(v));
  if (!tokenizer)
    return makeError(llvm::formatv("{0}: tokenizer: {1}", file.fileName(), tokenizer.status().message()));
  return llvm::Error::success();
}

// tokenizer.*: absent (t.present stays false), or a llama (SentencePiece) or gpt2 (BPE) vocabulary with
// llama.cpp's defaults for what the GGUF leaves out.
llvm::Error readTokenizer(const gguf::GgufFile& file, TokenizerDesc& t) {
  if (!file.find("tokenizer.ggml.tokens")) return llvm::Error::success();
  t.present = true;
  auto model = file.getString("tokenizer.ggml.model");
  if (!model) return model.takeError();
  t.model_name = std::string(*model);
  if (t.model_name == "llama") t.model = fb::TokenizerModel::Spm;
  else if (t.model_name == "gpt2") t.model = fb::TokenizerModel::Bpe;
  else
    return makeError(llvm::formatv("{0}: tokenizer.ggml.model = '{1}' is not supported (supported: llama, gpt2)",
                                   file.fileName(), t.model_name));
  if (const gguf::KeyValue* kv = file.find("tokenizer.ggml.pre")) t.pre = std::string(kv->value.str);
  else t.pre = "default";
  if (const gguf::KeyValue* kv = file.find("tokenizer.chat_template")) t.chat_template = std::string(kv->value.str);
  auto tokens = file.getStringArray("tokenizer.ggml.tokens");
  if (!tokens) return tokens.takeError();
  t.tokens = std::move(*tokens);
  const size_t n = t.tokens.size();
  if (file.find("tokenizer.ggml.scores")) {
    auto scores = file.getF32Array("tokenizer.ggml.scores");
    if (!scores) return scores.takeError();
    t.scores = std::move(*scores);
  }
  if (file.find("tokenizer.ggml.token_type")) {
    auto types = file.getI32Array("tokenizer.ggml.token_type");
    if (!types) return types.takeError();
    t.token_types = std::move(*types);
  }
  if (file.find("tokenizer.ggml.merges")) {
    auto merges = file.getStringArray("tokenizer.ggml.merges");
    if (!merges) return merges.takeError();
    t.merges = std::move(*merges);
  }
  if ((!t.scores.empty() && t.scores.size() != n) || (!t.token_types.empty() && t.token_types.size() != n))
    return makeError(llvm::formatv("{0}: tokenizer arrays disagree: {1} tokens, {2} scores, {3} token types",
                                   file.fileName(), n, t.scores.size(), t.token_types.size()));
  // Defaults are llama.cpp's for this model kind and pre-tokenizer (Vocabulary::withDefaults); each
  // key present in the GGUF overrides its default; special ids outside the vocabulary are ignored,
  // as llama.cpp does (GGUF writers store 0xFFFFFFFF for "none").
  const Vocabulary defaults = Vocabulary::withDefaults(t.model_name, t.pre);
  t.bos_id = defaults.bos_id;
  t.eos_id = defaults.eos_id;
  t.unk_id = defaults.unk_id;
  t.pad_id = defaults.pad_id;
  auto special = [&](const char* key, int32_t* out) -> llvm::Error {
    const gguf::KeyValue* kv = file.find(key);
    if (!kv) return llvm::Error::success();
    uint64_t id = 0;
    if (!kv->value.asU64(&id)) return makeError(llvm::formatv("{0}: {1} is not a token id", file.fileName(), key));
    if (id < n) *out = static_cast<int32_t>(id);
    return llvm::Error::success();
  };
  if (auto e = special("tokenizer.ggml.bos_token_id", &t.bos_id)) return e;
  if (auto e = special("tokenizer.ggml.eos_token_id", &t.eos_id)) return e;
  if (auto e = special("tokenizer.ggml.unknown_token_id", &t.unk_id)) return e;
  if (auto e = special("tokenizer.ggml.padding_token_id", &t.pad_id)) return e;
  if (auto e = special("tokenizer.ggml.eot_token_id", &t.eot_id)) return e;
  if (auto e = special("tokenizer.ggml.eom_token_id", &t.eom_id)) return e;
  auto add_bos = file.getBoolOr("tokenizer.ggml.add_bos_token", defaults.add_bos);
  if (!add_bos) return add_bos.takeError();
  t.add_bos = *add_bos;
  auto add_eos = file.getBoolOr("tokenizer.ggml.add_eos_token", defaults.add_eos);
  if (!add_eos) return add_eos.takeError();
  t.add_eos = *add_eos;
  auto add_space = file.getBoolOr("tokenizer.ggml.add_space_prefix", defaults.add_space_prefix);
  if (!add_space) return add_space.takeError();
  t.add_space_prefix = *add_space;
  return validateTokenizer(file, t);
}

}  // namespace

llvm::Expected<ModelDescription> describeModel(const gguf::GgufFile& file, uint32_t max_batch, uint32_t n_ctx) {
  if (max_batch == 0 || max_batch > kArtifactMaxBatch)
    return makeError(llvm::formatv("max batch {0} is out of range 1..{1}", max_batch, kArtifactMaxBatch));
  if (n_ctx > (1u << 20))
    return makeError(llvm::formatv("context {0} is out of range 0..2^20 (0: the model's)", n_ctx));
  ModelDescription desc;
  auto arch = readArchitecture(file, desc.config);
  if (!arch) return arch.takeError();
  if (auto e = readSizes(file, desc.config)) return e;
  if (auto e = readRopeAndNorm(file, (*arch)->facts, desc.config)) return e;
  if (auto e = readTokenizer(file, desc.tokenizer)) return e;
  desc.plan.max_batch = max_batch;
  desc.config.n_ctx_max = n_ctx;
  GraphBuilder builder(file, desc);
  if (auto e = (*arch)->forward(builder)) return e;
  if (auto e = builder.finish()) return e;
  return desc;
}

void ringLocalKvCaches(ExecutionPlan& plan) {
  std::map<int32_t, uint64_t> ring_layers;  // layer → kv_ring × f16 K+V bytes per position
  uint64_t ring_per_token = 0;
  for (std::vector<StepDesc>* steps : {&plan.prefill, &plan.decode})
    for (StepDesc& s : *steps) {
      const uint64_t ring = uint64_t{s.window} + plan.max_batch - 1;
      if (s.op != fb::OpKind::Attention || s.window == 0 || ring > (1u << 30)) continue;
      s.kv_ring = static_cast<uint32_t>(ring);
      const uint64_t per_position = 2ull * 2ull * s.n_head_kv * s.head_dim;
      if (ring_layers.try_emplace(s.layer, ring * per_position).second) ring_per_token += per_position;
    }
  plan.kv_ring_bytes_per_token = ring_per_token;
  plan.kv_ring_bytes = 0;
  for (const auto& [layer, bytes] : ring_layers) plan.kv_ring_bytes += bytes;
}

}  // namespace minfer::model
