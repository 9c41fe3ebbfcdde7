// Artifact container: writer (temp + rename, determinism, failures) and loader (verifier, checksums, damage).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "compiler/artifact/artifact_writer.h"
#include "kernels/mmq.cuh"
#include "kernels/topk.cuh"
#include "llvm/Support/JSON.h"
#include "minfer/artifact.h"
#include "runtime/artifact/artifact_file.h"
#include "tests/test_support.h"

namespace fb = minfer::fb;
using minfer::ArtifactFile;
using minfer::ElemType;
using minfer::GgmlType;
using minfer::PlaneKind;
using minfer::StrideTable;
using minfer::artifact::ArtifactWriter;
using minfer::artifact::SegmentId;

namespace {

// The newest format this runtime reads, as its messages spell it.
const std::string kUpTo = "1." + std::to_string(minfer::kArtifactFormatMinor);

// ---------------------------------------------------------------------------------------------
// A small artifact described as plain data; the same description builds the manifest for the writer
// and, with deliberate damage, for hand-made files.

struct TestPlane {
  StrideTable t;
  std::vector<uint8_t> data;
};
struct TestTensor {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  std::vector<TestPlane> planes;
};
// A launch record argument (schema KernelArg); `plane` only for Weight arguments.
struct TestArg {
  fb::ArgKind kind = fb::ArgKind::Null;
  std::string name;
  uint32_t buffer = 0;
  fb::Access access = fb::Access::Read;
  uint32_t width = 0;
  uint32_t tensor = 0;
  std::optional<StrideTable> plane;
  uint32_t layer = 0;
  uint64_t bytes = 0;
  int32_t value = 0;
  uint32_t view_offset = 0, view_width = 0;  // 1.4: Activation column view
};
struct TestLaunch {
  std::vector<uint32_t> images;
  std::vector<TestArg> args;
  minfer::kern::LaunchRule rule;
  uint32_t min_rows = 0, max_rows = 0;  // 1.10: a small-batch launch's row range
};
struct TestStep {
  fb::OpKind op;
  std::vector<uint32_t> inputs, outputs, weights;
  std::vector<TestLaunch> launches;
  bool tail = false;
  int32_t layer = -1;
  float eps = 0;
  uint32_t n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  fb::RopeStyle rope_style = fb::RopeStyle::Norm;
  float rope_freq_base = 10000, rope_freq_scale = 1;
  uint32_t rows = 0, cols = 0;
  std::string name;
  float rope_ext_factor = 0, rope_attn_factor = 1, rope_beta_fast = 32, rope_beta_slow = 1;  // 1.3: YaRN
  uint32_t rope_n_ctx_orig = 0;
  std::vector<fb::ColumnView> input_views, output_views;  // 1.4
  uint32_t window = 0, kv_ring = 0;                          // 1.3 window, 1.6 ring KV cache
  std::vector<TestLaunch> paged;                          // 1.6: Step.paged_launches
  std::vector<TestLaunch> small;                          // 1.7: Step.small_launches
  uint32_t small_rows = 0;                                // 1.7: Step.small_rows
};
struct TestBuffer {
  std::string name;
  uint32_t width;
  fb::BufferType type;
};

struct Spec {
  uint16_t major = minfer::kArtifactFormatMajor, minor = minfer::kArtifactFormatMinor;
  std::string producer = "minfer-compile", producer_version = "0.1.0-test";
  std::string source_name = "tiny-test.gguf";
  uint64_t source_size = 1185376;
  std::string source_sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
  // config
  std::string arch = "llama", model_name = "tiny test model";
  uint32_t n_embd = 96, n_layer = 2, n_head = 6, n_head_kv = 2, head_dim = 16, n_ff = 160, n_vocab = 11;
  uint32_t n_ctx_train = 384, n_rot = 16;
  fb::RopeStyle rope_style = fb::RopeStyle::Neox;
  float rope_freq_base = 500000.f, rope_freq_scale = 0.25f;
  fb::RopeScaling rope_scaling = fb::RopeScaling::Linear;
  float rms_norm_eps = 1e-6f;
  bool tied = true;
  // tokenizer
  bool with_tokenizer = true;
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a", "b", "ab", "\xe2\x96\x81the", "c", "d", "cd", "e"};
  std::vector<float> scores = {0, 0, 0, -1.5f, -2.25f, -3, -0.5f, -4, -5, -6.75f, -7};
  std::vector<int32_t> token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6};
  std::vector<std::string> merges = {"a b", "c d"};
  int32_t bos = 1, eos = 2, unk = 0, pad = -1;
  int32_t eot = 9, eom = 10;  // format 1.2; any in-range ids (the tokenizer only marks them end of generation)
  bool add_bos = true, add_eos = false, add_space_prefix = false;
  // Ends in an invalid UTF-8 sequence: artifact strings are bytes, and tools must cope (JSON).
  std::string chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}\xc3(";
  fb::TokenizerModel tok_model = fb::TokenizerModel::Bpe;
  std::string tok_model_name = "gpt2", tok_pre = "llama-bpe";
  // tensors, kernels, plans, memory
  std::vector<TestTensor> tensors;
  std::string kernel_key = "mmq_i8_q4k_n48_k512_tm64_tn32_sm90", kernel_entry = "mmq_i8_q4k", kernel_arch = "sm_90";
  std::vector<uint8_t> cubin, ptx;
  std::string nvrtc = "12.4";
  std::vector<std::string> kernel_options = {"--gpu-architecture=sm_90", "-default-device", "-DTILE_M=64"};
  std::vector<TestStep> prefill, decode;
  uint32_t max_batch = 64;
  std::vector<TestBuffer> buffers;
  uint32_t input_ids = 0, logits = 5;
  uint64_t kv_bytes = 2 * 2 * 2 * 16 * 2;
  uint64_t kv_ring_bytes_per_token = 0, kv_ring_bytes = 0;  // 1.8
  std::optional<TestLaunch> topk;                            // 1.9: Artifact.topk
  std::vector<std::string> target_archs = {"sm_90"};
  bool with_manifest_check = true;
};

std::vector<uint8_t> pseudoRandomBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<uint8_t>((x >> 24) | 1);  // never zero: a misplaced zero page would show
  }
  return out;
}

StrideTable table(PlaneKind kind, ElemType elem, uint64_t rows, uint64_t cols, uint64_t row_pitch, GgmlType type,
                  uint32_t group_size = 1, uint32_t group_pitch = 0, uint32_t bits = 8, int32_t q_offset = 0) {
  StrideTable t;
  t.kind = kind;
  t.elem = elem;
  t.rows = rows;
  t.cols = cols;
  t.row_pitch = row_pitch;
  t.group_size = group_size;
  t.group_pitch = group_pitch;
  t.bits = bits;
  t.q_offset = q_offset;
  t.ggml_type = static_cast<uint32_t>(type);
  return t;
}

TestPlane plane(const StrideTable& t, uint32_t seed) { return {t, pseudoRandomBytes(t.rows * t.row_pitch, seed)}; }

// Shapes: rows ≠ cols, several blocks per row, planes of different sizes, none a multiple of 4096.
Spec makeSpec() {
  Spec s;
  // Q8_0 embedding, 11 rows × 96 cols (3 blocks of 32 per row): source blocks for row gather.
  s.tensors.push_back({"token_embd.weight", GgmlType::Q8_0, {96, 11},
                       {plane(table(PlaneKind::kBlocks, ElemType::kU8, 11, 96, 102, GgmlType::Q8_0, 32, 34), 1)}});
  // Q4_K 48 × 512 (2 super-blocks per row): i8, scale, min, packed.
  s.tensors.push_back({"blk.0.attn_q.weight", GgmlType::Q4_K, {512, 48},
                       {plane(table(PlaneKind::kI8, ElemType::kI8, 48, 512, 512, GgmlType::Q4_K), 2),
                        plane(table(PlaneKind::kScale, ElemType::kF32, 48, 512, 64, GgmlType::Q4_K, 32, 4), 3),
                        plane(table(PlaneKind::kMin, ElemType::kF32, 48, 512, 64, GgmlType::Q4_K, 32, 4), 4),
                        plane(table(PlaneKind::kPacked, ElemType::kU8, 48, 512, 256, GgmlType::Q4_K, 1, 0, 4, 0), 5)}});
  s.tensors.push_back({"output_norm.weight", GgmlType::F32, {96},
                       {plane(table(PlaneKind::kF32, ElemType::kF32, 1, 96, 384, GgmlType::F32), 6)}});
  s.tensors.push_back({"output.weight", GgmlType::F16, {96, 11},
                       {plane(table(PlaneKind::kF16, ElemType::kF16, 11, 96, 192, GgmlType::F16), 7)}});
  s.cubin = pseudoRandomBytes(5000, 8);
  const std::string ptx = ".version 8.4\n.target sm_90\n.address_size 64\n.visible .entry mmq_i8_q4k() { ret; }\n";
  s.ptx.assign(ptx.begin(), ptx.end());

  s.buffers = {{"input_ids", 1, fb::BufferType::I32}, {"x", 96, fb::BufferType::F32}, {"xn", 96, fb::BufferType::F32},
               {"q", 48, fb::BufferType::F32},        {"xq", 96, fb::BufferType::I8},  {"logits", 11, fb::BufferType::F32}};
  TestStep embed{fb::OpKind::Embed, {0}, {1}, {0}};
  embed.name = "token_embd";
  TestStep norm{fb::OpKind::RmsNorm, {1}, {2}, {2}};
  norm.eps = 1e-6f;
  norm.name = "output_norm";
  TestStep quant{fb::OpKind::QuantizeAct, {2}, {4}, {}};
  TestStep mm{fb::OpKind::MatMul, {2, 4}, {3}, {1}};
  mm.rows = 48;
  mm.cols = 512;
  mm.name = "blk.0.attn_q";
  // The quantized matmul's launch record (kernels/mmq.cuh ABI), its planes as the tensor has them.
  const std::vector<TestPlane>& q4k = s.tensors[1].planes;
  TestLaunch mmq{{0}, {}, minfer::kern::mmqLaunchRule(48, 64, 64, 32, true)};
  mmq.args = {{.kind = fb::ArgKind::Weight, .name = "wq", .tensor = 1, .plane = q4k[0].t},
              {.kind = fb::ArgKind::Weight, .name = "wscale", .tensor = 1, .plane = q4k[1].t},
              {.kind = fb::ArgKind::Weight, .name = "wmin", .tensor = 1, .plane = q4k[2].t},
              {.kind = fb::ArgKind::Null, .name = "bias"},
              {.kind = fb::ArgKind::Q8Values, .name = "xq", .buffer = 4, .width = 96},
              {.kind = fb::ArgKind::Q8Meta, .name = "xmeta", .buffer = 4, .width = 96},
              {.kind = fb::ArgKind::Activation, .name = "out", .buffer = 3, .access = fb::Access::Write, .width = 48},
              {.kind = fb::ArgKind::TokenCount, .name = "n_tokens"}};
  mm.launches = {mmq};
  TestStep rope{fb::OpKind::Rope, {3, 3}, {3, 3}, {}};
  rope.n_head = 3;
  rope.n_head_kv = 1;
  rope.head_dim = 16;
  rope.n_rot = 16;
  rope.rope_style = fb::RopeStyle::Neox;
  rope.rope_freq_base = 500000.f;
  rope.rope_freq_scale = 0.25f;
  TestStep attn{fb::OpKind::Attention, {3, 3, 3}, {2}, {}};
  attn.layer = 1;
  attn.n_head = 6;
  attn.n_head_kv = 2;
  attn.head_dim = 16;
  TestStep logits{fb::OpKind::MatMul, {2}, {5}, {3}};
  logits.rows = 11;
  logits.cols = 96;
  logits.name = "output";
  TestStep logits_tail = logits;
  logits_tail.tail = true;
  s.prefill = {embed, norm, quant, mm, rope, attn, logits_tail};
  s.decode = {embed, norm, mm, attn, logits};
  return s;
}

// Segment payloads in manifest order: every plane of every tensor, then cubin, then PTX.
std::vector<const std::vector<uint8_t>*> payloads(const Spec& s) {
  std::vector<const std::vector<uint8_t>*> out;
  for (const auto& t : s.tensors)
    for (const auto& p : t.planes) out.push_back(&p.data);
  out.push_back(&s.cubin);
  out.push_back(&s.ptx);
  return out;
}

// Field names of the segments in the same order (the loader's names, written out independently).
std::vector<std::string> segmentFields(const Spec& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.tensors.size(); ++i)
    for (size_t j = 0; j < s.tensors[i].planes.size(); ++j)
      out.push_back("tensors[" + std::to_string(i) + "].planes[" + std::to_string(j) + "].data");
  out.push_back("kernels[0].cubin");
  out.push_back("kernels[0].ptx");
  return out;
}

