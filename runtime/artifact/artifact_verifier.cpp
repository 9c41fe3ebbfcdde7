// Verification of a mapped .mfb manifest: structure (FlatBuffers Verifier), then meaning (ranges).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "runtime/artifact/artifact_file.h"
#include "runtime/util/terminal_text.h"
#include "schema/op_traits.h"

namespace minfer::artifact {
namespace {

using artifact_detail::cat;
using artifact_detail::hex;

uint32_t readLE32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// Bytes from the file shown in a message, at most `max`: control characters and ill-formed UTF-8
// escaped (runtime/util/terminal_text.h), so a crafted name cannot drive the terminal.
std::string printable(const char* p, size_t n, size_t max = 64) {
  return util::escapeForTerminal(std::string_view(p, n), max);
}

std::string quoted(const flatbuffers::String* s) {
  return s ? "\"" + printable(s->c_str(), s->size()) + "\"" : "(none)";
}

// The private base of every generated table (C-style casts may name an inaccessible base).
const flatbuffers::Table* asTable(const void* t) { return (const flatbuffers::Table*)t; }

// ---------------------------------------------------------------------------------------------
// Stage 1 diagnostics: after the whole-buffer Verifier failed, verify each top-level field (and
// each element of the large vectors) on its own, to name where the damage is.

class StructureLocator {
 public:
  StructureLocator(const uint8_t* buf, size_t n, const flatbuffers::Verifier::Options& opts)
      : buf_(buf), n_(n), opts_(opts) {}

  std::string locate() {
    const uint64_t root_off = readLE32(buf_ + 4);
    if (root_off % 4 != 0 || 4 + root_off + 4 > n_)
      return cat("the root table offset ", root_off, " (at offset 4), outside the manifest or misaligned");
    root_ = fb::GetSizePrefixedArtifact(buf_);
    const auto* t = asTable(root_);
    {
      flatbuffers::Verifier v(buf_, n_, opts_);
      if (!t->VerifyTableStart(v)) return cat("the root table at offset ", hex(4 + root_off), " (its vtable)");
    }
    using A = fb::Artifact;
    if (!scalar<uint16_t>(t, A::VT_FORMAT_MAJOR, 2)) return "format_major";
    if (!scalar<uint16_t>(t, A::VT_FORMAT_MINOR, 2)) return "format_minor";
    if (!field(t, A::VT_PRODUCER, [&](flatbuffers::Verifier& v) { return v.VerifyString(root_->producer()); }))
      return "producer";
    if (!field(t, A::VT_PRODUCER_VERSION,
               [&](flatbuffers::Verifier& v) { return v.VerifyString(root_->producer_version()); }))
      return "producer_version";
    // Accessors are passed as getters: an accessor reads its field's offset slot, which may lie
    // outside the buffer until VerifyOffset has checked it (the vtable may name any slot).
    if (!table(t, A::VT_SOURCE, [&] { return root_->source(); })) return "source";
    if (!table(t, A::VT_CONFIG, [&] { return root_->config(); })) return "config";
    if (!table(t, A::VT_TOKENIZER, [&] { return root_->tokenizer(); })) return "tokenizer";
    std::string where = tableVector(t, A::VT_TENSORS, [&] { return root_->tensors(); }, "tensors");
    if (!where.empty()) return where;
    where = tableVector(t, A::VT_KERNELS, [&] { return root_->kernels(); }, "kernels");
    if (!where.empty()) return where;
    where = plan(t, A::VT_PREFILL, [&] { return root_->prefill(); }, "prefill");
    if (!where.empty()) return where;
    where = plan(t, A::VT_DECODE, [&] { return root_->decode(); }, "decode");
    if (!where.empty()) return where;
    where = plan(t, A::VT_LOAD, [&] { return root_->load(); }, "load");
    if (!where.empty()) return where;
    if (!table(t, A::VT_MEMORY, [&] { return root_->memory(); })) return "memory";
    if (!field(t, A::VT_TARGET_ARCHS, [&](flatbuffers::Verifier& v) {
          return v.VerifyVector(root_->target_archs()) && v.VerifyVectorOfStrings(root_->target_archs());
        }))
      return "target_archs";
    if (!scalar<fb::Segment>(t, A::VT_MANIFEST_CHECK, 8)) return "manifest_check";
    if (!table(t, A::VT_ARGMAX, [&] { return root_->argmax(); })) return "argmax";
    if (!table(t, A::VT_TOPK, [&] { return root_->topk(); })) return "topk";
    return "";
  }

 private:
  template <typename T>
  bool scalar(const flatbuffers::Table* t, flatbuffers::voffset_t f, size_t align) {
    flatbuffers::Verifier v(buf_, n_, opts_);
    return t->VerifyField<T>(v, f, align);
  }
  template <typename F>
  bool field(const flatbuffers::Table* t, flatbuffers::voffset_t f, F&& check) {
    flatbuffers::Verifier v(buf_, n_, opts_);
    return t->VerifyOffset(v, f) && check(v);
  }
  template <typename Get>
  bool table(const flatbuffers::Table* t, flatbuffers::voffset_t f, Get&& get) {
    return field(t, f, [&](flatbuffers::Verifier& v) { return v.VerifyTable(get()); });
  }
  template <typename Get>
  std::string tableVector(const flatbuffers::Table* t, flatbuffers::voffset_t f, Get&& get, const std::string& name) {
    if (!field(t, f, [&](flatbuffers::Verifier& v) { return v.VerifyVector(get()); })) return name;
    const auto* vec = get();
    if (!vec) return "";
    for (flatbuffers::uoffset_t i = 0; i < vec->size(); ++i) {
      flatbuffers::Verifier v(buf_, n_, opts_);
      if (!v.VerifyTable(vec->Get(i))) return cat(name, "[", i, "]");
    }
    return "";
  }
  template <typename Get>
  std::string plan(const flatbuffers::Table* t, flatbuffers::voffset_t f, Get&& get, const std::string& name) {
    const fb::Plan* p = nullptr;
    {
      flatbuffers::Verifier v(buf_, n_, opts_);
      if (!t->VerifyOffset(v, f)) return name;
      p = get();
      if (!p) return "";
      if (!asTable(p)->VerifyTableStart(v)) return name;
    }
    std::string where = tableVector(asTable(p), fb::Plan::VT_STEPS, [&] { return p->steps(); }, name + ".steps");
    if (!where.empty()) return where;
    return table(t, f, get) ? "" : name;
  }

  const uint8_t* buf_;
  size_t n_;
  flatbuffers::Verifier::Options opts_;
  const fb::Artifact* root_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Stage 2.

class SemanticVerifier {
 public:
  SemanticVerifier(const std::string& path, const uint8_t* data, uint64_t size, uint64_t n)
      : path_(path), data_(data), size_(size), n_(n), m_(fb::GetSizePrefixedArtifact(data)) {}

