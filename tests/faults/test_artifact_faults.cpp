// Fault tests of artifacts that are sound but not for this runtime or this machine: another format
// version, kernels for a GPU arch on a machine without a GPU, and a context too large for memory.
#include <doctest/doctest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "tests/faults/fault_support.h"
#include "tests/test_support.h"

using minfer::test::ChildResult;
using minfer::test::TinyGgufSpec;

namespace fs = std::filesystem;

namespace {

// A tiny CPU-only artifact compiled once per process.
const std::string& tinyArtifact() {
  static const std::string path = [] {
    const std::string dir = minfer::test::scratchDir() + "/artifact-faults";
    fs::create_directories(dir);
    minfer::test::writeTinyGguf(TinyGgufSpec{}, dir + "/tiny.gguf");
    minfer::test::compileWithTool(dir + "/tiny.gguf", dir + "/tiny.mfb");
    return dir + "/tiny.mfb";
  }();
  return path;
}

// The tiny model compiled with sm_90 kernel images, once per process; "" (after a SKIPPED message) when
// this build has no NVRTC, so minfer-compile writes no kernel images.
std::string sm90Artifact() {
  static const std::string path = [] {
    const std::string dir = fs::path(tinyArtifact()).parent_path().string();
    const std::string out = minfer::test::compileWithTool(
        dir + "/tiny.gguf", dir + "/sm90.mfb", {"--target=sm_90", "--kernel-cache=" + dir + "/kernel-cache"});
    const std::vector<uint8_t> bytes = minfer::test::fileBytes(dir + "/sm90.mfb");
    const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(bytes.data());
    if (m->kernels() && m->kernels()->size() > 0) return dir + "/sm90.mfb";
    MESSAGE("SKIPPED: this build has no NVRTC, so minfer-compile wrote no kernel images: " << out);
    return std::string();
  }();
  if (path.empty()) MESSAGE("SKIPPED: no kernel images in this build (see above)");
  return path;
}

// The generated table's private flatbuffers::Table base (a C-style cast may name it).
const flatbuffers::Table* asTable(const void* t) { return (const flatbuffers::Table*)t; }

// Recomputes manifest_check as the writer does (schema/artifact.fbs: XXH64 of [0, N) with the check's
// xxh64 field read as zero), so an edited manifest differs from a genuine one only in the edit.
void reseal(std::vector<uint8_t>& out) {
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(out.data());
  uint32_t prefix = 0;
  std::memcpy(&prefix, out.data(), 4);
  const uint64_t n = uint64_t{prefix} + 4;
  const uint64_t check_at = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(m->manifest_check()) - out.data());
  const uint64_t hash_at = check_at + 16;  // Segment {offset, size, xxh64}
  std::vector<uint8_t> manifest(out.begin(), out.begin() + static_cast<long>(n));
  std::memset(manifest.data() + hash_at, 0, 8);
  const uint64_t hash = XXH64(manifest.data(), manifest.size(), 0);
  std::memcpy(out.data() + hash_at, &hash, 8);
}

// Writes `value` over the scalar field `field` of the table `t` inside `out` (the compiler writes every
// field: ForceDefaults).
template <typename T>
void overwrite(std::vector<uint8_t>& out, const void* t, flatbuffers::voffset_t field, T value) {
  const uint8_t* at = asTable(t)->GetAddressOf(field);
  REQUIRE(at != nullptr);
  std::memcpy(out.data() + (at - out.data()), &value, sizeof value);
}

// Sets format_major/format_minor in a copy of an artifact and reseals it.
std::vector<uint8_t> withVersion(const std::vector<uint8_t>& bytes, uint16_t major, uint16_t minor) {
  std::vector<uint8_t> out = bytes;
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(out.data());
  overwrite(out, m, minfer::fb::Artifact::VT_FORMAT_MAJOR, major);
  overwrite(out, m, minfer::fb::Artifact::VT_FORMAT_MINOR, minor);
  reseal(out);
  return out;
}

uint64_t physicalMemory() { return uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)); }

}  // namespace

