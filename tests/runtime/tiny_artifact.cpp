// A tiny random transformer as a hand-built .mfb artifact, and its float64 reference forward pass.
#include "tests/runtime/tiny_artifact.h"

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/artifact/artifact_writer.h"
#include "minfer/artifact.h"

namespace minfer::test {
namespace {

RandomWeight vectorWeight(uint64_t n, std::mt19937_64& rng, float center, float spread) {
  RandomWeight w;
  w.type = GgmlType::F32;
  w.rows = 1;
  w.cols = n;
  w.values = randomFloats(n, rng, center - spread, center + spread);
  w.source.resize(n * 4);
  std::memcpy(w.source.data(), w.values.data(), n * 4);
  return w;
}

std::vector<std::string> spmTokens() {
  std::vector<std::string> t = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    t.push_back(buf);
  }
  for (const char* w : {"\u2581a", "\u2581the", "\u2581cat", "\u2581dog", "\u2581sat", "\u2581on", "\u2581mat",
                        "\u2581and", "\u2581ran", "at", "he", "\u2581", "."})
    t.push_back(w);
  return t;
}

// Plan description before serialization (mirrors compiler/model's StepDesc).
struct StepSpec {
  fb::OpKind op;
  std::vector<uint32_t> in, out, w;
  int32_t layer = -1;
  float eps = 0;
  uint32_t n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0, rows = 0, cols = 0;
  std::string name;
};

struct BufferSpec {
  std::string name;
  uint32_t width;
  fb::BufferType type;
};

}  // namespace

int TinyModel::find(const std::string& name) const {
  for (size_t i = 0; i < weights.size(); ++i)
    if (weights[i].name == name) return static_cast<int>(i);
  return -1;
}

TinyModel makeTinyModel(const TinySpec& s) {
  TinyModel m;
  m.spec = s;
  m.tokens = spmTokens();
  m.n_vocab = static_cast<uint32_t>(m.tokens.size());
  std::mt19937_64 rng(s.seed);
  const uint32_t qw = s.n_head * s.head_dim, kvw = s.n_head_kv * s.head_dim;
  auto matrix = [&](const std::string& name, GgmlType type, uint64_t rows, uint64_t cols) {
    m.weights.push_back({name, makeRandomWeight(type, rows, cols, rng, 0.1f), false});
  };
  auto vec = [&](const std::string& name, uint64_t n, float center, float spread) {
    m.weights.push_back({name, vectorWeight(n, rng, center, spread), true});
  };
  matrix("token_embd.weight", s.embd, m.n_vocab, s.n_embd);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    vec(b + "attn_norm.weight", s.n_embd, 1.0f, 0.2f);
    matrix(b + "attn_q.weight", s.wq, qw, s.n_embd);
    matrix(b + "attn_k.weight", s.wk, kvw, s.n_embd);
    matrix(b + "attn_v.weight", s.wv, kvw, s.n_embd);
    if (s.qkv_bias) {
      vec(b + "attn_q.bias", qw, 0.0f, 0.1f);
      vec(b + "attn_k.bias", kvw, 0.0f, 0.1f);
      vec(b + "attn_v.bias", kvw, 0.0f, 0.1f);
    }
    if (s.qk_norm) {
      vec(b + "attn_q_norm.weight", s.head_dim, 1.0f, 0.2f);
      vec(b + "attn_k_norm.weight", s.head_dim, 1.0f, 0.2f);
    }
    matrix(b + "attn_output.weight", s.wo, s.n_embd, qw);
    vec(b + "ffn_norm.weight", s.n_embd, 1.0f, 0.2f);
    matrix(b + "ffn_gate.weight", s.gate, s.n_ff, s.n_embd);
    matrix(b + "ffn_up.weight", s.up, s.n_ff, s.n_embd);
    matrix(b + "ffn_down.weight", l == 0 ? s.down0 : s.down1, s.n_embd, s.n_ff);
  }
  vec("output_norm.weight", s.n_embd, 1.0f, 0.2f);
  if (!s.tied) matrix("output.weight", s.output, m.n_vocab, s.n_embd);
  return m;
}

