// Kernel specializations per plan step (see kernel_spec.h).
#include "compiler/codegen/kernel_spec.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "kernels/attention.cuh"
#include "kernels/mmq.cuh"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::codegen {
namespace {

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

// Builds a spec field by field: define() appends -D constants in order.
struct SpecBuilder {
  KernelSpec spec;
  SpecBuilder(std::string key, const char* source, const char* entry) {
    spec.key = std::move(key);
    spec.source = source;
    spec.entry = entry;
  }
  SpecBuilder& define(const char* name, uint64_t v) { return define(name, std::to_string(v)); }
  SpecBuilder& define(const char* name, int64_t v) { return define(name, std::to_string(v)); }
  SpecBuilder& define(const char* name, std::string v) {
    spec.defines.emplace_back(name, std::move(v));
    return *this;
  }
  SpecBuilder& flag(const char* f) {
    spec.flags.emplace_back(f);
    return *this;
  }
};

// A number for a key: %g without '+' ("1e-05", "1e06", "10000", "0.5").
std::string keyNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  std::string s;
  for (const char* p = buf; *p; ++p)
    if (*p != '+') s += *p;
  return s;
}

const StrideTable* findPlane(const planes::TensorLayout& layout, PlaneKind kind) {
  const int i = layout.find(kind);
  return i < 0 ? nullptr : &layout.planes[static_cast<size_t>(i)];
}

const char* denseTag(PlaneKind kind) {
  switch (kind) {
    case PlaneKind::kF32: return "f32";
    case PlaneKind::kF16: return "f16";
    case PlaneKind::kBF16: return "bf16";
    default: return "?";
  }
}

// The dense float plane of a layout (F32 / F16 / BF16), or nullptr.
const StrideTable* densePlane(const planes::TensorLayout& layout) {
  for (PlaneKind k : {PlaneKind::kF32, PlaneKind::kF16, PlaneKind::kBF16})
    if (const StrideTable* t = findPlane(layout, k)) return t;
  return nullptr;
}

class StepSpecializer {
 public:
  StepSpecializer(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                  PlanVariant variant, size_t index)
      : desc_(desc),
        layouts_(layouts),
        variant_(variant),
        index_(index),
        step_((variant == PlanVariant::kPrefill ? desc.plan.prefill : desc.plan.decode)[index]) {}

  llvm::Expected<std::vector<KernelSpec>> run() {
    switch (step_.op) {
      case fb::OpKind::Embed: return embed();
      case fb::OpKind::RmsNorm: return rmsNorm();
      case fb::OpKind::HeadRmsNorm: return headRmsNorm();
      case fb::OpKind::QuantizeAct: return quantizeAct();
      case fb::OpKind::MatMul: return matmul();
      case fb::OpKind::Rope: return rope();
      case fb::OpKind::Attention: return attention();
      case fb::OpKind::SwiGlu: return elementwise(1, "swiglu");
      case fb::OpKind::Add: return elementwise(2, "add");
    }
    return error(llvm::formatv("unknown op kind {0}", static_cast<unsigned>(step_.op)));
  }

 private:
  llvm::Error error(const llvm::Twine& what) const {
    return makeError(llvm::formatv("{0} plan step {1} ('{2}'): ", variant_ == PlanVariant::kPrefill ? "prefill" : "decode",
                                   index_, step_.name) +
                     what);
  }

  llvm::Expected<const model::BufferDesc*> buffer(const std::vector<uint32_t>& ids, size_t i, const char* what) const {
    if (i >= ids.size() || ids[i] >= desc_.plan.buffers.size())
      return error(llvm::formatv("{0} buffer #{1} is missing or out of range", what, i));
    return &desc_.plan.buffers[ids[i]];
  }

  llvm::Expected<const planes::TensorLayout*> weight(size_t i) const {
    if (i >= step_.weights.size() || step_.weights[i] >= layouts_.size())
      return error(llvm::formatv("weight #{0} is missing or out of range", i));
    return &layouts_[step_.weights[i]];
  }

  // The f32 vector plane (norm weight, bias) of weight #i, checked to hold `n` values.
  llvm::Expected<const StrideTable*> vector(size_t i, uint64_t n) const {
    auto w = weight(i);
    if (!w) return w.takeError();
    const StrideTable* t = findPlane(**w, PlaneKind::kF32);
    if (!t || t->rows * t->cols != n)
      return error(llvm::formatv("weight '{0}' needs an f32 plane of {1} values", (*w)->desc.name, n));
    return t;
  }