std::vector<uint8_t> buildManifest(const Spec& s, const std::vector<fb::Segment>& segs,
                                   const fb::Segment& check = fb::Segment()) {
  flatbuffers::FlatBufferBuilder b;
  auto strings = [&](const std::vector<std::string>& v) {
    std::vector<flatbuffers::Offset<flatbuffers::String>> out;
    for (const auto& x : v) out.push_back(b.CreateString(x));
    return out;
  };
  auto source = fb::CreateSourceInfoDirect(b, s.source_name.c_str(), s.source_size, s.source_sha.c_str());
  auto config = fb::CreateModelConfigDirect(b, s.arch.c_str(), s.model_name.c_str(), s.n_embd, s.n_layer, s.n_head,
                                            s.n_head_kv, s.head_dim, s.n_ff, s.n_vocab, s.n_ctx_train, s.n_rot,
                                            s.rope_style, s.rope_freq_base, s.rope_freq_scale, s.rope_scaling,
                                            s.rms_norm_eps, s.tied);
  flatbuffers::Offset<fb::Tokenizer> tokenizer = 0;
  if (s.with_tokenizer) {
    auto tokens = strings(s.tokens);
    auto merges = strings(s.merges);
    tokenizer = fb::CreateTokenizerDirect(b, s.tok_model, s.tok_model_name.c_str(), s.tok_pre.c_str(), &tokens,
                                          &s.scores, &s.token_types, &merges, s.bos, s.eos, s.unk, s.pad, s.add_bos,
                                          s.add_eos, s.add_space_prefix, s.chat_template.c_str(), s.eot, s.eom);
  }
  size_t k = 0;
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  for (const auto& t : s.tensors) {
    std::vector<flatbuffers::Offset<fb::Plane>> planes;
    for (const auto& p : t.planes) {
      const StrideTable& st = p.t;
      auto layout = fb::CreateStrideTable(b, static_cast<uint8_t>(st.kind), static_cast<uint8_t>(st.elem), st.rows,
                                          st.cols, st.row_pitch, st.group_size, st.group_pitch, st.bits, st.q_offset,
                                          st.ggml_type, st.experts, st.expert_pitch);
      planes.push_back(fb::CreatePlane(b, layout, &segs[k++]));
    }
    tensors.push_back(fb::CreateTensorDirect(b, t.name.c_str(), static_cast<uint32_t>(t.type), &t.ne, &planes));
  }
  auto options = strings(s.kernel_options);
  std::vector<flatbuffers::Offset<fb::KernelImage>> kernels = {
      fb::CreateKernelImageDirect(b, s.kernel_key.c_str(), s.kernel_entry.c_str(), s.kernel_arch.c_str(), &segs[k],
                                  &segs[k + 1], s.nvrtc.c_str(), &options)};
  auto grid = [](const minfer::kern::GridExtent (&g)[3]) {
    auto e = [](const minfer::kern::GridExtent& x) { return fb::GridExtent(x.per_token, x.constant, x.divisor); };
    return fb::Grid(e(g[0]), e(g[1]), e(g[2]));
  };
  auto launch = [&](const TestLaunch& l) {
    std::vector<flatbuffers::Offset<fb::KernelArg>> args;
    for (const TestArg& a : l.args) {
      flatbuffers::Offset<fb::StrideTable> plane = 0;
      if (a.plane)
        plane = fb::CreateStrideTable(b, static_cast<uint8_t>(a.plane->kind), static_cast<uint8_t>(a.plane->elem),
                                      a.plane->rows, a.plane->cols, a.plane->row_pitch, a.plane->group_size,
                                      a.plane->group_pitch, a.plane->bits, a.plane->q_offset, a.plane->ggml_type,
                                      a.plane->experts, a.plane->expert_pitch);
      args.push_back(fb::CreateKernelArgDirect(b, a.kind, a.name.c_str(), a.buffer, a.access, a.width, a.tensor, plane,
                                               a.layer, a.bytes, a.value, a.view_offset, a.view_width));
    }
    const fb::Grid g = grid(l.rule.grid), g_large = grid(l.rule.grid_large);
    const fb::Dim3 block(l.rule.block.x, l.rule.block.y, l.rule.block.z);
    return fb::CreateLaunchDirect(b, &l.images, &args, &g, &g_large, l.rule.large_from, &block, l.rule.smem,
                                  /*overlap=*/false, l.min_rows, l.max_rows);
  };
  auto plan = [&](const std::vector<TestStep>& steps) {
    std::vector<flatbuffers::Offset<fb::Step>> out;
    for (const auto& st : steps) {
      std::vector<flatbuffers::Offset<fb::Launch>> launches;
      for (const TestLaunch& l : st.launches) launches.push_back(launch(l));
      std::vector<flatbuffers::Offset<fb::Launch>> paged;
      for (const TestLaunch& l : st.paged) paged.push_back(launch(l));
      std::vector<flatbuffers::Offset<fb::Launch>> small;
      for (const TestLaunch& l : st.small) small.push_back(launch(l));
      out.push_back(fb::CreateStepDirect(b, st.op, &st.inputs, &st.outputs, &st.weights, st.layer, st.eps, st.n_head,
                                         st.n_head_kv, st.head_dim, st.n_rot, st.rope_style, st.rope_freq_base,
                                         st.rope_freq_scale, st.rows, st.cols, st.name.empty() ? nullptr : st.name.c_str(),
                                         &launches, st.tail, 0, 0, st.window, st.rope_ext_factor, st.rope_attn_factor,
                                         st.rope_beta_fast, st.rope_beta_slow, st.rope_n_ctx_orig, /*fused=*/false,
                                         st.input_views.empty() ? nullptr : &st.input_views,
                                         st.output_views.empty() ? nullptr : &st.output_views, 0, 0, false, st.kv_ring,
                                         st.paged.empty() ? nullptr : &paged, st.small.empty() ? nullptr : &small,
                                         st.small_rows));
    }
    return fb::CreatePlanDirect(b, &out);
  };
  auto prefill = plan(s.prefill);
  auto decode = plan(s.decode);
  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  for (const auto& buf : s.buffers) buffers.push_back(fb::CreateBufferDirect(b, buf.name.c_str(), buf.width, buf.type));
  auto memory = fb::CreateMemoryPlanDirect(b, s.max_batch, &buffers, s.input_ids, s.logits, s.kv_bytes,
                                           s.kv_ring_bytes_per_token, s.kv_ring_bytes);
  auto archs = strings(s.target_archs);
  const flatbuffers::Offset<fb::Launch> topk = s.topk ? launch(*s.topk) : 0;
  auto root = fb::CreateArtifactDirect(b, s.major, s.minor, s.producer.c_str(), s.producer_version.c_str(), source,
                                       config, tokenizer, &tensors, &kernels, prefill, decode, memory, &archs,
                                       s.with_manifest_check ? &check : nullptr, 0, 0, topk);
  fb::FinishSizePrefixedArtifactBuffer(b, root);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

std::string errorText(llvm::Error err) { return err ? llvm::toString(std::move(err)) : std::string(); }

// How segments are written: in order on one thread, or in reverse over `threads` threads with the
// larger planes streamed in pieces.
struct WriteMode {
  unsigned threads = 1;
  bool reverse = false;
  size_t chunk = 0;  // 0: writeSegment; else beginSegment + append of this many bytes
};

// Writes `s` with the ArtifactWriter. Returns "" or the first error.
std::string writeArtifact(const std::string& path, const Spec& s, WriteMode mode = {}) {
  auto w = ArtifactWriter::create(path);
  if (!w) return llvm::toString(w.takeError());
  const auto data = payloads(s);
  std::vector<SegmentId> ids;
  for (const auto* d : data) ids.push_back((*w)->reserveSegment(d->size()));
  auto current = [&] {
    std::vector<fb::Segment> segs;
    for (SegmentId id : ids) segs.push_back((*w)->segment(id));
    return segs;
  };
  if (auto err = (*w)->layout(buildManifest(s, current()).size())) return errorText(std::move(err));
  std::vector<std::string> errors(mode.threads);
  auto work = [&](unsigned t) {
    for (size_t n = 0; n < ids.size(); ++n) {
      const size_t i = mode.reverse ? ids.size() - 1 - n : n;
      if (i % mode.threads != t) continue;
      llvm::ArrayRef<uint8_t> bytes(*data[i]);
      if (mode.chunk == 0) {
        if (auto err = (*w)->writeSegment(ids[i], bytes)) errors[t] = errorText(std::move(err));
        continue;
      }
      auto stream = (*w)->beginSegment(ids[i]);
      if (!stream) {
        errors[t] = llvm::toString(stream.takeError());
        continue;
      }
      for (size_t at = 0; at < bytes.size(); at += mode.chunk)
        if (auto err = stream->append(bytes.slice(at, std::min(mode.chunk, bytes.size() - at))))
          errors[t] = errorText(std::move(err));
      if (auto err = stream->finish()) errors[t] = errorText(std::move(err));
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < mode.threads; ++t) pool.emplace_back(work, t);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (!e.empty()) return e;
  return errorText((*w)->commit(buildManifest(s, current())));
}

std::vector<uint8_t> readBytes(const std::string& path) { return minfer::test::readFile(path); }

void writeBytes(const std::string& path, const uint8_t* p, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
  REQUIRE(out.good());
}
void writeBytes(const std::string& path, const std::vector<uint8_t>& v) { writeBytes(path, v.data(), v.size()); }

// Overwrites one byte of an existing file in place.
void patchByte(const std::string& path, uint64_t pos, uint8_t value) {
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  io.seekp(static_cast<std::streamoff>(pos));
  io.put(static_cast<char>(value));
  REQUIRE(io.good());
}

std::string openError(const std::string& path) {
  auto f = ArtifactFile::open(path);
  return f ? std::string() : f.status().message();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

uint64_t readLE32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24; }

std::vector<std::string> dirEntries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Removes this process's scratch directory at exit (the fork children of the size-limit test leave
// through _exit and so never run it).
struct ScratchCleanup {
  ~ScratchCleanup() {
    std::error_code ec;
    std::filesystem::remove_all(minfer::test::scratchDir(), ec);
  }
} g_scratch_cleanup;

// A fresh empty directory per test case.
std::string caseDir(const std::string& name) {
  const std::string dir = minfer::test::scratchDir() + "/artifact-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Reads every field of a verified manifest and every byte of every segment (touches everything an
// accepted artifact exposes, so ASan sees any read the verifier should have prevented).
uint64_t walkManifest(const ArtifactFile& f) {
  uint64_t acc = 0;
  auto str = [&](const flatbuffers::String* s) {
    if (s) acc += std::hash<std::string>()(s->str());
  };
  const fb::Artifact* m = f.manifest();
  acc += m->format_major() + m->format_minor();
  str(m->producer());
  str(m->producer_version());
  if (m->source()) {
    str(m->source()->name());
    str(m->source()->sha256());
    acc += m->source()->size();
  }
  const fb::ModelConfig* c = m->config();
  str(c->architecture());
  str(c->name());
  acc += c->n_embd() + c->n_layer() + c->n_head() + c->n_head_kv() + c->head_dim() + c->n_ff() + c->n_vocab() +
         c->n_ctx_train() + c->n_rot() + static_cast<int>(c->rope_style()) + static_cast<int>(c->rope_scaling()) +
         static_cast<uint64_t>(c->rope_freq_base() + c->rope_freq_scale() + c->rms_norm_eps()) + c->tied_embeddings();
  if (const fb::Tokenizer* t = m->tokenizer()) {
    str(t->model_name());
    str(t->pre());
    str(t->chat_template());
    if (t->tokens())
      for (auto s : *t->tokens()) str(s);
    if (t->merges())
      for (auto s : *t->merges()) str(s);
    if (t->scores())
      for (float x : *t->scores()) acc += static_cast<uint64_t>(x != 0);
    if (t->token_types())
      for (int32_t x : *t->token_types()) acc += x;
    acc += t->bos_id() + t->eos_id() + t->unk_id() + t->pad_id() + t->eot_id() + t->eom_id() + t->add_bos() +
           t->add_eos() + t->add_space_prefix() + static_cast<int>(t->model());
  }
  if (m->tensors())
    for (const fb::Tensor* t : *m->tensors()) {
      str(t->name());
      if (t->ne())
        for (uint64_t d : *t->ne()) acc += d;
      for (const fb::Plane* p : *t->planes()) {
        const StrideTable st = minfer::toStrideTable(*p->layout());
        acc += st.bytes() + st.group_size + st.group_pitch + st.bits + st.q_offset + st.ggml_type;
        const uint8_t* d = f.segmentData(*p->data());
        for (uint64_t i = 0; i < p->data()->size(); ++i) acc += d[i];
      }
    }
  if (m->kernels())
    for (const fb::KernelImage* k : *m->kernels()) {
      str(k->key());
      str(k->entry());
      str(k->arch());
      str(k->nvrtc_version());
      if (k->options())
        for (auto s : *k->options()) str(s);
      for (const fb::Segment* s : {k->cubin(), k->ptx()})
        if (s && s->size()) acc += f.segmentData(*s)[s->size() - 1];
    }
  for (const fb::Plan* plan : {m->prefill(), m->decode()}) {
    if (!plan || !plan->steps()) continue;
    for (const fb::Step* s : *plan->steps()) {
      str(s->name());
      for (auto* v : {s->inputs(), s->outputs(), s->weights()})
        if (v)
          for (uint32_t x : *v) acc += x;
      if (s->launches())
        for (const fb::Launch* l : *s->launches()) {
          for (uint32_t x : *l->images()) acc += x;
          if (l->args())
            for (const fb::KernelArg* a : *l->args()) {
              str(a->name());
              acc += static_cast<int>(a->kind()) + a->buffer() + a->width() + a->tensor() + a->layer() + a->bytes();
              if (a->plane()) acc += minfer::toStrideTable(*a->plane()).bytes();
            }
          acc += l->grid()->x().per_token() + l->block()->x() + l->smem() + l->large_from();
        }
      acc += s->tail();
      acc += static_cast<uint16_t>(s->op()) + s->layer() + s->n_head() + s->n_head_kv() + s->head_dim() + s->n_rot() +
             s->rows() + s->cols();
    }
  }
  if (const fb::MemoryPlan* mem = m->memory()) {
    acc += mem->max_batch() + mem->input_ids() + mem->logits() + mem->kv_bytes_per_token();
    if (mem->buffers())
      for (const fb::Buffer* b : *mem->buffers()) {
        str(b->name());
        acc += b->width() + static_cast<int>(b->type());
      }
  }
  if (m->target_archs())
    for (auto s : *m->target_archs()) str(s);
  return acc;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("writer + loader: every field round-trips, segments are aligned and checksummed") {
  const std::string dir = caseDir("roundtrip");
  const std::string path = dir + "/tiny.mfb";
  const Spec s = makeSpec();
  REQUIRE(writeArtifact(path, s) == "");
  CHECK(dirEntries(dir) == std::vector<std::string>{"tiny.mfb"});  // no temp file left behind

  auto opened = ArtifactFile::open(path);
  REQUIRE_MESSAGE(opened, opened.status().message());
  const ArtifactFile& f = **opened;
  CHECK(f.verifyChecksums().isOk());
  CHECK(f.path() == path);
  CHECK(f.fileSize() == std::filesystem::file_size(path));
  const std::vector<uint8_t> raw = readBytes(path);
  CHECK(f.manifestSize() == readLE32(raw.data()) + 4);

  const fb::Artifact* m = f.manifest();
  CHECK(m->format_major() == 1);
  CHECK(m->format_minor() == minfer::kArtifactFormatMinor);
  CHECK(m->producer()->str() == s.producer);
  CHECK(m->producer_version()->str() == s.producer_version);
  CHECK(m->source()->name()->str() == s.source_name);
  CHECK(m->source()->size() == s.source_size);
  CHECK(m->source()->sha256()->str() == s.source_sha);
  const fb::ModelConfig* c = m->config();
  CHECK(c->architecture()->str() == s.arch);
  CHECK(c->name()->str() == s.model_name);
  CHECK(c->n_embd() == s.n_embd);
  CHECK(c->n_layer() == s.n_layer);
  CHECK(c->n_head() == s.n_head);
  CHECK(c->n_head_kv() == s.n_head_kv);
  CHECK(c->head_dim() == s.head_dim);
  CHECK(c->n_ff() == s.n_ff);
  CHECK(c->n_vocab() == s.n_vocab);
  CHECK(c->n_ctx_train() == s.n_ctx_train);
  CHECK(c->n_rot() == s.n_rot);
  CHECK(c->rope_style() == s.rope_style);
  CHECK(c->rope_freq_base() == s.rope_freq_base);
  CHECK(c->rope_freq_scale() == s.rope_freq_scale);
  CHECK(c->rope_scaling() == s.rope_scaling);
  CHECK(c->rms_norm_eps() == s.rms_norm_eps);
  CHECK(c->tied_embeddings() == s.tied);

  const fb::Tokenizer* t = m->tokenizer();
  REQUIRE(t);
  CHECK(t->model() == s.tok_model);
  CHECK(t->model_name()->str() == s.tok_model_name);
  CHECK(t->pre()->str() == s.tok_pre);
  REQUIRE(t->tokens()->size() == s.tokens.size());
  for (size_t i = 0; i < s.tokens.size(); ++i) CHECK(t->tokens()->Get(i)->str() == s.tokens[i]);
  REQUIRE(t->scores()->size() == s.scores.size());
  for (size_t i = 0; i < s.scores.size(); ++i) CHECK(t->scores()->Get(i) == s.scores[i]);
  REQUIRE(t->token_types()->size() == s.token_types.size());
  for (size_t i = 0; i < s.token_types.size(); ++i) CHECK(t->token_types()->Get(i) == s.token_types[i]);
  REQUIRE(t->merges()->size() == s.merges.size());
  for (size_t i = 0; i < s.merges.size(); ++i) CHECK(t->merges()->Get(i)->str() == s.merges[i]);
  CHECK(t->bos_id() == s.bos);
  CHECK(t->eos_id() == s.eos);
  CHECK(t->unk_id() == s.unk);
  CHECK(t->pad_id() == s.pad);
  CHECK(t->eot_id() == 9);
  CHECK(t->eom_id() == 10);
  CHECK(t->add_bos() == s.add_bos);
  CHECK(t->add_eos() == s.add_eos);
  CHECK(t->add_space_prefix() == s.add_space_prefix);
  CHECK(t->chat_template()->str() == s.chat_template);

  // Tensors, planes, stride tables, and the bytes at each segment (through the loader and raw).
  REQUIRE(m->tensors()->size() == s.tensors.size());
  uint64_t prev_end = f.manifestSize();
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const fb::Tensor* ft = m->tensors()->Get(i);
    const TestTensor& tt = s.tensors[i];
    CHECK(ft->name()->str() == tt.name);
    CHECK(ft->ggml_type() == static_cast<uint32_t>(tt.type));
    REQUIRE(ft->ne()->size() == tt.ne.size());
    for (size_t d = 0; d < tt.ne.size(); ++d) CHECK(ft->ne()->Get(d) == tt.ne[d]);
    REQUIRE(ft->planes()->size() == tt.planes.size());
    for (size_t j = 0; j < tt.planes.size(); ++j) {
      const fb::Plane* p = ft->planes()->Get(j);
      const StrideTable want = tt.planes[j].t;
      const StrideTable got = minfer::toStrideTable(*p->layout());
      CHECK(got.kind == want.kind);
      CHECK(got.elem == want.elem);
      CHECK(got.rows == want.rows);
      CHECK(got.cols == want.cols);
      CHECK(got.row_pitch == want.row_pitch);
      CHECK(got.group_size == want.group_size);
      CHECK(got.group_pitch == want.group_pitch);
      CHECK(got.bits == want.bits);
      CHECK(got.q_offset == want.q_offset);
      CHECK(got.ggml_type == want.ggml_type);
      const std::vector<uint8_t>& data = tt.planes[j].data;
      const fb::Segment* seg = p->data();
      CHECK(seg->size() == data.size());
      CHECK(seg->offset() % 4096 == 0);
      CHECK(seg->offset() >= prev_end);  // reservation order, no overlap
      CHECK(seg->offset() - prev_end < 4096);  // packed: only alignment padding in between
      prev_end = seg->offset() + seg->size();
      CHECK(seg->xxh64() == XXH64(data.data(), data.size(), 0));
      CHECK(std::memcmp(f.segmentData(*seg), data.data(), data.size()) == 0);
      REQUIRE(seg->offset() + seg->size() <= raw.size());
      CHECK(std::memcmp(raw.data() + seg->offset(), data.data(), data.size()) == 0);
    }
  }

  REQUIRE(m->kernels()->size() == 1);
  const fb::KernelImage* k = m->kernels()->Get(0);
  CHECK(k->key()->str() == s.kernel_key);
  CHECK(k->entry()->str() == s.kernel_entry);
  CHECK(k->arch()->str() == s.kernel_arch);
  CHECK(k->nvrtc_version()->str() == s.nvrtc);
  REQUIRE(k->options()->size() == s.kernel_options.size());
  for (size_t i = 0; i < s.kernel_options.size(); ++i) CHECK(k->options()->Get(i)->str() == s.kernel_options[i]);
  for (const auto& [seg, data] : {std::pair{k->cubin(), &s.cubin}, std::pair{k->ptx(), &s.ptx}}) {
    REQUIRE(seg);
    CHECK(seg->size() == data->size());
    CHECK(seg->offset() % 4096 == 0);
    CHECK(seg->offset() >= prev_end);
    prev_end = seg->offset() + seg->size();
    CHECK(seg->xxh64() == XXH64(data->data(), data->size(), 0));
    CHECK(std::memcmp(f.segmentData(*seg), data->data(), data->size()) == 0);
  }
  CHECK(f.fileSize() == prev_end);  // the last segment ends the file

  auto checkPlan = [&](const fb::Plan* plan, const std::vector<TestStep>& want) {
    REQUIRE(plan);
    REQUIRE(plan->steps()->size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const fb::Step* st = plan->steps()->Get(i);
      const TestStep& w = want[i];
      CHECK(st->op() == w.op);
      auto same = [](const flatbuffers::Vector<uint32_t>* v, const std::vector<uint32_t>& e) {
        return v && std::vector<uint32_t>(v->begin(), v->end()) == e;
      };
      CHECK(same(st->inputs(), w.inputs));
      CHECK(same(st->outputs(), w.outputs));
      CHECK(same(st->weights(), w.weights));
      CHECK(st->tail() == w.tail);
      REQUIRE((st->launches() ? st->launches()->size() : 0u) == w.launches.size());
      for (size_t k = 0; k < w.launches.size(); ++k) {
        const fb::Launch* l = st->launches()->Get(k);
        const TestLaunch& wl = w.launches[k];
        CHECK(same(l->images(), wl.images));
        CHECK(l->block()->x() == wl.rule.block.x);
        CHECK(l->smem() == wl.rule.smem);
        CHECK(l->grid()->y().divisor() == wl.rule.grid[1].divisor);
        REQUIRE(l->args()->size() == wl.args.size());
        for (size_t a = 0; a < wl.args.size(); ++a) {
          CHECK(l->args()->Get(a)->kind() == wl.args[a].kind);
          CHECK(l->args()->Get(a)->name()->str() == wl.args[a].name);
          CHECK(static_cast<bool>(l->args()->Get(a)->plane()) == wl.args[a].plane.has_value());
          if (wl.args[a].plane) {
            const StrideTable got = minfer::toStrideTable(*l->args()->Get(a)->plane());
            const StrideTable& want_t = *wl.args[a].plane;
            CHECK(got.kind == want_t.kind);
            CHECK(got.row_pitch == want_t.row_pitch);
            CHECK(got.group_size == want_t.group_size);
            CHECK(got.rows == want_t.rows);
            CHECK(got.cols == want_t.cols);
          }
        }
      }
      CHECK(st->layer() == w.layer);
      CHECK(st->eps() == w.eps);
      CHECK(st->n_head() == w.n_head);
      CHECK(st->n_head_kv() == w.n_head_kv);
      CHECK(st->head_dim() == w.head_dim);
      CHECK(st->n_rot() == w.n_rot);
      CHECK(st->rope_style() == w.rope_style);
      CHECK(st->rope_freq_base() == w.rope_freq_base);
      CHECK(st->rope_freq_scale() == w.rope_freq_scale);
      CHECK(st->rows() == w.rows);
      CHECK(st->cols() == w.cols);
      CHECK((st->name() ? st->name()->str() : std::string()) == w.name);
    }
  };
  checkPlan(m->prefill(), s.prefill);
  checkPlan(m->decode(), s.decode);

  const fb::MemoryPlan* mem = m->memory();
  REQUIRE(mem);
  CHECK(mem->max_batch() == s.max_batch);
  CHECK(mem->input_ids() == s.input_ids);
  CHECK(mem->logits() == s.logits);
  CHECK(mem->kv_bytes_per_token() == s.kv_bytes);
  REQUIRE(mem->buffers()->size() == s.buffers.size());
  for (size_t i = 0; i < s.buffers.size(); ++i) {
    CHECK(mem->buffers()->Get(i)->name()->str() == s.buffers[i].name);
    CHECK(mem->buffers()->Get(i)->width() == s.buffers[i].width);
    CHECK(mem->buffers()->Get(i)->type() == s.buffers[i].type);
  }
  REQUIRE(m->target_archs()->size() == s.target_archs.size());
  for (size_t i = 0; i < s.target_archs.size(); ++i) CHECK(m->target_archs()->Get(i)->str() == s.target_archs[i]);

  // manifest_check: the manifest's extent, and XXH64 of its bytes with the hash field zeroed,
  // recomputed here from the raw file.
  const fb::Segment* mc = m->manifest_check();
  REQUIRE(mc);
  CHECK(mc->offset() == 0);
  CHECK(mc->size() == f.manifestSize());
  std::vector<uint8_t> zeroed(raw.begin(), raw.begin() + static_cast<ptrdiff_t>(f.manifestSize()));
  const size_t at = static_cast<size_t>(reinterpret_cast<const uint8_t*>(mc) - f.segmentData(fb::Segment(0, 1, 0)));
  std::memset(zeroed.data() + at + 16, 0, 8);
  CHECK(mc->xxh64() == XXH64(zeroed.data(), zeroed.size(), 0));

  // The loader lists every non-empty segment by field, sorted by offset.
  const std::vector<std::string> fields = segmentFields(s);
  REQUIRE(f.segments().size() == fields.size());
  for (size_t i = 0; i < fields.size(); ++i) CHECK(f.segments()[i].field == fields[i]);
  CHECK(walkManifest(f) != 0);
}

TEST_CASE("writer: same input gives byte-identical files whatever the write order, threads or chunking") {
  const std::string dir = caseDir("determinism");
  const Spec s = makeSpec();
  REQUIRE(writeArtifact(dir + "/a.mfb", s) == "");
  REQUIRE(writeArtifact(dir + "/b.mfb", s, WriteMode{3, true, 0}) == "");
  REQUIRE(writeArtifact(dir + "/c.mfb", s, WriteMode{2, false, 777}) == "");
  const auto a = readBytes(dir + "/a.mfb");
  CHECK(a.size() > 4 * 4096);
  CHECK(a == readBytes(dir + "/b.mfb"));
  CHECK(a == readBytes(dir + "/c.mfb"));
  // Sanity of the comparison itself: a one-byte change of one plane changes the file.
  Spec s2 = s;
  s2.tensors[1].planes[2].data[100] ^= 1;
  REQUIRE(writeArtifact(dir + "/d.mfb", s2) == "");
  CHECK(a != readBytes(dir + "/d.mfb"));
}

TEST_CASE("writer: commit never called or a failed commit leaves no file; a previous artifact stays") {
  const std::string dir = caseDir("nocommit");
  const std::string path = dir + "/model.mfb";
  const Spec s = makeSpec();
  {
    auto w = ArtifactWriter::create(path);
    REQUIRE(w);
    CHECK(dirEntries(dir).size() == 1);  // the temp file exists while writing
    CHECK(llvm::StringRef((*w)->tempPath()).startswith(dir + "/"));
    const SegmentId id = (*w)->reserveSegment(s.cubin.size());
    REQUIRE(!(*w)->layout(1000));
    REQUIRE(!(*w)->writeSegment(id, s.cubin));
  }
  CHECK(dirEntries(dir).empty());

  // A previous artifact at the path survives every failure below byte for byte.
  REQUIRE(writeArtifact(path, s) == "");
  const auto previous = readBytes(path);
  auto expectUntouched = [&](const std::string& why) {
    INFO(why);
    CHECK(dirEntries(dir) == std::vector<std::string>{"model.mfb"});
    CHECK(readBytes(path) == previous);
  };

  SUBCASE("segment never written") {
    auto w = ArtifactWriter::create(path);
    REQUIRE(w);
    const SegmentId a = (*w)->reserveSegment(100);
    (*w)->reserveSegment(5000);
    REQUIRE(!(*w)->layout(2000));
    REQUIRE(!(*w)->writeSegment(a, pseudoRandomBytes(100, 9)));
    const std::string err = errorText((*w)->commit(buildManifest(s, std::vector<fb::Segment>(16))));
    CHECK(contains(err, path));
    CHECK(contains(err, "segment 1 (5000 bytes at offset 8192) was never written"));
    expectUntouched("never written");
  }
  SUBCASE("manifest larger than reserved") {
    auto w = ArtifactWriter::create(path);
    REQUIRE(w);
    REQUIRE(!(*w)->layout(64));
    const auto manifest = buildManifest(s, std::vector<fb::Segment>(16));
    const std::string err = errorText((*w)->commit(manifest));
    CHECK(contains(err, "manifest is " + std::to_string(manifest.size()) + " bytes but layout reserved 64"));
    expectUntouched("manifest too large");
  }
  SUBCASE("manifest without manifest_check, or not an Artifact buffer") {
    Spec no_check = s;
    no_check.with_manifest_check = false;
    const auto manifest = buildManifest(no_check, std::vector<fb::Segment>(16));
    auto w = ArtifactWriter::create(path);
    REQUIRE(w);
    REQUIRE(!(*w)->layout(manifest.size()));
    CHECK(contains(errorText((*w)->commit(manifest)), "manifest has no manifest_check"));
    expectUntouched("no manifest_check");
    auto w2 = ArtifactWriter::create(path);
    REQUIRE(w2);
    REQUIRE(!(*w2)->layout(manifest.size()));
    std::vector<uint8_t> bad = manifest;
    std::memcpy(bad.data() + 8, "XXXX", 4);
    CHECK(contains(errorText((*w2)->commit(bad)), "not a verifiable size-prefixed Artifact FlatBuffer"));
    expectUntouched("bad identifier");
  }
  SUBCASE("misuse: wrong size, twice, unknown id, before layout, stream overrun") {
    auto w = ArtifactWriter::create(path);
    REQUIRE(w);
    const SegmentId a = (*w)->reserveSegment(300);
    const SegmentId b = (*w)->reserveSegment(200);
    CHECK(contains(errorText((*w)->writeSegment(a, pseudoRandomBytes(300, 1))), "before layout"));
    REQUIRE(!(*w)->layout(100));
    CHECK(contains(errorText((*w)->writeSegment(a, pseudoRandomBytes(299, 1))), "299 bytes given, 300 reserved"));
    CHECK(!(*w)->writeSegment(a, pseudoRandomBytes(300, 1)));
    CHECK(contains(errorText((*w)->writeSegment(a, pseudoRandomBytes(300, 1))), "segment 0 written twice"));
    CHECK(contains(errorText((*w)->writeSegment(7, pseudoRandomBytes(3, 1))), "segment id 7 out of range (2 reserved)"));
    auto stream = (*w)->beginSegment(b);
    REQUIRE(stream);
    CHECK(!stream->append(pseudoRandomBytes(150, 2)));
    CHECK(contains(errorText(stream->append(pseudoRandomBytes(51, 2))), "appending 51 bytes at 150 exceeds its reserved size of 200"));
    CHECK(contains(errorText(stream->finish()), "150 bytes written, 200 reserved"));
  }
  expectUntouched("after the subcase's writer is gone");
}

TEST_CASE("writer: unwritable or missing directory fails at create, naming the path; nothing is written") {
  const std::string dir = caseDir("unwritable");
  const std::string path = dir + "/model.mfb";
  const Spec s = makeSpec();
  REQUIRE(writeArtifact(path, s) == "");
  const auto previous = readBytes(path);

  // A directory component that is a regular file: fails for every user, root included.
  const std::string not_dir = dir + "/model.mfb/inner.mfb";
  auto w = ArtifactWriter::create(not_dir);
  REQUIRE(!w);
  const std::string err = llvm::toString(w.takeError());
  CHECK(contains(err, not_dir));
  CHECK(contains(err, "cannot create temporary file"));
  CHECK(contains(err, "Not a directory"));
  auto missing = ArtifactWriter::create(dir + "/no/such/dir/x.mfb");
  REQUIRE(!missing);
  CHECK(contains(llvm::toString(missing.takeError()), "No such file or directory"));

  if (::geteuid() == 0) {
    MESSAGE("running as root: permission bits do not stop root, so the chmod 0555 case is skipped");
  } else {
    REQUIRE(::chmod(dir.c_str(), 0555) == 0);
    auto ro = ArtifactWriter::create(path);
    REQUIRE(!ro);
    const std::string ro_err = llvm::toString(ro.takeError());
    CHECK(contains(ro_err, path));
    CHECK(contains(ro_err, "Permission denied"));
    REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  }
  CHECK(dirEntries(dir) == std::vector<std::string>{"model.mfb"});
  CHECK(readBytes(path) == previous);
}

// Runs `body` in a child process with RLIMIT_FSIZE = `limit` bytes (writes past it fail with EFBIG,
// as a full disk fails with ENOSPC) and returns what it wrote to the pipe.
std::string inLimitedChild(uint64_t limit, const std::function<std::string()>& setup,
                           const std::function<std::string()>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string out = setup();
    if (out.empty()) {
      ::signal(SIGXFSZ, SIG_IGN);
      struct rlimit rl = {limit, limit};
      ::setrlimit(RLIMIT_FSIZE, &rl);
      out = body();
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return out;
}

TEST_CASE("writer: a failed write (file size limit, like a full disk) names the numbers and leaves nothing") {
  const std::string dir = caseDir("diskfull");
  const std::string path = dir + "/model.mfb";
  const Spec s = makeSpec();
  REQUIRE(writeArtifact(path, s) == "");
  const auto previous = readBytes(path);

  // 1. layout under the limit: reserving the file fails.
  const std::string layout_err = inLimitedChild(
      3 * 4096, [] { return std::string(); },
      [&] {
        auto w = ArtifactWriter::create(path);
        if (!w) return "create: " + llvm::toString(w.takeError());
        (*w)->reserveSegment(4000);
        (*w)->reserveSegment(9000);
        return errorText((*w)->layout(500));
      });
  CHECK(contains(layout_err, path));
  CHECK(contains(layout_err, "File too large"));
  CHECK(contains(layout_err, std::to_string(4096 + 4096 + 9000)));  // the bytes it tried to reserve
  CHECK(dirEntries(dir) == std::vector<std::string>{"model.mfb"});

  // 2. layout before the limit, then a segment write crosses it.
  std::unique_ptr<ArtifactWriter> writer;
  SegmentId a = 0, b = 0;
  const std::string seg_err = inLimitedChild(
      3 * 4096,
      [&] {
        auto w = ArtifactWriter::create(path);
        if (!w) return "create: " + llvm::toString(w.takeError());
        writer = std::move(*w);
        a = writer->reserveSegment(4000);
        b = writer->reserveSegment(9000);
        return errorText(writer->layout(500));
      },
      [&] {
        if (auto err = writer->writeSegment(a, pseudoRandomBytes(4000, 1))) return "first: " + errorText(std::move(err));
        std::string err = errorText(writer->writeSegment(b, pseudoRandomBytes(9000, 2)));
        // After a failed write the temp file is already gone, and commit refuses.
        if (std::filesystem::exists(writer->tempPath())) err += " [temp file still exists]";
        err += " | " + errorText(writer->commit(buildManifest(makeSpec(), std::vector<fb::Segment>(16))));
        return err;
      });
  CHECK(contains(seg_err, path));
  CHECK(contains(seg_err, "segment 1: write of 9000 bytes at offset 8192 failed at offset 12288"));
  CHECK(contains(seg_err, "File too large"));
  CHECK(!contains(seg_err, "temp file still exists"));
  CHECK(contains(seg_err, "commit after a failed write"));
  CHECK(dirEntries(dir) == std::vector<std::string>{"model.mfb"});
  CHECK(readBytes(path) == previous);
}

// ---------------------------------------------------------------------------------------------
// Damage.

struct GoodArtifact {
  std::string dir, path;
  Spec spec;
  std::vector<uint8_t> bytes;
  uint64_t manifest_size = 0;
  std::vector<fb::Segment> segs;  // in manifest order
};

GoodArtifact makeGood(const std::string& name) {
  GoodArtifact g;
  g.dir = caseDir(name);
  g.path = g.dir + "/good.mfb";
  g.spec = makeSpec();
  REQUIRE(writeArtifact(g.path, g.spec) == "");
  g.bytes = readBytes(g.path);
  g.manifest_size = readLE32(g.bytes.data()) + 4;
  auto f = ArtifactFile::open(g.path);
  REQUIRE(f);
  const fb::Artifact* m = (*f)->manifest();
  for (const fb::Tensor* t : *m->tensors())
    for (const fb::Plane* p : *t->planes()) g.segs.push_back(*p->data());
  g.segs.push_back(*m->kernels()->Get(0)->cubin());
  g.segs.push_back(*m->kernels()->Get(0)->ptx());
  return g;
}

// The good file with its manifest replaced by one built from `spec` and `segs` (manifest_check set
// to the new extent and hash, as the writer would), written to `path`.
void writeVariant(const GoodArtifact& g, const Spec& spec, const std::vector<fb::Segment>& segs,
                  const std::string& path) {
  const uint64_t n = buildManifest(spec, segs).size();
  // XXH64 of the manifest with its hash field zero (schema/artifact.fbs), then the same manifest
  // carrying that hash: a variant differs from a genuine file only in what the test changed.
  const auto unsealed = buildManifest(spec, segs, fb::Segment(0, n, 0));
  const auto manifest = buildManifest(spec, segs, fb::Segment(0, n, XXH64(unsealed.data(), unsealed.size(), 0)));
  REQUIRE(manifest.size() == n);
  REQUIRE(n <= g.segs[0].offset());
  std::vector<uint8_t> out = g.bytes;
  std::fill(out.begin(), out.begin() + static_cast<ptrdiff_t>(g.segs[0].offset()), 0);
  std::copy(manifest.begin(), manifest.end(), out.begin());
  writeBytes(path, out);
}

// Step 3's MatMul (spec.prefill[3]) with two small-batch forms for 16 rows (1.10): its launch for 1..8 rows and again
// from 9 on (max_rows 0: up to small_rows).
void setRangedSmallLaunches(Spec& spec) {
  TestLaunch few = spec.prefill[3].launches[0], more = few;
  few.max_rows = 8;
  more.min_rows = 9;
  spec.prefill[3].small = {few, more};
  spec.prefill[3].small_rows = 16;
}

TEST_CASE("loader: semantic damage built on purpose is refused with the field, offset and numbers") {
  const GoodArtifact g = makeGood("semantic");
  const std::string path = g.dir + "/variant.mfb";
  const auto fields = segmentFields(g.spec);

  // The variant path itself produces an accepted file when nothing is changed.
  writeVariant(g, g.spec, g.segs, path);
  REQUIRE(openError(path) == "");

  auto refused = [&](const Spec& spec, const std::vector<fb::Segment>& segs, std::vector<std::string> words) {
    writeVariant(g, spec, segs, path);
    const std::string err = openError(path);
    REQUIRE_MESSAGE(!err.empty(), "accepted: expected ", words[0]);
    CHECK_MESSAGE(contains(err, path), err);
    for (const auto& w : words) CHECK_MESSAGE(contains(err, w), err, "  (missing: ", w, ")");
  };

  SUBCASE("overlapping segments") {
    auto segs = g.segs;
    segs[2] = fb::Segment(segs[1].offset(), segs[2].size(), segs[2].xxh64());
    refused(g.spec, segs, {fields[2], "overlaps", fields[1], std::to_string(segs[1].offset())});
  }
  SUBCASE("segment past the end of the file") {
    auto segs = g.segs;
    const auto& last = segs.back();
    segs.back() = fb::Segment(last.offset() + 8 * 4096, last.size(), last.xxh64());
    refused(g.spec, segs, {fields.back(), "past the end of the file", std::to_string(g.bytes.size())});
  }
  SUBCASE("misaligned segment") {
    auto segs = g.segs;
    segs[3] = fb::Segment(segs[3].offset() + 8, segs[3].size(), segs[3].xxh64());
    refused(g.spec, segs, {fields[3], std::to_string(segs[3].offset()), "not a multiple of 4096"});
  }
  SUBCASE("segment inside the manifest") {
    auto segs = g.segs;
    segs[0] = fb::Segment(0, segs[0].size(), segs[0].xxh64());
    refused(g.spec, segs, {fields[0], "starts inside the manifest"});
  }
  SUBCASE("empty segment with an offset") {
    auto segs = g.segs;
    segs.back() = fb::Segment(segs.back().offset(), 0, 0);
    refused(g.spec, segs, {"kernels[0].ptx", "empty segment has offset"});
  }
  SUBCASE("plane size differs from its stride table") {
    Spec spec = g.spec;
    spec.tensors[1].planes[0].t.row_pitch = 528;  // 48 rows x 528 = 25344, segment holds 48 x 512
    refused(spec, g.segs, {"tensors[1].planes[0].data", "segment is 24576 bytes", "48 rows x 528 bytes = 25344",
                           "blk.0.attn_q.weight", "manifest offset 0x"});
  }
  SUBCASE("stride table row_pitch smaller than a row") {
    Spec spec = g.spec;
    spec.tensors[3].planes[0].t.row_pitch = 96;  // f16: 96 cols need 192 bytes
    auto segs = g.segs;
    segs[6] = fb::Segment(segs[6].offset(), 11 * 96, 0);
    refused(spec, segs, {"tensors[3].planes[0].layout", "row_pitch 96 is smaller than one row of 96 weights (192 bytes)"});
  }
  SUBCASE("scale plane row_pitch smaller than its groups") {
    Spec spec = g.spec;
    spec.tensors[1].planes[1].t.row_pitch = 60;  // 16 groups x 4 bytes = 64
    auto segs = g.segs;
    segs[2] = fb::Segment(segs[2].offset(), 48 * 60, 0);
    refused(spec, segs, {"tensors[1].planes[1].layout", "row_pitch 60", "(64 bytes)"});
  }
  SUBCASE("stride table enum out of range, wrong elem, bad bits, wrong block geometry") {
    Spec spec = g.spec;
    spec.tensors[2].planes[0].t.kind = static_cast<PlaneKind>(9);
    refused(spec, g.segs, {"tensors[2].planes[0].layout", "kind 9 is not a PlaneKind"});
    spec = g.spec;
    spec.tensors[2].planes[0].t.elem = ElemType::kF16;
    refused(spec, g.segs, {"tensors[2].planes[0].layout", "elem 2 does not fit plane kind 4"});
    spec = g.spec;
    spec.tensors[1].planes[3].t.bits = 5;
    refused(spec, g.segs, {"tensors[1].planes[3].layout", "bits 5"});
    spec = g.spec;
    spec.tensors[0].planes[0].t.group_pitch = 36;
    refused(spec, g.segs, {"tensors[0].planes[0].layout", "differ from Q8_0 blocks (32 weights in 34 bytes, in slots of 34 or 48 bytes)"});
  }
  SUBCASE("expert axis (1.4): experts 0, a pitch without an axis, a 2-D tensor, a wrong pitch, a launch without it") {
    Spec spec = g.spec;
    spec.tensors[2].planes[0].t.experts = 0;
    refused(spec, g.segs, {"tensors[2].planes[0].layout", "experts is 0"});
    spec = g.spec;
    spec.tensors[2].planes[0].t.expert_pitch = 384;
    refused(spec, g.segs, {"tensors[2].planes[0].layout", "expert_pitch 384 without an expert axis"});
    spec = g.spec;  // blk.0.attn_q is 2-D: no expert axis
    spec.tensors[1].planes[0].t.experts = 2;
    spec.tensors[1].planes[0].t.expert_pitch = 24 * 512;
    refused(spec, g.segs, {"tensors[1].planes[0].layout.experts", "only a 3-D tensor"});
    spec = g.spec;  // as 3 experts of 16 rows: every plane needs expert_pitch = 16 rows
    spec.tensors[1].ne = {512, 16, 3};
    for (TestPlane& p : spec.tensors[1].planes) p.t.experts = 3, p.t.expert_pitch = 16 * p.t.row_pitch;
    spec.tensors[1].planes[1].t.expert_pitch += 4;
    refused(spec, g.segs, {"tensors[1].planes[1].layout", "expert axis: 3 experts of 48 rows", "found 1028"});
    spec.tensors[1].planes[1].t.expert_pitch -= 4;
    // The planes are valid now, but the matmul's launch record was specialized without the axis.
    refused(spec, g.segs, {"experts 1", "experts 3"});
  }
  SUBCASE("plane shape differs from the tensor's") {
    Spec spec = g.spec;
    spec.tensors[3].ne = {96, 12};
    refused(spec, g.segs, {"tensors[3].planes[0].layout", "plane is 11 rows x 96 cols but the tensor is 12 x 96"});
  }
  SUBCASE("unknown ggml type") {
    Spec spec = g.spec;
    spec.tensors[2].type = static_cast<GgmlType>(4);  // a gap in the ggml enum
    refused(spec, g.segs, {"tensors[2].ggml_type", "4 is not a ggml type id", "output_norm.weight"});
  }
  SUBCASE("buffer id out of range") {
    Spec spec = g.spec;
    spec.prefill[3].inputs = {4, 6};
    refused(spec, g.segs, {"prefill.steps[3].inputs[1]", "buffer id 6 is out of range (memory.buffers has 6)"});
  }
  SUBCASE("tensor index out of range") {
    Spec spec = g.spec;
    spec.decode[4].weights = {4};
    refused(spec, g.segs, {"decode.steps[4].weights[0]", "tensor index 4 is out of range (tensors has 4)"});
  }
  SUBCASE("launch records: image index, arch, argument ranges") {
    Spec spec = g.spec;
    spec.prefill[3].launches[0].images = {1};
    refused(spec, g.segs, {"prefill.steps[3].launches[0].images[0]", "kernel index 1 is out of range (kernels has 1)"});
    spec = g.spec;
    spec.target_archs = {"sm_89"};
    refused(spec, g.segs, {"prefill.steps[3].launches[0].images[0]", "kernels[0] is for sm_90 but target_archs[0] is sm_89"});
    spec = g.spec;
    spec.prefill[3].launches[0].args[4].buffer = 6;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[4].buffer", "buffer id 6 is out of range (6 buffers)"});
    spec = g.spec;
    spec.prefill[3].launches[0].args[6].width = 47;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[6].width", "specialized for rows of 47 but buffer 'q' is 48 wide"});
    spec = g.spec;
    spec.prefill[3].launches[0].args[4].buffer = 3;  // an f32 buffer as q8 values
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[4].kind", "Q8Values argument on buffer 'q' of type F32"});
    spec = g.spec;
    spec.prefill[3].launches[0].args[0].tensor = 4;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[0].tensor", "tensor index 4 is out of range (4 tensors)"});
    spec = g.spec;
    spec.prefill[3].launches[0].args[0].plane->kind = PlaneKind::kF16;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[0].plane.kind", "which has no such plane"});
    spec = g.spec;
    spec.prefill[3].launches[0].args.resize(17, TestArg{.kind = fb::ArgKind::Null, .name = "pad"});
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args", "17 arguments, more than 16"});
    // Counters (1.5): whole 32-bit words, at least one, at most kArtifactMaxCounterBytes.
    for (uint64_t bytes : {uint64_t{0}, uint64_t{6}, minfer::kArtifactMaxCounterBytes + 4}) {
      spec = g.spec;
      spec.prefill[3].launches[0].args[3] = TestArg{.kind = fb::ArgKind::Counters, .name = "counters", .bytes = bytes};
      refused(spec, g.segs, {"prefill.steps[3].launches[0].args[3].bytes", "counters of " + std::to_string(bytes) + " bytes"});
    }
  }
  SUBCASE("paged launches (1.6): only on steps with positional launches, row arguments only there") {
    // A launch record for the Rope step (the verifier checks records, not which kernel they name) and a paged
    // form of it whose fourth argument is the per-row positions.
    Spec base = g.spec;
    base.prefill[4].launches = {base.prefill[3].launches[0]};
    TestLaunch paged = base.prefill[3].launches[0];
    paged.args[3] = TestArg{.kind = fb::ArgKind::RowPositions, .name = "pos"};
    base.prefill[4].paged = {paged};
    writeVariant(g, base, g.segs, path);
    CHECK(openError(path) == "");  // control: accepted
    Spec spec = g.spec;
    spec.prefill[3].launches[0].args[3] = TestArg{.kind = fb::ArgKind::BlockTables, .name = "tables"};
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[3].kind", "BlockTables argument outside a paged launch"});
    spec = g.spec;
    spec.prefill[3].paged = {paged};  // a MatMul: its launches take no positions or KV cache
    refused(spec, g.segs, {"prefill.steps[3].paged_launches", "only the prefill and decode plans' Rope and Attention steps "
                                                              "and steps whose launches take positions or a KV cache"});
    spec = g.spec;
    spec.decode[3].paged = {paged};  // the decode plan's Attention, which has no launches here
    refused(spec, g.segs, {"decode.steps[3].paged_launches", "without launches"});
    spec = g.spec;
    spec.prefill[5].paged = {paged};  // an Attention without launches of its own
    refused(spec, g.segs, {"prefill.steps[5].paged_launches", "without launches"});
    spec = base;
    spec.prefill[4].paged[0].args[3] = TestArg{.kind = fb::ArgKind::Positions, .name = "pos"};
    refused(spec, g.segs, {"prefill.steps[4].paged_launches[0].args[3].kind", "takes per-row positions (RowPositions), not Positions"});
    spec = base;
    spec.prefill[4].paged[0].args[4].buffer = 6;
    refused(spec, g.segs, {"prefill.steps[4].paged_launches[0].args[4].buffer", "buffer id 6 is out of range"});
  }
  SUBCASE("small-batch launches (1.7): only on the prefill plan's MatMul steps, for 1..max_batch rows") {
    // The MatMul's own record as its small-batch form (the verifier checks records, not which kernel they name).
    Spec base = g.spec;
    base.prefill[3].small = {base.prefill[3].launches[0]};
    base.prefill[3].small_rows = 16;
    writeVariant(g, base, g.segs, path);
    CHECK(openError(path) == "");  // control: accepted
    Spec spec = base;
    spec.prefill[3].small_rows = 0;
    refused(spec, g.segs, {"prefill.steps[3].small_rows", "small_rows 0 outside 1..memory.max_batch (64)"});
    spec.prefill[3].small_rows = 65;
    refused(spec, g.segs, {"prefill.steps[3].small_rows", "small_rows 65 outside 1..memory.max_batch (64)"});
    spec = g.spec;
    spec.prefill[3].small_rows = 8;  // without launches
    refused(spec, g.segs, {"prefill.steps[3].small_rows", "has small_rows 8 but no small launches"});
    spec = g.spec;
    spec.decode[2].small = {g.spec.prefill[3].launches[0]};  // the decode plan's MatMul
    spec.decode[2].small_rows = 8;
    refused(spec, g.segs, {"decode.steps[2].small_launches", "only the prefill plan's MatMul steps have them"});
    spec = g.spec;
    spec.prefill[4].small = {g.spec.prefill[3].launches[0]};  // a Rope
    spec.prefill[4].small_rows = 8;
    refused(spec, g.segs, {"prefill.steps[4].small_launches", "only the prefill plan's MatMul steps have them"});
    spec = base;
    spec.prefill[3].small[0].args[4].buffer = 6;
    refused(spec, g.segs, {"prefill.steps[3].small_launches[0].args[4].buffer", "buffer id 6 is out of range"});
    spec = base;
    spec.prefill[3].small[0].args[0].plane->row_pitch = 528;  // the offset gate covers them too
    refused(spec, g.segs, {"prefill.steps[3].small_launches[0].args[0].plane.row_pitch", "specialized for row_pitch 528"});
  }
  SUBCASE("row ranges of small-batch launches (1.10): read back; bounded by small_rows; every call served") {
    Spec base = g.spec;
    setRangedSmallLaunches(base);
    const TestLaunch few = base.prefill[3].small[0], more = base.prefill[3].small[1];
    writeVariant(g, base, g.segs, path);
    REQUIRE(openError(path) == "");
    {
      auto f = ArtifactFile::open(path);
      REQUIRE(f);
      const fb::Step* mm = (*f)->manifest()->prefill()->steps()->Get(3);
      REQUIRE(mm->small_launches()->size() == 2);
      CHECK(mm->small_launches()->Get(0)->min_rows() == 0);
      CHECK(mm->small_launches()->Get(0)->max_rows() == 8);
      CHECK(mm->small_launches()->Get(1)->min_rows() == 9);
      CHECK(mm->small_launches()->Get(1)->max_rows() == 0);
      CHECK(mm->launches()->Get(0)->min_rows() == 0);  // the step's own launch carries none
      CHECK(mm->launches()->Get(0)->max_rows() == 0);
    }
    Spec spec = base;  // overlapping ranges: a call in both runs both, in order
    spec.prefill[3].small[1].min_rows = 1;
    spec.prefill[3].small[1].max_rows = 16;
    writeVariant(g, spec, g.segs, path);
    CHECK(openError(path) == "");
    // A range anywhere else: the step's own launches, another plan, the argmax's place.
    spec = base;
    spec.prefill[3].launches[0].max_rows = 8;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].max_rows",
                           "row range min_rows 0, max_rows 8 on a launch outside Step.small_launches",
                           "step 'blk.0.attn_q'"});
    spec = base;
    spec.decode[2].launches[0].min_rows = 1;
    refused(spec, g.segs, {"decode.steps[2].launches[0].min_rows", "row range min_rows 1, max_rows 0"});
    spec = base;
    spec.prefill[4].launches = {base.prefill[3].launches[0]};  // a Rope's paged launch (as in the 1.6 case)
    spec.prefill[4].paged = {base.prefill[3].launches[0]};
    spec.prefill[4].paged[0].args[3] = TestArg{.kind = fb::ArgKind::RowPositions, .name = "pos"};
    spec.prefill[4].paged[0].min_rows = 2;
    refused(spec, g.segs, {"prefill.steps[4].paged_launches[0].min_rows", "outside Step.small_launches"});
    // Bounds: min ≤ max ≤ small_rows where set.
    spec = base;
    spec.prefill[3].small[1].max_rows = 8;  // 9..8
    refused(spec, g.segs, {"prefill.steps[3].small_launches[1].min_rows", "min_rows 9 above max_rows 8"});
    spec = base;
    spec.prefill[3].small[1].max_rows = 17;
    refused(spec, g.segs, {"prefill.steps[3].small_launches[1].max_rows", "max_rows 17 above small_rows 16"});
    spec = base;
    spec.prefill[3].small[1].min_rows = 17;
    refused(spec, g.segs, {"prefill.steps[3].small_launches[1].min_rows", "min_rows 17 above small_rows 16"});
    // Coverage: a hole in the middle, at the top, at the bottom.
    spec = base;
    spec.prefill[3].small[0].max_rows = 4;
    spec.prefill[3].small[1].min_rows = 6;
    refused(spec, g.segs, {"prefill.steps[3].small_launches",
                           "a call of n_tokens = 5 runs none of its 2 small-batch launches (rows 1..4, 6..16; small_rows 16)"});
    spec = base;
    spec.prefill[3].small[1].max_rows = 15;
    refused(spec, g.segs, {"prefill.steps[3].small_launches", "a call of n_tokens = 16 runs none", "(rows 1..8, 9..15;"});
    spec = base;
    spec.prefill[3].small = {more};
    refused(spec, g.segs, {"prefill.steps[3].small_launches", "a call of n_tokens = 1 runs none of its 1 small-batch"});
    // Covered out of order (the later launch serves the smaller calls).
    spec = base;
    spec.prefill[3].small = {more, few};
    writeVariant(g, spec, g.segs, path);
    CHECK(openError(path) == "");
    // A 1.9 artifact (no ranges: every small launch serves 1..small_rows) is still read.
    spec = g.spec;
    spec.minor = 9;
    spec.prefill[3].small = {g.spec.prefill[3].launches[0]};
    spec.prefill[3].small_rows = 16;
    writeVariant(g, spec, g.segs, path);
    CHECK(openError(path) == "");
  }
  SUBCASE("launch records: a kernel specialized for another stride than the plane it binds (offset gate)") {
    // The q8 weight plane is 512 bytes per row; a kernel compiled for 528 would read the right bytes at
    // the wrong addresses from row 1 on. The refusal names step, kernel, argument and both numbers.
    Spec spec = g.spec;
    spec.prefill[3].launches[0].args[0].plane->row_pitch = 528;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[0].plane.row_pitch",
                           "kernel 'mmq_i8_q4k_n48_k512_tm64_tn32_sm90' (mmq_i8_q4k), argument 'wq' was specialized "
                           "for row_pitch 528 of tensor 'blk.0.attn_q.weight' plane kind 0, but that plane's stride "
                           "table has row_pitch 512",
                           "step 'blk.0.attn_q', MatMul"});
    spec = g.spec;
    spec.decode[2].launches[0].args[1].plane->group_size = 16;
    refused(spec, g.segs, {"decode.steps[2].launches[0].args[1].plane.group_size", "argument 'wscale'",
                           "group_size 16", "has group_size 32"});
    spec = g.spec;
    spec.prefill[3].launches[0].args[2].plane->q_offset = -8;
    refused(spec, g.segs, {"args[2].plane.q_offset", "q_offset -8", "has q_offset 0"});
  }
  SUBCASE("launch records: grid, block and shared memory limits") {
    Spec spec = g.spec;
    spec.prefill[3].launches[0].rule.grid[1].divisor = 0;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].grid.y.divisor", "is 0"});
    spec = g.spec;
    spec.prefill[3].launches[0].rule.grid[1] = {70000, 0, 1};  // 70000 · max_batch blocks in y
    refused(spec, g.segs, {"prefill.steps[3].launches[0].grid.y", "extent 70000..4480000 for 1..64 tokens is outside 1..65535"});
    spec = g.spec;
    spec.prefill[3].launches[0].rule.grid[0] = {0, 0, 1};
    refused(spec, g.segs, {"prefill.steps[3].launches[0].grid.x", "extent 0..0"});
    spec = g.spec;
    spec.prefill[3].launches[0].rule.block = {1024, 2, 1};
    refused(spec, g.segs, {"prefill.steps[3].launches[0].block", "block 1024 x 2 x 1 is outside CUDA's limits"});
    spec = g.spec;
    spec.prefill[3].launches[0].rule.smem = 300000;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].smem", "300000 bytes of dynamic shared memory"});
    spec = g.spec;
    spec.prefill[3].launches[0].rule.large_from = 8;
    spec.prefill[3].launches[0].rule.grid_large[0] = {0, 0, 1};
    refused(spec, g.segs, {"prefill.steps[3].launches[0].grid_large.x", "for 8..64 tokens"});
  }
  SUBCASE("last-token tail: a suffix of row-wise steps ending in the logits") {
    Spec spec = g.spec;
    spec.prefill[5].tail = true;  // attention
    refused(spec, g.segs, {"prefill.steps[5].tail", "Attention step marked as last-token tail"});
    spec = g.spec;
    spec.prefill[2].tail = true;  // a tail step followed by non-tail steps
    refused(spec, g.segs, {"prefill.steps[3].tail", "follows a tail step (the tail is a suffix)"});
    spec = g.spec;
    spec.prefill[6].outputs = {2};
    refused(spec, g.segs, {"prefill.steps[6].tail", "must end by writing the logits buffer 5"});
    spec = g.spec;
    spec.prefill[3].tail = spec.prefill[4].tail = spec.prefill[5].tail = true;
    spec.prefill[4].op = fb::OpKind::MatMul;  // so that the first refusal is the launch's
    spec.prefill[4].inputs = {3};
    spec.prefill[4].outputs = {3};
    spec.prefill[4].weights = {3};
    spec.prefill[4].rows = spec.prefill[4].cols = 4;
    spec.prefill[5].op = fb::OpKind::Add;
    spec.prefill[5].inputs = {3, 3};
    spec.prefill[3].launches[0].args[6].access = fb::Access::ReadWrite;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[6].access", "may not update buffer 'q' in place"});
  }
  SUBCASE("step arity and fields by the op traits") {
    Spec spec = g.spec;
    spec.prefill[4].inputs = {3};
    spec.prefill[4].outputs = {3};
    refused(spec, g.segs, {"prefill.steps[4]", "Rope step has 1 inputs, 1 outputs, 0 weights; expected 2..2 inputs"});
    spec = g.spec;
    spec.prefill[4].outputs = {3, 2};
    refused(spec, g.segs, {"prefill.steps[4].outputs[1]", "Rope works in place but output 1 is buffer 2, input 1 buffer 3"});
    spec = g.spec;
    spec.prefill[5].head_dim = 0;
    refused(spec, g.segs, {"prefill.steps[5].head_dim", "Attention step with head_dim 0"});
    spec = g.spec;
    spec.decode[2].weights = {1, 2, 3};
    refused(spec, g.segs, {"decode.steps[2]", "MatMul step has 2 inputs, 1 outputs, 3 weights; expected 1..2 inputs"});
  }
  SUBCASE("YaRN fields of a Rope step (1.3) out of range") {
    Spec spec = g.spec;
    spec.prefill[4].rope_ext_factor = 1.5f;
    refused(spec, g.segs, {"prefill.steps[4].rope_ext_factor", "1.5 is not in [0, 1] (0: no YaRN)"});
    spec = g.spec;
    spec.prefill[4].rope_ext_factor = NAN;
    refused(spec, g.segs, {"prefill.steps[4].rope_ext_factor", "is not in [0, 1]"});
    spec = g.spec;
    spec.prefill[4].rope_attn_factor = 0;
    refused(spec, g.segs, {"prefill.steps[4].rope_attn_factor", "0 is not a finite number > 0"});
    spec = g.spec;
    spec.prefill[4].rope_beta_slow = INFINITY;
    refused(spec, g.segs, {"prefill.steps[4].rope_beta_fast", "YaRN beta_fast 32 / beta_slow inf must be finite and > 0"});
    spec = g.spec;
    spec.prefill[4].rope_ext_factor = 1;
    refused(spec, g.segs, {"prefill.steps[4].rope_n_ctx_orig", "is 0, but YaRN (rope_ext_factor ≠ 0) needs the original"});
  }
  SUBCASE("a ring KV cache (1.6): only on a windowed Attention, at least window + max_batch - 1 positions") {
    Spec spec = g.spec;
    const uint32_t max_batch = spec.max_batch;
    spec.prefill[5].window = spec.decode[3].window = 16;
    spec.prefill[5].kv_ring = spec.decode[3].kv_ring = 16 + max_batch - 1;
    // 1.8: the memory plan's ring share: one layer of f16 K and V, 2 kv heads of 16 (128 bytes per position).
    spec.kv_ring_bytes_per_token = 128;
    spec.kv_ring_bytes = 128 * (16 + max_batch - 1);
    writeVariant(g, spec, g.segs, path);
    CHECK(openError(path) == "");
    {
      Spec wrong = spec;
      wrong.kv_ring_bytes = 128 * 16;  // the window's, not the ring's
      refused(wrong, g.segs, {"memory.kv_ring_bytes_per_token", "kv_ring_bytes_per_token 128 and kv_ring_bytes 2048 (of "
                                                                "kv_bytes_per_token 256) differ from the 1 ring layers' 128 and " +
                                                                    std::to_string(128 * (15 + max_batch))});
      wrong = spec;
      wrong.kv_ring_bytes_per_token = wrong.kv_ring_bytes = 0;  // what a 1.7 compiler wrote
      refused(wrong, g.segs, {"memory.kv_ring_bytes_per_token", "differ from the 1 ring layers' 128"});
      wrong.minor = 7;  // a 1.7 artifact: no ring figures, read as 0
      writeVariant(g, wrong, g.segs, path);
      CHECK(openError(path) == "");
    }
    spec.prefill[5].kv_ring = 16 + max_batch - 2;
    refused(spec, g.segs, {"prefill.steps[5].kv_ring",
                           "KV ring of " + std::to_string(14 + max_batch) + " positions is outside " +
                               std::to_string(15 + max_batch) + "..2^30 (window 16 + memory.max_batch " +
                               std::to_string(max_batch) + " - 1 keys are read at once)"});
    spec.prefill[5].kv_ring = (1u << 30) + 1;
    refused(spec, g.segs, {"prefill.steps[5].kv_ring", "is outside"});
    spec.prefill[5].kv_ring = 100;
    spec.prefill[5].window = 0;
    refused(spec, g.segs, {"prefill.steps[5].kv_ring", "KV ring of 100 positions on a Attention step without a sliding window (window 0)"});
    spec = g.spec;
    spec.prefill[4].kv_ring = 100;
    refused(spec, g.segs, {"prefill.steps[4].kv_ring", "on a Rope step without a sliding window"});
  }
  SUBCASE("column views (1.4): inside their buffer, one per operand, only on the ops that take them") {
    Spec spec = g.spec;  // q = columns 0..31 and k = 32..47 of buffer 3: accepted
    spec.prefill[4].input_views = spec.prefill[4].output_views = {fb::ColumnView(0, 32), fb::ColumnView(32, 16)};
    writeVariant(g, spec, g.segs, path);
    CHECK(openError(path) == "");
    spec.prefill[4].input_views[1] = fb::ColumnView(40, 16);
    refused(spec, g.segs, {"prefill.steps[4].input_views[1]", "columns 40 + 16 are empty or outside buffer \"q\" of width 48"});
    spec.prefill[4].input_views[1] = fb::ColumnView(0, 0);
    refused(spec, g.segs, {"prefill.steps[4].input_views[1]", "columns 0 + 0 are empty"});
    spec.prefill[4].input_views = {fb::ColumnView(0, 32)};
    refused(spec, g.segs, {"prefill.steps[4].input_views", "1 views for 2 operands"});
    spec = g.spec;
    spec.prefill[3].output_views = {fb::ColumnView(0, 48)};
    refused(spec, g.segs, {"prefill.steps[3].output_views", "MatMul step with column views"});
    // Launch arguments: the view lies inside a row of the buffer (width = the row pitch); none on q8.
    spec = g.spec;
    spec.prefill[3].launches[0].args[6].view_offset = 40;
    spec.prefill[3].launches[0].args[6].view_width = 16;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[6].view_offset", "column view 40 + 16 is outside rows of 48"});
    spec.prefill[3].launches[0].args[6].view_width = 0;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[6].view_offset", "column view 40 + 0"});
    spec.prefill[3].launches[0].args[6].view_offset = 32;
    spec.prefill[3].launches[0].args[6].view_width = 16;
    writeVariant(g, spec, g.segs, path);
    CHECK(openError(path) == "");
    spec = g.spec;
    spec.prefill[3].launches[0].args[4].view_width = 32;
    refused(spec, g.segs, {"prefill.steps[3].launches[0].args[4].view_width", "a Q8Values argument with a column view"});
  }
  SUBCASE("attention layer out of range, op out of range") {
    Spec spec = g.spec;
    spec.prefill[5].layer = 2;
    refused(spec, g.segs, {"prefill.steps[5].layer", "layer 2 is out of range (config.n_layer is 2"});
    spec = g.spec;
    spec.prefill[5].layer = -1;
    refused(spec, g.segs, {"prefill.steps[5].layer", "attention needs a KV cache layer"});
    spec = g.spec;
    spec.prefill[0].op = static_cast<fb::OpKind>(40);
    refused(spec, g.segs, {"prefill.steps[0].op", "value 40 is not an OpKind"});
  }
  SUBCASE("memory plan ids out of range") {
    Spec spec = g.spec;
    spec.logits = 6;
    refused(spec, g.segs, {"memory.logits", "buffer id 6 is out of range (6 buffers)"});
  }
  SUBCASE("format versions 2.0, one minor past this runtime's and 1.0") {
    Spec spec = g.spec;
    spec.major = 2;
    spec.minor = 0;
    refused(spec, g.segs, {"artifact format 2.0, this runtime reads 1.1 up to " + kUpTo});
    spec.major = 1;
    spec.minor = minfer::kArtifactFormatMinor + 1;
    refused(spec, g.segs, {"artifact format 1." + std::to_string(spec.minor) + ", this runtime reads 1.1 up to " + kUpTo});
    spec.minor = 0;
    refused(spec, g.segs, {"artifact format 1.0, this runtime reads 1.1 up to " + kUpTo,
                           "format 1.0 artifacts carry no launch records: recompile the GGUF with minfer-compile"});
  }
  SUBCASE("config: heads, zero dims, vocab vs tokenizer, bad floats, RoPE dims") {
    Spec spec = g.spec;
    spec.n_head_kv = 4;
    refused(spec, g.segs, {"config.n_head_kv", "n_head 6 is not a multiple of n_head_kv 4"});
    spec = g.spec;
    spec.n_ff = 0;
    refused(spec, g.segs, {"config.n_ff", "is 0"});
    spec = g.spec;
    spec.n_vocab = 12;
    refused(spec, g.segs, {"tokenizer.tokens", "has 11 tokens but config.n_vocab is 12"});
    spec = g.spec;
    spec.rms_norm_eps = -1e-6f;
    refused(spec, g.segs, {"config.rms_norm_eps", "not a positive finite number"});
    spec = g.spec;
    spec.n_rot = 18;
    refused(spec, g.segs, {"config.n_rot", "n_rot 18 must be even and at most head_dim 16"});
  }
  SUBCASE("tokenizer: scores length, special id out of range") {
    Spec spec = g.spec;
    spec.scores.pop_back();
    refused(spec, g.segs, {"tokenizer.scores", "has 10 entries for 11 tokens"});
    spec = g.spec;
    spec.eos = 11;
    refused(spec, g.segs, {"tokenizer.eos_id", "token id 11 is out of range"});
    spec = g.spec;
    spec.eot = 11;
    refused(spec, g.segs, {"tokenizer.eot_id", "token id 11 is out of range (-1 = none, or 0..10)"});
    spec = g.spec;
    spec.eom = -2;
    refused(spec, g.segs, {"tokenizer.eom_id", "token id -2 is out of range"});
  }
  SUBCASE("the top-k launch (1.9): read back; its TopK slot must have this runtime's layout and appear nowhere else") {
    Spec spec = g.spec;
    TestLaunch topk{{0}, {}, minfer::kern::topkLaunchRule(spec.n_vocab)};
    topk.args = {{.kind = fb::ArgKind::Activation, .name = "logits", .buffer = spec.logits, .width = spec.n_vocab},
                 {.kind = fb::ArgKind::TopK, .name = "slot", .bytes = sizeof(minfer::kern::TopKSlot)},
                 {.kind = fb::ArgKind::Scratch, .name = "scratch", .bytes = minfer::kern::topkScratchBytes(spec.n_vocab)},
                 {.kind = fb::ArgKind::Counters, .name = "counters", .bytes = minfer::kern::kTopKCounterBytes}};
    spec.topk = topk;
    writeVariant(g, spec, g.segs, path);
    REQUIRE(openError(path) == "");
    {
      auto f = ArtifactFile::open(path);
      REQUIRE(f);
      const fb::Launch* l = (*f)->manifest()->topk();
      REQUIRE(l);
      REQUIRE(l->args()->size() == 4);
      CHECK(l->args()->Get(1)->kind() == fb::ArgKind::TopK);
      CHECK(l->args()->Get(1)->bytes() == sizeof(minfer::kern::TopKSlot));
      CHECK(l->grid()->x().constant() == minfer::kern::topkBlocks(spec.n_vocab));
    }
    Spec wrong = spec;
    wrong.topk->args[1].bytes = sizeof(minfer::kern::TopKSlot) - 8;  // a build with another kTopKMax
    refused(wrong, g.segs, {"topk.args[1].bytes", "was built for a top-k slot of " +
                                                      std::to_string(sizeof(minfer::kern::TopKSlot) - 8) + " bytes"});
    wrong = spec;
    wrong.topk->args[0].buffer = 6;
    refused(wrong, g.segs, {"topk.args[0].buffer", "buffer id 6 is out of range", "(the top-k)"});
    wrong = spec;
    wrong.topk->args.erase(wrong.topk->args.begin() + 1);  // the slot unbound
    refused(wrong, g.segs, {"topk.args", "needs exactly one TopK argument", "has 0"});
    wrong = spec;
    wrong.topk->args.push_back(topk.args[1]);  // two slots
    refused(wrong, g.segs, {"topk.args", "needs exactly one TopK argument", "has 2"});
    wrong = g.spec;
    wrong.prefill[3].launches[0].args.push_back(topk.args[1]);
    refused(wrong, g.segs, {"prefill.steps[3].launches[0].args[", "TopK argument outside Artifact.topk"});
    // An artifact without it (format 1.8 and older, or compiled without --target) is still read.
    wrong = g.spec;
    wrong.minor = 8;
    writeVariant(g, wrong, g.segs, path);
    CHECK(openError(path) == "");
  }
  SUBCASE("format 1.1 (no eot_id / eom_id) is still read: both are -1") {
    Spec spec = g.spec;
    spec.minor = 1;
    spec.eot = -1;  // the schema default: not stored, as a 1.1 compiler wrote it
    spec.eom = -1;
    writeVariant(g, spec, g.segs, path);
    REQUIRE(openError(path) == "");
    auto f = ArtifactFile::open(path);
    REQUIRE(f);
    CHECK((*f)->manifest()->format_minor() == 1);
    CHECK((*f)->manifest()->tokenizer()->eot_id() == -1);
    CHECK((*f)->manifest()->tokenizer()->eom_id() == -1);
  }
  SUBCASE("kernel with neither cubin nor PTX") {
    auto segs = g.segs;
    segs[segs.size() - 2] = fb::Segment();
    segs[segs.size() - 1] = fb::Segment();
    refused(g.spec, segs, {"kernels[0]", "has neither cubin nor PTX"});
  }
  SUBCASE("manifest_check missing or wrong") {
    Spec spec = g.spec;
    spec.with_manifest_check = false;
    refused(spec, g.segs, {"manifest_check", "missing"});
    // The extent recorded differs from the size prefix.
    const auto manifest = buildManifest(g.spec, g.segs, fb::Segment(0, 100, 0));
    std::vector<uint8_t> out = g.bytes;
    std::copy(manifest.begin(), manifest.end(), out.begin());
    writeBytes(path, out);
    CHECK(contains(openError(path), "manifest_check"));
    CHECK(contains(openError(path), "says the manifest is [0, +100)"));
  }
}

