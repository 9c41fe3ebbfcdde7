// GraphBuilder: the shared blocks of the forward passes in arch/ (see graph_builder.h).
#include "compiler/model/graph_builder.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <tuple>

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::model {
namespace {

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

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

}  // namespace

llvm::Error GraphBuilder::error(const llvm::Twine& message) const {
  return makeError(llvm::formatv("{0}: {1}", file_.fileName(), message.str()));
}

std::string GraphBuilder::layerPrefix(uint32_t layer) { return "blk." + std::to_string(layer) + "."; }

llvm::Expected<const gguf::TensorInfo*> GraphBuilder::checkTensor(const std::string& name, planes::TensorRole role,
                                                                 const std::vector<uint64_t>& ne, bool optional) {
  const gguf::TensorInfo* info = file_.findTensor(name);
  if (!info) {
    if (optional) return nullptr;
    return makeError(llvm::formatv("{0}: tensor '{1}' is missing (architecture {2} needs it)", file_.fileName(),
                                   name, desc_.config.architecture));
  }
  if (info->elements() == 0) {  // the GGUF reader accepts empty tensors; no block computes with one
    uint32_t d = 0;
    while (info->ne[d] != 0) ++d;
    return makeError(llvm::formatv("{0}: tensor '{1}' has no elements (ne[{2}] = 0); architecture {3} uses it",
                                   file_.fileName(), name, d, desc_.config.architecture));
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
    return makeError(llvm::formatv("{0}: tensor '{1}' has type {2}; norm weights, biases and RoPE factors must be F32",
                                   file_.fileName(), name, traits.name));
  return info;
}

llvm::Expected<uint32_t> GraphBuilder::weight(const std::string& name, planes::TensorRole role,
                                              std::vector<uint64_t> ne, bool optional, bool* found) {
  auto info = checkTensor(name, role, ne, optional);
  if (found) *found = info && *info;
  if (!info) return info.takeError();
  if (!*info) return UINT32_MAX;
  desc_.weights.push_back({name, role, *info});
  return static_cast<uint32_t>(desc_.weights.size() - 1);
}

void GraphBuilder::push(StepDesc step, std::initializer_list<Operand> inputs, std::initializer_list<Operand> outputs) {
  bool views = false;
  for (const Operand& o : inputs) views |= o.width != 0;
  for (const Operand& o : outputs) views |= o.width != 0;
  auto add = [&](const Operand& o, std::vector<uint32_t>& ids, std::vector<ColumnView>& vs) {
    ids.push_back(o.buffer);
    if (views) vs.push_back({o.offset, o.width != 0 ? o.width : desc_.plan.buffers[o.buffer].width});
  };
  for (const Operand& o : inputs) add(o, step.inputs, step.input_views);
  for (const Operand& o : outputs) add(o, step.outputs, step.output_views);
  desc_.plan.prefill.push_back(std::move(step));
}

uint32_t GraphBuilder::buffer(const char* name, uint32_t width, fb::BufferType type) {
  desc_.plan.buffers.push_back({name, width, type});
  return static_cast<uint32_t>(desc_.plan.buffers.size() - 1);
}

llvm::Error GraphBuilder::embedding(ActivationOptions options) {
  ModelConfig& c = desc_.config;
  ExecutionPlan& plan = desc_.plan;
  const gguf::TensorInfo* embd = file_.findTensor("token_embd.weight");
  if (!embd) return makeError(llvm::formatv("{0}: tensor 'token_embd.weight' is missing", file_.fileName()));
  if (embd->n_dims != 2 || embd->rows() == 0 || embd->rows() > (1u << 24))
    return makeError(llvm::formatv("{0}: tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab] with n_vocab ≤ 2^24",
                                   file_.fileName()));
  c.n_vocab = static_cast<uint32_t>(embd->rows());
  if (desc_.tokenizer.present && desc_.tokenizer.tokens.size() != c.n_vocab)
    return makeError(llvm::formatv("{0}: the tokenizer has {1} tokens but token_embd.weight has {2} rows",
                                   file_.fileName(), desc_.tokenizer.tokens.size(), c.n_vocab));
  c.tied_embeddings = file_.findTensor("output.weight") == nullptr;

  const uint32_t q_width = c.n_head * c.head_dim, kv_width = c.n_head_kv * c.head_dim;
  Activations& a = act_;
  a.ids = buffer("ids", 1, fb::BufferType::I32);
  a.x = buffer("x", c.n_embd), a.h = buffer("h", c.n_embd);
  if (options.fused_qkv) {
    a.qkv = buffer("qkv", q_width + 2 * kv_width);
    a.q = {a.qkv, 0, q_width}, a.k = {a.qkv, q_width, kv_width}, a.v = {a.qkv, q_width + kv_width, kv_width};
  } else {
    a.q = {buffer("q", q_width)}, a.k = {buffer("k", kv_width)}, a.v = {buffer("v", kv_width)};
  }
  a.attn = buffer("attn", q_width);
  a.gate = buffer("gate", c.n_ff);
  if (options.fused_gate_up) a.gate_up = buffer("gate_up", 2 * c.n_ff);
  else a.up = buffer("up", c.n_ff);
  a.logits = buffer("logits", c.n_vocab);
  plan.input_ids = a.ids;
  plan.logits = a.logits;
  plan.kv_bytes_per_token = 2ull * 2ull * c.n_layer * kv_width;  // f16 K and V

  auto w = weight("token_embd.weight",
                  c.tied_embeddings ? planes::TensorRole::kEmbeddingMatMul : planes::TensorRole::kEmbedding,
                  {c.n_embd, c.n_vocab});
  if (!w) return w.takeError();
  embd_weight_ = *w;
  plan.prefill.push_back({.op = fb::OpKind::Embed, .inputs = {a.ids}, .outputs = {a.x}, .weights = {*w},
                          .name = "token_embd"});
  return llvm::Error::success();
}

llvm::Error GraphBuilder::norm(const std::string& name, uint32_t in, uint32_t out) {
  const ModelConfig& c = desc_.config;
  auto w = weight(name + ".weight", planes::TensorRole::kVector, {c.n_embd});
  if (!w) return w.takeError();
  desc_.plan.prefill.push_back({.op = fb::OpKind::RmsNorm, .inputs = {in}, .outputs = {out}, .weights = {*w},
                                .eps = c.rms_norm_eps, .name = name});
  return llvm::Error::success();
}

llvm::Error GraphBuilder::matmul(const std::string& base, uint32_t in, uint32_t out, uint32_t rows, uint32_t cols,
                                 bool bias) {
  auto w = weight(base + ".weight", planes::TensorRole::kMatMul, {cols, rows});
  if (!w) return w.takeError();
  StepDesc s{.op = fb::OpKind::MatMul, .inputs = {in}, .outputs = {out}, .weights = {*w}, .rows = rows,
             .cols = cols, .name = base};
  if (bias) {
    auto b = weight(base + ".bias", planes::TensorRole::kVector, {rows});
    if (!b) return b.takeError();
    s.weights.push_back(*b);
  }
  desc_.plan.prefill.push_back(std::move(s));
  return llvm::Error::success();
}

llvm::Error GraphBuilder::qkvProjection(uint32_t layer, uint32_t in, QkvOptions options) {
  const ModelConfig& c = desc_.config;
  const std::string p = layerPrefix(layer);
  const uint32_t q_width = c.n_head * c.head_dim, kv_width = c.n_head_kv * c.head_dim;
  if (act_.qkv != Activations::kNone) {  // one matmul; q, k and v stay column views of its output
    if (options.bias || options.head_norm)
      return error("a fused attn_qkv projection with biases or q/k head norms is not supported");
    return matmul(p + "attn_qkv", in, act_.qkv, q_width + 2 * kv_width, c.n_embd);
  }
  if (auto e = matmul(p + "attn_q", in, act_.q.buffer, q_width, c.n_embd, options.bias)) return e;
  if (auto e = matmul(p + "attn_k", in, act_.k.buffer, kv_width, c.n_embd, options.bias)) return e;
  if (auto e = matmul(p + "attn_v", in, act_.v.buffer, kv_width, c.n_embd, options.bias)) return e;
  if (!options.head_norm) return llvm::Error::success();
  for (auto [which, buf, heads] : {std::tuple{"attn_q_norm", act_.q.buffer, c.n_head},
                                   std::tuple{"attn_k_norm", act_.k.buffer, c.n_head_kv}}) {
    auto w = weight(p + which + ".weight", planes::TensorRole::kVector, {c.head_dim});
    if (!w) return w.takeError();
    desc_.plan.prefill.push_back({.op = fb::OpKind::HeadRmsNorm, .inputs = {buf}, .outputs = {buf},
                                  .weights = {*w}, .eps = c.rms_norm_eps, .n_head = heads,
                                  .head_dim = c.head_dim, .name = p + which});
  }
  return llvm::Error::success();
}

llvm::Error GraphBuilder::checkFactors(const gguf::TensorInfo& t) const {
  // θ_i is divided by these (kernels/rope.cuh): refuse what would make it inf or NaN.
  const llvm::ArrayRef<uint8_t> data = file_.tensorData(t);
  for (uint64_t i = 0; i < t.elements(); ++i) {
    float v;
    std::memcpy(&v, data.data() + 4 * i, 4);
    if (!(v > 0) || !std::isfinite(v))
      return makeError(llvm::formatv("{0}: tensor '{1}' value {2} = {3} must be finite and > 0", file_.fileName(),
                                     t.name, i, llvm::format("%g", v)));
  }
  return llvm::Error::success();
}

llvm::Expected<uint32_t> GraphBuilder::ropeFreqs() {
  if (rope_freqs_ != kNotLooked) return static_cast<uint32_t>(rope_freqs_);
  const uint32_t n = desc_.config.n_rot / 2;
  auto w = weight("rope_freqs.weight", planes::TensorRole::kVector, {n}, /*optional=*/true);
  if (!w) return w.takeError();
  if (*w != UINT32_MAX)
    if (auto e = checkFactors(*desc_.weights[*w].info)) return e;
  rope_freqs_ = *w;
  return *w;
}

llvm::Expected<uint32_t> GraphBuilder::longRopeFactors() {
  if (long_rope_ != kNotLooked) return static_cast<uint32_t>(long_rope_);
  ModelConfig& c = desc_.config;
  // n_ctx_orig_yarn as llama_model::load_hparams reads it: context_length unless the key exists.
  const std::string orig_key = c.architecture + ".rope.scaling.original_context_length";
  auto orig = file_.getU32Or(orig_key, c.n_ctx_train);
  if (!orig) return orig.takeError();
  const uint64_t ctx = c.n_ctx_max != 0 ? c.n_ctx_max : c.n_ctx_train;  // llama.cpp's n_ctx_per_seq
  const bool use_long = ctx > *orig;
  const uint32_t n = c.n_rot / 2;
  const char* names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
  uint32_t chosen = UINT32_MAX;
  for (int i = 0; i < 2; ++i) {
    auto t = checkTensor(names[i], planes::TensorRole::kVector, {n}, /*optional=*/true);
    if (!t) return t.takeError();
    if (!*t) continue;
    if (auto e = checkFactors(**t)) return e;
    if (use_long == (i == 0)) {
      desc_.weights.push_back({names[i], planes::TensorRole::kVector, *t});
      chosen = static_cast<uint32_t>(desc_.weights.size() - 1);
    } else {
      left_out_.push_back(*t);
    }
  }
  const bool any = chosen != UINT32_MAX || !left_out_.empty();
  if (any && !use_long) c.n_ctx_max = c.n_ctx_max != 0 ? std::min(c.n_ctx_max, *orig) : *orig;
  long_rope_ = chosen;
  return chosen;
}

llvm::Error GraphBuilder::rope(uint32_t layer, RopeOptions options) {
  const ModelConfig& c = desc_.config;
  StepDesc s{.op = fb::OpKind::Rope, .n_head = c.n_head,
             .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .n_rot = c.n_rot, .rope_style = c.rope_style,
             .rope_freq_base = options.freq_base > 0 ? options.freq_base : c.rope_freq_base,
             .rope_freq_scale = options.freq_scale > 0 ? options.freq_scale : c.rope_freq_scale,
             .rope_ext_factor = c.rope_ext_factor, .rope_attn_factor = c.rope_attn_factor,
             .rope_beta_fast = c.rope_beta_fast, .rope_beta_slow = c.rope_beta_slow,
             .rope_n_ctx_orig = c.rope_n_ctx_orig, .name = layerPrefix(layer) + "rope"};
  if (options.freq_factors || options.long_rope) {
    auto ff = options.long_rope ? longRopeFactors() : ropeFreqs();
    if (!ff) return ff.takeError();
    if (*ff != UINT32_MAX) s.weights.push_back(*ff);
  }
  push(std::move(s), {act_.q, act_.k}, {act_.q, act_.k});
  return llvm::Error::success();
}

llvm::Error GraphBuilder::attention(uint32_t layer, uint32_t out, AttentionOptions options) {
  const ModelConfig& c = desc_.config;
  const std::string p = layerPrefix(layer);
  push({.op = fb::OpKind::Attention, .layer = static_cast<int32_t>(layer), .n_head = c.n_head,
        .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .name = p + "attention", .scale = options.scale,
        .softcap = options.softcap, .window = options.window},
       {act_.q, act_.k, act_.v}, {{act_.attn}});
  return matmul(p + "attn_output", act_.attn, out, c.n_embd, c.n_head * c.head_dim);
}

void GraphBuilder::scale(const std::string& name, uint32_t in, uint32_t out, float scale, float softcap) {
  desc_.plan.prefill.push_back(
      {.op = fb::OpKind::Scale, .inputs = {in}, .outputs = {out}, .name = name, .scale = scale, .softcap = softcap});
}

void GraphBuilder::residualAdd(const std::string& name, uint32_t acc, uint32_t in) {
  desc_.plan.prefill.push_back({.op = fb::OpKind::Add, .inputs = {acc, in}, .outputs = {acc}, .name = name});
}

llvm::Error GraphBuilder::gatedFfn(uint32_t layer, uint32_t in, uint32_t out, FfnActivation act) {
  const ModelConfig& c = desc_.config;
  const std::string p = layerPrefix(layer);
  const bool gelu = act == FfnActivation::kGeluTanh;
  const StepDesc glu{.op = gelu ? fb::OpKind::GeGlu : fb::OpKind::SwiGlu, .name = p + (gelu ? "geglu" : "swiglu")};
  if (act_.gate_up != Activations::kNone) {  // one matmul; the GLU reads its two halves in place
    if (auto e = matmul(p + "ffn_up", in, act_.gate_up, 2 * c.n_ff, c.n_embd)) return e;
    push(glu, {{act_.gate_up, 0, c.n_ff}, {act_.gate_up, c.n_ff, c.n_ff}}, {{act_.gate}});
  } else {
    if (auto e = matmul(p + "ffn_gate", in, act_.gate, c.n_ff, c.n_embd)) return e;
    if (auto e = matmul(p + "ffn_up", in, act_.up, c.n_ff, c.n_embd)) return e;
    push(glu, {{act_.gate}, {act_.up}}, {{act_.gate}});
  }
  return matmul(p + "ffn_down", act_.gate, out, c.n_embd, c.n_ff);
}

llvm::Error GraphBuilder::moeFfn(uint32_t layer, uint32_t in, bool norm_weights) {
  const ModelConfig& c = desc_.config;
  const std::string p = layerPrefix(layer);
  if (c.n_expert == 0 || c.n_expert_used == 0)
    return error(llvm::formatv("architecture {0} has a mixture-of-experts FFN but {0}.expert_count = {1}, "
                               "expert_used_count = {2} (both must be > 0)",
                               c.architecture, c.n_expert, c.n_expert_used));
  const uint32_t n_ff_exp = c.n_ff_exp != 0 ? c.n_ff_exp : c.n_ff / c.n_expert_used;
  if (n_ff_exp == 0) return error("expert feed-forward width is 0 (feed_forward_length / expert_used_count)");
  if (act_.router == UINT32_MAX) {
    act_.router = buffer("router", c.n_expert);
    act_.expert_ids = buffer("expert_ids", c.n_expert_used, fb::BufferType::I32);
    act_.expert_w = buffer("expert_w", c.n_expert_used);
    act_.moe_out = buffer("moe_out", c.n_embd);
  }
  if (auto e = matmul(p + "ffn_gate_inp", in, act_.router, c.n_expert, c.n_embd)) return e;
  desc_.plan.prefill.push_back({.op = fb::OpKind::MoeRoute, .inputs = {act_.router},
                                .outputs = {act_.expert_ids, act_.expert_w}, .name = p + "moe_route",
                                .n_expert = c.n_expert, .n_expert_used = c.n_expert_used, .moe_norm = norm_weights});
  StepDesc s{.op = fb::OpKind::MoeFfn, .inputs = {in, act_.expert_ids, act_.expert_w}, .outputs = {act_.moe_out},
             .rows = n_ff_exp, .cols = c.n_embd, .name = p + "moe_ffn", .n_expert = c.n_expert,
             .n_expert_used = c.n_expert_used};
  for (auto [name, ne0, ne1] : {std::tuple{"ffn_gate_exps", c.n_embd, n_ff_exp},
                                std::tuple{"ffn_up_exps", c.n_embd, n_ff_exp},
                                std::tuple{"ffn_down_exps", n_ff_exp, c.n_embd}}) {
    auto w = weight(p + name + ".weight", planes::TensorRole::kMatMul, {ne0, ne1, c.n_expert});
    if (!w) return w.takeError();
    desc_.weights[*w].experts = c.n_expert;
    s.weights.push_back(*w);
  }
  desc_.plan.prefill.push_back(std::move(s));
  return llvm::Error::success();
}

llvm::Error GraphBuilder::decoderLayer(uint32_t layer, const LayerOptions& o) {
  const Activations& a = act_;
  const std::string p = layerPrefix(layer);
  if (auto e = norm(p + "attn_norm", a.x, a.h)) return e;
  if (auto e = qkvProjection(layer, a.h, o.qkv)) return e;
  if (auto e = rope(layer, o.rope)) return e;
  if (auto e = attention(layer, a.h, o.attention)) return e;
  if (o.post_norms)
    if (auto e = norm(p + "post_attention_norm", a.h, a.h)) return e;
  residualAdd(p + "attn_residual", a.x, a.h);
  if (auto e = norm(p + "ffn_norm", a.x, a.h)) return e;
  uint32_t ffn_out = a.h;
  if (o.moe) {
    if (auto e = moeFfn(layer, a.h, o.moe_norm_weights)) return e;
    ffn_out = act_.moe_out;
  } else if (auto e = gatedFfn(layer, a.h, a.h, o.activation)) {
    return e;
  }
  if (o.post_norms)
    if (auto e = norm(p + "post_ffw_norm", ffn_out, ffn_out)) return e;
  residualAdd(p + "ffn_residual", a.x, ffn_out);
  return llvm::Error::success();
}

llvm::Error GraphBuilder::outputHead(uint32_t in) {
  const ModelConfig& c = desc_.config;
  const uint32_t normed = act_.h;
  if (auto e = norm("output_norm", in, normed)) return e;
  if (!c.tied_embeddings) return matmul("output", normed, act_.logits, c.n_vocab, c.n_embd);
  desc_.plan.prefill.push_back({.op = fb::OpKind::MatMul, .inputs = {normed}, .outputs = {act_.logits},
                                .weights = {embd_weight_}, .rows = c.n_vocab, .cols = c.n_embd,
                                .name = "output (tied to token_embd)"});
  return llvm::Error::success();
}

llvm::Error GraphBuilder::finish() {
  // Every GGUF tensor must be used: an unknown tensor means an architecture variant we do not handle.
  if (desc_.weights.size() + left_out_.size() != file_.tensors().size()) {
    for (const gguf::TensorInfo& t : file_.tensors()) {
      bool used = false;
      for (const WeightDesc& w : desc_.weights) used |= w.info == &t;
      for (const gguf::TensorInfo* l : left_out_) used |= l == &t;
      if (!used)
        return makeError(llvm::formatv("{0}: tensor '{1}' is not used by the {2} architecture as minfer knows it",
                                       file_.fileName(), t.name, desc_.config.architecture));
    }
  }
  // The CPU and the first GPU path run the same step list for one token and for many.
  desc_.plan.decode = desc_.plan.prefill;
  return llvm::Error::success();
}

}  // namespace minfer::model