  llvm::Expected<std::vector<KernelSpec>> embed() {
    auto w = weight(0);
    if (!w) return w.takeError();
    auto out = buffer(step_.outputs, 0, "output");
    if (!out) return out.takeError();
    const planes::TensorLayout& l = **w;
    const StrideTable* t = findPlane(l, PlaneKind::kBlocks);
    if (!t) t = densePlane(l);
    if (!t) return error(llvm::formatv("'{0}' has neither a kBlocks nor a dense plane to gather from", l.desc.name));
    if ((*out)->width != t->cols)
      return error(llvm::formatv("output width {0} != embedding width {1}", (*out)->width, t->cols));
    const bool blocks = t->kind == PlaneKind::kBlocks;
    SpecBuilder b(llvm::formatv("embed_{0}_{1}_n{2}", blocks ? "blocks" : denseTag(t->kind), typeTag(t->ggml_type),
                                t->cols),
                  "kernels/embed.cuh", "minfer_embed");
    b.define("EMBED_PLANE", static_cast<uint64_t>(t->kind))
        .define("EMBED_TYPE", static_cast<uint64_t>(t->ggml_type))
        .define("EMBED_COLS", t->cols)
        .define("EMBED_ROW_PITCH", t->row_pitch)
        .define("EMBED_GROUP_SIZE", static_cast<uint64_t>(t->group_size))
        .define("EMBED_GROUP_PITCH", static_cast<uint64_t>(t->group_pitch))
        .flag("--fmad=false");  // dequantizeBlock bit-identical to the CPU
    return std::vector<KernelSpec>{b.spec};
  }

  llvm::Expected<std::vector<KernelSpec>> rmsNorm() {
    auto in = buffer(step_.inputs, 0, "input");
    if (!in) return in.takeError();
    auto out = buffer(step_.outputs, 0, "output");
    if (!out) return out.takeError();
    const uint32_t width = (*in)->width;
    if ((*out)->width != width) return error(llvm::formatv("input width {0} != output width {1}", width, (*out)->width));
    if (auto v = vector(0, width); !v) return v.takeError();
    SpecBuilder b(llvm::formatv("rms_norm_w{0}_eps{1}", width, keyNumber(step_.eps)), "kernels/rms_norm.cuh",
                  "minfer_rms_norm");
    b.define("RMS_WIDTH", static_cast<uint64_t>(width)).define("RMS_EPS", floatLiteral(step_.eps));
    return std::vector<KernelSpec>{b.spec};
  }

  llvm::Expected<std::vector<KernelSpec>> headRmsNorm() {
    auto in = buffer(step_.inputs, 0, "input");
    if (!in) return in.takeError();
    if (step_.n_head == 0 || step_.head_dim == 0 || (*in)->width != step_.n_head * step_.head_dim)
      return error(llvm::formatv("buffer width {0} != n_head {1} × head_dim {2}", (*in)->width, step_.n_head,
                                 step_.head_dim));
    if (auto v = vector(0, step_.head_dim); !v) return v.takeError();
    SpecBuilder b(llvm::formatv("head_rms_norm_h{0}_d{1}_eps{2}", step_.n_head, step_.head_dim, keyNumber(step_.eps)),
                  "kernels/rms_norm.cuh", "minfer_head_rms_norm");
    b.define("HRMS_NHEAD", static_cast<uint64_t>(step_.n_head))
        .define("HRMS_HEAD_DIM", static_cast<uint64_t>(step_.head_dim))
        .define("HRMS_EPS", floatLiteral(step_.eps));
    return std::vector<KernelSpec>{b.spec};
  }

  llvm::Expected<std::vector<KernelSpec>> quantizeAct() {
    auto in = buffer(step_.inputs, 0, "input");
    if (!in) return in.takeError();
    auto out = buffer(step_.outputs, 0, "output");
    if (!out) return out.takeError();
    const uint32_t k = (*in)->width;
    if (k % 32 != 0 || (*out)->width != k || (*out)->type != fb::BufferType::I8)
      return error(llvm::formatv("quantizes a width-{0} buffer into a width-{1} buffer; both must match, be a "
                                 "multiple of 32, and the output must be I8",
                                 k, (*out)->width));
    SpecBuilder b(llvm::formatv("quantize_act_k{0}", k), "kernels/quantize_act.cuh", "minfer_quantize_act");
    b.define("QA_K", static_cast<uint64_t>(k));
    return std::vector<KernelSpec>{b.spec};
  }