std::string writeTinyArtifact(const TinyModel& m, const std::string& path) {
  const TinySpec& s = m.spec;
  const uint32_t qw = s.n_head * s.head_dim, kvw = s.n_head_kv * s.head_dim;

  // Planes of every tensor.
  std::vector<std::vector<BuiltPlane>> planes;
  for (const TinyWeight& tw : m.weights) {
    const bool is_embd = tw.name == "token_embd.weight";
    const bool quantized = ggmlTypeTraits(tw.w.type).block_size > 1;
    PlaneOptions o;
    o.blocks = is_embd && quantized;
    o.matmul = !(is_embd && quantized) || s.tied;
    o.extra_pitch = tw.vector ? 0 : 16;
    planes.push_back(buildPlanes(tw.w, o));
    if (tw.vector) {  // exact 1 × n f32 plane, as the layout planner makes for vectors
      planes.back()[0].table.row_pitch = alignUp(tw.w.cols * 4, kPlaneRowAlign);
      planes.back()[0].bytes.resize(planes.back()[0].table.row_pitch, 0);
    }
    if (s.gpu_extras && (tw.w.type == GgmlType::Q4_0 || tw.w.type == GgmlType::Q4_K) && !is_embd) {
      BuiltPlane p;  // decode-GEMV plane: the CPU must ignore it (random bytes)
      p.table.kind = PlaneKind::kPacked;
      p.table.elem = ElemType::kU8;
      p.table.rows = tw.w.rows;
      p.table.cols = tw.w.cols;
      p.table.row_pitch = alignUp(tw.w.cols / 2, kPlaneRowAlign);
      p.table.bits = 4;
      p.table.q_offset = tw.w.type == GgmlType::Q4_0 ? -8 : 0;
      p.table.ggml_type = static_cast<uint32_t>(tw.w.type);
      p.bytes.assign(p.table.bytes(), 0x5A);
      planes.back().push_back(std::move(p));
    }
    if (s.defect == TinySpec::Defect::kNoScalePlane && tw.name == "blk.0.attn_k.weight")
      for (size_t i = 0; i < planes.back().size(); ++i)
        if (planes.back()[i].table.kind == PlaneKind::kScale) planes.back().erase(planes.back().begin() + i);
  }

  // Buffers and steps.
  std::vector<BufferSpec> buffers;
  auto buffer = [&](const char* name, uint32_t width, fb::BufferType type = fb::BufferType::F32) {
    buffers.push_back({name, width, type});
    return static_cast<uint32_t>(buffers.size() - 1);
  };
  const uint32_t ids = buffer("ids", 1, fb::BufferType::I32), x = buffer("x", s.n_embd), h = buffer("h", s.n_embd);
  const uint32_t q = buffer("q", qw), k = buffer("k", kvw), v = buffer("v", kvw), attn = buffer("attn", qw);
  const uint32_t gate = buffer("gate", s.n_ff), up = buffer("up", s.n_ff), logits = buffer("logits", m.n_vocab);
  const uint32_t h_q8 = s.gpu_extras ? buffer("h_q8", s.n_embd, fb::BufferType::I8) : 0;
  if (s.defect == TinySpec::Defect::kBufferWidth) buffers[up].width = s.n_ff + 1;

  auto widx = [&](const std::string& name) { return static_cast<uint32_t>(m.find(name)); };
  std::vector<StepSpec> steps;
  steps.push_back({.op = fb::OpKind::Embed, .in = {ids}, .out = {x}, .w = {widx("token_embd.weight")}, .name = "token_embd"});
  auto matmul = [&](const std::string& base, uint32_t in, uint32_t out, uint32_t rows, uint32_t cols, bool bias) {
    StepSpec st{.op = fb::OpKind::MatMul, .in = {in}, .out = {out}, .w = {widx(base + ".weight")}, .rows = rows,
                .cols = cols, .name = base};
    if (bias) st.w.push_back(widx(base + ".bias"));
    if (s.gpu_extras && in == h) st.in.push_back(h_q8);
    steps.push_back(st);
  };
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    steps.push_back({.op = fb::OpKind::RmsNorm, .in = {x}, .out = {h}, .w = {widx(b + "attn_norm.weight")}, .eps = s.eps,
                     .name = b + "attn_norm"});
    if (s.gpu_extras)
      steps.push_back({.op = fb::OpKind::QuantizeAct, .in = {h}, .out = {h_q8}, .name = b + "quantize_h"});
    matmul(b + "attn_q", h, q, s.defect == TinySpec::Defect::kMatMulRows && l == 1 ? qw + 32 : qw, s.n_embd, s.qkv_bias);
    matmul(b + "attn_k", h, k, kvw, s.n_embd, s.qkv_bias);
    matmul(b + "attn_v", h, v, kvw, s.n_embd, s.qkv_bias);
    if (s.qk_norm) {
      steps.push_back({.op = fb::OpKind::HeadRmsNorm, .in = {q}, .out = {q}, .w = {widx(b + "attn_q_norm.weight")},
                       .eps = s.eps, .n_head = s.n_head, .head_dim = s.head_dim, .name = b + "attn_q_norm"});
      steps.push_back({.op = fb::OpKind::HeadRmsNorm, .in = {k}, .out = {k}, .w = {widx(b + "attn_k_norm.weight")},
                       .eps = s.eps, .n_head = s.n_head_kv, .head_dim = s.head_dim, .name = b + "attn_k_norm"});
    }
    steps.push_back({.op = fb::OpKind::Rope, .in = {q, k}, .out = {q, k}, .n_head = s.n_head, .n_head_kv = s.n_head_kv,
                     .head_dim = s.head_dim, .n_rot = s.n_rot, .name = b + "rope"});
    steps.push_back({.op = fb::OpKind::Attention, .in = {q, k, v}, .out = {attn}, .layer = static_cast<int32_t>(l),
                     .n_head = s.n_head, .n_head_kv = s.n_head_kv, .head_dim = s.head_dim, .name = b + "attention"});
    matmul(b + "attn_output", attn, h, s.n_embd, qw, false);
    steps.push_back({.op = fb::OpKind::Add, .in = {x, h}, .out = {x}, .name = b + "attn_residual"});
    steps.push_back({.op = fb::OpKind::RmsNorm, .in = {x}, .out = {h}, .w = {widx(b + "ffn_norm.weight")}, .eps = s.eps,
                     .name = b + "ffn_norm"});
    matmul(b + "ffn_gate", h, gate, s.n_ff, s.n_embd, false);
    matmul(b + "ffn_up", h, up, s.n_ff, s.n_embd, false);
    steps.push_back({.op = fb::OpKind::SwiGlu, .in = {gate, up}, .out = {gate}, .name = b + "swiglu"});
    matmul(b + "ffn_down", gate, h, s.n_embd, s.n_ff, false);
    steps.push_back({.op = fb::OpKind::Add, .in = {x, h}, .out = {x}, .name = b + "ffn_residual"});
  }
  steps.push_back({.op = fb::OpKind::RmsNorm, .in = {x}, .out = {h}, .w = {widx("output_norm.weight")}, .eps = s.eps,
                   .name = "output_norm"});
  matmul(s.tied ? "token_embd" : "output", h, logits, m.n_vocab, s.n_embd, false);
  if (s.defect == TinySpec::Defect::kOpKind) steps[1].op = fb::OpKind::SwiGlu;  // the first RmsNorm: 1 input, not 2

  // Segments: one per plane, in tensor order.
  auto writer_or = artifact::ArtifactWriter::create(path);
  if (!writer_or) return llvm::toString(writer_or.takeError());
  artifact::ArtifactWriter& writer = **writer_or;
  std::vector<std::vector<artifact::SegmentId>> seg(planes.size());
  for (size_t t = 0; t < planes.size(); ++t)
    for (const BuiltPlane& p : planes[t]) seg[t].push_back(writer.reserveSegment(p.bytes.size()));

  auto build = [&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
    for (size_t t = 0; t < planes.size(); ++t) {
      std::vector<flatbuffers::Offset<fb::Plane>> ps;
      for (size_t j = 0; j < planes[t].size(); ++j) {
        const StrideTable& st = planes[t][j].table;
        auto layout = fb::CreateStrideTable(fbb, static_cast<uint8_t>(st.kind), static_cast<uint8_t>(st.elem), st.rows,
                                            st.cols, st.row_pitch, st.group_size, st.group_pitch, st.bits, st.q_offset,
                                            st.ggml_type);
        const fb::Segment sg = writer.segment(seg[t][j]);
        ps.push_back(fb::CreatePlane(fbb, layout, &sg));
      }
      const TinyWeight& tw = m.weights[t];
      std::vector<uint64_t> ne = tw.vector ? std::vector<uint64_t>{tw.w.cols} : std::vector<uint64_t>{tw.w.cols, tw.w.rows};
      tensors.push_back(fb::CreateTensorDirect(fbb, tw.name.c_str(), static_cast<uint32_t>(tw.w.type), &ne, &ps));
    }
    auto config = fb::CreateModelConfigDirect(fbb, s.arch.c_str(), "tiny-test", s.n_embd, s.n_layer, s.n_head,
                                              s.n_head_kv, s.head_dim, s.n_ff, m.n_vocab, 128, s.n_rot, s.rope_style,
                                              s.rope_base, s.rope_scale, fb::RopeScaling::None, s.eps, s.tied);
    std::vector<flatbuffers::Offset<flatbuffers::String>> toks;
    std::vector<float> scores;
    std::vector<int32_t> types;
    for (size_t i = 0; i < m.tokens.size(); ++i) {
      toks.push_back(fbb.CreateString(m.tokens[i]));
      scores.push_back(i < 259 ? 0.0f : -static_cast<float>(i - 258));
      types.push_back(i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    }
    auto tokenizer = fb::CreateTokenizerDirect(fbb, fb::TokenizerModel::Spm, "llama", "default", &toks, &scores, &types,
                                               nullptr, 1, s.eos_id, 0, -1, true, false, true);
    std::vector<flatbuffers::Offset<fb::Step>> fsteps;
    for (const StepSpec& st : steps)
      fsteps.push_back(fb::CreateStepDirect(fbb, st.op, &st.in, &st.out, &st.w, st.layer, st.eps, st.n_head,
                                            st.n_head_kv, st.head_dim, st.n_rot, s.rope_style, s.rope_base,
                                            s.rope_scale, st.rows, st.cols, st.name.c_str()));
    auto plan_p = fb::CreatePlanDirect(fbb, &fsteps);
    auto plan_d = fb::CreatePlanDirect(fbb, &fsteps);
    std::vector<flatbuffers::Offset<fb::Buffer>> fbufs;
    for (const BufferSpec& b : buffers) fbufs.push_back(fb::CreateBufferDirect(fbb, b.name.c_str(), b.width, b.type));
    auto memory = fb::CreateMemoryPlanDirect(fbb, s.max_batch, &fbufs, ids, logits,
                                             uint64_t{4} * s.n_layer * kvw);
    const fb::Segment check(0, 0, 0);
    auto root = fb::CreateArtifactDirect(fbb, kArtifactFormatMajor, kArtifactFormatMinor, "minfer-tests", "0", 0, config, tokenizer, &tensors, nullptr,
                                         plan_p, plan_d, memory, nullptr, &check);
    fb::FinishSizePrefixedArtifactBuffer(fbb, root);
  };
  {
    flatbuffers::FlatBufferBuilder fbb;
    build(fbb);
    if (auto e = writer.layout(fbb.GetSize())) return llvm::toString(std::move(e));
  }
  for (size_t t = 0; t < planes.size(); ++t)
    for (size_t j = 0; j < planes[t].size(); ++j)
      if (auto e = writer.writeSegment(seg[t][j], planes[t][j].bytes)) return llvm::toString(std::move(e));
  flatbuffers::FlatBufferBuilder fbb;
  build(fbb);
  if (auto e = writer.commit(llvm::ArrayRef<uint8_t>(fbb.GetBufferPointer(), fbb.GetSize())))
    return llvm::toString(std::move(e));
  return "";
}