  Status run(std::vector<ArtifactFile::SegmentRef>* segments) {
    if (m_->format_major() != kArtifactFormatMajor || m_->format_minor() > kArtifactFormatMinor ||
        m_->format_minor() < kArtifactFormatMinorOldest)
      return Status::error(cat(path_, ": artifact format ", m_->format_major(), ".", m_->format_minor(),
                               ", this runtime reads ", kArtifactFormatMajor, ".", kArtifactFormatMinorOldest, " up to ",
                               kArtifactFormatMajor, ".", kArtifactFormatMinor,
                               " (format_major/format_minor at manifest offset ", hex(offsetOf(m_)), ")",
                               m_->format_major() == kArtifactFormatMajor && m_->format_minor() < kArtifactFormatMinorOldest
                                   ? "; format 1.0 artifacts carry no launch records: recompile the GGUF with minfer-compile"
                                   : ""));
    const fb::Segment* check = m_->manifest_check();
    if (!check) return fail("manifest_check", m_, "missing (every format 1.0 artifact records its manifest extent)");
    if (check->offset() != 0 || check->size() != n_)
      return fail("manifest_check", check,
                  cat("says the manifest is [", check->offset(), ", +", check->size(), ") but the size prefix says [0, +",
                      n_, ")"));
    MINFER_RETURN_IF_ERROR(checkConfig());
    MINFER_RETURN_IF_ERROR(checkTokenizer());
    MINFER_RETURN_IF_ERROR(checkSource());
    MINFER_RETURN_IF_ERROR(checkTensors());
    MINFER_RETURN_IF_ERROR(checkKernels());
    MINFER_RETURN_IF_ERROR(checkMemory());
    MINFER_RETURN_IF_ERROR(checkPlan(m_->prefill(), "prefill", false));
    MINFER_RETURN_IF_ERROR(checkPlan(m_->decode(), "decode", false));
    MINFER_RETURN_IF_ERROR(checkPlan(m_->load(), "load", true));
    MINFER_RETURN_IF_ERROR(checkDerivedWrites());
    MINFER_RETURN_IF_ERROR(checkKvRingBytes());
    if (m_->argmax()) MINFER_RETURN_IF_ERROR(checkLaunchAt(*m_->argmax(), "argmax", "the argmax", LaunchPlace::kStep));
    if (m_->topk()) MINFER_RETURN_IF_ERROR(checkLaunchAt(*m_->topk(), "topk", "the top-k", LaunchPlace::kTopK));
    MINFER_RETURN_IF_ERROR(checkOverlaps());
    *segments = std::move(segments_);
    return Status::ok();
  }

 private:
  uint64_t offsetOf(const void* p) const { return static_cast<uint64_t>(static_cast<const uint8_t*>(p) - data_); }

  Status fail(const std::string& field, const void* at, const std::string& what) const {
    return Status::error(cat(path_, ": ", field, " (manifest offset ", hex(offsetOf(at)), "): ", what));
  }

  Status checkConfig() {
    const fb::ModelConfig* c = m_->config();  // required: the Verifier checked presence
    if (c->architecture()->size() == 0) return fail("config.architecture", c, "is empty");
    const std::pair<const char*, uint32_t> dims[] = {
        {"n_embd", c->n_embd()}, {"n_layer", c->n_layer()}, {"n_head", c->n_head()},
        {"n_head_kv", c->n_head_kv()}, {"head_dim", c->head_dim()}, {"n_ff", c->n_ff()},
        {"n_vocab", c->n_vocab()}};
    for (const auto& [name, value] : dims)
      if (value == 0) return fail(cat("config.", name), c, "is 0");
    if (c->n_head_kv() > c->n_head() || c->n_head() % c->n_head_kv() != 0)
      return fail("config.n_head_kv", c,
                  cat("n_head ", c->n_head(), " is not a multiple of n_head_kv ", c->n_head_kv(),
                      " (grouped-query attention shares each KV head among n_head / n_head_kv query heads)"));
    // head_dim · n_head need not equal n_embd (qwen3, Mistral Nemo), but the projections' widths
    // must be representable in the u32 fields that carry them.
    if (uint64_t{c->head_dim()} * c->n_head() > UINT32_MAX)
      return fail("config.head_dim", c, cat("head_dim ", c->head_dim(), " x n_head ", c->n_head(), " overflows 32 bits"));
    if (c->n_rot() > c->head_dim() || c->n_rot() % 2 != 0)
      return fail("config.n_rot", c,
                  cat("n_rot ", c->n_rot(), " must be even and at most head_dim ", c->head_dim(),
                      " (RoPE rotates pairs of a head's dimensions)"));
    if (static_cast<uint8_t>(c->rope_style()) > static_cast<uint8_t>(fb::RopeStyle::MAX))
      return fail("config.rope_style", c, cat("value ", int(c->rope_style()), " is not a RopeStyle (0..1)"));
    if (static_cast<uint8_t>(c->rope_scaling()) > static_cast<uint8_t>(fb::RopeScaling::MAX))
      return fail("config.rope_scaling", c, cat("value ", int(c->rope_scaling()), " is not a RopeScaling (0..2)"));
    const std::pair<const char*, float> positive[] = {{"rms_norm_eps", c->rms_norm_eps()},
                                                     {"rope_freq_base", c->rope_freq_base()},
                                                     {"rope_freq_scale", c->rope_freq_scale()}};
    for (const auto& [name, value] : positive)
      if (!std::isfinite(value) || !(value > 0)) return fail(cat("config.", name), c, cat(value, " is not a positive finite number"));
    return Status::ok();
  }

  Status checkTokenizer() {
    const fb::Tokenizer* t = m_->tokenizer();
    if (!t) return Status::ok();
    if (static_cast<uint8_t>(t->model()) > static_cast<uint8_t>(fb::TokenizerModel::MAX))
      return fail("tokenizer.model", t, cat("value ", int(t->model()), " is not a TokenizerModel (0..1)"));
    const uint64_t n = t->tokens() ? t->tokens()->size() : 0;
    if (n != m_->config()->n_vocab())
      return fail("tokenizer.tokens", t, cat("has ", n, " tokens but config.n_vocab is ", m_->config()->n_vocab()));
    if (t->scores() && t->scores()->size() != 0 && t->scores()->size() != n)
      return fail("tokenizer.scores", t, cat("has ", t->scores()->size(), " entries for ", n, " tokens"));
    if (t->token_types() && t->token_types()->size() != 0 && t->token_types()->size() != n)
      return fail("tokenizer.token_types", t, cat("has ", t->token_types()->size(), " entries for ", n, " tokens"));
    const std::pair<const char*, int32_t> ids[] = {
        {"bos_id", t->bos_id()}, {"eos_id", t->eos_id()}, {"unk_id", t->unk_id()}, {"pad_id", t->pad_id()},
        {"eot_id", t->eot_id()}, {"eom_id", t->eom_id()}};  // eot/eom: -1 in a 1.1 artifact (schema default)
    for (const auto& [name, id] : ids)
      if (id < -1 || id >= static_cast<int64_t>(n))
        return fail(cat("tokenizer.", name), t, cat("token id ", id, " is out of range (-1 = none, or 0..", n - 1, ")"));
    return Status::ok();
  }

  Status checkSource() {
    const fb::SourceInfo* s = m_->source();
    if (!s || !s->sha256() || s->sha256()->size() == 0) return Status::ok();
    const flatbuffers::String* h = s->sha256();
    bool ok = h->size() == 64;
    for (size_t i = 0; ok && i < h->size(); ++i) {
      const char ch = h->c_str()[i];
      ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
    }
    if (!ok) return fail("source.sha256", s, cat(quoted(h), " is not 64 lowercase hex digits"));
    return Status::ok();
  }