TEST_CASE("an artifact of another format version: the message names both versions") {
  const std::vector<uint8_t> original = minfer::test::fileBytes(tinyArtifact());
  // Control: re-stamping the version it has gives back the very same bytes (the check recomputation
  // matches the writer's).
  CHECK(withVersion(original, minfer::kArtifactFormatMajor, minfer::kArtifactFormatMinor) == original);

  struct Case {
    uint16_t major, minor;
  };
  for (const Case c : {Case{2, 0}, Case{minfer::kArtifactFormatMajor, uint16_t(minfer::kArtifactFormatMinor + 1)},
                       Case{0, 9}, Case{1, 0}}) {
    const std::string version = std::to_string(c.major) + "." + std::to_string(c.minor);
    CAPTURE(version);
    const std::string path = minfer::test::scratchDir() + "/artifact-faults/v" + version + ".mfb";
    minfer::test::writeBytes(path, withVersion(original, c.major, c.minor));
    const std::string ours =
        std::to_string(minfer::kArtifactFormatMajor) + "." + std::to_string(minfer::kArtifactFormatMinor);

    auto file = minfer::ArtifactFile::open(path);
    REQUIRE_FALSE(file.isOk());
    const std::string& message = file.status().message();
    INFO(message);
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find("artifact format " + version) != std::string::npos);
    CHECK(message.find(ours) != std::string::npos);

    const ChildResult r = minfer::test::runChild(
        {minfer::test::toolPath("minfer-run"), path, "-p", "the cat", "-n", "2", "--device", "cpu"});
    INFO(r.output);
    CHECK(r.describe() == "exit 1");
    CHECK(r.output.find("artifact format " + version) != std::string::npos);
    CHECK(r.output.find(ours) != std::string::npos);
  }
}

TEST_CASE("kernels for sm_80 only, --device cuda on a machine without a GPU: the no-GPU error") {
  if (fs::exists("/dev/nvidiactl") || fs::exists("/dev/nvidia0")) {
    MESSAGE("SKIPPED: this machine has an NVIDIA device; the GPU-side arch check is tested by tests/cuda");
    return;
  }
  const std::string dir = fs::path(tinyArtifact()).parent_path().string();
  const std::string path = dir + "/sm80.mfb";
  const std::string out = minfer::test::compileWithTool(
      dir + "/tiny.gguf", path, {"--target=sm_80", "--kernel-cache=" + dir + "/kernel-cache"});
  auto file = minfer::ArtifactFile::open(path);
  REQUIRE_MESSAGE(file.isOk(), file.status().message());
  const minfer::fb::Artifact* m = (*file)->manifest();
  if (!m->kernels() || m->kernels()->size() == 0) {
    MESSAGE("SKIPPED: this build has no NVRTC, so minfer-compile wrote no kernel images: " << out);
    return;
  }
  for (const minfer::fb::KernelImage* k : *m->kernels()) CHECK(k->arch()->str() == "sm_80");

  const ChildResult r = minfer::test::runChild(
      {minfer::test::toolPath("minfer-run"), path, "-p", "the cat", "-n", "2", "--device", "cuda"});
  INFO(r.output);
  CHECK(r.describe() == "exit 1");
  CHECK(r.output.find(path) != std::string::npos);
  CHECK(r.output.find("CUDA") != std::string::npos);
  // auto falls back to the CPU and still runs the artifact.
  const ChildResult a = minfer::test::runChild(
      {minfer::test::toolPath("minfer-run"), path, "-p", "the cat", "-n", "2", "--temp", "0", "--device", "auto"});
  INFO(a.output);
  CHECK(a.describe() == "exit 0");
}