  llvm::Expected<std::vector<KernelSpec>> matmul() {
    auto w = weight(0);
    if (!w) return w.takeError();
    const planes::TensorLayout& l = **w;
    auto in = buffer(step_.inputs, 0, "input");
    if (!in) return in.takeError();
    auto out = buffer(step_.outputs, 0, "output");
    if (!out) return out.takeError();
    const uint64_t n = l.desc.rows, k = l.desc.cols;
    if ((*in)->width != k || (*out)->width != n)
      return error(llvm::formatv("'{0}' is {1} × {2} but the input is {3} wide and the output {4}", l.desc.name, n, k,
                                 (*in)->width, (*out)->width));
    const bool bias = step_.weights.size() > 1;
    if (bias)
      if (auto v = vector(1, n); !v) return v.takeError();
    const std::string bias_tag = bias ? "_bias" : "";
    const std::string type = typeTag(static_cast<uint32_t>(l.desc.type));

    const StrideTable* q = findPlane(l, PlaneKind::kI8);
    if (!q) {
      const StrideTable* d = densePlane(l);
      if (!d) return error(llvm::formatv("'{0}' has neither a kI8 nor a dense plane", l.desc.name));
      const bool prefill = variant_ == PlanVariant::kPrefill;
      SpecBuilder b(llvm::formatv("{0}_{1}_n{2}_k{3}{4}", prefill ? "dense_mm" : "dense_gemv", denseTag(d->kind), n, k,
                                  bias_tag),
                    "kernels/dense_matmul.cuh", prefill ? "minfer_dense_mm" : "minfer_dense_gemv");
      const char* p = prefill ? "DMM_" : "DGEMV_";
      b.define((std::string(p) + "N").c_str(), n)
          .define((std::string(p) + "K").c_str(), k)
          .define((std::string(p) + "PLANE").c_str(), static_cast<uint64_t>(d->kind))
          .define((std::string(p) + "PITCH").c_str(), d->row_pitch)
          .define((std::string(p) + "HAS_BIAS").c_str(), static_cast<uint64_t>(bias));
      return std::vector<KernelSpec>{b.spec};
    }

    // Quantized: the q8 activations are the step's second input (QuantizeAct wrote them).
    auto qin = buffer(step_.inputs, 1, "quantized input");
    if (!qin) return qin.takeError();
    if ((*qin)->type != fb::BufferType::I8 || (*qin)->width != k)
      return error(llvm::formatv("the quantized input '{0}' must be an I8 buffer of width {1}", (*qin)->name, k));
    const StrideTable* s = findPlane(l, PlaneKind::kScale);
    const StrideTable* m = findPlane(l, PlaneKind::kMin);
    if (!s) return error(llvm::formatv("'{0}' has a kI8 plane without a kScale plane", l.desc.name));
    if (k % 32 != 0 || (s->group_size != 16 && s->group_size != 32) || s->group_pitch != 4 ||
        (m && (m->group_size != s->group_size || m->group_pitch != 4)) || q->row_pitch % 16 != 0)
      return error(llvm::formatv("'{0}': unsupported geometry (cols {1}, group {2}, group pitch {3}, kI8 pitch {4})",
                                 l.desc.name, k, s->group_size, s->group_pitch, q->row_pitch));
    const uint64_t has_min = m ? 1 : 0;
    if (variant_ == PlanVariant::kPrefill) {
      const auto [tm, tn] = chooseMmqTile(n, k);
      SpecBuilder b(llvm::formatv("mmq_i8_{0}_n{1}_k{2}_tm{3}_tn{4}{5}", type, n, k, tm, tn, bias_tag),
                    "kernels/mmq.cuh", "minfer_mmq");
      b.define("MMQ_N", n)
          .define("MMQ_K", k)
          .define("MMQ_GROUP", static_cast<uint64_t>(s->group_size))
          .define("MMQ_HAS_MIN", has_min)
          .define("MMQ_HAS_BIAS", static_cast<uint64_t>(bias))
          .define("MMQ_Q_PITCH", q->row_pitch)
          .define("MMQ_S_PITCH", s->row_pitch)
          .define("MMQ_M_PITCH", m ? m->row_pitch : 0)
          .define("MMQ_TM", static_cast<uint64_t>(tm))
          .define("MMQ_TN", static_cast<uint64_t>(tn));
      return std::vector<KernelSpec>{b.spec};
    }
    const StrideTable* packed = findPlane(l, PlaneKind::kPacked);
    const bool four = packed && packed->bits == 4 && s->group_size == 32 && packed->row_pitch % 16 == 0;
    const StrideTable* read = four ? packed : q;
    SpecBuilder b(llvm::formatv("gemv_{0}_{1}_n{2}_k{3}{4}", four ? "packed4" : "i8", type, n, k, bias_tag),
                  "kernels/gemv.cuh", "minfer_gemv");
    b.define("GEMV_N", n)
        .define("GEMV_K", k)
        .define("GEMV_BITS", static_cast<uint64_t>(four ? 4 : 8))
        .define("GEMV_PITCH", read->row_pitch)
        .define("GEMV_Q_OFFSET", static_cast<int64_t>(four ? packed->q_offset : 0))
        .define("GEMV_GROUP", static_cast<uint64_t>(s->group_size))
        .define("GEMV_S_PITCH", s->row_pitch)
        .define("GEMV_HAS_MIN", has_min)
        .define("GEMV_M_PITCH", m ? m->row_pitch : 0)
        .define("GEMV_HAS_BIAS", static_cast<uint64_t>(bias));
    return std::vector<KernelSpec>{b.spec};
  }