TEST_CASE("loader: wrong identifier, empty, tiny, missing and non-artifact files are refused") {
  const GoodArtifact g = makeGood("identity");
  const std::string path = g.dir + "/bad.mfb";
  std::vector<uint8_t> b = g.bytes;
  std::memcpy(b.data() + 8, "MFB2", 4);
  writeBytes(path, b);
  std::string err = openError(path);
  CHECK(contains(err, path));
  CHECK(contains(err, "file identifier at offset 8 is \"MFB2\", expected \"MFB1\""));

  writeBytes(path, b.data(), 0);
  CHECK(contains(openError(path), "file is 0 bytes, too small"));
  CHECK(contains(openError(g.dir + "/absent.mfb"), "No such file or directory"));
  CHECK(contains(openError(g.dir), "not a regular file"));
  const std::vector<uint8_t> gguf = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  writeBytes(path, gguf);
  CHECK(contains(openError(path), "not a minfer artifact"));
}

TEST_CASE("loader: truncation at every offset in the manifest and a sample in the data is refused") {
  const GoodArtifact g = makeGood("truncate");
  const std::string path = g.dir + "/cut.mfb";
  std::vector<uint64_t> cuts;
  for (uint64_t t = 0; t <= g.manifest_size; ++t) cuts.push_back(t);
  for (const auto& seg : g.segs)
    for (uint64_t t : {seg.offset() - 1, seg.offset(), seg.offset() + 1, seg.offset() + seg.size() / 2,
                       seg.offset() + seg.size() - 1})
      cuts.push_back(t);
  for (uint64_t t = g.manifest_size; t < g.bytes.size(); t += 1237) cuts.push_back(t);
  // Longest first, so each cut is one truncate() of the same file.
  std::sort(cuts.begin(), cuts.end(), std::greater<>());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  writeBytes(path, g.bytes);
  size_t refused = 0;
  for (uint64_t t : cuts) {
    REQUIRE(t < g.bytes.size());
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(t)) == 0);
    REQUIRE(std::filesystem::file_size(path) == t);
    const std::string err = openError(path);
    if (err.empty()) {
      FAIL_CHECK("truncated at ", t, " of ", g.bytes.size(), " bytes but accepted");
      continue;
    }
    ++refused;
    if (!contains(err, path) || !contains(err, "truncated")) FAIL_CHECK("cut at ", t, ": unclear message: ", err);
  }
  CHECK(refused == cuts.size());
  MESSAGE("truncation: ", cuts.size(), " cuts (", g.manifest_size + 1, " inside the manifest), all refused");
}

