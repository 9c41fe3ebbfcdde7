// Semantic checks of one launch record (see artifact_file.h checkLaunch): the contract between the
// compiler's op families and the runtime's generic binder, checked before any kernel is bound.
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/topk.cuh"
#include "runtime/artifact/artifact_file.h"
#include "runtime/util/terminal_text.h"

namespace minfer::artifact {
namespace {

using artifact_detail::cat;

// A string of the manifest as a message shows it: control characters and ill-formed UTF-8 escaped.
std::string shown(const flatbuffers::String* s) {
  return s ? util::escapeForTerminal(std::string_view(s->c_str(), s->size()), 128) : std::string();
}

class LaunchChecker {
 public:
  LaunchChecker(const fb::Artifact& m, const fb::Launch& l, LaunchPlace place, LaunchProblem* p)
      : m_(m),
        l_(l),
        tail_(place == LaunchPlace::kTailStep),
        load_(place == LaunchPlace::kLoadStep),
        paged_(place == LaunchPlace::kPagedStep),
        topk_(place == LaunchPlace::kTopK),
        p_(p) {}

  bool run() { return images() && args() && shape(); }

 private:
  bool fail(std::string field, const void* at, std::string what) {
    *p_ = {std::move(field), at, std::move(what)};
    return false;
  }

  // "kernel 'mmq_…_sm90' (minfer_mmq)", for messages.
  std::string kernel() const {
    const auto* k = m_.kernels();
    if (!l_.images() || l_.images()->size() == 0 || !k || l_.images()->Get(0) >= k->size()) return "kernel ?";
    const fb::KernelImage* img = k->Get(l_.images()->Get(0));
    return cat("kernel '", shown(img->key()), "' (", shown(img->entry()), ")");
  }

  bool images() {
    const uint64_t n_arch = m_.target_archs() ? m_.target_archs()->size() : 0;
    const uint64_t n_img = l_.images() ? l_.images()->size() : 0;
    const uint64_t n_kernels = m_.kernels() ? m_.kernels()->size() : 0;
    if (n_img != n_arch || n_arch == 0)
      return fail("images", &l_, cat("has ", n_img, " kernel images for ", n_arch, " target archs (one per arch)"));
    const fb::KernelImage* first = nullptr;
    for (flatbuffers::uoffset_t a = 0; a < n_img; ++a) {
      const uint32_t i = l_.images()->Get(a);
      if (i >= n_kernels) return fail(cat("images[", a, "]"), &l_, cat("kernel index ", i, " is out of range (kernels has ", n_kernels, ")"));
      const fb::KernelImage* k = m_.kernels()->Get(i);
      if (k->arch()->str() != m_.target_archs()->Get(a)->str())
        return fail(cat("images[", a, "]"), &l_,
                    cat("kernels[", i, "] is for ", shown(k->arch()), " but target_archs[", a, "] is ",
                        shown(m_.target_archs()->Get(a))));
      if (first && k->entry()->str() != first->entry()->str())
        return fail(cat("images[", a, "]"), &l_,
                    cat("kernels[", i, "] has entry ", shown(k->entry()), ", the launch's other images ",
                        shown(first->entry())));
      first = first ? first : k;
    }
    return true;
  }

  bool args() {
    const uint64_t n = l_.args() ? l_.args()->size() : 0;
    if (n > kArtifactMaxKernelArgs)
      return fail("args", &l_, cat(n, " arguments, more than ", kArtifactMaxKernelArgs, " (", kernel(), ")"));
    uint64_t slots = 0;  // TopK arguments
    for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
      if (!arg(cat("args[", i, "]"), *l_.args()->Get(i))) return false;
      slots += l_.args()->Get(i)->kind() == fb::ArgKind::TopK;
    }
    if (topk_ && slots != 1)
      return fail("args", &l_, cat("the top-k launch needs exactly one TopK argument (its request and result slot), has ",
                                   slots, " (", kernel(), ")"));
    return true;
  }

