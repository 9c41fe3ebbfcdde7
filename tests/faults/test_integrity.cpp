// Damaged artifacts never run by default: one flipped byte in a weight plane, a cubin or a PTX image
// makes Model::open, minfer-run, minfer-perplexity and minfer-bench refuse, naming the segment, its
// tensor or kernel, both hashes and --no-verify; with --no-verify (verify_checksums = false) they run.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "tests/faults/fault_support.h"
#include "tests/test_support.h"

using minfer::test::ChildResult;
namespace fs = std::filesystem;

namespace {

const std::string& workDir() {
  static const std::string dir = [] {
    const std::string d = minfer::test::scratchDir() + "/integrity";
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// `gguf` compiled by minfer-compile into workDir()/<name>.mfb, with kernel images for `target` ("" for
// none); cached per process.
std::string compiled(const std::string& gguf, const std::string& name, const std::string& target) {
  static std::map<std::string, std::string> done;
  const std::string out = workDir() + "/" + name + ".mfb";
  if (done.count(out)) return out;
  minfer::test::compileWithTool(gguf, out, {"--target=" + target, "--kernel-cache=" + workDir() + "/kernel-cache"});
  done[out] = out;
  return out;
}

// The writer-made tiny llama (tests/fuzz/tiny_gguf.h).
std::string tinyGguf() {
  const std::string path = workDir() + "/tiny.gguf";
  if (!fs::exists(path)) minfer::test::writeTinyGguf(minfer::test::TinyGgufSpec{}, path);
  return path;
}

std::string hex16(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

// A copy of an artifact with the low bit of one byte flipped in the middle of one segment, and what
// the refusal must say about it (derived here from the manifest and the damaged bytes).
struct Damage {
  std::string what;    // "weight plane", "cubin", "PTX"
  std::string path;    // the damaged copy
  std::string field;   // "tensors[3].planes[0].data"
  std::string owner;   // "tensor \"blk.0.ffn_down.weight\"", "kernel \"rms_norm_…\""
  uint64_t offset = 0, recorded = 0, computed = 0;
};

Damage flip(const std::string& src, const std::string& what, const std::string& field, const std::string& owner,
            const minfer::fb::Segment& seg, std::vector<uint8_t> bytes) {
  Damage d{what, src.substr(0, src.size() - 4) + "-" + what + ".mfb", field, owner, seg.offset(), seg.xxh64(), 0};
  REQUIRE(seg.size() > 0);
  bytes[seg.offset() + seg.size() / 2] ^= 0x01;  // the low bit: values stay finite (f16/f32 mantissa, int8)
  d.computed = XXH64(bytes.data() + seg.offset(), seg.size(), 0);
  REQUIRE(d.computed != d.recorded);
  minfer::test::writeBytes(d.path, bytes);
  return d;
}

// One damage per kind of segment the artifact holds: the middle tensor's last plane; kernels[0]'s
// cubin and the last kernel's PTX when it has kernel images.
std::vector<Damage> damages(const std::string& path) {
  const std::vector<uint8_t> bytes = minfer::test::fileBytes(path);
  const minfer::fb::Artifact* m = minfer::fb::GetSizePrefixedArtifact(bytes.data());
  std::vector<Damage> out;
  const uint32_t t = m->tensors()->size() / 2;
  const minfer::fb::Tensor* tensor = m->tensors()->Get(t);
  const uint32_t p = tensor->planes()->size() - 1;
  out.push_back(flip(path, "plane", "tensors[" + std::to_string(t) + "].planes[" + std::to_string(p) + "].data",
                     "tensor \"" + tensor->name()->str() + "\"", *tensor->planes()->Get(p)->data(), bytes));
  if (m->kernels() && m->kernels()->size() > 0) {
    const uint32_t last = m->kernels()->size() - 1;
    const minfer::fb::KernelImage* k0 = m->kernels()->Get(0);
    const minfer::fb::KernelImage* kl = m->kernels()->Get(last);
    out.push_back(flip(path, "cubin", "kernels[0].cubin", "kernel \"" + k0->key()->str() + "\"", *k0->cubin(), bytes));
    out.push_back(flip(path, "ptx", "kernels[" + std::to_string(last) + "].ptx", "kernel \"" + kl->key()->str() + "\"",
                       *kl->ptx(), bytes));
  }
  return out;
}

// The refusal names the segment with its extent, the owner, both hashes and how to skip the check.
void checkRefusal(const std::string& message, const Damage& d) {
  INFO(d.what << ": " << message);
  CHECK(message.find(d.path + ": " + d.field + " [" + std::to_string(d.offset) + ", +") != std::string::npos);
  CHECK(message.find("(" + d.owner + ")") != std::string::npos);
  CHECK(message.find("xxh64 " + hex16(d.computed) + " computed, " + hex16(d.recorded) + " recorded") !=
        std::string::npos);
  CHECK(message.find("damaged data") != std::string::npos);
  CHECK(message.find("--no-verify") != std::string::npos);
}

// The artifacts under test: the tiny model without and with sm_90 kernel images (NVRTC), and
// stories260K the same two ways when the fixtures are present.
std::vector<std::string> artifacts() {
  std::vector<std::string> out = {compiled(tinyGguf(), "tiny", ""), compiled(tinyGguf(), "tiny-sm90", "sm_90")};
  if (minfer::test::haveFixtures()) {
    const std::string stories = minfer::test::fixturesDir() + "/models/stories260K.gguf";
    out.push_back(compiled(stories, "stories", ""));
    out.push_back(compiled(stories, "stories-sm90", "sm_90"));
  }
  return out;
}

bool hasKernels(const std::string& path) {
  auto f = minfer::ArtifactFile::open(path);
  REQUIRE_MESSAGE(f.isOk(), f.status().message());
  return (*f)->manifest()->kernels() && (*f)->manifest()->kernels()->size() > 0;
}

std::string textFile() {
  const std::string path = workDir() + "/text.txt";
  std::ofstream(path) << "the cat sat on the mat and the dog ran far away from the old red barn.\n";
  return path;
}

ChildResult tool(const std::string& name, const std::string& model, std::vector<std::string> args) {
  args.insert(args.begin(), {minfer::test::toolPath(name), model});
  return minfer::test::runChild(args);
}

}  // namespace

TEST_CASE("Model::open refuses a flipped byte in a plane, a cubin or a PTX by default; verify_checksums = false runs") {
  int kernel_artifacts = 0;
  for (const std::string& path : artifacts()) {
    CAPTURE(path);
    kernel_artifacts += hasKernels(path);
    // Control: the genuine artifact opens with the default options.
    auto good = minfer::Model::open(path, minfer::BackendKind::kCpu);
    REQUIRE_MESSAGE(good.isOk(), good.status().message());
    for (const Damage& d : damages(path)) {
      for (minfer::BackendKind kind : {minfer::BackendKind::kCpu, minfer::BackendKind::kAuto}) {
        auto m = minfer::Model::open(d.path, kind);
        REQUIRE_FALSE(m.isOk());
        checkRefusal(m.status().message(), d);
      }
      auto m = minfer::Model::open(d.path, minfer::BackendKind::kCpu, {.verify_checksums = false});
      REQUIRE_MESSAGE(m.isOk(), m.status().message());
      auto session = (*m)->createSession({.n_ctx = 16, .n_threads = 1});
      REQUIRE_MESSAGE(session.isOk(), session.status().message());
      const std::vector<int32_t> ids = {1, 5, 7};
      CHECK((*session)->prefill(ids).isOk());
    }
  }
  if (kernel_artifacts == 0) MESSAGE("SKIPPED (cubin/PTX part): this build has no NVRTC, so no kernel images");
}

TEST_CASE("minfer-run, minfer-perplexity, minfer-bench: exit 1 naming the damaged segment; --no-verify runs") {
  const std::string text = textFile();
  for (const std::string& path : artifacts()) {
    CAPTURE(path);
    for (const Damage& d : damages(path)) {
      const std::vector<std::string> run = {"-p", "the cat", "-n", "2", "--temp", "0", "--device", "cpu"};
      const std::vector<std::string> ppl = {"-f", text, "-c", "8", "--chunks", "1", "--device", "cpu"};
      const std::vector<std::string> bench = {"-p", "4", "-n", "2", "-r", "1", "--device", "cpu"};
      for (const auto& [name, args] : {std::pair{"minfer-run", run}, {"minfer-perplexity", ppl}, {"minfer-bench", bench}}) {
        const std::string tool_name = name;
        CAPTURE(tool_name);
        const ChildResult refused = tool(name, d.path, args);
        CHECK(refused.describe() == "exit 1");
        checkRefusal(refused.output, d);
        std::vector<std::string> skip = args;
        skip.push_back("--no-verify");
        const ChildResult ran = tool(name, d.path, skip);
        INFO(ran.output);
        CHECK(ran.describe() == "exit 0");
        CHECK(ran.output.find("damaged") == std::string::npos);
      }
    }
  }
}

TEST_CASE("padding is outside the runtime's check (nothing reads it); verifyChecksums still reports it") {
  const std::string path = compiled(tinyGguf(), "tiny", "");
  std::vector<uint8_t> bytes = minfer::test::fileBytes(path);
  auto f = minfer::ArtifactFile::open(path);
  REQUIRE(f.isOk());
  const minfer::fb::Segment* first = (*f)->segments().front().segment;
  const uint64_t at = first->offset() + first->size() + 7;  // after the first segment, before the next page
  REQUIRE(at % minfer::kArtifactSegmentAlignment != 0);
  REQUIRE(bytes.at(at) == 0);
  bytes[at] = 0x5a;
  const std::string padded = workDir() + "/tiny-padding.mfb";
  minfer::test::writeBytes(padded, bytes);
  auto m = minfer::Model::open(padded, minfer::BackendKind::kCpu);
  CHECK_MESSAGE(m.isOk(), m.status().message());
  auto g = minfer::ArtifactFile::open(padded);
  REQUIRE(g.isOk());
  CHECK((*g)->verifySegments().isOk());
  const minfer::Status full = (*g)->verifyChecksums();
  CHECK_FALSE(full.isOk());
  CHECK(full.message().find("byte 0x5a at offset " + std::to_string(at)) != std::string::npos);
}

TEST_CASE("verifySegments: the damaged segment with the lowest offset, at any thread count; include filters") {
  const std::string path = compiled(tinyGguf(), "tiny", "");
  std::vector<uint8_t> bytes = minfer::test::fileBytes(path);
  auto f = minfer::ArtifactFile::open(path);
  REQUIRE(f.isOk());
  const auto& segs = (*f)->segments();
  REQUIRE(segs.size() >= 3);
  // findSegment maps a manifest segment back to its entry (field and owner).
  const minfer::fb::Tensor* t0 = (*f)->manifest()->tensors()->Get(0);
  const minfer::ArtifactFile::SegmentRef* ref = (*f)->findSegment(*t0->planes()->Get(0)->data());
  REQUIRE(ref != nullptr);
  CHECK(ref->field == "tensors[0].planes[0].data");
  CHECK(ref->owner == "tensor \"" + t0->name()->str() + "\"");
  // Damage the second and the last segment (in file order).
  const minfer::fb::Segment* low = segs[1].segment;
  const minfer::fb::Segment* high = segs.back().segment;
  bytes[low->offset()] ^= 0x80;
  bytes[high->offset() + high->size() - 1] ^= 0x80;
  const std::string twice = workDir() + "/tiny-twice.mfb";
  minfer::test::writeBytes(twice, bytes);
  auto g = minfer::ArtifactFile::open(twice);
  REQUIRE(g.isOk());
  for (unsigned threads : {1u, 2u, 3u, 0u}) {
    CAPTURE(threads);
    const minfer::Status s = (*g)->verifySegments({}, threads);
    REQUIRE_FALSE(s.isOk());
    CHECK(s.message().find(": " + segs[1].field + " [" + std::to_string(low->offset()) + ", +") != std::string::npos);
  }
  const std::string low_field = segs[1].field, high_field = segs.back().field;
  const minfer::Status only_high =
      (*g)->verifySegments([&](const minfer::ArtifactFile::SegmentRef& r) { return r.field != low_field; });
  CHECK(only_high.message().find(": " + high_field + " [") != std::string::npos);
  CHECK((*g)->verifySegments([&](const minfer::ArtifactFile::SegmentRef& r) {
               return r.field != low_field && r.field != high_field;
             }).isOk());
}