TEST_CASE("loader: byte and bit flips in the manifest are refused by the verifier or caught by the checksum") {
  const GoodArtifact g = makeGood("flipmanifest");
  const std::string path = g.dir + "/flip.mfb";
  writeBytes(path, g.bytes);
  size_t structural = 0, semantic = 0, checksum = 0, undetected = 0, total = 0;
  std::string examples;  // the first messages of each category, shown once
  auto example = [&](size_t count, const std::string& msg) {
    if (count <= 3) examples += "\n  " + msg;
  };
  for (uint64_t pos = 0; pos < g.manifest_size; ++pos) {
    for (uint8_t mask : {static_cast<uint8_t>(1u << (pos % 8)), static_cast<uint8_t>(0xff)}) {
      patchByte(path, pos, g.bytes[pos] ^ mask);
      ++total;
      auto f = ArtifactFile::open(path);
      if (!f) {
        const std::string& err = f.status().message();
        if (!contains(err, path)) FAIL_CHECK("message without the path: ", err);
        const bool is_structural = contains(err, "fails FlatBuffers verification") ||
                                   contains(err, "file identifier at offset 8") ||
                                   contains(err, "manifest size prefix at offset 0");
        // open() checks the manifest's own checksum after both verifiers.
        const bool is_checksum = contains(err, "damaged manifest");
        if (is_checksum && !contains(err, "xxh64")) FAIL_CHECK("checksum message without hashes: ", err);
        example(++(is_structural ? structural : is_checksum ? checksum : semantic), err);
      } else {
        walkManifest(**f);  // an accepted manifest must be safe to read in full
        const minfer::Status st = (*f)->verifyChecksums();
        if (!st.isOk()) {
          example(++checksum, st.message());
          if (!contains(st.message(), "xxh64")) FAIL_CHECK("checksum message without hashes: ", st.message());
        } else {
          ++undetected;
          FAIL_CHECK("flip of byte ", pos, " with mask ", int(mask), " went undetected");
        }
      }
      patchByte(path, pos, g.bytes[pos]);
    }
  }
  CHECK(openError(path) == "");  // restored: the loop really patched and unpatched this file
  CHECK(undetected == 0);
  CHECK(structural > 0);
  CHECK(semantic > 0);
  CHECK(checksum > 0);
  MESSAGE("manifest flips: ", total, " (", g.manifest_size, " bytes x 2 masks): structural ", structural,
          ", semantic ", semantic, ", checksum only ", checksum, ", undetected ", undetected, "; examples:", examples);
}

