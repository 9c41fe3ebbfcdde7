// Architecture mapping: GGUF metadata and tensors → ModelDescription and the prefill/decode plans.
#include "compiler/model/model_desc.h"

#include <cmath>

#include "llvm/ADT/StringExtras.h"
#include "minfer/tokenizer.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::model {
namespace {

constexpr uint32_t kMaxReasonableDim = 1u << 20;     // per-dimension sanity bound (embedding, FFN, heads)
constexpr uint32_t kMaxReasonableLayers = 4096;

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

const char* kArchitectures[] = {"llama", "qwen2", "qwen3"};

std::string supportedTypes() {
  std::string out;
  for (uint32_t id = 0; id < 64; ++id) {
    const GgmlTypeTraits t = ggmlTypeTraits(id);
    if (!t.supported) continue;
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

class Lowering {
 public:
  Lowering(const gguf::GgufFile& file, ModelDescription& desc) : file_(file), desc_(desc) {}

  llvm::Error readConfig() {
    ModelConfig& c = desc_.config;
    auto arch = file_.getString("general.architecture");
    if (!arch) return arch.takeError();
    c.architecture = std::string(*arch);
    if (!llvm::is_contained(kArchitectures, llvm::StringRef(c.architecture)))
      return makeError(llvm::formatv("{0}: unsupported architecture '{1}' (general.architecture); supported: {2}",
                                     file_.fileName(), c.architecture, supportedArchitectures()));
    if (auto name = file_.getString("general.name")) c.name = std::string(*name);
    else llvm::consumeError(name.takeError());
    const std::string p = c.architecture + ".";
    auto get = [&](const char* key, uint32_t* out) -> llvm::Error {
      auto v = file_.getU32(p + key);
      if (!v) return v.takeError();
      *out = *v;
      return llvm::Error::success();
    };
    if (auto e = get("embedding_length", &c.n_embd)) return e;
    if (auto e = get("block_count", &c.n_layer)) return e;
    if (auto e = get("feed_forward_length", &c.n_ff)) return e;
    if (auto e = get("attention.head_count", &c.n_head)) return e;
    auto n_head_kv = file_.getU32Or(p + "attention.head_count_kv", c.n_head);
    if (!n_head_kv) return n_head_kv.takeError();
    c.n_head_kv = *n_head_kv;
    auto ctx = file_.getU32Or(p + "context_length", 2048);
    if (!ctx) return ctx.takeError();
    c.n_ctx_train = *ctx;
    if (c.n_embd == 0 || c.n_embd > kMaxReasonableDim || c.n_head == 0 || c.n_head > c.n_embd ||
        c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0 || c.n_layer == 0 || c.n_layer > kMaxReasonableLayers ||
        c.n_ff == 0 || c.n_ff > kMaxReasonableDim)
      return makeError(llvm::formatv("{0}: inconsistent hyperparameters: {1}embedding_length = {2}, block_count = "
                                     "{3}, feed_forward_length = {4}, attention.head_count = {5}, "
                                     "attention.head_count_kv = {6} (need non-zero sizes, head_count ≤ "
                                     "embedding_length, head_count a multiple of head_count_kv)",
                                     file_.fileName(), p, c.n_embd, c.n_layer, c.n_ff, c.n_head, c.n_head_kv));
    auto key_length = file_.getU32Or(p + "attention.key_length", c.n_embd / c.n_head);
    if (!key_length) return key_length.takeError();
    c.head_dim = *key_length;
    if (c.head_dim == 0 || c.head_dim % 2 != 0 || c.head_dim > 1024)
      return makeError(llvm::formatv("{0}: head dimension {1} must be even and in 2..1024", file_.fileName(),
                                     c.head_dim));
    auto n_rot = file_.getU32Or(p + "rope.dimension_count", c.head_dim);
    if (!n_rot) return n_rot.takeError();
    c.n_rot = *n_rot;
    if (c.n_rot == 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
      return makeError(llvm::formatv("{0}: {1}rope.dimension_count = {2} must be even and ≤ head dim {3}",
                                     file_.fileName(), p, c.n_rot, c.head_dim));
    auto base = file_.getF32Or(p + "rope.freq_base", 10000.0f);
    if (!base) return base.takeError();
    c.rope_freq_base = *base;
    auto eps = file_.getF32Or(p + "attention.layer_norm_rms_epsilon", 1e-5f);
    if (!eps) return eps.takeError();
    c.rms_norm_eps = *eps;
    if (!(c.rope_freq_base > 0) || !std::isfinite(c.rope_freq_base) || !(c.rms_norm_eps >= 0) ||
        !std::isfinite(c.rms_norm_eps))
      return makeError(llvm::formatv("{0}: rope.freq_base = {1} and layer_norm_rms_epsilon = {2} must be finite and "
                                     "positive",
                                     file_.fileName(), c.rope_freq_base, c.rms_norm_eps));
    c.rope_style = c.architecture == "llama" ? fb::RopeStyle::Norm : fb::RopeStyle::Neox;
    if (const gguf::KeyValue* kv = file_.find(p + "rope.scaling.type")) {
      const std::string_view type = kv->value.str;
      if (type == "linear") {
        auto factor = file_.getF32(p + "rope.scaling.factor");
        if (!factor) return factor.takeError();
        if (!(*factor > 0) || !std::isfinite(*factor))
          return makeError(llvm::formatv("{0}: {1}rope.scaling.factor = {2} must be positive", file_.fileName(), p,
                                         *factor));
        c.rope_scaling = fb::RopeScaling::Linear;
        c.rope_freq_scale = 1.0f / *factor;
      } else if (type != "none") {
        return makeError(llvm::formatv("{0}: {1}rope.scaling.type = '{2}' is not supported (supported: none, linear)",
                                       file_.fileName(), p, type));
      }
    }
    return llvm::Error::success();
  }

  llvm::Error readTokenizer() {
    TokenizerDesc& t = desc_.tokenizer;
    if (!file_.find("tokenizer.ggml.tokens")) return llvm::Error::success();
    t.present = true;
    auto model = file_.getString("tokenizer.ggml.model");
    if (!model) return model.takeError();
    t.model_name = std::string(*model);
    if (t.model_name == "llama") t.model = fb::TokenizerModel::Spm;
    else if (t.model_name == "gpt2") t.model = fb::TokenizerModel::Bpe;
    else
      return makeError(llvm::formatv("{0}: tokenizer.ggml.model = '{1}' is not supported (supported: llama, gpt2)",
                                     file_.fileName(), t.model_name));
    if (const gguf::KeyValue* kv = file_.find("tokenizer.ggml.pre")) t.pre = std::string(kv->value.str);
    else t.pre = "default";
    if (const gguf::KeyValue* kv = file_.find("tokenizer.chat_template")) t.chat_template = std::string(kv->value.str);
    auto tokens = file_.getStringArray("tokenizer.ggml.tokens");
    if (!tokens) return tokens.takeError();
    t.tokens = std::move(*tokens);
    const size_t n = t.tokens.size();
    if (file_.find("tokenizer.ggml.scores")) {
      auto scores = file_.getF32Array("tokenizer.ggml.scores");
      if (!scores) return scores.takeError();
      t.scores = std::move(*scores);
    }
    if (file_.find("tokenizer.ggml.token_type")) {
      auto types = file_.getI32Array("tokenizer.ggml.token_type");
      if (!types) return types.takeError();
      t.token_types = std::move(*types);
    }
    if (file_.find("tokenizer.ggml.merges")) {
      auto merges = file_.getStringArray("tokenizer.ggml.merges");
      if (!merges) return merges.takeError();
      t.merges = std::move(*merges);
    }
    if ((!t.scores.empty() && t.scores.size() != n) || (!t.token_types.empty() && t.token_types.size() != n))
      return makeError(llvm::formatv("{0}: tokenizer arrays disagree: {1} tokens, {2} scores, {3} token types",
                                     file_.fileName(), n, t.scores.size(), t.token_types.size()));
    // Defaults are llama.cpp's for this model kind and pre-tokenizer (Vocabulary::withDefaults); each
    // key present in the GGUF overrides its default; special ids outside the vocabulary are ignored,
    // as llama.cpp does (GGUF writers store 0xFFFFFFFF for "none").
    const Vocabulary defaults = Vocabulary::withDefaults(t.model_name, t.pre);
    t.bos_id = defaults.bos_id;
    t.eos_id = defaults.eos_id;
    t.unk_id = defaults.unk_id;
    t.pad_id = defaults.pad_id;
    auto special = [&](const char* key, int32_t* out) -> llvm::Error {
      const gguf::KeyValue* kv = file_.find(key);
      if (!kv) return llvm::Error::success();
      uint64_t id = 0;
      if (!kv->value.asU64(&id)) return makeError(llvm::formatv("{0}: {1} is not a token id", file_.fileName(), key));
      if (id < n) *out = static_cast<int32_t>(id);
      return llvm::Error::success();
    };
    if (auto e = special("tokenizer.ggml.bos_token_id", &t.bos_id)) return e;
    if (auto e = special("tokenizer.ggml.eos_token_id", &t.eos_id)) return e;
    if (auto e = special("tokenizer.ggml.unknown_token_id", &t.unk_id)) return e;
    if (auto e = special("tokenizer.ggml.padding_token_id", &t.pad_id)) return e;
    auto add_bos = file_.getBoolOr("tokenizer.ggml.add_bos_token", defaults.add_bos);
    if (!add_bos) return add_bos.takeError();
    t.add_bos = *add_bos;
    auto add_eos = file_.getBoolOr("tokenizer.ggml.add_eos_token", defaults.add_eos);
    if (!add_eos) return add_eos.takeError();
    t.add_eos = *add_eos;
    auto add_space = file_.getBoolOr("tokenizer.ggml.add_space_prefix", defaults.add_space_prefix);
    if (!add_space) return add_space.takeError();
    t.add_space_prefix = *add_space;
    return validateTokenizer();
  }

  // Builds the runtime's tokenizer once, so a vocabulary it would refuse fails here, at compile time.
  llvm::Error validateTokenizer() {
    const TokenizerDesc& t = desc_.tokenizer;
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
    v.add_bos = t.add_bos;
    v.add_eos = t.add_eos;
    v.add_space_prefix = t.add_space_prefix;
    Result<Tokenizer> tokenizer = Tokenizer::create(std::move(v));
    if (!tokenizer)
      return makeError(llvm::formatv("{0}: tokenizer: {1}", file_.fileName(), tokenizer.status().message()));
    return llvm::Error::success();
  }

  // Registers a weight after checking its presence, shape (ne) and type. Returns its index.
  llvm::Expected<uint32_t> weight(const std::string& name, planes::TensorRole role, std::vector<uint64_t> ne,
                                  bool optional = false, bool* found = nullptr) {
    const gguf::TensorInfo* info = file_.findTensor(name);
    if (found) *found = info != nullptr;
    if (!info) {
      if (optional) return UINT32_MAX;
      return makeError(llvm::formatv("{0}: tensor '{1}' is missing (architecture {2} needs it)", file_.fileName(),
                                     name, desc_.config.architecture));
    }
    bool shape_ok = true;  // unused trailing dims of a TensorInfo are 1
    for (size_t d = 0; d < 4; ++d) shape_ok &= info->ne[d] == (d < ne.size() ? ne[d] : 1);
    if (!shape_ok) {
      std::string want, have;
      for (size_t d = 0; d < ne.size(); ++d) want += (d ? ", " : "") + std::to_string(ne[d]);
      for (uint32_t d = 0; d < info->n_dims; ++d) have += (d ? ", " : "") + std::to_string(info->ne[d]);
      return makeError(llvm::formatv("{0}: tensor '{1}' has shape [{2}], expected [{3}] from the hyperparameters",
                                     file_.fileName(), name, have, want));
    }
    const GgmlTypeTraits traits = ggmlTypeTraits(info->type);
    if (!traits.supported)
      return makeError(llvm::formatv("{0}: tensor '{1}' has type {2}, which minfer does not support (supported: {3})",
                                     file_.fileName(), name, traits.name, supportedTypes()));
    if (role == planes::TensorRole::kVector && info->type != GgmlType::F32)
      return makeError(llvm::formatv("{0}: tensor '{1}' has type {2}; norm weights and biases must be F32",
                                     file_.fileName(), name, traits.name));
    desc_.weights.push_back({name, role, info});
    return static_cast<uint32_t>(desc_.weights.size() - 1);
  }

  uint32_t buffer(const char* name, uint32_t width, fb::BufferType type = fb::BufferType::F32) {
    desc_.plan.buffers.push_back({name, width, type});
    return static_cast<uint32_t>(desc_.plan.buffers.size() - 1);
  }

  llvm::Error lower(uint32_t max_batch) {
    const ModelConfig& c = desc_.config;
    ExecutionPlan& plan = desc_.plan;
    plan.max_batch = max_batch;
    const uint32_t q_width = c.n_head * c.head_dim, kv_width = c.n_head_kv * c.head_dim;

    const gguf::TensorInfo* embd = file_.findTensor("token_embd.weight");
    if (!embd)
      return makeError(llvm::formatv("{0}: tensor 'token_embd.weight' is missing", file_.fileName()));
    if (embd->n_dims != 2 || embd->rows() == 0 || embd->rows() > (1u << 24))
      return makeError(llvm::formatv("{0}: tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab] with n_vocab ≤ 2^24",
                                     file_.fileName()));
    desc_.config.n_vocab = static_cast<uint32_t>(embd->rows());
    if (desc_.tokenizer.present && desc_.tokenizer.tokens.size() != c.n_vocab)
      return makeError(llvm::formatv("{0}: the tokenizer has {1} tokens but token_embd.weight has {2} rows",
                                     file_.fileName(), desc_.tokenizer.tokens.size(), c.n_vocab));
    desc_.config.tied_embeddings = file_.findTensor("output.weight") == nullptr;

    const uint32_t ids = buffer("ids", 1, fb::BufferType::I32);
    const uint32_t x = buffer("x", c.n_embd), h = buffer("h", c.n_embd);
    const uint32_t q = buffer("q", q_width), k = buffer("k", kv_width), v = buffer("v", kv_width);
    const uint32_t attn = buffer("attn", q_width);
    const uint32_t gate = buffer("gate", c.n_ff), up = buffer("up", c.n_ff);
    const uint32_t logits = buffer("logits", c.n_vocab);
    plan.input_ids = ids;
    plan.logits = logits;
    plan.kv_bytes_per_token = 2ull * 2ull * c.n_layer * kv_width;

    std::vector<StepDesc>& steps = plan.prefill;
    auto embd_index = weight("token_embd.weight",
                             desc_.config.tied_embeddings ? planes::TensorRole::kEmbeddingMatMul : planes::TensorRole::kEmbedding,
                             {c.n_embd, c.n_vocab});
    if (!embd_index) return embd_index.takeError();
    steps.push_back({.op = fb::OpKind::Embed, .inputs = {ids}, .outputs = {x}, .weights = {*embd_index},
                     .name = "token_embd"});

    auto norm = [&](const std::string& wname, uint32_t in, uint32_t out, const std::string& step) -> llvm::Error {
      auto w = weight(wname, planes::TensorRole::kVector, {c.n_embd});
      if (!w) return w.takeError();
      steps.push_back({.op = fb::OpKind::RmsNorm, .inputs = {in}, .outputs = {out}, .weights = {*w},
                       .eps = c.rms_norm_eps, .name = step});
      return llvm::Error::success();
    };
    auto matmul = [&](const std::string& base, uint32_t in, uint32_t out, uint32_t rows, uint32_t cols,
                      bool bias) -> llvm::Error {
      auto w = weight(base + ".weight", planes::TensorRole::kMatMul, {cols, rows});
      if (!w) return w.takeError();
      StepDesc s{.op = fb::OpKind::MatMul, .inputs = {in}, .outputs = {out}, .weights = {*w}, .rows = rows,
                 .cols = cols, .name = base};
      if (bias) {
        auto b = weight(base + ".bias", planes::TensorRole::kVector, {rows});
        if (!b) return b.takeError();
        s.weights.push_back(*b);
      }
      steps.push_back(std::move(s));
      return llvm::Error::success();
    };

    const bool bias = c.architecture == "qwen2";
    desc_.config.qkv_bias = bias;
    desc_.config.qk_norm = c.architecture == "qwen3";
    for (uint32_t l = 0; l < c.n_layer; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      if (auto e = norm(b + "attn_norm.weight", x, h, b + "attn_norm")) return e;
      if (auto e = matmul(b + "attn_q", h, q, q_width, c.n_embd, bias)) return e;
      if (auto e = matmul(b + "attn_k", h, k, kv_width, c.n_embd, bias)) return e;
      if (auto e = matmul(b + "attn_v", h, v, kv_width, c.n_embd, bias)) return e;
      if (desc_.config.qk_norm) {
        for (auto [which, buf, heads] : {std::tuple{"attn_q_norm", q, c.n_head}, std::tuple{"attn_k_norm", k, c.n_head_kv}}) {
          auto w = weight(b + which + ".weight", planes::TensorRole::kVector, {c.head_dim});
          if (!w) return w.takeError();
          steps.push_back({.op = fb::OpKind::HeadRmsNorm, .inputs = {buf}, .outputs = {buf}, .weights = {*w},
                           .eps = c.rms_norm_eps, .n_head = heads, .head_dim = c.head_dim, .name = b + which});
        }
      }
      steps.push_back({.op = fb::OpKind::Rope, .inputs = {q, k}, .outputs = {q, k}, .n_head = c.n_head,
                       .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .n_rot = c.n_rot,
                       .rope_style = c.rope_style, .rope_freq_base = c.rope_freq_base,
                       .rope_freq_scale = c.rope_freq_scale, .name = b + "rope"});
      steps.push_back({.op = fb::OpKind::Attention, .inputs = {q, k, v}, .outputs = {attn},
                       .layer = static_cast<int32_t>(l), .n_head = c.n_head, .n_head_kv = c.n_head_kv,
                       .head_dim = c.head_dim, .name = b + "attention"});
      if (auto e = matmul(b + "attn_output", attn, h, c.n_embd, q_width, false)) return e;
      steps.push_back({.op = fb::OpKind::Add, .inputs = {x, h}, .outputs = {x}, .name = b + "attn_residual"});
      if (auto e = norm(b + "ffn_norm.weight", x, h, b + "ffn_norm")) return e;
      if (auto e = matmul(b + "ffn_gate", h, gate, c.n_ff, c.n_embd, false)) return e;
      if (auto e = matmul(b + "ffn_up", h, up, c.n_ff, c.n_embd, false)) return e;
      steps.push_back({.op = fb::OpKind::SwiGlu, .inputs = {gate, up}, .outputs = {gate}, .name = b + "swiglu"});
      if (auto e = matmul(b + "ffn_down", gate, h, c.n_embd, c.n_ff, false)) return e;
      steps.push_back({.op = fb::OpKind::Add, .inputs = {x, h}, .outputs = {x}, .name = b + "ffn_residual"});
    }
    if (auto e = norm("output_norm.weight", x, h, "output_norm")) return e;
    if (desc_.config.tied_embeddings) {
      steps.push_back({.op = fb::OpKind::MatMul, .inputs = {h}, .outputs = {logits}, .weights = {*embd_index},
                       .rows = c.n_vocab, .cols = c.n_embd, .name = "output (tied to token_embd)"});
    } else if (auto e = matmul("output", h, logits, c.n_vocab, c.n_embd, false)) {
      return e;
    }
    // Every GGUF tensor must be used: an unknown tensor means an architecture variant we do not handle.
    if (desc_.weights.size() != file_.tensors().size()) {
      for (const gguf::TensorInfo& t : file_.tensors()) {
        bool used = false;
        for (const WeightDesc& w : desc_.weights) used |= w.info == &t;
        if (!used)
          return makeError(llvm::formatv("{0}: tensor '{1}' is not used by the {2} architecture as minfer knows it",
                                         file_.fileName(), t.name, c.architecture));
      }
    }
    // The CPU and the first GPU path run the same step list for one token and for many.
    plan.decode = plan.prefill;
    return llvm::Error::success();
  }

 private:
  const gguf::GgufFile& file_;
  ModelDescription& desc_;
};

}  // namespace

const char* supportedArchitectures() { return "llama, qwen2, qwen3"; }

llvm::Expected<ModelDescription> describeModel(const gguf::GgufFile& file, uint32_t max_batch) {
  if (max_batch == 0 || max_batch > 65536)
    return makeError(llvm::formatv("max batch {0} is out of range 1..65536", max_batch));
  ModelDescription desc;
  Lowering lowering(file, desc);
  if (auto e = lowering.readConfig()) return e;
  if (auto e = lowering.readTokenizer()) return e;
  if (auto e = lowering.lower(max_batch)) return e;
  return desc;
}

}  // namespace minfer::model