  Status checkTensors() {
    const auto* tensors = m_->tensors();
    if (!tensors) return Status::ok();
    for (flatbuffers::uoffset_t i = 0; i < tensors->size(); ++i) {
      const fb::Tensor* t = tensors->Get(i);
      const std::string field = cat("tensors[", i, "]");
      const std::string who = cat(" (tensor ", quoted(t->name()), ")");
      if (t->name()->size() == 0) return fail(field + ".name", t, "is empty");
      const GgmlTypeTraits traits = ggmlTypeTraits(t->ggml_type());
      if (!traits.known) return fail(field + ".ggml_type", t, cat(t->ggml_type(), " is not a ggml type id", who));
      const auto* ne = t->ne();
      if (!ne || ne->size() == 0 || ne->size() > 4)
        return fail(field + ".ne", t, cat("has ", ne ? ne->size() : 0, " dimensions (1..4 expected)", who));
      // flatbuffers::Verifier checks a vector's 4-byte length prefix for alignment but not its elements:
      // a forged manifest can put these 8-byte integers at an offset ≡ 4 (mod 8) (the mapping itself is
      // page-aligned, so the file offset decides).
      if (offsetOf(ne->Data()) % alignof(uint64_t) != 0)
        return fail(field + ".ne", ne, cat("elements at file offset ", offsetOf(ne->Data()),
                                           ", not a multiple of 8 (misaligned vector of ulong)", who));
      uint64_t rows = 1;
      for (flatbuffers::uoffset_t d = 0; d < ne->size(); ++d) {
        if (ne->Get(d) == 0) return fail(cat(field, ".ne[", d, "]"), t, cat("is 0", who));
        if (d > 0 && __builtin_mul_overflow(rows, ne->Get(d), &rows))
          return fail(field + ".ne", t, cat("product of dimensions overflows 64 bits", who));
      }
      const uint64_t cols = ne->Get(0);
      const auto* planes = t->planes();
      if (!planes || planes->size() == 0) return fail(field + ".planes", t, cat("is empty", who));
      for (flatbuffers::uoffset_t j = 0; j < planes->size(); ++j) {
        const fb::Plane* p = planes->Get(j);
        const std::string pf = cat(field, ".planes[", j, "]");
        const fb::StrideTable* l = p->layout();
        const std::string problem = strideTableProblem(*l);
        if (!problem.empty()) return fail(pf + ".layout", l, problem + who);
        if (l->rows() != rows || l->cols() != cols)
          return fail(pf + ".layout", l,
                      cat("plane is ", l->rows(), " rows x ", l->cols(), " cols but the tensor is ", rows, " x ", cols,
                          " (rows = ne[1]*ne[2]*ne[3], cols = ne[0])", who));
        // 1.4: an expert axis slices a 3-D tensor along ne[2] (the experts; ne[3] = 1).
        if (l->experts() > 1 && (!t->ne() || t->ne()->size() != 3 || t->ne()->Get(2) != l->experts()))
          return fail(pf + ".layout.experts", l,
                      cat("plane has ", l->experts(), " experts, but only a 3-D tensor [cols, rows per expert, experts] "
                          "has an expert axis, and its ne[2] must equal experts", who));
        if (static_cast<PlaneKind>(l->kind()) == PlaneKind::kBlocks && l->ggml_type() != t->ggml_type())
          return fail(pf + ".layout.ggml_type", l,
                      cat("blocks plane of type ", l->ggml_type(), " in a tensor of type ", t->ggml_type(), who));
        if (p->derived()) {  // 1.3: no bytes in the file; materialized at load from the tensor's kBlocks plane
          if (static_cast<PlaneKind>(l->kind()) == PlaneKind::kBlocks || !hasBlocks(t))
            return fail(pf + ".derived", p, cat("plane kind ", int(l->kind()),
                                                " is marked derived, but only a tensor's non-kBlocks planes derive from its "
                                                "stored kBlocks plane", who));
          const fb::Segment* d = p->data();
          if (d->offset() != 0 || d->size() != 0 || d->xxh64() != 0)
            return fail(pf + ".data", d, cat("a derived plane stores no bytes, but its segment is [", d->offset(), ", +",
                                             d->size(), ")", who));
          continue;
        }
        const uint64_t bytes = l->rows() * l->row_pitch();  // no overflow: strideTableProblem checked it
        if (p->data()->size() != bytes)
          return fail(pf + ".data", p->data(),
                      cat("segment is ", p->data()->size(), " bytes but the stride table implies ", l->rows(),
                          " rows x ", l->row_pitch(), " bytes = ", bytes, who));
        MINFER_RETURN_IF_ERROR(addSegment(pf + ".data", p->data(), cat("tensor ", quoted(t->name()))));
      }
    }
    return Status::ok();
  }

  // The tensor has a stored kBlocks plane (what its derived planes are expanded from).
  static bool hasBlocks(const fb::Tensor* t) {
    for (const fb::Plane* p : *t->planes())
      if (static_cast<PlaneKind>(p->layout()->kind()) == PlaneKind::kBlocks && !p->derived()) return true;
    return false;
  }

  Status checkKernels() {
    const auto* kernels = m_->kernels();
    if (!kernels) return Status::ok();
    for (flatbuffers::uoffset_t i = 0; i < kernels->size(); ++i) {
      const fb::KernelImage* k = kernels->Get(i);
      const std::string field = cat("kernels[", i, "]");
      if (k->key()->size() == 0) return fail(field + ".key", k, "is empty");
      if (k->entry()->size() == 0) return fail(field + ".entry", k, cat("is empty (kernel ", quoted(k->key()), ")"));
      if (k->arch()->size() == 0) return fail(field + ".arch", k, cat("is empty (kernel ", quoted(k->key()), ")"));
      const bool has_cubin = k->cubin() && k->cubin()->size() > 0;
      const bool has_ptx = k->ptx() && k->ptx()->size() > 0;
      if (!has_cubin && !has_ptx) return fail(field, k, cat("kernel ", quoted(k->key()), " has neither cubin nor PTX"));
      const std::string owner = cat("kernel ", quoted(k->key()));
      MINFER_RETURN_IF_ERROR(addSegment(field + ".cubin", k->cubin(), owner));
      MINFER_RETURN_IF_ERROR(addSegment(field + ".ptx", k->ptx(), owner));
    }
    return Status::ok();
  }

  Status checkMemory() {
    const fb::MemoryPlan* mem = m_->memory();
    if (!mem) return Status::ok();
    if (mem->max_batch() == 0 || mem->max_batch() > kArtifactMaxBatch)
      return fail("memory.max_batch", mem, cat(mem->max_batch(), " is out of range 1..", kArtifactMaxBatch));
    const uint64_t n = mem->buffers() ? mem->buffers()->size() : 0;
    for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
      const fb::Buffer* b = mem->buffers()->Get(i);
      const std::string field = cat("memory.buffers[", i, "]");
      if (b->name()->size() == 0) return fail(field + ".name", b, "is empty");
      if (b->width() == 0) return fail(field + ".width", b, cat("is 0 (buffer ", quoted(b->name()), ")"));
      if (static_cast<uint8_t>(b->type()) > static_cast<uint8_t>(fb::BufferType::MAX))
        return fail(field + ".type", b, cat("value ", int(b->type()), " is not a BufferType (0..3)"));
    }
    if (n > 0 && mem->input_ids() >= n)
      return fail("memory.input_ids", mem, cat("buffer id ", mem->input_ids(), " is out of range (", n, " buffers)"));
    if (n > 0 && mem->logits() >= n)
      return fail("memory.logits", mem, cat("buffer id ", mem->logits(), " is out of range (", n, " buffers)"));
    return Status::ok();
  }