TEST_CASE("a launch record specialized for another row pitch than the plane it binds: refused at load, every backend") {
  const std::string dir = fs::path(tinyArtifact()).parent_path().string();
  const std::string path = sm90Artifact();
  if (path.empty()) return;
  std::vector<uint8_t> bytes = minfer::test::fileBytes(path);
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(bytes.data());
  // The first Weight argument of a quantized matmul (mmq) of the prefill plan: its kI8 plane.
  const minfer::fb::Step* step = nullptr;
  const minfer::fb::KernelArg* arg = nullptr;
  for (const minfer::fb::Step* s : *m->prefill()->steps())
    if (!arg && s->launches() && s->launches()->size() > 0)
      for (const minfer::fb::KernelArg* a : *s->launches()->Get(0)->args())
        if (!arg && a->kind() == minfer::fb::ArgKind::Weight &&
            a->plane()->kind() == static_cast<uint8_t>(minfer::PlaneKind::kI8)) {
          step = s;
          arg = a;
        }
  REQUIRE(arg != nullptr);
  const uint64_t pitch = arg->plane()->row_pitch();
  overwrite(bytes, arg->plane(), minfer::fb::StrideTable::VT_ROW_PITCH, pitch + 16);
  reseal(bytes);
  const std::string forged = dir + "/sm90-forged-pitch.mfb";
  minfer::test::writeBytes(forged, bytes);

  auto file = minfer::ArtifactFile::open(forged);
  REQUIRE_FALSE(file.isOk());
  const std::string& message = file.status().message();
  INFO(message);
  CHECK(message.rfind(forged + ": prefill.steps[", 0) == 0);
  CHECK(message.find("].launches[0].args[0].plane.row_pitch") != std::string::npos);
  CHECK(message.find("argument 'wq' was specialized for row_pitch " + std::to_string(pitch + 16)) != std::string::npos);
  CHECK(message.find("has row_pitch " + std::to_string(pitch)) != std::string::npos);
  CHECK(message.find("step '" + step->name()->str() + "', MatMul") != std::string::npos);
  CHECK(message.find("kernel 'mmq_i8_") != std::string::npos);

  // The CPU backend never launches a kernel, yet the damaged contract is refused there too.
  const ChildResult r = minfer::test::runChild(
      {minfer::test::toolPath("minfer-run"), forged, "-p", "the cat", "-n", "2", "--device", "cpu"});
  INFO(r.output);
  CHECK(r.describe() == "exit 1");
  CHECK(r.output.find("row_pitch " + std::to_string(pitch + 16)) != std::string::npos);
  // Control: the genuine artifact runs.
  const ChildResult ok = minfer::test::runChild(
      {minfer::test::toolPath("minfer-run"), path, "-p", "the cat", "-n", "2", "--device", "cpu"});
  INFO(ok.output);
  CHECK(ok.describe() == "exit 0");
}

TEST_CASE("a context far beyond memory (n_ctx 2^20, 128 KiB of KV cache per position): an error with the numbers") {
  const uint64_t kv_bytes = (uint64_t{1} << 20) * 2 * 16 * 1024 * 4;  // K and V, 16 heads × 1024, f32, one layer
  if (physicalMemory() >= kv_bytes / 2) {
    MESSAGE("SKIPPED: this machine has " << physicalMemory() << " bytes of memory; the case needs less than "
                                         << kv_bytes / 2);
    return;
  }
  TinyGgufSpec spec;  // head_dim 1024 (attention.key_length) on a 32-wide model: small weights, huge KV
  spec.n_head = 16;
  spec.n_head_kv = 16;
  spec.head_dim = 1024;
  spec.byte_tokens = false;
  const std::string dir = minfer::test::scratchDir() + "/artifact-faults";
  fs::create_directories(dir);
  minfer::test::writeTinyGguf(spec, dir + "/wide-kv.gguf");
  minfer::test::compileWithTool(dir + "/wide-kv.gguf", dir + "/wide-kv.mfb");

  auto model = minfer::Model::open(dir + "/wide-kv.mfb", minfer::BackendKind::kCpu);
  REQUIRE_MESSAGE(model.isOk(), model.status().message());
  auto huge = (*model)->createSession({.n_ctx = minfer::Model::kMaxContext, .n_threads = 1});
  REQUIRE_FALSE(huge.isOk());
  const std::string& message = huge.status().message();
  INFO(message);
  CHECK(message.find("n_ctx = " + std::to_string(minfer::Model::kMaxContext)) != std::string::npos);
  CHECK(message.find("memory") != std::string::npos);
  CHECK(message.find(std::to_string(physicalMemory())) != std::string::npos);
  // Past the limit, and at zero or below: a range error.
  for (int n_ctx : {minfer::Model::kMaxContext + 1, 0, -1}) {
    auto bad = (*model)->createSession({.n_ctx = n_ctx});
    REQUIRE_FALSE(bad.isOk());
    CHECK(bad.status().message().find(std::to_string(n_ctx)) != std::string::npos);
  }
  // A context that fits still works after the refusals.
  auto ok = (*model)->createSession({.n_ctx = 16, .n_threads = 1});
  CHECK_MESSAGE(ok.isOk(), ok.status().message());

  // The same through minfer-run: exit 1 with the message, not an abort.
  const ChildResult r = minfer::test::runChild({minfer::test::toolPath("minfer-run"), dir + "/wide-kv.mfb", "-p",
                                                "the cat", "-c", std::to_string(minfer::Model::kMaxContext),
                                                "--device", "cpu"});
  INFO(r.output);
  CHECK(r.describe() == "exit 1");
  CHECK(r.output.find("memory") != std::string::npos);
}

