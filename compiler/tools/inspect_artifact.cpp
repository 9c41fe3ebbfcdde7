// The .mfb half of minfer-inspect: config, tokenizer, tensors with planes and stride tables, plans,
// memory plan and kernel images of a verified artifact, as text or JSON; --verify checks checksums.
#include "compiler/tools/inspect_artifact.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/artifact.h"
#include "runtime/util/terminal_text.h"

namespace minfer {
namespace {

const char* planeKindText(uint8_t kind) {
  static const char* const kNames[] = {"i8", "scale", "min", "packed", "f32", "f16", "bf16", "blocks"};
  return kind < sizeof(kNames) / sizeof(kNames[0]) ? kNames[kind] : "?";
}

const char* elemText(uint8_t elem) {
  static const char* const kNames[] = {"i8", "f32", "f16", "bf16", "u8"};
  return elem < sizeof(kNames) / sizeof(kNames[0]) ? kNames[elem] : "?";
}

std::string raw(const flatbuffers::String* s) { return s ? s->str() : std::string(); }
// For text output: a string from the artifact with control characters and ill-formed UTF-8 escaped
// (runtime/util/terminal_text.h), so a crafted artifact cannot drive the terminal.
std::string str(const flatbuffers::String* s) { return util::escapeForTerminal(raw(s)); }

// For JSON values: llvm::json requires UTF-8, and artifact strings (token texts, names) are bytes.
std::string utf8(std::string v) { return llvm::json::isUTF8(v) ? v : llvm::json::fixUTF8(v); }
std::string jstr(const flatbuffers::String* s) { return utf8(raw(s)); }

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// A string from the artifact on one line (newlines shown as \n, every control character escaped),
// shortened to `max` bytes of the original.
std::string oneLine(const std::string& s, size_t max = 80) { return util::escapeForTerminal(s, max); }

int64_t i64(uint64_t v) { return static_cast<int64_t>(v); }

// A float with all its significant digits (formatv's default shows two decimals: 1e-6 would read 0.00).
std::string num(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(x));
  return buf;
}

// "3:blk.0.attn_q.weight" for an index into a vector of named things.
template <typename T>
std::string named(const flatbuffers::Vector<flatbuffers::Offset<T>>* vec, uint32_t i) {
  const std::string name = vec && i < vec->size() ? str(vec->Get(i)->name()) : std::string("?");
  return std::to_string(i) + ":" + name;
}

template <typename T>
std::string idList(const flatbuffers::Vector<uint32_t>* ids, const flatbuffers::Vector<flatbuffers::Offset<T>>* names) {
  std::string out = "[";
  if (ids)
    for (flatbuffers::uoffset_t k = 0; k < ids->size(); ++k) out += (k ? " " : "") + named(names, ids->Get(k));
  return out + "]";
}

std::string plainIds(const flatbuffers::Vector<uint32_t>* ids) {
  std::string out = "[";
  if (ids)
    for (flatbuffers::uoffset_t k = 0; k < ids->size(); ++k) out += (k ? " " : "") + std::to_string(ids->Get(k));
  return out + "]";
}

llvm::json::Array jsonIds(const flatbuffers::Vector<uint32_t>* ids) {
  llvm::json::Array out;
  if (ids)
    for (uint32_t id : *ids) out.push_back(static_cast<int64_t>(id));
  return out;
}

std::string segmentText(const fb::Segment* s) {
  if (!s || s->size() == 0) return "(none)";
  return llvm::formatv("[{0:x}, +{1}) xxh64 {2}", s->offset(), s->size(), hex64(s->xxh64())).str();
}

llvm::json::Value segmentJson(const fb::Segment* s) {
  if (!s) return nullptr;
  return llvm::json::Object{{"offset", i64(s->offset())}, {"size", i64(s->size())}, {"xxh64", hex64(s->xxh64())}};
}

// The stride table on one line: only the fields its kind uses.
std::string strideText(const fb::StrideTable& t) {
  std::string s = llvm::formatv("{0,-6} {1,-4} {2} x {3}, row_pitch {4}", planeKindText(t.kind()), elemText(t.elem()),
                                t.rows(), t.cols(), t.row_pitch())
                      .str();
  const auto kind = static_cast<PlaneKind>(t.kind());
  if (kind == PlaneKind::kScale || kind == PlaneKind::kMin || kind == PlaneKind::kBlocks)
    s += llvm::formatv(", group {0} / pitch {1}", t.group_size(), t.group_pitch()).str();
  if (kind == PlaneKind::kPacked) s += llvm::formatv(", bits {0}, q_offset {1}", t.bits(), t.q_offset()).str();
  if (t.experts() > 1) s += llvm::formatv(", {0} experts / pitch {1}", t.experts(), t.expert_pitch()).str();
  return s;
}

llvm::json::Object strideJson(const fb::StrideTable& t) {
  return llvm::json::Object{{"kind", planeKindText(t.kind())},     {"elem", elemText(t.elem())},
                            {"rows", i64(t.rows())},               {"cols", i64(t.cols())},
                            {"row_pitch", i64(t.row_pitch())},     {"group_size", static_cast<int64_t>(t.group_size())},
                            {"group_pitch", int64_t{t.group_pitch()}}, {"bits", int64_t{t.bits()}},
                            {"q_offset", int64_t{t.q_offset()}},   {"ggml_type", ggmlTypeTraits(t.ggml_type()).name},
                            {"bytes", i64(t.rows() * t.row_pitch())}};
}

// One plan step on one line: op, name, buffers, weights, the parameters its op uses, kernels.
std::string stepText(const fb::Step& s, const fb::Artifact& m) {
  const auto* buffers = m.memory() ? m.memory()->buffers() : nullptr;
  std::string line = llvm::formatv("{0,-11} {1,-22} in {2} out {3}", fb::EnumNameOpKind(s.op()), oneLine(raw(s.name()), 22),
                                   idList(s.inputs(), buffers), idList(s.outputs(), buffers))
                         .str();
  if (s.weights() && s.weights()->size()) line += " w " + idList(s.weights(), m.tensors());
  // 1.4 column views: [offset+width] per operand.
  for (const auto* views : {s.input_views(), s.output_views()})
    if (views && views->size()) {
      line += views == s.input_views() ? " in-views" : " out-views";
      for (const fb::ColumnView* v : *views) line += llvm::formatv(" [{0}+{1}]", v->offset(), v->width()).str();
    }
  switch (s.op()) {
    case fb::OpKind::RmsNorm: case fb::OpKind::HeadRmsNorm: line += " eps " + num(s.eps()); break;
    case fb::OpKind::MatMul: line += llvm::formatv(" {0}x{1}", s.rows(), s.cols()).str(); break;
    case fb::OpKind::Rope:
      line += llvm::formatv(" heads {0}/{1} head_dim {2} n_rot {3} {4} base {5} scale {6}", s.n_head(), s.n_head_kv(),
                            s.head_dim(), s.n_rot(), fb::EnumNameRopeStyle(s.rope_style()), num(s.rope_freq_base()),
                            num(s.rope_freq_scale()))
                  .str();
      if (s.rope_ext_factor() != 0)
        line += llvm::formatv(" yarn ext {0} beta {1}/{2} n_ctx_orig {3}", num(s.rope_ext_factor()),
                              num(s.rope_beta_fast()), num(s.rope_beta_slow()), s.rope_n_ctx_orig())
                    .str();
      if (s.rope_attn_factor() != 1) line += " attn_factor " + num(s.rope_attn_factor());
      break;
    case fb::OpKind::Attention:
      line += llvm::formatv(" layer {0} heads {1}/{2} head_dim {3}", s.layer(), s.n_head(), s.n_head_kv(), s.head_dim())
                  .str();
      if (s.scale() != 0) line += " scale " + num(s.scale());
      if (s.softcap() != 0) line += " softcap " + num(s.softcap());
      if (s.window() != 0) line += llvm::formatv(" window {0}", s.window()).str();
      if (s.kv_ring() != 0) line += llvm::formatv(" kv_ring {0}", s.kv_ring()).str();
      break;
    case fb::OpKind::MoeRoute:
      line += llvm::formatv(" top {0} of {1} experts{2}", s.n_expert_used(), s.n_expert(), s.moe_norm() ? " renormalised" : "")
                  .str();
      break;
    case fb::OpKind::MoeFfn:
      line += llvm::formatv(" {0} of {1} experts, {2}x{3}", s.n_expert_used(), s.n_expert(), s.rows(), s.cols()).str();
      break;
    default: break;
  }
  if (s.op() != fb::OpKind::Attention && s.layer() >= 0) line += llvm::formatv(" layer {0}", s.layer()).str();
  if (s.launches())
    for (const fb::Launch* l : *s.launches()) line += " k" + plainIds(l->images());
  if (s.paged_launches() && s.paged_launches()->size() > 0) {  // 1.6: what batch sessions launch instead
    line += " paged";
    for (const fb::Launch* l : *s.paged_launches()) line += " k" + plainIds(l->images());
  }
  if (s.small_launches() && s.small_launches()->size() > 0) {  // 1.7: what calls of ≤ small_rows rows launch instead
    line += llvm::formatv(" small(<={0} rows)", s.small_rows()).str();
    for (const fb::Launch* l : *s.small_launches()) {
      line += " k" + plainIds(l->images());
      if (l->min_rows() != 0 || l->max_rows() != 0)  // 1.10: its row range, 0 read as 1 / small_rows
        line += llvm::formatv("(rows {0}..{1})", std::max(l->min_rows(), 1u),
                              l->max_rows() != 0 ? l->max_rows() : s.small_rows())
                    .str();
    }
  }
  if (s.fused()) line += " fused (done by the previous step's launch)";
  if (s.tail()) line += " tail";
  return line;
}

llvm::json::Object gridJson(const fb::Grid& g) {
  auto e = [](const fb::GridExtent& x) {
    return llvm::json::Object{{"per_token", int64_t{x.per_token()}}, {"constant", int64_t{x.constant()}},
                              {"divisor", int64_t{x.divisor()}}};
  };
  return llvm::json::Object{{"x", e(g.x())}, {"y", e(g.y())}, {"z", e(g.z())}};
}

llvm::json::Object argJson(const fb::KernelArg& a) {
  llvm::json::Object o{{"kind", fb::EnumNameArgKind(a.kind())}, {"name", jstr(a.name())}};
  switch (a.kind()) {
    case fb::ArgKind::Activation: case fb::ArgKind::Q8Values: case fb::ArgKind::Q8Meta:
      o["buffer"] = int64_t{a.buffer()};
      o["access"] = fb::EnumNameAccess(a.access());
      o["width"] = int64_t{a.width()};
      if (a.view_width() != 0) {  // 1.4 column view
        o["view_offset"] = int64_t{a.view_offset()};
        o["view_width"] = int64_t{a.view_width()};
      }
      break;
    case fb::ArgKind::Weight:
      o["tensor"] = int64_t{a.tensor()};
      if (a.plane()) o["plane"] = strideJson(*a.plane());
      break;
    case fb::ArgKind::KCache: case fb::ArgKind::VCache:
      o["layer"] = int64_t{a.layer()};
      o["width"] = int64_t{a.width()};
      break;
    case fb::ArgKind::Scratch: case fb::ArgKind::Counters: case fb::ArgKind::TopK: o["bytes"] = i64(a.bytes()); break;
    case fb::ArgKind::Int: o["value"] = a.value(); break;
    default: break;
  }
  return o;
}

// A launch record: images, entry, typed arguments, shape.
llvm::json::Object launchJson(const fb::Launch& l, const fb::Artifact& m) {
  llvm::json::Array args;
  if (l.args())
    for (const fb::KernelArg* a : *l.args()) args.push_back(argJson(*a));
  const auto* k = m.kernels();
  const bool named = l.images() && l.images()->size() && k && l.images()->Get(0) < k->size();
  llvm::json::Object o{{"images", jsonIds(l.images())},
                       {"entry", named ? jstr(k->Get(l.images()->Get(0))->entry()) : std::string()},
                       {"args", std::move(args)},
                       {"grid", gridJson(*l.grid())},
                       {"large_from", int64_t{l.large_from()}},
                       {"block", llvm::json::Array{int64_t{l.block()->x()}, int64_t{l.block()->y()},
                                                   int64_t{l.block()->z()}}},
                       {"smem", int64_t{l.smem()}},
                       {"min_rows", int64_t{l.min_rows()}},  // 1.10: small-batch launches' row range (0: unbounded)
                       {"max_rows", int64_t{l.max_rows()}}};
  if (l.grid_large()) o["grid_large"] = gridJson(*l.grid_large());
  return o;
}

llvm::json::Object stepJson(const fb::Step& s, const fb::Artifact& m) {
  llvm::json::Array launches, paged, small;
  if (s.launches())
    for (const fb::Launch* l : *s.launches()) launches.push_back(launchJson(*l, m));
  if (s.paged_launches())
    for (const fb::Launch* l : *s.paged_launches()) paged.push_back(launchJson(*l, m));
  if (s.small_launches())
    for (const fb::Launch* l : *s.small_launches()) small.push_back(launchJson(*l, m));
  return llvm::json::Object{{"op", fb::EnumNameOpKind(s.op())},
                            {"name", jstr(s.name())},
                            {"inputs", jsonIds(s.inputs())},
                            {"outputs", jsonIds(s.outputs())},
                            {"weights", jsonIds(s.weights())},
                            {"layer", s.layer()},
                            {"eps", s.eps()},
                            {"n_head", int64_t{s.n_head()}},
                            {"n_head_kv", int64_t{s.n_head_kv()}},
                            {"head_dim", int64_t{s.head_dim()}},
                            {"n_rot", int64_t{s.n_rot()}},
                            {"rope_style", fb::EnumNameRopeStyle(s.rope_style())},
                            {"rope_freq_base", s.rope_freq_base()},
                            {"rope_freq_scale", s.rope_freq_scale()},
                            {"rope_ext_factor", s.rope_ext_factor()},
                            {"rope_attn_factor", s.rope_attn_factor()},
                            {"rope_beta_fast", s.rope_beta_fast()},
                            {"rope_beta_slow", s.rope_beta_slow()},
                            {"rope_n_ctx_orig", int64_t{s.rope_n_ctx_orig()}},
                            {"rows", int64_t{s.rows()}},
                            {"cols", int64_t{s.cols()}},
                            {"scale", s.scale()},
                            {"softcap", s.softcap()},
                            {"window", int64_t{s.window()}},
                            {"kv_ring", int64_t{s.kv_ring()}},
                            {"tail", s.tail()},
                            {"fused", s.fused()},
                            {"launches", std::move(launches)},
                            {"paged_launches", std::move(paged)},  // 1.6
                            {"small_launches", std::move(small)},  // 1.7
                            {"small_rows", int64_t{s.small_rows()}}};
}

// The KV cache of one attention layer as its Attention steps declare it: K+V bytes per position (f16) and the
// ring (schema Step.kv_ring; 0: n_ctx positions) with the window it serves.
struct KvCacheLayer {
  int32_t layer = 0;
  uint64_t bytes_per_position = 0;
  uint32_t ring = 0, window = 0;
};

std::vector<KvCacheLayer> kvCacheLayers(const fb::Artifact& m) {
  std::map<int32_t, KvCacheLayer> layers;
  for (const fb::Plan* plan : {m.prefill(), m.decode()})
    if (plan && plan->steps())
      for (const fb::Step* s : *plan->steps())
        if (s->op() == fb::OpKind::Attention)
          layers[s->layer()] = {s->layer(), 2ull * 2ull * s->n_head_kv() * s->head_dim(), s->kv_ring(), s->window()};
  std::vector<KvCacheLayer> out;
  for (const auto& [layer, l] : layers) out.push_back(l);
  return out;
}

// "KV cache per layer" lines of the memory plan: a ring layer's bytes are bounded whatever n_ctx.
void printKvCache(const fb::Artifact& m, llvm::raw_ostream& os) {
  const std::vector<KvCacheLayer> layers = kvCacheLayers(m);
  if (layers.empty()) return;
  uint64_t per_position = 0, ring_bytes = 0;
  for (const KvCacheLayer& l : layers) {
    if (l.ring) ring_bytes += l.bytes_per_position * l.ring;
    else per_position += l.bytes_per_position;
  }
  os << llvm::formatv("  KV cache (f16 K and V): {0} bytes/position x n_ctx for the full-size layers", per_position);
  if (ring_bytes) os << llvm::formatv(", + at most {0} bytes for the sliding-window layers' rings", ring_bytes);
  os << "\n";
  for (const KvCacheLayer& l : layers) {
    if (l.ring)
      os << llvm::formatv("    layer {0,3}: {1} bytes/position, ring of {2} positions (window {3}): at most {4} bytes\n",
                          l.layer, l.bytes_per_position, l.ring, l.window, l.bytes_per_position * l.ring);
    else
      os << llvm::formatv("    layer {0,3}: {1} bytes/position x n_ctx{2}\n", l.layer, l.bytes_per_position,
                          l.window ? llvm::formatv(" (window {0}, full-size)", l.window).str() : std::string());
  }
}

llvm::json::Array kvLayersJson(const fb::Artifact& m) {
  llvm::json::Array out;
  for (const KvCacheLayer& l : kvCacheLayers(m))
    out.push_back(llvm::json::Object{{"layer", int64_t{l.layer}},
                                     {"bytes_per_position", i64(l.bytes_per_position)},
                                     {"ring", int64_t{l.ring}},
                                     {"window", int64_t{l.window}}});
  return out;
}

void printText(const ArtifactFile& f, llvm::raw_ostream& os) {
  const fb::Artifact& m = *f.manifest();
  os << llvm::formatv("{0}: minfer artifact format {1}.{2}, {3} bytes, manifest {4} bytes, {5} data segments\n",
                      f.path(), m.format_major(), m.format_minor(), f.fileSize(), f.manifestSize(),
                      f.segments().size());
  os << llvm::formatv("producer:     {0} {1}\n", str(m.producer()), str(m.producer_version()));
  if (const fb::SourceInfo* s = m.source())
    os << llvm::formatv("source:       {0}, {1} bytes, sha256 {2}\n", str(s->name()), s->size(), str(s->sha256()));
  if (m.target_archs()) {
    os << "target archs:";
    for (const auto* a : *m.target_archs()) os << " " << str(a);
    os << "\n";
  }

  const fb::ModelConfig& c = *m.config();
  os << "\nconfig:\n";
  os << llvm::formatv("  architecture {0}, name \"{1}\"\n", str(c.architecture()), oneLine(raw(c.name())));
  os << llvm::formatv("  n_embd {0}, n_layer {1}, n_head {2}, n_head_kv {3}, head_dim {4}, n_ff {5}, n_vocab {6}, "
                      "n_ctx_train {7}, n_ctx_max {8}\n",
                      c.n_embd(), c.n_layer(), c.n_head(), c.n_head_kv(), c.head_dim(), c.n_ff(), c.n_vocab(),
                      c.n_ctx_train(), c.n_ctx_max());
  os << llvm::formatv("  RoPE {0}, n_rot {1}, base {2}, scale {3}, scaling {4}; rms_norm_eps {5}\n",
                      fb::EnumNameRopeStyle(c.rope_style()), c.n_rot(), num(c.rope_freq_base()),
                      num(c.rope_freq_scale()), fb::EnumNameRopeScaling(c.rope_scaling()), num(c.rms_norm_eps()));
  os << llvm::formatv("  tied_embeddings {0}\n", c.tied_embeddings());

  if (const fb::Tokenizer* t = m.tokenizer()) {
    const uint32_t n = t->tokens() ? t->tokens()->size() : 0;
    os << llvm::formatv("\ntokenizer: {0} (model \"{1}\", pre \"{2}\"), {3} tokens, {4} merges\n",
                        fb::EnumNameTokenizerModel(t->model()), str(t->model_name()), str(t->pre()), n,
                        t->merges() ? t->merges()->size() : 0);
    os << llvm::formatv("  bos {0}, eos {1}, unk {2}, pad {3}; add_bos {4}, add_eos {5}, add_space_prefix {6}\n",
                        t->bos_id(), t->eos_id(), t->unk_id(), t->pad_id(), t->add_bos(), t->add_eos(),
                        t->add_space_prefix());
    os << "  first tokens:";
    for (uint32_t i = 0; i < n && i < 8; ++i) os << " \"" << oneLine(t->tokens()->Get(i)->str(), 24) << "\"";
    os << (n > 8 ? " …\n" : "\n");
    const std::string tmpl = raw(t->chat_template());
    os << llvm::formatv("  chat template: {0}\n", tmpl.empty() ? std::string("(none)")
                                                              : std::to_string(tmpl.size()) + " bytes: " + oneLine(tmpl, 60));
  } else {
    os << "\ntokenizer: (none)\n";
  }

  const uint32_t n_tensors = m.tensors() ? m.tensors()->size() : 0;
  uint64_t plane_bytes = 0, n_planes = 0, n_derived = 0, derived_bytes = 0;
  for (uint32_t i = 0; i < n_tensors; ++i)
    for (const fb::Plane* p : *m.tensors()->Get(i)->planes()) {
      plane_bytes += p->data()->size(), ++n_planes;
      if (p->derived()) ++n_derived, derived_bytes += p->layout()->rows() * p->layout()->row_pitch();
    }
  // Compact: quantized matmul weights store their GGUF blocks only, the rest is expanded at load.
  os << llvm::formatv("\ntensors ({0}, {1} planes, {2} bytes stored; planes: {3}", n_tensors, n_planes, plane_bytes,
                      n_derived ? "compact" : "expanded");
  if (n_derived) os << llvm::formatv(", {0} derived at load ({1} bytes)", n_derived, derived_bytes);
  os << "):\n";
  for (uint32_t i = 0; i < n_tensors; ++i) {
    const fb::Tensor& t = *m.tensors()->Get(i);
    std::string ne;
    if (t.ne())
      for (flatbuffers::uoffset_t d = 0; d < t.ne()->size(); ++d) ne += (d ? ", " : "") + std::to_string(t.ne()->Get(d));
    os << llvm::formatv("  {0,3} {1,-32} {2,-5} [{3}]\n", i, str(t.name()), ggmlTypeTraits(t.ggml_type()).name, ne);
    for (const fb::Plane* p : *t.planes())
      os << llvm::formatv("        {0,-62} {1}\n", strideText(*p->layout()),
                          p->derived() ? std::string("derived at load") : segmentText(p->data()));
  }

  if (const fb::MemoryPlan* mem = m.memory()) {
    const auto* buffers = mem->buffers();
    // 1.8: the ring layers' share (older artifacts read 0; their per-layer lines below still show rings).
    const std::string single_sequence =
        mem->kv_ring_bytes_per_token() == 0
            ? std::string()
            : llvm::formatv(" in a batch session; a single sequence: {0} bytes/token + at most {1} bytes of rings",
                            mem->kv_bytes_per_token() - mem->kv_ring_bytes_per_token(), mem->kv_ring_bytes())
                  .str();
    os << llvm::formatv("\nmemory plan: max_batch {0}, KV cache {1} bytes/token{2}, input_ids {3}, logits {4}\n",
                        mem->max_batch(), mem->kv_bytes_per_token(), single_sequence,
                        named(buffers, mem->input_ids()), named(buffers, mem->logits()));
    printKvCache(m, os);
    if (buffers)
      for (uint32_t i = 0; i < buffers->size(); ++i) {
        const fb::Buffer& b = *buffers->Get(i);
        os << llvm::formatv("  {0,3} {1,-24} {2,-3} x {3}  ({4} bytes at max_batch)\n", i, str(b.name()),
                            fb::EnumNameBufferType(b.type()), b.width(),
                            uint64_t{mem->max_batch()} * b.width() * (b.type() == fb::BufferType::F16  ? 2
                                                                      : b.type() == fb::BufferType::I8 ? 1
                                                                                                       : 4));
      }
  } else {
    os << "\nmemory plan: (none)\n";
  }

  for (const auto& [name, plan] :
       {std::pair{"prefill", m.prefill()}, std::pair{"decode", m.decode()}, std::pair{"load", m.load()}}) {
    const uint32_t n = plan && plan->steps() ? plan->steps()->size() : 0;
    os << llvm::formatv("\n{0} plan ({1} steps):\n", name, n);
    for (uint32_t i = 0; i < n; ++i) os << llvm::formatv("  {0,4} {1}\n", i, stepText(*plan->steps()->Get(i), m));
  }

  const uint32_t n_kernels = m.kernels() ? m.kernels()->size() : 0;
  os << llvm::formatv("\nkernel images ({0}):\n", n_kernels);
  for (uint32_t i = 0; i < n_kernels; ++i) {
    const fb::KernelImage& k = *m.kernels()->Get(i);
    std::string options;
    if (k.options())
      for (const auto* o : *k.options()) options += " " + str(o);
    os << llvm::formatv("  {0,3} {1}\n      entry {2}, arch {3}, nvrtc {4}, options:{5}\n      cubin {6}\n      ptx   {7}\n",
                        i, str(k.key()), str(k.entry()), str(k.arch()), str(k.nvrtc_version()), options,
                        segmentText(k.cubin()), segmentText(k.ptx()));
  }
}

llvm::json::Object toJson(const ArtifactFile& f) {
  const fb::Artifact& m = *f.manifest();
  auto strings = [](const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v) {
    llvm::json::Array out;
    if (v)
      for (const auto* s : *v) out.push_back(jstr(s));
    return out;
  };
  const fb::ModelConfig& c = *m.config();
  llvm::json::Object root{
      {"file", utf8(f.path())},
      {"format", "mfb"},
      {"version", llvm::formatv("{0}.{1}", m.format_major(), m.format_minor()).str()},
      {"size", i64(f.fileSize())},
      {"manifest_size", i64(f.manifestSize())},
      {"manifest_check", segmentJson(m.manifest_check())},
      {"producer", jstr(m.producer())},
      {"producer_version", jstr(m.producer_version())},
      {"target_archs", strings(m.target_archs())},
      {"config",
       llvm::json::Object{{"architecture", jstr(c.architecture())}, {"name", jstr(c.name())},
                          {"n_embd", int64_t{c.n_embd()}},         {"n_layer", int64_t{c.n_layer()}},
                          {"n_head", int64_t{c.n_head()}},         {"n_head_kv", int64_t{c.n_head_kv()}},
                          {"head_dim", int64_t{c.head_dim()}},     {"n_ff", int64_t{c.n_ff()}},
                          {"n_vocab", int64_t{c.n_vocab()}},       {"n_ctx_train", int64_t{c.n_ctx_train()}},
                          {"n_rot", int64_t{c.n_rot()}},           {"rope_style", fb::EnumNameRopeStyle(c.rope_style())},
                          {"rope_freq_base", c.rope_freq_base()},  {"rope_freq_scale", c.rope_freq_scale()},
                          {"rope_scaling", fb::EnumNameRopeScaling(c.rope_scaling())},
                          {"rms_norm_eps", c.rms_norm_eps()},      {"tied_embeddings", c.tied_embeddings()}}},
  };
  if (const fb::SourceInfo* s = m.source())
    root["source"] = llvm::json::Object{{"name", jstr(s->name())}, {"size", i64(s->size())}, {"sha256", jstr(s->sha256())}};
  if (const fb::Tokenizer* t = m.tokenizer())
    root["tokenizer"] = llvm::json::Object{{"model", fb::EnumNameTokenizerModel(t->model())},
                                           {"model_name", jstr(t->model_name())},
                                           {"pre", jstr(t->pre())},
                                           {"tokens", int64_t{t->tokens() ? t->tokens()->size() : 0}},
                                           {"merges", int64_t{t->merges() ? t->merges()->size() : 0}},
                                           {"bos_id", t->bos_id()},
                                           {"eos_id", t->eos_id()},
                                           {"unk_id", t->unk_id()},
                                           {"pad_id", t->pad_id()},
                                           {"add_bos", t->add_bos()},
                                           {"add_eos", t->add_eos()},
                                           {"add_space_prefix", t->add_space_prefix()},
                                           {"chat_template", jstr(t->chat_template())}};
  llvm::json::Array tensors;
  if (m.tensors())
    for (const fb::Tensor* t : *m.tensors()) {
      llvm::json::Array ne, planes;
      if (t->ne())
        for (uint64_t d : *t->ne()) ne.push_back(i64(d));
      for (const fb::Plane* p : *t->planes())
        planes.push_back(llvm::json::Object{
            {"layout", strideJson(*p->layout())}, {"data", segmentJson(p->data())}, {"derived", p->derived()}});
      tensors.push_back(llvm::json::Object{{"name", jstr(t->name())},
                                           {"type", ggmlTypeTraits(t->ggml_type()).name},
                                           {"ne", std::move(ne)},
                                           {"planes", std::move(planes)}});
    }
  root["tensors"] = std::move(tensors);
  if (const fb::MemoryPlan* mem = m.memory()) {
    llvm::json::Array buffers;
    if (mem->buffers())
      for (const fb::Buffer* b : *mem->buffers())
        buffers.push_back(llvm::json::Object{
            {"name", jstr(b->name())}, {"width", int64_t{b->width()}}, {"type", fb::EnumNameBufferType(b->type())}});
    root["memory"] = llvm::json::Object{{"max_batch", int64_t{mem->max_batch()}},
                                        {"input_ids", int64_t{mem->input_ids()}},
                                        {"logits", int64_t{mem->logits()}},
                                        {"kv_bytes_per_token", i64(mem->kv_bytes_per_token())},
                                        {"kv_ring_bytes_per_token", i64(mem->kv_ring_bytes_per_token())},
                                        {"kv_ring_bytes", i64(mem->kv_ring_bytes())},
                                        {"kv_layers", kvLayersJson(m)},
                                        {"buffers", std::move(buffers)}};
  }
  for (const auto& [name, plan] :
       {std::pair{"prefill", m.prefill()}, std::pair{"decode", m.decode()}, std::pair{"load", m.load()}}) {
    llvm::json::Array steps;
    if (plan && plan->steps())
      for (const fb::Step* s : *plan->steps()) steps.push_back(stepJson(*s, m));
    root[name] = std::move(steps);
  }
  if (m.argmax()) root["argmax"] = launchJson(*m.argmax(), m);
  if (m.topk()) root["topk"] = launchJson(*m.topk(), m);
  llvm::json::Array kernels;
  if (m.kernels())
    for (const fb::KernelImage* k : *m.kernels())
      kernels.push_back(llvm::json::Object{{"key", jstr(k->key())},
                                           {"entry", jstr(k->entry())},
                                           {"arch", jstr(k->arch())},
                                           {"nvrtc_version", jstr(k->nvrtc_version())},
                                           {"options", strings(k->options())},
                                           {"cubin", segmentJson(k->cubin())},
                                           {"ptx", segmentJson(k->ptx())}});
  root["kernels"] = std::move(kernels);
  return root;
}

}  // namespace

int inspectArtifact(const std::string& path, bool json, bool verify) {
  auto file = ArtifactFile::open(path);
  if (!file) {
    llvm::errs() << "minfer-inspect: "
                 << util::escapeForTerminal(file.status().message(), std::string::npos, /*keep_newlines=*/true) << "\n";
    return 1;
  }
  const ArtifactFile& f = **file;
  Status checked = Status::ok();
  if (verify) checked = f.verifyChecksums();
  if (json) {
    llvm::json::Object root = toJson(f);  // every string passed through jstr()
    if (verify)
      root["checksums"] = checked.isOk() ? llvm::json::Value("ok") : llvm::json::Value(utf8(checked.message()));
    llvm::outs() << util::escapeJsonForTerminal(llvm::formatv("{0:2}", llvm::json::Value(std::move(root))).str())
                 << "\n";
  } else {
    printText(f, llvm::outs());
    if (verify && checked.isOk())
      llvm::outs() << llvm::formatv("\nchecksums: manifest and {0} segments OK\n", f.segments().size());
  }
  llvm::outs().flush();
  if (!checked.isOk()) {
    llvm::errs() << "minfer-inspect: "
                 << util::escapeForTerminal(checked.message(), std::string::npos, /*keep_newlines=*/true) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace minfer