  // Every element of `ids` must be < `limit`.
  Status checkIndices(const flatbuffers::Vector<uint32_t>* ids, uint64_t limit, const std::string& field,
                      const void* at, const char* what, const char* where) const {
    if (!ids) return Status::ok();
    for (flatbuffers::uoffset_t k = 0; k < ids->size(); ++k)
      if (ids->Get(k) >= limit)
        return fail(cat(field, "[", k, "]"), at,
                    cat(what, " ", ids->Get(k), " is out of range (", where, " has ", limit, ")"));
    return Status::ok();
  }

  // small: l is one of Step.small_launches, the only launches that may carry a row range (Launch.min_rows /
  // max_rows, 1.10; checkSmallLaunches bounds it).
  Status checkLaunchAt(const fb::Launch& l, const std::string& field, const std::string& who, LaunchPlace place,
                       bool small = false) const {
    if (!small && (l.min_rows() != 0 || l.max_rows() != 0))
      return fail(field + (l.min_rows() != 0 ? ".min_rows" : ".max_rows"), &l,
                  cat("row range min_rows ", l.min_rows(), ", max_rows ", l.max_rows(),
                      " on a launch outside Step.small_launches (only small-batch launches have one; 0 expected) (",
                      who, ")"));
    LaunchProblem p;
    if (checkLaunch(*m_, l, place, &p)) return Status::ok();
    return fail(field + "." + p.field, p.at, p.what + " (" + who + ")");
  }

  // Arity and fields by the op's traits (op_traits.h).
  Status checkStepShape(const fb::Step* s, const OpTraits& t, const std::string& field) const {
    const auto count = [](const flatbuffers::Vector<uint32_t>* v) { return v ? v->size() : 0u; };
    const uint32_t n_in = count(s->inputs()), n_out = count(s->outputs()), n_w = count(s->weights());
    if (n_in < t.min_inputs || n_in > t.max_inputs || n_out != t.outputs || n_w < t.min_weights || n_w > t.max_weights)
      return fail(field, s,
                  cat(t.name, " step has ", n_in, " inputs, ", n_out, " outputs, ", n_w, " weights; expected ",
                      int(t.min_inputs), "..", int(t.max_inputs), " inputs, ", int(t.outputs), " outputs, ",
                      int(t.min_weights), "..", int(t.max_weights), " weights"));
    if (t.in_place)
      for (uint32_t i = 0; i < n_out; ++i)
        if (s->outputs()->Get(i) != s->inputs()->Get(i))
          return fail(cat(field, ".outputs[", i, "]"), s, cat(t.name, " works in place but output ", i, " is buffer ",
                                                            s->outputs()->Get(i), ", input ", i, " buffer ",
                                                            s->inputs()->Get(i)));
    const std::pair<uint32_t, std::pair<const char*, uint32_t>> positive[] = {
        {kFieldHeads, {"n_head", s->n_head()}}, {kFieldKvHeads, {"n_head_kv", s->n_head_kv()}},
        {kFieldHeadDim, {"head_dim", s->head_dim()}}, {kFieldShape, {"rows", s->rows()}},
        {kFieldShape, {"cols", s->cols()}}, {kFieldExperts, {"n_expert", s->n_expert()}},
        {kFieldExperts, {"n_expert_used", s->n_expert_used()}}};
    for (const auto& [bit, f] : positive)
      if ((t.fields & bit) && (f.second == 0 || f.second > (1u << 20)))
        return fail(cat(field, ".", f.first), s, cat(t.name, " step with ", f.first, " ", f.second, " (out of range 1..2^20)"));
    if ((t.fields & kFieldExperts) && s->n_expert_used() > s->n_expert())
      return fail(field + ".n_expert_used", s, cat(t.name, " step chooses ", s->n_expert_used(), " of ", s->n_expert(),
                                                   " experts (n_expert_used must be ≤ n_expert)"));
    return Status::ok();
  }

  // With kernel images, every derived plane is written by exactly one launch of the load plan (a
  // CPU-only artifact has no launches: the CPU reads the kBlocks plane and ignores derived planes).
  Status checkDerivedWrites() const {
    if (!m_->tensors() || !m_->kernels() || m_->kernels()->size() == 0) return Status::ok();
    std::map<std::pair<uint32_t, uint8_t>, int> writes;  // (tensor, plane kind) → launches writing it
    if (m_->load() && m_->load()->steps())
      for (const fb::Step* s : *m_->load()->steps())
        if (s->launches())
          for (const fb::Launch* l : *s->launches())
            if (l->args())
              for (const fb::KernelArg* a : *l->args())
                if (a->kind() == fb::ArgKind::Weight && a->access() != fb::Access::Read && a->plane())
                  ++writes[{a->tensor(), a->plane()->kind()}];
    for (flatbuffers::uoffset_t i = 0; i < m_->tensors()->size(); ++i) {
      const fb::Tensor* t = m_->tensors()->Get(i);
      for (flatbuffers::uoffset_t j = 0; j < t->planes()->size(); ++j) {
        const fb::Plane* p = t->planes()->Get(j);
        const int n = writes[{i, p->layout()->kind()}];
        if (p->derived() && n != 1)
          return fail(cat("tensors[", i, "].planes[", j, "].derived"), p,
                      cat("derived plane kind ", int(p->layout()->kind()), " of tensor ", quoted(t->name()), " is written by ", n,
                          " load-plan launches (exactly 1 expected)"));
      }
    }
    return Status::ok();
  }