namespace {

// The first derived plane of the artifact `m` (its tensor and plane indices), and that tensor's kBlocks plane.
struct DerivedPlane {
  const minfer::fb::Tensor* tensor = nullptr;
  const minfer::fb::Plane* derived = nullptr;
  const minfer::fb::Plane* blocks = nullptr;
};
DerivedPlane firstDerived(const minfer::fb::Artifact* m) {
  for (const minfer::fb::Tensor* t : *m->tensors())
    for (const minfer::fb::Plane* p : *t->planes())
      if (p->derived()) {
        DerivedPlane d{t, p, nullptr};
        for (const minfer::fb::Plane* q : *t->planes())
          if (q->layout()->kind() == static_cast<uint8_t>(minfer::PlaneKind::kBlocks)) d.blocks = q;
        return d;
      }
  return {};
}

// Opens a copy of `bytes` with one edit applied (then resealed) and returns the loader's message.
template <typename Edit>
std::string refusalAfter(const std::vector<uint8_t>& bytes, const std::string& path, Edit&& edit) {
  std::vector<uint8_t> out = bytes;
  edit(out, minfer::fb::GetSizePrefixedArtifact(out.data()));
  reseal(out);
  minfer::test::writeBytes(path, out);
  auto file = minfer::ArtifactFile::open(path);
  return file.isOk() ? std::string("accepted") : file.status().message();
}

}  // namespace