// ---------------------------------------------------------------------------------------------
// Float64 reference (fixtures/README.md §3, plus per-head q/k RMSNorm and partial RoPE).

namespace {

using Vec = std::vector<double>;

Vec matvec(const RandomWeight& w, const Vec& x, const RandomWeight* bias) {
  Vec y(w.rows, 0.0);
  for (uint64_t r = 0; r < w.rows; ++r) {
    double acc = bias ? bias->values[r] : 0.0;
    for (uint64_t c = 0; c < w.cols; ++c) acc += double(w.values[r * w.cols + c]) * x[c];
    y[r] = acc;
  }
  return y;
}

Vec rmsnorm(const Vec& x, const float* w, size_t off, size_t n, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  Vec y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * inv * w[i];
  return y;
}

}  // namespace

std::vector<double> referenceForward(const TinyModel& m, const std::vector<int32_t>& tokens) {
  const TinySpec& s = m.spec;
  const size_t n = tokens.size(), hd = s.head_dim, qw = s.n_head * hd;
  const RandomWeight* no_bias = nullptr;
  std::vector<Vec> xs(n);
  const RandomWeight& embd = m.weight("token_embd.weight");
  for (size_t t = 0; t < n; ++t)
    xs[t] = Vec(embd.values.begin() + tokens[t] * embd.cols, embd.values.begin() + (tokens[t] + 1) * embd.cols);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    auto bias = [&](const char* which) { return s.qkv_bias ? &m.weight(b + which) : no_bias; };
    std::vector<Vec> qs(n), ks(n), vs(n);
    for (size_t t = 0; t < n; ++t) {
      const Vec h = rmsnorm(xs[t], m.weight(b + "attn_norm.weight").values.data(), 0, s.n_embd, s.eps);
      qs[t] = matvec(m.weight(b + "attn_q.weight"), h, bias("attn_q.bias"));
      ks[t] = matvec(m.weight(b + "attn_k.weight"), h, bias("attn_k.bias"));
      vs[t] = matvec(m.weight(b + "attn_v.weight"), h, bias("attn_v.bias"));
      if (s.qk_norm) {
        for (uint32_t j = 0; j < s.n_head; ++j) {
          const Vec y = rmsnorm(qs[t], m.weight(b + "attn_q_norm.weight").values.data(), j * hd, hd, s.eps);
          std::copy(y.begin(), y.end(), qs[t].begin() + j * hd);
        }
        for (uint32_t j = 0; j < s.n_head_kv; ++j) {
          const Vec y = rmsnorm(ks[t], m.weight(b + "attn_k_norm.weight").values.data(), j * hd, hd, s.eps);
          std::copy(y.begin(), y.end(), ks[t].begin() + j * hd);
        }
      }
      for (Vec* e : {&qs[t], &ks[t]}) {
        const size_t heads = e->size() / hd;
        for (size_t j = 0; j < heads; ++j)
          for (uint32_t i = 0; i < s.n_rot / 2; ++i) {
            const double theta = double(t) * s.rope_scale * std::pow(double(s.rope_base), -2.0 * i / s.n_rot);
            const size_t a = j * hd + (s.rope_style == fb::RopeStyle::Norm ? 2 * i : i);
            const size_t bb = j * hd + (s.rope_style == fb::RopeStyle::Norm ? 2 * i + 1 : i + s.n_rot / 2);
            const double va = (*e)[a], vb = (*e)[bb];
            (*e)[a] = va * std::cos(theta) - vb * std::sin(theta);
            (*e)[bb] = va * std::sin(theta) + vb * std::cos(theta);
          }
      }
    }
    for (size_t t = 0; t < n; ++t) {
      Vec attn(qw, 0.0);
      for (uint32_t j = 0; j < s.n_head; ++j) {
        const size_t g = j / (s.n_head / s.n_head_kv);
        Vec sc(t + 1);
        double mx = -INFINITY;
        for (size_t i = 0; i <= t; ++i) {
          double acc = 0;
          for (size_t d = 0; d < hd; ++d) acc += qs[t][j * hd + d] * ks[i][g * hd + d];
          sc[i] = acc / std::sqrt(double(hd));
          mx = std::max(mx, sc[i]);
        }
        double sum = 0;
        for (double& e : sc) sum += (e = std::exp(e - mx));
        for (size_t i = 0; i <= t; ++i)
          for (size_t d = 0; d < hd; ++d) attn[j * hd + d] += sc[i] / sum * vs[i][g * hd + d];
      }
      const Vec o = matvec(m.weight(b + "attn_output.weight"), attn, no_bias);
      for (size_t c = 0; c < s.n_embd; ++c) xs[t][c] += o[c];
      const Vec h = rmsnorm(xs[t], m.weight(b + "ffn_norm.weight").values.data(), 0, s.n_embd, s.eps);
      Vec g = matvec(m.weight(b + "ffn_gate.weight"), h, no_bias);
      const Vec u = matvec(m.weight(b + "ffn_up.weight"), h, no_bias);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const Vec d = matvec(m.weight(b + "ffn_down.weight"), g, no_bias);
      for (size_t c = 0; c < s.n_embd; ++c) xs[t][c] += d[c];
    }
  }
  const RandomWeight& out_w = m.weight(s.tied ? "token_embd.weight" : "output.weight");
  std::vector<double> logits;
  logits.reserve(n * m.n_vocab);
  for (size_t t = 0; t < n; ++t) {
    const Vec h = rmsnorm(xs[t], m.weight("output_norm.weight").values.data(), 0, s.n_embd, s.eps);
    const Vec row = matvec(out_w, h, no_bias);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

}  // namespace minfer::test