  // `load`: the load plan (ExpandBlocks steps only; its launches write derived planes).
  Status checkPlan(const fb::Plan* plan, const char* name, bool load) {
    if (!plan || !plan->steps()) return Status::ok();
    const uint64_t n_buffers = m_->memory() && m_->memory()->buffers() ? m_->memory()->buffers()->size() : 0;
    const uint64_t n_tensors = m_->tensors() ? m_->tensors()->size() : 0;
    const uint32_t n_steps = plan->steps()->size();
    bool in_tail = false;
    for (flatbuffers::uoffset_t i = 0; i < n_steps; ++i) {
      const fb::Step* s = plan->steps()->Get(i);
      const std::string field = cat(name, ".steps[", i, "]");
      const OpTraits* traits = opTraits(s->op());
      if (!traits)
        return fail(field + ".op", s, cat("value ", static_cast<uint16_t>(s->op()), " is not an OpKind (0..",
                                          static_cast<uint16_t>(fb::OpKind::MAX), ")"));
      MINFER_RETURN_IF_ERROR(checkIndices(s->inputs(), n_buffers, field + ".inputs", s, "buffer id", "memory.buffers"));
      MINFER_RETURN_IF_ERROR(checkIndices(s->outputs(), n_buffers, field + ".outputs", s, "buffer id", "memory.buffers"));
      MINFER_RETURN_IF_ERROR(checkIndices(s->weights(), n_tensors, field + ".weights", s, "tensor index", "tensors"));
      MINFER_RETURN_IF_ERROR(checkStepShape(s, *traits, field));
      MINFER_RETURN_IF_ERROR(checkViews(s, s->inputs(), s->input_views(), field + ".input_views"));
      MINFER_RETURN_IF_ERROR(checkViews(s, s->outputs(), s->output_views(), field + ".output_views"));
      MINFER_RETURN_IF_ERROR(checkStepFields(s, *traits, field));
      MINFER_RETURN_IF_ERROR(checkTail(s, *traits, field, i + 1 == n_steps, &in_tail));
      if (load != (s->op() == fb::OpKind::ExpandBlocks))
        return fail(field + ".op", s, cat(traits->name, load ? " step in the load plan, which holds ExpandBlocks steps only"
                                                             : " step outside the load plan"));
      const std::string who = cat("step '", s->name() ? s->name()->str() : "", "', ", traits->name);
      const LaunchPlace place = load ? LaunchPlace::kLoadStep : s->tail() ? LaunchPlace::kTailStep : LaunchPlace::kStep;
      if (s->launches())
        for (flatbuffers::uoffset_t k = 0; k < s->launches()->size(); ++k)
          MINFER_RETURN_IF_ERROR(checkLaunchAt(*s->launches()->Get(k), cat(field, ".launches[", k, "]"), who, place));
      MINFER_RETURN_IF_ERROR(checkPagedLaunches(s, field, who, load));
      MINFER_RETURN_IF_ERROR(checkSmallLaunches(s, field, who, plan == m_->prefill(), place));
      if (s->fused() && load) return fail(field + ".fused", s, cat(who, " in the load plan is fused (its launches are all it does)"));
      if (s->fused()) MINFER_RETURN_IF_ERROR(checkFused(plan, i, field, who));
    }
    return Status::ok();
  }

  // 1.6 paged launches: only on the prefill and decode plans' Rope and Attention steps and steps whose
  // launches take positions or a KV cache (a q MatMul running the fused QKV GEMV, a q HeadRmsNorm running the
  // fused head-norm RoPE), with launches of their own
  // (not fused, not in the tail), each a valid launch record in the paged place (artifact_file.h checkLaunch).
  Status checkPagedLaunches(const fb::Step* s, const std::string& field, const std::string& who, bool load) const {
    const auto* paged = s->paged_launches();
    if (!paged || paged->size() == 0) return Status::ok();
    if (s->fused() || s->tail() || !s->launches() || s->launches()->size() == 0)
      return fail(field + ".paged_launches", s, cat(who, " has paged launches but is fused, in the tail, or without launches"));
    bool positional = false;
    for (const fb::Launch* l : *s->launches())
      if (l->args())
        for (const fb::KernelArg* a : *l->args())
          positional |= a->kind() == fb::ArgKind::Positions || a->kind() == fb::ArgKind::KCache ||
                        a->kind() == fb::ArgKind::VCache;
    if (load || (s->op() != fb::OpKind::Rope && s->op() != fb::OpKind::Attention && !positional))
      return fail(field + ".paged_launches", s, cat(who, " has ", paged->size(), " paged launches (only the prefill and ",
                                                    "decode plans' Rope and Attention steps and steps whose launches take "
                                                    "positions or a KV cache have them)"));
    for (flatbuffers::uoffset_t k = 0; k < paged->size(); ++k)
      MINFER_RETURN_IF_ERROR(checkLaunchAt(*paged->Get(k), cat(field, ".paged_launches[", k, "]"), who, LaunchPlace::kPagedStep));
    return Status::ok();
  }

  // 1.7 small-batch launches: only on the prefill plan's MatMul steps that have launches of their own (not
  // fused), with 1 ≤ small_rows ≤ memory.max_batch; small_rows without small launches is refused too. Each is
  // a valid launch record in the step's own place (a tail step's run on one row), and its row range (1.10) is
  // bounded: 1 ≤ min_rows ≤ max_rows ≤ small_rows where set (0: unbounded), every call of 1..small_rows rows
  // served by at least one of them (checkSmallCoverage).
  Status checkSmallLaunches(const fb::Step* s, const std::string& field, const std::string& who, bool prefill,
                            LaunchPlace place) const {
    const auto* small = s->small_launches();
    const uint32_t n = small ? small->size() : 0;
    if (n == 0 && s->small_rows() == 0) return Status::ok();
    if (n == 0)
      return fail(field + ".small_rows", s, cat(who, " has small_rows ", s->small_rows(), " but no small launches"));
    if (!prefill || s->op() != fb::OpKind::MatMul)
      return fail(field + ".small_launches", s, cat(who, " has ", n, " small-batch launches (only the prefill plan's ",
                                                    "MatMul steps have them)"));
    if (s->fused() || !s->launches() || s->launches()->size() == 0)
      return fail(field + ".small_launches", s, cat(who, " has small-batch launches but is fused or without launches"));
    const uint32_t max_batch = m_->memory() ? m_->memory()->max_batch() : 0;
    if (s->small_rows() < 1 || s->small_rows() > max_batch)
      return fail(field + ".small_rows", s, cat(who, ": small_rows ", s->small_rows(), " outside 1..memory.max_batch (",
                                                max_batch, ")"));
    const uint32_t rows = s->small_rows();
    for (uint32_t k = 0; k < n; ++k) {
      const fb::Launch& l = *small->Get(k);
      const std::string at = cat(field, ".small_launches[", k, "]");
      MINFER_RETURN_IF_ERROR(checkLaunchAt(l, at, who, place, /*small=*/true));
      if (l.min_rows() > rows)
        return fail(at + ".min_rows", &l, cat(who, ": min_rows ", l.min_rows(), " above small_rows ", rows,
                                              " (1..small_rows, or 0: from 1)"));
      if (l.max_rows() > rows)
        return fail(at + ".max_rows", &l, cat(who, ": max_rows ", l.max_rows(), " above small_rows ", rows,
                                              " (1..small_rows, or 0: up to small_rows)"));
      if (l.max_rows() != 0 && l.min_rows() > l.max_rows())
        return fail(at + ".min_rows", &l, cat(who, ": min_rows ", l.min_rows(), " above max_rows ", l.max_rows(),
                                              " (the launch would serve no call)"));
    }
    return checkSmallCoverage(s, field, who);
  }

  // Every call of 1..small_rows rows runs at least one small-batch launch (ranges bounded by checkSmallLaunches;
  // 0 = 1 or small_rows). Cost: O(launches²) per step, no allocation.
  Status checkSmallCoverage(const fb::Step* s, const std::string& field, const std::string& who) const {
    const auto* small = s->small_launches();
    const uint32_t rows = s->small_rows();
    auto lo = [](const fb::Launch* l) { return std::max(l->min_rows(), 1u); };
    auto hi = [rows](const fb::Launch* l) { return l->max_rows() != 0 ? l->max_rows() : rows; };
    uint32_t next = 1;  // the fewest rows not yet known to be served
    for (bool grew = true; grew && next <= rows;) {
      grew = false;
      for (const fb::Launch* l : *small)
        if (lo(l) <= next && hi(l) >= next) next = hi(l) + 1, grew = true;
    }
    if (next > rows) return Status::ok();
    std::string ranges;
    for (const fb::Launch* l : *small) ranges += cat(ranges.empty() ? "" : ", ", lo(l), "..", hi(l));
    return fail(field + ".small_launches", s,
                cat(who, ": a call of n_tokens = ", next, " runs none of its ", small->size(), " small-batch launches (rows ",
                    ranges, "; small_rows ", rows, ")"));
  }