TEST_CASE("compact artifact (1.3): derived planes and the load plan are checked at load") {
  const std::vector<uint8_t> bytes = minfer::test::fileBytes(tinyArtifact());
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(bytes.data());
  const DerivedPlane d = firstDerived(m);
  REQUIRE(d.derived != nullptr);  // the tiny model has quantized matmul weights
  REQUIRE(d.blocks != nullptr);
  CHECK(d.derived->data()->size() == 0);
  REQUIRE(m->load() != nullptr);
  REQUIRE(m->load()->steps()->size() > 0);
  const std::string dir = fs::path(tinyArtifact()).parent_path().string();
  const std::string path = dir + "/derived-forged.mfb";
  using minfer::fb::Plane;
  using minfer::fb::Step;

  SUBCASE("a derived plane that claims bytes in the file") {
    const std::string msg = refusalAfter(bytes, path, [&](std::vector<uint8_t>& out, const minfer::fb::Artifact* c) {
      const DerivedPlane e = firstDerived(c);
      const uint64_t size = 4096;
      std::memcpy(out.data() + (reinterpret_cast<const uint8_t*>(e.derived->data()) - out.data()) + 8, &size, 8);
    });
    INFO(msg);
    CHECK(msg.find("a derived plane stores no bytes, but its segment is [0, +4096)") != std::string::npos);
    CHECK(msg.find(d.tensor->name()->str()) != std::string::npos);
  }
  SUBCASE("a derived plane whose flag is cleared: no bytes where its stride table needs them") {
    const std::string msg = refusalAfter(bytes, path, [&](std::vector<uint8_t>& out, const minfer::fb::Artifact* c) {
      overwrite(out, firstDerived(c).derived, Plane::VT_DERIVED, uint8_t{0});
    });
    INFO(msg);
    CHECK(msg.find("segment is 0 bytes but the stride table implies") != std::string::npos);
  }
  SUBCASE("the stored kBlocks plane marked derived") {
    const std::string msg = refusalAfter(bytes, path, [&](std::vector<uint8_t>& out, const minfer::fb::Artifact* c) {
      overwrite(out, firstDerived(c).blocks, Plane::VT_DERIVED, uint8_t{1});
    });
    INFO(msg);
    CHECK(msg.find(".derived") != std::string::npos);
    CHECK(msg.find("is marked derived, but only a tensor's non-kBlocks planes derive from its stored kBlocks plane") !=
          std::string::npos);
  }
  SUBCASE("a load-plan step that is not ExpandBlocks, and an ExpandBlocks step in the prefill plan") {
    const std::string msg = refusalAfter(bytes, path, [&](std::vector<uint8_t>& out, const minfer::fb::Artifact* c) {
      overwrite(out, c->load()->steps()->Get(0), Step::VT_OP, static_cast<uint16_t>(minfer::fb::OpKind::MatMul));
    });
    INFO(msg);
    CHECK(msg.find("load.steps[0]") != std::string::npos);
    const std::string msg2 = refusalAfter(bytes, path, [&](std::vector<uint8_t>& out, const minfer::fb::Artifact* c) {
      // QuantizeAct has no buffers in common with ExpandBlocks' arity: use the Embed step's slot instead
      // and expect the arity or the placement message.
      overwrite(out, c->prefill()->steps()->Get(0), Step::VT_OP, static_cast<uint16_t>(minfer::fb::OpKind::ExpandBlocks));
    });
    INFO(msg2);
    CHECK(msg2.find("prefill.steps[0]") != std::string::npos);
    CHECK(msg2 != "accepted");
  }
  // Control: the genuine compact artifact runs on the CPU (which reads the kBlocks planes).
  const ChildResult ok = minfer::test::runChild(
      {minfer::test::toolPath("minfer-run"), tinyArtifact(), "-p", "the cat", "-n", "2", "--device", "cpu"});
  INFO(ok.output);
  CHECK(ok.describe() == "exit 0");
}

TEST_CASE("compact artifact (1.3): only the load plan writes weight planes, and only derived ones") {
  const std::string dir = fs::path(tinyArtifact()).parent_path().string();
  const std::string path = sm90Artifact();
  if (path.empty()) return;
  const std::vector<uint8_t> bytes = minfer::test::fileBytes(path);
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(bytes.data());
  using minfer::fb::KernelArg;
  // The load plan's first launch: args[0] reads the kBlocks plane, args[1] writes the kI8 plane.
  const auto loadArg = [](const minfer::fb::Artifact* c, int i) {
    return c->load()->steps()->Get(0)->launches()->Get(0)->args()->Get(i);
  };
  REQUIRE(loadArg(m, 1)->access() == minfer::fb::Access::Write);
  const std::string forged = dir + "/sm90-forged-access.mfb";

  const std::string reads = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    overwrite(o, loadArg(c, 1), KernelArg::VT_ACCESS, static_cast<uint8_t>(minfer::fb::Access::Read));
  });
  INFO(reads);
  CHECK(reads.find("load.steps[0].launches[0].args[1].access") != std::string::npos);
  CHECK(reads.find("in the load plan, which is what writes it") != std::string::npos);
  // Then the derived plane is written by no launch at all? No: the read is refused first. Writing the
  // stored kBlocks plane is refused too.
  const std::string writes_stored = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    overwrite(o, loadArg(c, 0), KernelArg::VT_ACCESS, static_cast<uint8_t>(minfer::fb::Access::Write));
  });
  INFO(writes_stored);
  CHECK(writes_stored.find("args[0].access") != std::string::npos);
  CHECK(writes_stored.find("a stored plane is never written") != std::string::npos);
  // A prefill kernel writing a weight plane.
  const std::string prefill_writes = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    for (const minfer::fb::Step* s : *c->prefill()->steps())
      if (s->launches() && s->launches()->size() > 0)
        for (const KernelArg* a : *s->launches()->Get(0)->args())
          if (a->kind() == minfer::fb::ArgKind::Weight) {
            overwrite(o, a, KernelArg::VT_ACCESS, static_cast<uint8_t>(minfer::fb::Access::Write));
            return;
          }
  });
  INFO(prefill_writes);
  CHECK(prefill_writes.find("only the load plan writes weight planes") != std::string::npos);
  // Two writers of one derived plane: the second load step's kI8 argument pointed at the first's tensor.
  if (m->load()->steps()->size() > 1) {
    const std::string twice = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
      const auto* args0 = c->load()->steps()->Get(0)->launches()->Get(0)->args();
      const auto* args1 = c->load()->steps()->Get(1)->launches()->Get(0)->args();
      // Same tensor index everywhere in launch 1, so the verifier's pitch checks still pass only if
      // the shapes agree; either refusal names the plane.
      for (const KernelArg* a : *args1)
        if (a->kind() == minfer::fb::ArgKind::Weight) overwrite(o, a, KernelArg::VT_TENSOR, args0->Get(0)->tensor());
    });
    INFO(twice);
    CHECK(twice != "accepted");
  }
}