TEST_CASE("loader: flips in data segments fail verifyChecksums naming the segment; stray bytes between too") {
  const GoodArtifact g = makeGood("flipdata");
  const std::string path = g.dir + "/flip.mfb";
  const auto fields = segmentFields(g.spec);
  for (size_t i = 0; i < g.segs.size(); ++i) {
    const fb::Segment& seg = g.segs[i];
    for (uint64_t at : {seg.offset(), seg.offset() + seg.size() / 3, seg.offset() + seg.size() - 1}) {
      std::vector<uint8_t> b = g.bytes;
      b[at] ^= 0x10;
      writeBytes(path, b);
      auto f = ArtifactFile::open(path);
      REQUIRE_MESSAGE(f, f.status().message());  // the verifier does not read data
      const minfer::Status st = (*f)->verifyChecksums();
      REQUIRE(!st.isOk());
      CHECK_MESSAGE(contains(st.message(), fields[i] + " [" + std::to_string(seg.offset())), st.message());
      CHECK(contains(st.message(), "xxh64"));
      CHECK(contains(st.message(), "damaged data"));
    }
  }
  // Padding after the manifest and between two segments.
  for (uint64_t at : {g.manifest_size + 3, g.segs[0].offset() + g.segs[0].size() + 5}) {
    std::vector<uint8_t> b = g.bytes;
    REQUIRE(b[at] == 0);
    b[at] = 0x5a;
    writeBytes(path, b);
    auto f = ArtifactFile::open(path);
    REQUIRE(f);
    const minfer::Status st = (*f)->verifyChecksums();
    REQUIRE(!st.isOk());
    CHECK_MESSAGE(contains(st.message(), "byte 0x5a at offset " + std::to_string(at)), st.message());
    CHECK(contains(st.message(), "stray data"));
  }
}