  bool arg(const std::string& f, const fb::KernelArg& a) {
    if (a.kind() > fb::ArgKind::MAX)
      return fail(f + ".kind", &a, cat("value ", int(a.kind()), " is not an ArgKind (0..", int(fb::ArgKind::MAX), ")"));
    if (a.access() > fb::Access::MAX)
      return fail(f + ".access", &a, cat("value ", int(a.access()), " is not an Access (0..", int(fb::Access::MAX), ")"));
    switch (a.kind()) {
      case fb::ArgKind::Activation: case fb::ArgKind::Q8Values: case fb::ArgKind::Q8Meta: return buffer(f, a);
      case fb::ArgKind::Weight: return weight(f, a);
      case fb::ArgKind::KCache: case fb::ArgKind::VCache: return cache(f, a);
      case fb::ArgKind::Scratch:
        if (a.bytes() == 0 || a.bytes() > kArtifactMaxScratchBytes)
          return fail(f + ".bytes", &a, cat("scratch of ", a.bytes(), " bytes is out of range 1..", kArtifactMaxScratchBytes));
        return notInTail(f, a, "scratch");
      case fb::ArgKind::Counters:
        if (a.bytes() == 0 || a.bytes() % 4 != 0 || a.bytes() > kArtifactMaxCounterBytes)
          return fail(f + ".bytes", &a, cat("counters of ", a.bytes(), " bytes: need a multiple of 4 in 4..",
                                         kArtifactMaxCounterBytes));
        return true;
      case fb::ArgKind::Positions:
        if (paged_)
          return fail(f + ".kind", &a, cat("a paged launch takes per-row positions (RowPositions), not Positions (", kernel(), ")"));
        return notInTail(f, a, "the positions");
      case fb::ArgKind::RowPositions: case fb::ArgKind::BlockTables: case fb::ArgKind::BlockSize:
        if (!paged_)
          return fail(f + ".kind", &a, cat(fb::EnumNameArgKind(a.kind()), " argument outside a paged launch (Step.paged_launches) (",
                                           kernel(), ")"));
        return true;
      case fb::ArgKind::TopK:
        if (!topk_)
          return fail(f + ".kind", &a, cat("TopK argument outside Artifact.topk (", kernel(), ")"));
        if (a.bytes() != sizeof(kern::TopKSlot))
          return fail(f + ".bytes", &a, cat(kernel(), " was built for a top-k slot of ", a.bytes(),
                                            " bytes; this runtime's TopKSlot (kernels/topk.cuh) is ", sizeof(kern::TopKSlot)));
        return true;
      default: return true;
    }
  }

  bool notInTail(const std::string& f, const fb::KernelArg& a, const char* what) {
    if (!tail_) return true;
    return fail(f + ".kind", &a, cat("a last-token tail step may not use ", what, " (", kernel(), "); tail steps are row-wise"));
  }

  bool buffer(const std::string& f, const fb::KernelArg& a) {
    const auto* bufs = m_.memory() ? m_.memory()->buffers() : nullptr;
    const uint64_t n = bufs ? bufs->size() : 0;
    if (a.buffer() >= n) return fail(f + ".buffer", &a, cat("buffer id ", a.buffer(), " is out of range (", n, " buffers)"));
    const fb::Buffer* b = bufs->Get(a.buffer());
    const bool q8 = a.kind() != fb::ArgKind::Activation;
    if (q8 != (b->type() == fb::BufferType::I8))
      return fail(f + ".kind", &a, cat(fb::EnumNameArgKind(a.kind()), " argument on buffer '", shown(b->name()), "' of type ",
                                       fb::EnumNameBufferType(b->type()), " (", kernel(), ")"));
    if (a.width() != b->width() || (q8 && a.width() % kern::kQ8Block != 0))
      return fail(f + ".width", &a, cat(kernel(), " was specialized for rows of ", a.width(), " but buffer '", shown(b->name()),
                                        "' is ", b->width(), " wide", q8 ? " (q8 widths are multiples of 32)" : ""));
    // 1.4 column views: width is the buffer's (the kernel's row pitch); the view lies inside a row.
    if (q8 && (a.view_offset() != 0 || a.view_width() != 0))
      return fail(f + ".view_width", &a, cat("a ", fb::EnumNameArgKind(a.kind()), " argument with a column view (", kernel(), ")"));
    if (a.view_width() == 0 ? a.view_offset() != 0 : uint64_t{a.view_offset()} + a.view_width() > a.width())
      return fail(f + ".view_offset", &a, cat("column view ", a.view_offset(), " + ", a.view_width(), " is outside rows of ",
                                              a.width(), " in buffer '", shown(b->name()), "' (", kernel(), ")"));
    if (tail_ && a.access() == fb::Access::ReadWrite)
      return fail(f + ".access", &a, cat("a last-token tail step may not update buffer '", shown(b->name()), "' in place (", kernel(), ")"));
    return true;
  }

  bool cache(const std::string& f, const fb::KernelArg& a) {
    if (a.layer() >= m_.config()->n_layer())
      return fail(f + ".layer", &a, cat("KV cache layer ", a.layer(), " is out of range (config.n_layer is ", m_.config()->n_layer(), ")"));
    if (a.width() == 0 || a.width() > (1u << 20))
      return fail(f + ".width", &a, cat("KV cache width ", a.width(), " is out of range 1..2^20"));
    return notInTail(f, a, "the KV cache");
  }