  // A fused step (schema Step.fused) has no launches of its own and follows, directly or through other
  // fused steps, a step that has some, on the same side of the last-token tail; each of its output
  // buffers is written by those launches.
  Status checkFused(const fb::Plan* plan, flatbuffers::uoffset_t i, const std::string& field, const std::string& who) {
    const fb::Step* s = plan->steps()->Get(i);
    if (s->launches() && s->launches()->size() > 0)
      return fail(field + ".fused", s, cat(who, " is fused into the step before it but has ", s->launches()->size(), " launches"));
    flatbuffers::uoffset_t p = i;
    while (p > 0 && plan->steps()->Get(p - 1)->fused()) --p;
    const fb::Step* prev = p > 0 ? plan->steps()->Get(p - 1) : nullptr;
    if (!prev || !prev->launches() || prev->launches()->size() == 0)
      return fail(field + ".fused", s, cat(who, " is fused into the step before it, which has no launches"));
    if (prev->tail() != s->tail())
      return fail(field + ".fused", s, cat(who, " is fused into a step on the other side of the last-token tail"));
    if (!s->outputs() || s->outputs()->size() == 0)
      return fail(field + ".fused", s, cat(who, " is fused but has no outputs for the step before it to write"));
    for (uint32_t out : *s->outputs()) {
      bool written = false;
      for (const fb::Launch* l : *prev->launches())
        if (l->args())
          for (const fb::KernelArg* a : *l->args())
            written |= (a->kind() == fb::ArgKind::Activation || a->kind() == fb::ArgKind::Q8Values ||
                        a->kind() == fb::ArgKind::Q8Meta) &&
                       a->access() != fb::Access::Read && a->buffer() == out;
      if (!written)
        return fail(field + ".fused", s, cat(who, " is fused into the step before it, whose launches do not write its output buffer ",
                                             out));
    }
    return Status::ok();
  }

  // 1.4 column views: absent or one per operand, each non-empty and inside its buffer (ids checked
  // before), and only on the ops that take them (op_traits.h takesColumnViews).
  Status checkViews(const fb::Step* s, const flatbuffers::Vector<uint32_t>* ids,
                    const flatbuffers::Vector<const fb::ColumnView*>* views, const std::string& field) const {
    if (!views || views->size() == 0) return Status::ok();
    const uint32_t n = ids ? ids->size() : 0;
    if (!takesColumnViews(s->op()))
      return fail(field, s, cat(opName(s->op()), " step with column views (only Rope, Attention, SwiGlu, GeGlu and Add take them)"));
    if (views->size() != n) return fail(field, s, cat(views->size(), " views for ", n, " operands (one per operand)"));
    for (uint32_t i = 0; i < n; ++i) {
      const fb::ColumnView* v = views->Get(i);
      const fb::Buffer* b = m_->memory()->buffers()->Get(ids->Get(i));
      if (v->width() == 0 || uint64_t{v->offset()} + v->width() > b->width())
        return fail(cat(field, "[", i, "]"), v,
                    cat("columns ", v->offset(), " + ", v->width(), " are empty or outside buffer ", quoted(b->name()),
                        " of width ", b->width()));
    }
    return Status::ok();
  }

  Status checkStepFields(const fb::Step* s, const OpTraits& t, const std::string& field) const {
    const uint32_t n_layer = m_->config()->n_layer();
    const bool needs_layer = t.fields & kFieldLayer;
    if (s->layer() < (needs_layer ? 0 : -1) || s->layer() >= static_cast<int64_t>(n_layer))
      return fail(field + ".layer", s,
                  cat("layer ", s->layer(), " is out of range (config.n_layer is ", n_layer,
                      needs_layer ? "; attention needs a KV cache layer)" : "; -1 = none)"));
    if (static_cast<uint8_t>(s->rope_style()) > static_cast<uint8_t>(fb::RopeStyle::MAX))
      return fail(field + ".rope_style", s, cat("value ", int(s->rope_style()), " is not a RopeStyle (0..1)"));
    if (!std::isfinite(s->eps()) || s->eps() < 0)
      return fail(field + ".eps", s, cat(s->eps(), " is not a finite non-negative number"));
    if (!std::isfinite(s->rope_freq_base()) || !std::isfinite(s->rope_freq_scale()))
      return fail(field + ".rope_freq_base", s,
                  cat("RoPE base ", s->rope_freq_base(), " / scale ", s->rope_freq_scale(), " not finite"));
    if (!std::isfinite(s->scale()) || !std::isfinite(s->softcap()) || s->softcap() < 0)
      return fail(field + ".softcap", s,
                  cat("scale ", s->scale(), " / softcap ", s->softcap(), " must be finite (softcap ≥ 0)"));
    // 1.3, YaRN (kernels/rope.cuh; 1.1 and 1.2 artifacts read the defaults 0, 1, 32, 1, 0: none).
    if (!(s->rope_ext_factor() >= 0 && s->rope_ext_factor() <= 1))
      return fail(field + ".rope_ext_factor", s, cat(s->rope_ext_factor(), " is not in [0, 1] (0: no YaRN)"));
    if (!std::isfinite(s->rope_attn_factor()) || !(s->rope_attn_factor() > 0))
      return fail(field + ".rope_attn_factor", s, cat(s->rope_attn_factor(), " is not a finite number > 0"));
    if (!std::isfinite(s->rope_beta_fast()) || !(s->rope_beta_fast() > 0) || !std::isfinite(s->rope_beta_slow()) ||
        !(s->rope_beta_slow() > 0))
      return fail(field + ".rope_beta_fast", s,
                  cat("YaRN beta_fast ", s->rope_beta_fast(), " / beta_slow ", s->rope_beta_slow(),
                      " must be finite and > 0"));
    if (s->rope_ext_factor() != 0 && s->rope_n_ctx_orig() == 0)
      return fail(field + ".rope_n_ctx_orig", s, "is 0, but YaRN (rope_ext_factor ≠ 0) needs the original context");
    // 1.6: a ring KV cache only on a windowed Attention, large enough for one step's keys (schema Step.kv_ring).
    if (s->kv_ring() != 0) {
      const uint32_t max_batch = m_->memory() ? m_->memory()->max_batch() : 1;
      const uint64_t need = uint64_t{s->window()} + max_batch - 1;
      if (s->op() != fb::OpKind::Attention || s->window() == 0)
        return fail(field + ".kv_ring", s, cat("KV ring of ", s->kv_ring(), " positions on a ", opName(s->op()),
                                               " step without a sliding window (window ", s->window(), ")"));
      if (s->kv_ring() < need || s->kv_ring() > (1u << 30))
        return fail(field + ".kv_ring", s,
                    cat("KV ring of ", s->kv_ring(), " positions is outside ", need, "..2^30 (window ", s->window(),
                        " + memory.max_batch ", max_batch, " - 1 keys are read at once)"));
    }
    if (s->n_head_kv() > 0 && s->n_head() % s->n_head_kv() != 0)
      return fail(field + ".n_head_kv", s,
                  cat("n_head ", s->n_head(), " is not a multiple of n_head_kv ", s->n_head_kv()));
    if (s->n_rot() > s->head_dim() || s->n_rot() % 2 != 0)
      return fail(field + ".n_rot", s,
                  cat("n_rot ", s->n_rot(), " must be even and at most head_dim ", s->head_dim()));
    return Status::ok();
  }