// ---------------------------------------------------------------------------------------------
// minfer-inspect on an artifact (the tool built with this test; MINFER_INSPECT is its path).

namespace {

struct ToolRun {
  int rc = -1;
  std::string out, err;
};

ToolRun runInspect(const std::string& args, const std::string& dir) {
  const std::string err_path = dir + "/inspect.stderr";
  const std::string cmd = std::string(MINFER_INSPECT) + " " + args + " 2>" + err_path;
  ToolRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const auto err = readBytes(err_path);
  r.err.assign(err.begin(), err.end());
  return r;
}

}  // namespace

TEST_CASE("minfer-inspect: text and JSON views of an artifact, --verify, errors exit 1") {
  const GoodArtifact g = makeGood("inspect");
  const Spec& s = g.spec;

  const ToolRun text = runInspect("--verify " + g.path, g.dir);
  CHECK_MESSAGE(text.rc == 0, text.err);
  CHECK(contains(text.out, g.path + ": minfer artifact format " + kUpTo + ", " + std::to_string(g.bytes.size()) + " bytes"));
  CHECK(contains(text.out, "n_embd 96, n_layer 2, n_head 6, n_head_kv 2, head_dim 16, n_ff 160, n_vocab 11"));
  CHECK(contains(text.out, "rms_norm_eps 9.99999997e-07"));  // all digits of the float 1e-6
  CHECK(contains(text.out, "11 tokens, 2 merges"));
  for (const auto& t : s.tensors) CHECK(contains(text.out, t.name));
  CHECK(contains(text.out, "blocks u8   11 x 96, row_pitch 102, group 32 / pitch 34"));
  CHECK(contains(text.out, "scale  f32  48 x 512, row_pitch 64, group 32 / pitch 4"));
  CHECK(contains(text.out, "packed u8   48 x 512, row_pitch 256, bits 4, q_offset 0"));
  char seg[64];
  std::snprintf(seg, sizeof(seg), "[0x%llx, +%llu)", static_cast<unsigned long long>(g.segs[1].offset()),
                static_cast<unsigned long long>(g.segs[1].size()));
  CHECK(contains(text.out, seg));
  CHECK(contains(text.out, "prefill plan (7 steps)"));
  CHECK(contains(text.out, "decode plan (5 steps)"));
  CHECK(contains(text.out,
                 "MatMul      blk.0.attn_q           in [2:xn 4:xq] out [3:q] w [1:blk.0.attn_q.weight] 48x512 k[0]\n"));
  CHECK(contains(text.out, "Attention                          in [3:q 3:q 3:q] out [2:xn] layer 1 heads 6/2 head_dim 16"));
  CHECK(contains(text.out, "MatMul      output                 in [2:xn] out [5:logits] w [3:output.weight] 11x96 tail\n"));
  CHECK(contains(text.out, s.kernel_key));
  CHECK(contains(text.out, "cubin [0x"));
  CHECK(contains(text.out, "checksums: manifest and 9 segments OK"));

  const ToolRun json = runInspect("--json --verify " + g.path, g.dir);
  CHECK_MESSAGE(json.rc == 0, json.err);
  auto parsed = llvm::json::parse(json.out);
  REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  const llvm::json::Object* root = parsed->getAsObject();
  REQUIRE(root);
  CHECK(root->getString("version") == llvm::StringRef(kUpTo));
  CHECK(root->getString("checksums") == llvm::StringRef("ok"));
  CHECK(root->getObject("tokenizer")->getString("chat_template")->startswith("{% for m in messages %}"));
  CHECK(root->getObject("config")->getInteger("n_head_kv") == int64_t{2});
  CHECK(root->getObject("memory")->getArray("buffers")->size() == s.buffers.size());
  CHECK(root->getArray("prefill")->size() == s.prefill.size());
  CHECK(root->getArray("decode")->size() == s.decode.size());
  const llvm::json::Array* tensors = root->getArray("tensors");
  REQUIRE(tensors);
  REQUIRE(tensors->size() == s.tensors.size());
  const llvm::json::Object* packed =
      (*tensors)[1].getAsObject()->getArray("planes")->back().getAsObject()->getObject("layout");
  CHECK(packed->getString("kind") == llvm::StringRef("packed"));
  CHECK(packed->getInteger("bytes") == int64_t{48 * 256});
  CHECK((*root->getArray("kernels"))[0].getAsObject()->getObject("cubin")->getInteger("size") ==
        llvm::Optional<int64_t>(static_cast<int64_t>(s.cubin.size())));
  // The launch record of the quantized matmul: entry, typed arguments, the plane table it was made for.
  const llvm::json::Object* mm = (*root->getArray("prefill"))[3].getAsObject();
  const llvm::json::Object* launch = (*mm->getArray("launches"))[0].getAsObject();
  CHECK(launch->getString("entry") == llvm::StringRef(s.kernel_entry));
  const llvm::json::Array* args = launch->getArray("args");
  REQUIRE(args->size() == 8);
  const llvm::json::Object* wq = (*args)[0].getAsObject();
  CHECK(wq->getString("kind") == llvm::StringRef("Weight"));
  CHECK(wq->getString("name") == llvm::StringRef("wq"));
  CHECK(wq->getObject("plane")->getInteger("row_pitch") == int64_t{512});
  CHECK((*args)[6].getAsObject()->getString("access") == llvm::StringRef("Write"));
  CHECK(launch->getObject("grid")->getObject("y")->getInteger("divisor") == int64_t{64});
  CHECK((*root->getArray("prefill"))[6].getAsObject()->getBoolean("tail") == true);

  // A damaged plane: printed, then --verify fails with the segment named on stderr and exit 1.
  const std::string bad = g.dir + "/bad.mfb";
  std::vector<uint8_t> b = g.bytes;
  b[g.segs[3].offset() + 77] ^= 4;
  writeBytes(bad, b);
  const ToolRun damaged = runInspect("--verify " + bad, g.dir);
  CHECK(damaged.rc == 1);
  CHECK_MESSAGE(contains(damaged.err, "tensors[1].planes[2].data"), damaged.err);
  CHECK(contains(damaged.err, "xxh64"));
  CHECK(runInspect(bad, g.dir).rc == 0);  // without --verify the data is not read

  writeBytes(bad, g.bytes.data(), g.manifest_size + 100);
  const ToolRun cut = runInspect(bad, g.dir);
  CHECK(cut.rc == 1);
  CHECK_MESSAGE(contains(cut.err, "truncated"), cut.err);
  CHECK(cut.out.empty());
}