  bool weight(const std::string& f, const fb::KernelArg& a) {
    const auto* tensors = m_.tensors();
    const uint64_t n = tensors ? tensors->size() : 0;
    if (a.tensor() >= n) return fail(f + ".tensor", &a, cat("tensor index ", a.tensor(), " is out of range (", n, " tensors)"));
    const fb::StrideTable* want = a.plane();
    if (!want) return fail(f + ".plane", &a, cat("a Weight argument without the stride table it was specialized for (", kernel(), ")"));
    const fb::Tensor* t = tensors->Get(a.tensor());
    const fb::Plane* plane = nullptr;
    if (t->planes())
      for (const fb::Plane* p : *t->planes())
        if (p->layout()->kind() == want->kind()) plane = p;
    const std::string who = cat(kernel(), ", argument '", a.name() ? shown(a.name()) : "", "'");
    if (!plane)
      return fail(f + ".plane.kind", want, cat(who, " reads plane kind ", int(want->kind()), " of tensor '", shown(t->name()), "', which has no such plane"));
    // Derived planes (1.3) are written by the load plan, once, and read afterwards; stored planes are
    // never written. Within the load plan a derived plane is not read (nothing has written it yet).
    const bool writes = a.access() != fb::Access::Read;
    if (writes && !(load_ && plane->derived()))
      return fail(f + ".access", &a, cat(who, " writes plane kind ", int(want->kind()), " of tensor '", shown(t->name()), "': ",
                                         load_ ? "a stored plane is never written" : "only the load plan writes weight planes"));
    if (!writes && load_ && plane->derived())
      return fail(f + ".access", &a, cat(who, " reads derived plane kind ", int(want->kind()), " of tensor '", shown(t->name()),
                                         "' in the load plan, which is what writes it"));
    const fb::StrideTable* have = plane->layout();
    const std::pair<const char*, std::pair<uint64_t, uint64_t>> fields[] = {
        {"elem", {want->elem(), have->elem()}},
        {"rows", {want->rows(), have->rows()}},
        {"cols", {want->cols(), have->cols()}},
        {"row_pitch", {want->row_pitch(), have->row_pitch()}},
        {"group_size", {want->group_size(), have->group_size()}},
        {"group_pitch", {want->group_pitch(), have->group_pitch()}},
        {"bits", {want->bits(), have->bits()}},
        {"q_offset", {static_cast<uint64_t>(want->q_offset()), static_cast<uint64_t>(have->q_offset())}},
        {"ggml_type", {want->ggml_type(), have->ggml_type()}},
        {"experts", {want->experts(), have->experts()}},
        {"expert_pitch", {want->expert_pitch(), have->expert_pitch()}}};
    for (const auto& [name, v] : fields)
      if (v.first != v.second) {
        const bool is_signed = std::string(name) == "q_offset";
        const auto show = [&](uint64_t x) { return is_signed ? cat(static_cast<int32_t>(x)) : cat(x); };
        return fail(cat(f, ".plane.", name), want,
                    cat(who, " was specialized for ", name, " ", show(v.first), " of tensor '", shown(t->name()),
                        "' plane kind ", int(want->kind()), ", but that plane's stride table has ", name, " ",
                        show(v.second), ": the kernel would address the plane's bytes with the wrong stride"));
      }
    return true;
  }

  // Extent bounds over n in [lo, hi]: monotone in n, so the ends decide.
  bool extents(const char* name, const fb::Grid& g, uint32_t lo, uint32_t hi) {
    const fb::GridExtent* e[3] = {&g.x(), &g.y(), &g.z()};
    const uint64_t limit[3] = {0x7fffffffu, 65535, 65535};
    for (int d = 0; d < 3; ++d) {
      if (e[d]->divisor() == 0) return fail(cat(name, ".", "xyz"[d], ".divisor"), &l_, cat("is 0 (", kernel(), ")"));
      const auto at = [&](uint64_t n) { return (e[d]->per_token() * n + e[d]->constant() + e[d]->divisor() - 1) / e[d]->divisor(); };
      if (at(lo) < 1 || at(hi) > limit[d])
        return fail(cat(name, ".", "xyz"[d]), &l_,
                    cat("extent ", at(lo), "..", at(hi), " for ", lo, "..", hi, " tokens is outside 1..", limit[d], " (", kernel(), ")"));
    }
    return true;
  }

  bool shape() {
    const uint32_t max_batch = m_.memory() ? m_.memory()->max_batch() : 1;
    const uint32_t from = l_.large_from();
    if (!extents("grid", *l_.grid(), 1, from > 0 && from <= max_batch ? from - 1 : max_batch)) return false;
    if (from > 0 && from <= max_batch) {
      if (!l_.grid_large()) return fail("grid_large", &l_, cat("is absent but large_from is ", from, " (", kernel(), ")"));
      if (!extents("grid_large", *l_.grid_large(), from, max_batch)) return false;
    }
    const fb::Dim3& b = *l_.block();
    const uint64_t threads = uint64_t{b.x()} * b.y() * b.z();
    if (b.x() == 0 || b.y() == 0 || b.z() == 0 || threads > 1024 || b.z() > 64)
      return fail("block", &l_, cat("block ", b.x(), " x ", b.y(), " x ", b.z(), " is outside CUDA's limits (", kernel(), ")"));
    if (l_.smem() > kArtifactMaxSharedBytes)
      return fail("smem", &l_, cat(l_.smem(), " bytes of dynamic shared memory, more than ", kArtifactMaxSharedBytes, " (", kernel(), ")"));
    return true;
  }

  const fb::Artifact& m_;
  const fb::Launch& l_;
  bool tail_;
  bool load_;
  bool paged_;  // Step.paged_launches (1.6)
  bool topk_;   // Artifact.topk (1.9)
  LaunchProblem* p_;
};

}  // namespace

bool checkLaunch(const fb::Artifact& m, const fb::Launch& launch, LaunchPlace place, LaunchProblem* problem) {
  return LaunchChecker(m, launch, place, problem).run();
}

}  // namespace minfer::artifact