  // 1.8: memory.kv_ring_bytes_per_token and kv_ring_bytes are what the Attention steps' kv_ring imply
  // (per layer: 2 × 2 × n_head_kv × head_dim bytes per position, f16 K and V); older artifacts read 0.
  Status checkKvRingBytes() const {
    const fb::MemoryPlan* mem = m_->memory();
    if (!mem || m_->format_minor() < 8) return Status::ok();
    std::map<int32_t, std::pair<uint64_t, uint64_t>> layers;  // layer → (bytes per position, ring bytes)
    for (const fb::Plan* plan : {m_->prefill(), m_->decode()})
      if (plan && plan->steps())
        for (const fb::Step* s : *plan->steps()) {
          if (s->op() != fb::OpKind::Attention || s->kv_ring() == 0) continue;
          uint64_t per_position = 0, ring_bytes = 0;
          if (__builtin_mul_overflow(uint64_t{4} * s->n_head_kv(), uint64_t{s->head_dim()}, &per_position) ||
              __builtin_mul_overflow(per_position, uint64_t{s->kv_ring()}, &ring_bytes))
            return fail("memory.kv_ring_bytes", mem, cat("layer ", s->layer(), "'s ring of ", s->kv_ring(),
                                                        " positions overflows 64 bits"));
          layers.try_emplace(s->layer(), per_position, ring_bytes);
        }
    uint64_t per_token = 0, bytes = 0;
    for (const auto& [layer, l] : layers)
      if (__builtin_add_overflow(per_token, l.first, &per_token) || __builtin_add_overflow(bytes, l.second, &bytes))
        return fail("memory.kv_ring_bytes", mem, "the rings' bytes overflow 64 bits");
    if (mem->kv_ring_bytes_per_token() != per_token || mem->kv_ring_bytes() != bytes ||
        per_token > mem->kv_bytes_per_token())
      return fail("memory.kv_ring_bytes_per_token", mem,
                  cat("kv_ring_bytes_per_token ", mem->kv_ring_bytes_per_token(), " and kv_ring_bytes ",
                      mem->kv_ring_bytes(), " (of kv_bytes_per_token ", mem->kv_bytes_per_token(),
                      ") differ from the ", layers.size(), " ring layers' ", per_token, " and ", bytes,
                      " (Attention steps' kv_ring, n_head_kv, head_dim)"));
    return Status::ok();
  }

  // Tail steps (schema Plan) form a suffix of row-wise, not in-place steps ending in the logits.
  Status checkTail(const fb::Step* s, const OpTraits& t, const std::string& field, bool last, bool* in_tail) const {
    if (!s->tail()) {
      if (*in_tail) return fail(field + ".tail", s, "a step outside the last-token tail follows a tail step (the tail is a suffix)");
      return Status::ok();
    }
    *in_tail = true;
    if (!t.row_wise || t.in_place)
      return fail(field + ".tail", s, cat(t.name, " step marked as last-token tail, but it is not a row-wise, out-of-place op"));
    const uint32_t logits = m_->memory() ? m_->memory()->logits() : 0;
    if (last && (!s->outputs() || s->outputs()->size() != 1 || s->outputs()->Get(0) != logits))
      return fail(field + ".tail", s, cat("the last-token tail must end by writing the logits buffer ", logits));
    return Status::ok();
  }

  // A segment of `field` must be empty (0, 0) or aligned, after the manifest and inside the file.
  Status addSegment(const std::string& field, const fb::Segment* s, const std::string& owner) {
    if (!s) return Status::ok();
    if (s->size() == 0) {
      if (s->offset() != 0)
        return fail(field, s, cat("empty segment has offset ", s->offset(), " (an empty segment is (0, 0))"));
      return Status::ok();
    }
    if (s->offset() % kArtifactSegmentAlignment != 0)
      return fail(field, s, cat("segment offset ", s->offset(), " (", hex(s->offset()), ") is not a multiple of ",
                                kArtifactSegmentAlignment));
    if (s->offset() < n_)
      return fail(field, s, cat("segment at offset ", s->offset(), " starts inside the manifest (", n_, " bytes)"));
    uint64_t end;
    if (__builtin_add_overflow(s->offset(), s->size(), &end) || end > size_)
      return fail(field, s,
                  cat("segment [", s->offset(), ", +", s->size(), ") ends past the end of the file (", size_,
                      " bytes): truncated artifact?"));
    segments_.push_back({field, s, owner});
    return Status::ok();
  }

  Status checkOverlaps() {
    std::stable_sort(segments_.begin(), segments_.end(), [](const auto& a, const auto& b) {
      return a.segment->offset() < b.segment->offset();
    });
    for (size_t i = 1; i < segments_.size(); ++i) {
      const auto& prev = segments_[i - 1];
      const auto& cur = segments_[i];
      const uint64_t prev_end = prev.segment->offset() + prev.segment->size();
      if (cur.segment->offset() < prev_end)
        return fail(cur.field, cur.segment,
                    cat("segment [", cur.segment->offset(), ", +", cur.segment->size(), ") overlaps ", prev.field, " [",
                        prev.segment->offset(), ", +", prev.segment->size(), ")"));
    }
    return Status::ok();
  }

  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t n_;
  const fb::Artifact* m_;
  std::vector<ArtifactFile::SegmentRef> segments_;
};

}  // namespace

Status verifyStructure(const std::string& path, const uint8_t* data, uint64_t size, uint64_t* manifest_size) {
  constexpr uint64_t kHeader = 12;  // size prefix, root offset, file identifier
  if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0)
    return Status::error(cat(path, ": is a GGUF model, not a minfer artifact: compile it first with "
                                   "`minfer-compile ", path, " -o MODEL.mfb`"));
  if (size < kHeader)
    return Status::error(cat(path, ": file is ", size, " bytes, too small for an artifact header (", kHeader,
                             " bytes: size prefix, root offset, identifier \"MFB1\"): truncated or not an artifact"));
  if (std::memcmp(data + 8, fb::ArtifactIdentifier(), 4) != 0)
    return Status::error(cat(path, ": file identifier at offset 8 is \"",
                             printable(reinterpret_cast<const char*>(data + 8), 4), "\", expected \"",
                             fb::ArtifactIdentifier(), "\": not a minfer artifact"));
  const uint64_t prefix = readLE32(data);
  const uint64_t n = prefix + 4;
  if (prefix < kHeader - 4)
    return Status::error(cat(path, ": manifest size prefix at offset 0 is ", prefix,
                             ", smaller than a FlatBuffer header (8 bytes)"));
  if (n > size)
    return Status::error(cat(path, ": manifest size prefix at offset 0 says ", n, " bytes (", prefix,
                             " + 4) but the file has only ", size, " bytes: truncated artifact"));
  if (n >= FLATBUFFERS_MAX_BUFFER_SIZE)
    return Status::error(cat(path, ": manifest size ", n, " exceeds the FlatBuffers limit of ",
                             FLATBUFFERS_MAX_BUFFER_SIZE, " bytes"));
  flatbuffers::Verifier::Options opts;
  opts.max_depth = kVerifierMaxDepth;
  opts.max_tables = kVerifierMaxTables;
  opts.check_alignment = true;
  flatbuffers::Verifier verifier(data, n, opts);
  if (!fb::VerifySizePrefixedArtifactBuffer(verifier)) {
    const std::string where = StructureLocator(data, n, opts).locate();
    return Status::error(cat(path, ": manifest (bytes [0, ", n, ")) fails FlatBuffers verification",
                             where.empty() ? cat(" (nesting deeper than ", kVerifierMaxDepth, " or more than ",
                                                 kVerifierMaxTables, " tables?)")
                                           : " in " + where,
                             ": damaged or truncated manifest"));
  }
  *manifest_size = n;
  return Status::ok();
}