  llvm::Error checkHeads(uint32_t q_width, uint32_t kv_width) const {
    const uint32_t h = step_.n_head, hkv = step_.n_head_kv, d = step_.head_dim;
    if (h == 0 || hkv == 0 || d == 0 || h % hkv != 0 || d > 256 || q_width != h * d || kv_width != hkv * d)
      return error(llvm::formatv("heads {0}, kv heads {1}, head_dim {2} do not fit buffers of width {3} and {4} "
                                 "(need n_head % n_head_kv == 0 and head_dim ≤ 256)",
                                 h, hkv, d, q_width, kv_width));
    return llvm::Error::success();
  }

  llvm::Expected<std::vector<KernelSpec>> rope() {
    auto q = buffer(step_.inputs, 0, "q");
    if (!q) return q.takeError();
    auto k = buffer(step_.inputs, 1, "k");
    if (!k) return k.takeError();
    if (auto e = checkHeads((*q)->width, (*k)->width)) return e;
    if (step_.n_rot % 2 != 0 || step_.n_rot > step_.head_dim || step_.n_rot == 0)
      return error(llvm::formatv("n_rot {0} must be even and in 2..head_dim {1}", step_.n_rot, step_.head_dim));
    const bool neox = step_.rope_style == fb::RopeStyle::Neox;
    std::string key = llvm::formatv("rope_{0}_h{1}_hkv{2}_d{3}_r{4}_b{5}", neox ? "neox" : "norm", step_.n_head,
                                    step_.n_head_kv, step_.head_dim, step_.n_rot, keyNumber(step_.rope_freq_base));
    if (step_.rope_freq_scale != 1.0f) key += "_s" + keyNumber(step_.rope_freq_scale);
    SpecBuilder b(key, "kernels/rope.cuh", "minfer_rope");
    b.define("ROPE_NHEAD", static_cast<uint64_t>(step_.n_head))
        .define("ROPE_NHEAD_KV", static_cast<uint64_t>(step_.n_head_kv))
        .define("ROPE_HEAD_DIM", static_cast<uint64_t>(step_.head_dim))
        .define("ROPE_NROT", static_cast<uint64_t>(step_.n_rot))
        .define("ROPE_NEOX", static_cast<uint64_t>(neox))
        .define("ROPE_BASE", floatLiteral(step_.rope_freq_base))
        .define("ROPE_SCALE", floatLiteral(step_.rope_freq_scale))
        .flag("--fmad=false");  // rotation rounded like the CPU reference
    return std::vector<KernelSpec>{b.spec};
  }

