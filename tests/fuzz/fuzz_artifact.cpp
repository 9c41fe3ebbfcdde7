// Fuzz harness: the artifact loader, verifier and CPU runtime on arbitrary bytes (see fuzz_harness.h).
//
// First the two verification stages (runtime/artifact/artifact_file.h) run over libFuzzer's own heap
// copy of the input, where ASan sees a read one byte past the end; a mapping has no redzone, so an
// out-of-bounds read there is only caught when it happens to leave the mapped pages. Then, as a real
// file: ArtifactFile::open maps a path, so the input is written to one memfd (created once, truncated
// per input) and opened as /proc/self/fd/N (the same open/fstat/mmap path a file takes); its verdict
// must equal the in-memory one.
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <xxhash.h>
#include <string>
#include <vector>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "runtime/artifact/artifact_file.h"
#include "tests/fuzz/fuzz_harness.h"

namespace minfer::fuzz {
namespace {

// Sessions whose buffers, KV cache and scratch would exceed this are not created: the loader is the
// target, and a real model's session legitimately needs gigabytes.
constexpr double kMaxSessionBytes = 64.0 * 1024 * 1024;
constexpr int kSessionContext = 8;

volatile uint64_t g_sink = 0;
void sink(uint64_t v) { g_sink = g_sink + v; }

const std::string& memfdPath(int* fd_out) {
  static int fd = -1;
  static std::string path;
  if (fd < 0) {
    fd = ::memfd_create("fuzz.mfb", MFD_CLOEXEC);
    if (fd < 0) fuzzFail("memfd_create failed");
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  *fd_out = fd;
  return path;
}

void writeInput(int fd, const uint8_t* data, size_t size) {
  if (::ftruncate(fd, 0) != 0) fuzzFail("ftruncate of the memfd failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) fuzzFail("pwrite to the memfd failed");
    done += static_cast<size_t>(n);
  }
}

void touchString(const flatbuffers::String* s) {
  if (!s) return;
  for (char c : s->string_view()) sink(static_cast<uint8_t>(c));
}

// Reads every field a runtime would read; checks each segment the verifier accepted lies in the file.
void walkManifest(const ArtifactFile& file) {
  const fb::Artifact* m = file.manifest();
  if (!m) fuzzFail("open succeeded without a manifest");
  if (file.manifestSize() > file.fileSize()) fuzzFail("manifest larger than the file");
  touchString(m->producer());
  touchString(m->producer_version());
  if (m->source()) {
    touchString(m->source()->name());
    touchString(m->source()->sha256());
  }
  touchString(m->config()->architecture());
  touchString(m->config()->name());
  if (const fb::Tokenizer* t = m->tokenizer()) {
    touchString(t->model_name());
    touchString(t->pre());
    touchString(t->chat_template());
    if (t->tokens())
      for (const flatbuffers::String* s : *t->tokens()) touchString(s);
    if (t->merges())
      for (const flatbuffers::String* s : *t->merges()) touchString(s);
    if (t->scores())
      for (float f : *t->scores()) sink(f == f);
    if (t->token_types())
      for (int32_t v : *t->token_types()) sink(static_cast<uint64_t>(v));
  }
  if (m->tensors()) {
    for (const fb::Tensor* t : *m->tensors()) {
      touchString(t->name());
      if (!t->planes()) continue;
      for (const fb::Plane* p : *t->planes()) {
        const StrideTable st = toStrideTable(*p->layout());
        // A derived plane (1.3) stores nothing: its segment is empty whatever its stride table says.
        if (p->derived() ? p->data()->size() != 0 : st.bytes() != p->data()->size())
          fuzzFail("plane size differs from its stride table after verification");
        const uint8_t* bytes = file.segmentData(*p->data());
        if (p->data()->size() > 0 && !bytes) fuzzFail("verified plane segment outside the file");
        if (bytes && p->data()->size() > 0) sink(bytes[0] + bytes[p->data()->size() - 1]);
      }
    }
  }
  if (m->kernels()) {
    for (const fb::KernelImage* k : *m->kernels()) {
      touchString(k->key());
      touchString(k->entry());
      touchString(k->arch());
      touchString(k->nvrtc_version());
      for (const fb::Segment* s : {k->cubin(), k->ptx()})
        if (s && s->size() > 0 && !file.segmentData(*s)) fuzzFail("verified kernel segment outside the file");
    }
  }
  for (const fb::Plan* plan : {m->prefill(), m->decode()}) {
    if (!plan || !plan->steps()) continue;
    for (const fb::Step* s : *plan->steps()) touchString(s->name());
  }
  if (m->memory() && m->memory()->buffers())
    for (const fb::Buffer* b : *m->memory()->buffers()) touchString(b->name());
  uint64_t last_end = 0;
  for (const ArtifactFile::SegmentRef& ref : file.segments()) {
    const fb::Segment& s = *ref.segment;
    if (s.offset() < last_end) fuzzFail(ref.field + ": segments overlap or are unsorted after verification");
    if (s.offset() % kArtifactSegmentAlignment != 0) fuzzFail(ref.field + ": unaligned segment accepted");
    if (s.offset() > file.fileSize() || s.size() > file.fileSize() - s.offset())
      fuzzFail(ref.field + ": segment past the end accepted");
    last_end = s.offset() + s.size();
  }
}

// Upper bound of what a CPU session of kSessionContext positions allocates (cpu_backend.cpp: buffers
// of max_batch rows, K and V per attention layer, per-thread scratch), in double to avoid overflow.
double sessionBytes(const fb::Artifact& m) {
  const fb::MemoryPlan* mem = m.memory();
  if (!mem || !mem->buffers()) return 0;
  double bytes = 0;
  for (const fb::Buffer* b : *mem->buffers()) bytes += 4.0 * mem->max_batch() * b->width();
  for (const fb::Plan* plan : {m.prefill(), m.decode()}) {
    if (!plan || !plan->steps()) continue;
    for (const fb::Step* s : *plan->steps()) {
      bytes += 8.0 * kSessionContext * s->n_head_kv() * s->head_dim();
      bytes += 4.0 * s->cols();
    }
  }
  return bytes;
}

void runModel(const std::string& path, const ArtifactFile& file) {
  // Checksums off: fuzzed data segments must still reach the CPU backend (damage is only numbers to it).
  auto model = Model::open(path, BackendKind::kCpu, {.verify_checksums = false});
  if (!model) return;
  const Model& mo = **model;
  const int n_vocab = mo.info().n_vocab;
  if (mo.hasTokenizer()) {
    auto ids = mo.tokenize("Hello, w\xC3\xB6rld <s></s>", true, true);
    if (!ids) fuzzFail("tokenize failed with a tokenizer: " + ids.status().message());
    for (int32_t id : *ids)
      if (id < 0 || id >= n_vocab) fuzzFail("tokenize gave an id outside n_vocab");
    auto text = mo.detokenize(*ids);
    if (!text) fuzzFail("detokenize failed with a tokenizer");
    (void)mo.isEndOfGeneration(0);
  }
  if (n_vocab <= 0 || sessionBytes(*file.manifest()) > kMaxSessionBytes) return;
  auto session = mo.createSession({.n_ctx = kSessionContext, .n_threads = 1});
  if (!session) return;
  const std::vector<int32_t> tokens = {std::min(1, n_vocab - 1), 0};
  if (!(*session)->prefill(tokens).isOk()) return;
  if ((*session)->logits().size() != static_cast<size_t>(n_vocab)) fuzzFail("logits row is not n_vocab floats");
  if (!(*session)->decode(n_vocab - 1).isOk()) return;
  if ((*session)->position() != 3) fuzzFail("position after prefill(2) + decode is not 3");
}

}  // namespace

int runArtifact(const uint8_t* data, size_t size) {
  static const uint8_t kEmpty[1] = {0};
  const uint8_t* bytes = size ? data : kEmpty;
  uint64_t manifest_size = 0;
  std::vector<ArtifactFile::SegmentRef> segments;
  Status in_memory = artifact::verifyStructure("fuzz.mfb", bytes, size, &manifest_size);
  if (in_memory.isOk()) in_memory = artifact::verifySemantics("fuzz.mfb", bytes, size, manifest_size, &segments);

  // ArtifactFile::open also checks the manifest's own checksum, which a mutated input almost never
  // matches: an input that passes both verifiers is sealed (manifest_check.xxh64 recomputed, as the
  // writer does) so the fuzzer keeps reaching the runtime behind open().
  std::vector<uint8_t> sealed;
  if (in_memory.isOk()) {
    sealed.assign(data, data + size);
    const fb::Segment* check = fb::GetSizePrefixedArtifact(sealed.data())->manifest_check();
    const size_t hash_at = static_cast<size_t>(reinterpret_cast<const uint8_t*>(check) - sealed.data()) + 16;
    std::memset(sealed.data() + hash_at, 0, 8);
    const uint64_t hash = XXH64(sealed.data(), manifest_size, 0);
    std::memcpy(sealed.data() + hash_at, &hash, 8);
    data = sealed.data();
  }

  int fd = -1;
  const std::string& path = memfdPath(&fd);
  writeInput(fd, data, size);
  auto file = ArtifactFile::open(path);
  if (file.isOk() != in_memory.isOk())
    fuzzFail("ArtifactFile::open and the in-memory stages disagree: " +
             (file ? in_memory.message() : file.status().message()));
  if (!file) {
    if (file.status().message().rfind(path, 0) != 0)
      fuzzFail("error message does not start with the path: " + file.status().message());
    return 0;
  }
  if ((*file)->manifestSize() != manifest_size || (*file)->segments().size() != segments.size())
    fuzzFail("ArtifactFile::open and the in-memory stages found different manifests");
  if ((*file)->fileSize() != size) fuzzFail("file size differs from the input size");
  const Status checksums = (*file)->verifyChecksums();
  walkManifest(**file);
  // The runtime maps the file again (Model::open); checksums decide nothing here: a damaged data
  // segment is still only numbers to the CPU backend.
  (void)checksums;
  runModel(path, **file);
  return 0;
}

}  // namespace minfer::fuzz

#ifdef MINFER_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return minfer::fuzz::runArtifact(data, size);
}
#endif