Status verifySemantics(const std::string& path, const uint8_t* data, uint64_t size, uint64_t manifest_size,
                       std::vector<ArtifactFile::SegmentRef>* segments) {
  return SemanticVerifier(path, data, size, manifest_size).run(segments);
}

std::string strideTableProblem(const fb::StrideTable& t) {
  if (t.kind() > static_cast<uint8_t>(PlaneKind::kBlocks))
    return cat("kind ", int(t.kind()), " is not a PlaneKind (0..", int(PlaneKind::kBlocks), ")");
  if (t.elem() > static_cast<uint8_t>(ElemType::kU8))
    return cat("elem ", int(t.elem()), " is not an ElemType (0..", int(ElemType::kU8), ")");
  if (t.rows() == 0 || t.cols() == 0 || t.row_pitch() == 0)
    return cat("rows ", t.rows(), ", cols ", t.cols(), ", row_pitch ", t.row_pitch(), ": none may be 0");
  uint64_t bytes;
  if (__builtin_mul_overflow(t.rows(), t.row_pitch(), &bytes))
    return cat("rows ", t.rows(), " x row_pitch ", t.row_pitch(), " overflows 64 bits");
  // 1.4: the expert axis (kernels/stride_table.h): experts ≥ 1 slices of rows / experts rows each.
  if (t.experts() == 0) return "experts is 0 (1: no expert axis)";
  if (t.experts() == 1 && t.expert_pitch() != 0)
    return cat("expert_pitch ", t.expert_pitch(), " without an expert axis (experts 1; expected 0)");
  if (t.experts() > 1 && (t.rows() % t.experts() != 0 || t.expert_pitch() != t.rows() / t.experts() * t.row_pitch()))
    return cat("expert axis: ", t.experts(), " experts of ", t.rows(), " rows with row_pitch ", t.row_pitch(),
               " need rows a multiple of experts and expert_pitch = rows / experts x row_pitch = ",
               t.rows() % t.experts() == 0 ? t.rows() / t.experts() * t.row_pitch() : 0, ", found ", t.expert_pitch());
  const auto kind = static_cast<PlaneKind>(t.kind());
  const auto elem = static_cast<ElemType>(t.elem());
  auto expectElem = [&](ElemType want) -> std::string {
    return elem == want ? "" : cat("elem ", int(t.elem()), " does not fit plane kind ", int(t.kind()), " (expected ",
                                   int(want), ")");
  };
  uint64_t need = 0;  // minimum row_pitch
  switch (kind) {
    case PlaneKind::kI8: case PlaneKind::kF32: case PlaneKind::kF16: case PlaneKind::kBF16: {
      const ElemType want = kind == PlaneKind::kI8    ? ElemType::kI8
                            : kind == PlaneKind::kF32 ? ElemType::kF32
                            : kind == PlaneKind::kF16 ? ElemType::kF16
                                                      : ElemType::kBF16;
      if (auto why = expectElem(want); !why.empty()) return why;
      if (__builtin_mul_overflow(t.cols(), uint64_t{elemBytes(elem)}, &need))
        return cat("cols ", t.cols(), " x ", elemBytes(elem), " bytes overflows 64 bits");
      break;
    }
    case PlaneKind::kScale: case PlaneKind::kMin: {
      if (elem != ElemType::kF32 && elem != ElemType::kF16)
        return cat("elem ", int(t.elem()), " of a scale/min plane is neither f32 (1) nor f16 (2)");
      if (t.group_size() == 0) return "group_size is 0";
      if (t.group_pitch() < elemBytes(elem))
        return cat("group_pitch ", t.group_pitch(), " is smaller than one element (", elemBytes(elem), " bytes)");
      const uint64_t groups = t.cols() / t.group_size() + (t.cols() % t.group_size() != 0);
      if (__builtin_mul_overflow(groups, uint64_t{t.group_pitch()}, &need))
        return cat(groups, " groups x group_pitch ", t.group_pitch(), " overflows 64 bits");
      break;
    }
    case PlaneKind::kPacked: {
      if (auto why = expectElem(ElemType::kU8); !why.empty()) return why;
      if (t.bits() == 4) {
        if (t.cols() % 32 != 0) return cat("4-bit packed plane with cols ", t.cols(), " not a multiple of 32");
        need = t.cols() / 2;
      } else if (t.bits() == 8) {
        need = t.cols();
      } else {
        return cat("bits ", t.bits(), " of a packed plane is neither 4 nor 8");
      }
      break;
    }
    case PlaneKind::kBlocks: {
      if (auto why = expectElem(ElemType::kU8); !why.empty()) return why;
      const GgmlTypeTraits traits = ggmlTypeTraits(t.ggml_type());
      if (!traits.known) return cat("ggml_type ", t.ggml_type(), " of a blocks plane is not a ggml type id");
      // group_pitch: the block's bytes, or a slot padded to 16 bytes (layout_planner.h).
      const uint64_t padded = alignUp(traits.type_size, kPlaneRowAlign);
      if (t.group_size() != traits.block_size || (t.group_pitch() != traits.type_size && t.group_pitch() != padded))
        return cat("group_size ", t.group_size(), " / group_pitch ", t.group_pitch(), " differ from ", traits.name,
                   " blocks (", traits.block_size, " weights in ", traits.type_size, " bytes, in slots of ",
                   traits.type_size, " or ", padded, " bytes)");
      if (t.cols() % traits.block_size != 0)
        return cat("cols ", t.cols(), " is not a multiple of the ", traits.name, " block size ", traits.block_size);
      if (__builtin_mul_overflow(t.cols() / traits.block_size, uint64_t{t.group_pitch()}, &need))
        return cat("row of ", t.cols(), " ", traits.name, " weights overflows 64 bits");
      break;
    }
  }
  if (t.row_pitch() < need)
    return cat("row_pitch ", t.row_pitch(), " is smaller than one row of ", t.cols(), " weights (", need, " bytes)");
  return "";
}

}  // namespace minfer::artifact