TEST_CASE("launch fusion (1.4): fused steps are checked at load") {
  const std::string dir = fs::path(tinyArtifact()).parent_path().string();
  const std::string path = sm90Artifact();
  if (path.empty()) return;
  const std::vector<uint8_t> bytes = minfer::test::fileBytes(path);
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(bytes.data());
  using minfer::fb::Step;
  // The first fused decode step (a QuantizeAct done by the RmsNorm before it) and a step with launches.
  const auto fusedAt = [](const minfer::fb::Artifact* c) {
    for (flatbuffers::uoffset_t i = 0; i < c->decode()->steps()->size(); ++i)
      if (c->decode()->steps()->Get(i)->fused()) return i;
    return flatbuffers::uoffset_t{0};
  };
  const flatbuffers::uoffset_t f = fusedAt(m);
  REQUIRE(f > 0);
  CHECK(m->decode()->steps()->Get(f)->op() == minfer::fb::OpKind::QuantizeAct);
  CHECK(m->decode()->steps()->Get(f - 1)->op() == minfer::fb::OpKind::RmsNorm);
  const std::string forged = dir + "/sm90-forged-fused.mfb";

  const std::string with_launches = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    overwrite(o, c->decode()->steps()->Get(f - 1), Step::VT_FUSED, uint8_t{1});  // the RmsNorm has a launch
  });
  INFO(with_launches);
  CHECK(with_launches.find("decode.steps[" + std::to_string(f - 1) + "].fused") != std::string::npos);
  CHECK(with_launches.find("is fused into the step before it but has 1 launches") != std::string::npos);
  // The RmsNorm's q8 arguments no longer written: the fused QuantizeAct's output would be stale.
  const std::string unwritten = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    for (const minfer::fb::KernelArg* a : *c->decode()->steps()->Get(f - 1)->launches()->Get(0)->args())
      if (a->kind() == minfer::fb::ArgKind::Q8Values || a->kind() == minfer::fb::ArgKind::Q8Meta)
        overwrite(o, a, minfer::fb::KernelArg::VT_ACCESS, static_cast<uint8_t>(minfer::fb::Access::Read));
  });
  INFO(unwritten);
  CHECK(unwritten.find("decode.steps[" + std::to_string(f) + "].fused") != std::string::npos);
  CHECK(unwritten.find("whose launches do not write its output buffer") != std::string::npos);
  // A step with launches cannot be marked fused (the plan's first step included).
  const std::string first = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    overwrite(o, c->decode()->steps()->Get(0), Step::VT_FUSED, uint8_t{1});
  });
  INFO(first);
  CHECK(first.find("decode.steps[0].fused") != std::string::npos);
  // The load plan has no fusion: its steps are exactly its launches.
  const std::string load_fused = refusalAfter(bytes, forged, [&](std::vector<uint8_t>& o, const minfer::fb::Artifact* c) {
    overwrite(o, c->load()->steps()->Get(c->load()->steps()->size() - 1), Step::VT_FUSED, uint8_t{1});
  });
  INFO(load_fused);
  CHECK(load_fused.find("in the load plan is fused") != std::string::npos);
}