TEST_CASE("minfer-inspect: small-batch launches with their row ranges (1.10)") {
  const GoodArtifact g = makeGood("inspect-small");
  Spec spec = g.spec;
  setRangedSmallLaunches(spec);
  const std::string path = g.dir + "/small.mfb";
  writeVariant(g, spec, g.segs, path);

  // Text: each small launch with its range, 0 read as 1 / small_rows.
  const ToolRun text = runInspect(path, g.dir);
  CHECK_MESSAGE(text.rc == 0, text.err);
  CHECK_MESSAGE(contains(text.out, "48x512 k[0] small(<=16 rows) k[0](rows 1..8) k[0](rows 9..16)\n"), text.out);

  // JSON: the schema's values (0: no bound), on the small launches and (both 0) every other launch.
  const ToolRun json = runInspect("--json " + path, g.dir);
  CHECK_MESSAGE(json.rc == 0, json.err);
  auto parsed = llvm::json::parse(json.out);
  REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  const llvm::json::Object* mm = (*parsed->getAsObject()->getArray("prefill"))[3].getAsObject();
  CHECK(mm->getInteger("small_rows") == int64_t{16});
  const llvm::json::Array* small = mm->getArray("small_launches");
  REQUIRE(small->size() == 2);
  CHECK((*small)[0].getAsObject()->getInteger("min_rows") == int64_t{0});
  CHECK((*small)[0].getAsObject()->getInteger("max_rows") == int64_t{8});
  CHECK((*small)[1].getAsObject()->getInteger("min_rows") == int64_t{9});
  CHECK((*small)[1].getAsObject()->getInteger("max_rows") == int64_t{0});
  const llvm::json::Object* own = (*mm->getArray("launches"))[0].getAsObject();
  CHECK(own->getInteger("min_rows") == int64_t{0});
  CHECK(own->getInteger("max_rows") == int64_t{0});

  // Without ranges (1.9 and older): the plain list, as before.
  spec.prefill[3].small = {g.spec.prefill[3].launches[0]};
  writeVariant(g, spec, g.segs, path);
  const ToolRun plain = runInspect(path, g.dir);
  CHECK_MESSAGE(plain.rc == 0, plain.err);
  CHECK_MESSAGE(contains(plain.out, "48x512 k[0] small(<=16 rows) k[0]\n"), plain.out);
}