  llvm::Expected<std::vector<KernelSpec>> attention() {
    auto q = buffer(step_.inputs, 0, "q");
    if (!q) return q.takeError();
    auto k = buffer(step_.inputs, 1, "k");
    if (!k) return k.takeError();
    auto v = buffer(step_.inputs, 2, "v");
    if (!v) return v.takeError();
    auto out = buffer(step_.outputs, 0, "output");
    if (!out) return out.takeError();
    if (auto e = checkHeads((*q)->width, (*k)->width)) return e;
    if ((*v)->width != (*k)->width || (*out)->width != (*q)->width)
      return error(llvm::formatv("v width {0} must equal k width {1} and output width {2} q width {3}", (*v)->width,
                                 (*k)->width, (*out)->width, (*q)->width));
    if (step_.layer < 0) return error("attention step without a KV cache layer");
    const uint32_t h = step_.n_head, hkv = step_.n_head_kv, d = step_.head_dim;
    auto heads = [&](SpecBuilder& b) -> SpecBuilder& {
      return b.define("ATT_NHEAD", static_cast<uint64_t>(h))
          .define("ATT_NHEAD_KV", static_cast<uint64_t>(hkv))
          .define("ATT_HEAD_DIM", static_cast<uint64_t>(d));
    };
    std::vector<KernelSpec> specs;
    SpecBuilder store(llvm::formatv("kv_store_hkv{0}_d{1}", hkv, d), "kernels/attention.cuh", "minfer_kv_store");
    heads(store).define("ATT_KV_STORE", uint64_t{1});
    specs.push_back(store.spec);
    if (variant_ == PlanVariant::kPrefill) {
      SpecBuilder b(llvm::formatv("attn_prefill_h{0}_hkv{1}_d{2}", h, hkv, d), "kernels/attention.cuh",
                    "minfer_attn_prefill");
      heads(b).define("ATT_PREFILL", uint64_t{1});
      specs.push_back(b.spec);
    } else {
      SpecBuilder b(llvm::formatv("attn_decode_h{0}_hkv{1}_d{2}_s{3}", h, hkv, d, kAttnDecodeSplits),
                    "kernels/attention.cuh", "minfer_attn_decode");
      heads(b).define("ATT_SPLITS", static_cast<uint64_t>(kAttnDecodeSplits)).define("ATT_DECODE", uint64_t{1});
      specs.push_back(b.spec);
      SpecBuilder c(llvm::formatv("attn_combine_h{0}_d{1}_s{2}", h, d, kAttnDecodeSplits), "kernels/attention.cuh",
                    "minfer_attn_combine");
      heads(c).define("ATT_SPLITS", static_cast<uint64_t>(kAttnDecodeSplits)).define("ATT_COMBINE", uint64_t{1});
      specs.push_back(c.spec);
    }
    return specs;
  }

  llvm::Expected<std::vector<KernelSpec>> elementwise(int op, const char* name) {
    auto a = buffer(step_.inputs, 0, "first input");
    if (!a) return a.takeError();
    auto b2 = buffer(step_.inputs, 1, "second input");
    if (!b2) return b2.takeError();
    auto out = buffer(step_.outputs, 0, "output");
    if (!out) return out.takeError();
    const uint32_t w = (*a)->width;
    if ((*b2)->width != w || (*out)->width != w)
      return error(llvm::formatv("widths {0}, {1} → {2} differ", w, (*b2)->width, (*out)->width));
    SpecBuilder b(llvm::formatv("{0}_w{1}", name, w), "kernels/elementwise.cuh",
                  op == 1 ? "minfer_swiglu" : "minfer_add");
    b.define("EW_WIDTH", static_cast<uint64_t>(w)).define("EW_OP", static_cast<uint64_t>(op));
    return std::vector<KernelSpec>{b.spec};
  }

  const model::ModelDescription& desc_;
  llvm::ArrayRef<planes::TensorLayout> layouts_;
  PlanVariant variant_;
  size_t index_;
  const model::StepDesc& step_;
};

}  // namespace

std::string KernelSpec::identity() const {
  std::string s = source + '\n' + entry + '\n';
  for (const auto& [name, value] : defines) s += "-D" + name + "=" + value + '\n';
  for (const std::string& f : flags) s += f + '\n';
  s += inline_source;
  return s;
}

std::string KernelSpec::define(const std::string& name) const {
  for (const auto& [n, v] : defines)
    if (n == name) return v;
  return "";
}

llvm::Expected<std::vector<KernelSpec>> specsForStep(const model::ModelDescription& desc,
                                                     llvm::ArrayRef<planes::TensorLayout> layouts,
                                                     PlanVariant variant, size_t step_index) {
  const auto& steps = variant == PlanVariant::kPrefill ? desc.plan.prefill : desc.plan.decode;
  if (step_index >= steps.size())
    return makeError(llvm::formatv("plan step {0} out of range ({1} steps)", step_index, steps.size()));
  return StepSpecializer(desc, layouts, variant, step_index).run();
}

KernelSpec argmaxSpec(uint32_t n_vocab) {
  SpecBuilder b(llvm::formatv("argmax_n{0}", n_vocab), "kernels/argmax.cuh", "minfer_argmax");
  b.define("AM_N", static_cast<uint64_t>(n_vocab));
  return b.spec;
}

std::pair<unsigned, unsigned> chooseMmqTile(uint64_t n, uint64_t /*k*/) {
  const unsigned tm = n >= 1024 ? 128 : 64, tn = 64;
  static_assert(kern::kMmqThreads == 256, "tile choice assumes 8 warps");
  return {tm, tn};
}

std::string typeTag(uint32_t ggml_type) {
  std::string s;
  for (const char* p = ggmlTypeTraits(ggml_type).name; *p; ++p)
    if (*p != '_') s += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  return s;
}

std::string floatLiteral(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "10000" → "10000.0" ("inf"/"nan" have 'n')
  return s + "f";
}

}  // namespace minfer::codegen
