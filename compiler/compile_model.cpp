// The GGUF → .mfb pipeline (see compile_model.h).
#include "compiler/compile_model.h"

#include <algorithm>
#include <thread>

#include "compiler/artifact/artifact_writer.h"
#include "compiler/artifact/temp_file_signals.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/plan_rewrite.h"
#include "compiler/gguf/gguf_reader.h"
#include "compiler/model/model_desc.h"
#include "compiler/planes/layout_planner.h"
#include "compiler/planes/plane_transforms.h"
#include "compiler/planes/plane_workers.h"
#include "minfer/artifact.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "openssl/evp.h"

namespace minfer {
namespace {

constexpr const char* kProducer = "minfer-compile";
constexpr const char* kProducerVersion = "0.1.0";

struct TensorPlanes {
  planes::TensorLayout layout;
  std::vector<artifact::SegmentId> segments;  // one per layout.planes[i]; kDerived for a derived plane
};
constexpr artifact::SegmentId kDerived = ~artifact::SegmentId{0};

// Kernel images and the segments of their cubin and PTX (PTX stored with a terminating NUL, so the
// runtime can hand the mapped bytes to cuModuleLoadData directly).
struct Kernels {
  codegen::KernelSet set;
  std::vector<artifact::SegmentId> cubin, ptx;  // one per set.images[i]
};

struct SourceFacts {
  std::string name;
  uint64_t size = 0;
  std::string sha256;
};

// SHA-256 of `bytes` in lowercase hex (OpenSSL's EVP digest: SHA-NI where the CPU has it), or "" if
// OpenSSL fails (compileModel then fails).
std::string sha256Hex(llvm::ArrayRef<uint8_t> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr) != 1 || n != 32) return "";
  return llvm::toHex(llvm::ArrayRef<uint8_t>(digest, n), /*LowerCase=*/true);
}

flatbuffers::Offset<fb::StrideTable> createStrideTable(flatbuffers::FlatBufferBuilder& b, const StrideTable& st) {
  return fb::CreateStrideTable(b, static_cast<uint8_t>(st.kind), static_cast<uint8_t>(st.elem), st.rows, st.cols,
                               st.row_pitch, st.group_size, st.group_pitch, st.bits, st.q_offset, st.ggml_type,
                               st.experts, st.expert_pitch);
}

// A launch record (schema Launch) from the codegen's.
flatbuffers::Offset<fb::Launch> createLaunch(flatbuffers::FlatBufferBuilder& b, const codegen::LaunchRecord& r) {
  std::vector<flatbuffers::Offset<fb::KernelArg>> args;
  for (const codegen::KernelArgDesc& a : r.args) {
    const auto plane = a.kind == fb::ArgKind::Weight ? createStrideTable(b, a.plane) : 0;
    args.push_back(fb::CreateKernelArg(b, a.kind, b.CreateString(a.name), a.buffer, a.access, a.width, a.tensor, plane,
                                       a.layer, a.bytes, a.value, a.view_offset, a.view_width));
  }
  auto grid = [](const kern::GridExtent (&g)[3]) {
    auto e = [](const kern::GridExtent& x) { return fb::GridExtent(x.per_token, x.constant, x.divisor); };
    return fb::Grid(e(g[0]), e(g[1]), e(g[2]));
  };
  const fb::Grid g = grid(r.rule.grid), g_large = grid(r.rule.grid_large);
  const fb::Dim3 block(r.rule.block.x, r.rule.block.y, r.rule.block.z);
  return fb::CreateLaunch(b, b.CreateVector(r.images), b.CreateVector(args), &g, &g_large, r.rule.large_from, &block,
                          r.rule.smem, r.overlap, r.min_rows, r.max_rows);
}

flatbuffers::Offset<fb::Tokenizer> createTokenizer(flatbuffers::FlatBufferBuilder& b, const model::TokenizerDesc& t) {
  std::vector<flatbuffers::Offset<flatbuffers::String>> tokens, merges;
  tokens.reserve(t.tokens.size());
  for (std::string_view s : t.tokens) tokens.push_back(b.CreateString(s.data(), s.size()));
  merges.reserve(t.merges.size());
  for (std::string_view s : t.merges) merges.push_back(b.CreateString(s.data(), s.size()));
  return fb::CreateTokenizer(b, t.model, b.CreateString(t.model_name), b.CreateString(t.pre), b.CreateVector(tokens),
                             b.CreateVector(t.scores), b.CreateVector(t.token_types), b.CreateVector(merges), t.bos_id,
                             t.eos_id, t.unk_id, t.pad_id, t.add_bos, t.add_eos, t.add_space_prefix,
                             b.CreateString(t.chat_template), t.eot_id, t.eom_id);
}

// A plan: its steps with their launch records; steps from tail_begin on form the last-token tail.
// fused[i] != 0: step i is fused into step i − 1's launches (empty when there are no kernels).
// paged[i]: step i's paged launches (1.6; prefill and decode plans, else empty). small[i], small_rows[i]: its
// small-batch launches and the largest call they serve (1.7; prefill plan, else empty).
flatbuffers::Offset<fb::Plan> createPlan(flatbuffers::FlatBufferBuilder& b, const std::vector<model::StepDesc>& steps,
                                         const std::vector<std::vector<codegen::LaunchRecord>>& launches,
                                         const std::vector<uint8_t>& fused, size_t tail_begin,
                                         const std::vector<std::vector<codegen::LaunchRecord>>& paged = {},
                                         const std::vector<std::vector<codegen::LaunchRecord>>& small = {},
                                         const std::vector<uint32_t>& small_rows = {}) {
  std::vector<flatbuffers::Offset<fb::Step>> out;
  auto views = [&](const std::vector<model::ColumnView>& v) -> flatbuffers::Offset<flatbuffers::Vector<const fb::ColumnView*>> {
    if (v.empty()) return 0;  // whole buffers (1.3 and older read the same)
    std::vector<fb::ColumnView> cv;
    for (const model::ColumnView& c : v) cv.emplace_back(c.offset, c.width);
    return b.CreateVectorOfStructs(cv);
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const model::StepDesc& s = steps[i];
    std::vector<flatbuffers::Offset<fb::Launch>> records;
    if (i < launches.size())
      for (const codegen::LaunchRecord& r : launches[i]) records.push_back(createLaunch(b, r));
    std::vector<flatbuffers::Offset<fb::Launch>> paged_records;
    if (i < paged.size())
      for (const codegen::LaunchRecord& r : paged[i]) paged_records.push_back(createLaunch(b, r));
    std::vector<flatbuffers::Offset<fb::Launch>> small_records;
    if (i < small.size())
      for (const codegen::LaunchRecord& r : small[i]) small_records.push_back(createLaunch(b, r));
    const uint32_t rows = small_records.empty() || i >= small_rows.size() ? 0 : small_rows[i];
    out.push_back(fb::CreateStep(b, s.op, b.CreateVector(s.inputs), b.CreateVector(s.outputs),
                                 b.CreateVector(s.weights), s.layer, s.eps, s.n_head, s.n_head_kv, s.head_dim, s.n_rot,
                                 s.rope_style, s.rope_freq_base, s.rope_freq_scale, s.rows, s.cols,
                                 b.CreateString(s.name), b.CreateVector(records), i >= tail_begin, s.scale, s.softcap,
                                 s.window, s.rope_ext_factor, s.rope_attn_factor, s.rope_beta_fast, s.rope_beta_slow,
                                 s.rope_n_ctx_orig, i < fused.size() && fused[i] != 0, views(s.input_views),
                                 views(s.output_views), s.n_expert, s.n_expert_used, s.moe_norm, s.kv_ring,
                                 b.CreateVector(paged_records), b.CreateVector(small_records), rows));
  }
  return fb::CreatePlan(b, b.CreateVector(out));
}

// Builds the manifest from the description, the planned tensors and the writer's current segments
// (placeholders before layout, final values after the data is written: same size either way).
std::vector<uint8_t> buildManifest(const model::ModelDescription& desc, const std::vector<TensorPlanes>& tensors,
                                   const Kernels& kernels, const artifact::ArtifactWriter& writer,
                                   const SourceFacts& source, const CompileOptions& options) {
  flatbuffers::FlatBufferBuilder b(1 << 20);
  b.ForceDefaults(true);  // every field present: sizes never depend on values
  const model::ModelConfig& c = desc.config;

  auto config = fb::CreateModelConfig(
      b, b.CreateString(c.architecture), b.CreateString(c.name), c.n_embd, c.n_layer, c.n_head, c.n_head_kv,
      c.head_dim, c.n_ff, c.n_vocab, c.n_ctx_train, c.n_rot, c.rope_style, c.rope_freq_base, c.rope_freq_scale,
      c.rope_scaling, c.rms_norm_eps, c.tied_embeddings, c.n_ctx_max);

  const flatbuffers::Offset<fb::Tokenizer> tokenizer = desc.tokenizer.present ? createTokenizer(b, desc.tokenizer) : 0;

  std::vector<flatbuffers::Offset<fb::Tensor>> tensor_offsets;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorPlanes& tp = tensors[i];
    const gguf::TensorInfo& info = *desc.weights[i].info;
    std::vector<flatbuffers::Offset<fb::Plane>> plane_offsets;
    for (size_t p = 0; p < tp.layout.planes.size(); ++p) {
      auto table = createStrideTable(b, tp.layout.planes[p]);
      const bool derived = tp.segments[p] == kDerived;
      const fb::Segment seg = derived ? fb::Segment(0, 0, 0) : writer.segment(tp.segments[p]);
      plane_offsets.push_back(fb::CreatePlane(b, table, &seg, derived));
    }
    std::vector<uint64_t> ne(info.ne, info.ne + info.n_dims);
    tensor_offsets.push_back(fb::CreateTensor(b, b.CreateString(desc.weights[i].name),
                                              static_cast<uint32_t>(info.type), b.CreateVector(ne),
                                              b.CreateVector(plane_offsets)));
  }

  auto prefill = createPlan(b, desc.plan.prefill, kernels.set.prefill, kernels.set.prefill_fused,
                            codegen::lastTokenTailBegin(desc.plan.prefill, desc.plan.logits), kernels.set.prefill_paged,
                            kernels.set.prefill_small, kernels.set.prefill_small_rows);
  auto decode = createPlan(b, desc.plan.decode, kernels.set.decode, kernels.set.decode_fused, desc.plan.decode.size(),
                           kernels.set.decode_paged);
  auto load = createPlan(b, desc.plan.load, kernels.set.load, {}, desc.plan.load.size());

  std::vector<flatbuffers::Offset<fb::KernelImage>> images;
  for (size_t i = 0; i < kernels.set.images.size(); ++i) {
    const codegen::KernelImageData& k = kernels.set.images[i];
    std::vector<flatbuffers::Offset<flatbuffers::String>> opts;
    for (const std::string& o : k.options) opts.push_back(b.CreateString(o));
    const fb::Segment cubin = writer.segment(kernels.cubin[i]), ptx = writer.segment(kernels.ptx[i]);
    images.push_back(fb::CreateKernelImage(b, b.CreateString(k.key), b.CreateString(k.entry), b.CreateString(k.arch),
                                           &cubin, &ptx, b.CreateString(k.nvrtc_version), b.CreateVector(opts)));
  }

  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  for (const model::BufferDesc& buf : desc.plan.buffers)
    buffers.push_back(fb::CreateBuffer(b, b.CreateString(buf.name), buf.width, buf.type));
  auto memory = fb::CreateMemoryPlan(b, desc.plan.max_batch, b.CreateVector(buffers), desc.plan.input_ids,
                                     desc.plan.logits, desc.plan.kv_bytes_per_token,
                                     desc.plan.kv_ring_bytes_per_token, desc.plan.kv_ring_bytes);

  auto source_info =
      fb::CreateSourceInfo(b, b.CreateString(source.name), source.size, b.CreateString(source.sha256));
  std::vector<flatbuffers::Offset<flatbuffers::String>> archs;
  for (const std::string& a : options.targets) archs.push_back(b.CreateString(a));
  const fb::Segment manifest_check(0, 0, 0);

  flatbuffers::Offset<fb::Launch> argmax, topk;
  if (!kernels.set.images.empty()) {
    argmax = createLaunch(b, kernels.set.argmax);
    topk = createLaunch(b, kernels.set.topk);
  }
  auto root = fb::CreateArtifact(b, kArtifactFormatMajor, kArtifactFormatMinor, b.CreateString(kProducer),
                                 b.CreateString(kProducerVersion), source_info, config, tokenizer,
                                 b.CreateVector(tensor_offsets), b.CreateVector(images), prefill, decode, memory,
                                 b.CreateVector(archs), &manifest_check, argmax, load, topk);
  fb::FinishSizePrefixedArtifactBuffer(b, root);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

}  // namespace

bool usesHopperPrefill(const std::vector<std::string>& targets) { return codegen::sm90aTargetsOnly(targets); }

llvm::Expected<CompileSummary> compileModel(const CompileOptions& options) {
  auto file = gguf::GgufFile::open(options.input);
  if (!file) return file.takeError();
  const gguf::GgufFile& gguf = **file;

  // The source's SHA-256 is computed beside the transforms (it is one more pass over the file).
  // Until it is known, a placeholder of the same length stands in (the manifest size must not change).
  SourceFacts source{llvm::sys::path::filename(options.input).str(), gguf.fileSize(), std::string(64, '0')};
  std::string sha256;
  // Started with the interrupt signals blocked, which it keeps: they go to this thread, which blocks
  // them while it creates and registers the temporary output file (ArtifactWriter::create). A signal
  // taken by the hasher in that window would leave the file behind.
  std::thread hasher = [&] {
    const artifact::TempFileSignalBlock block;
    return std::thread([&] { sha256 = sha256Hex(gguf.bytes()); });
  }();
  struct JoinOnExit {
    std::thread& t;
    ~JoinOnExit() { if (t.joinable()) t.join(); }
  } join_hasher{hasher};

  auto desc = model::describeModel(gguf, options.max_batch, options.n_ctx);
  if (!desc) return desc.takeError();
  if (!options.swa_full) model::ringLocalKvCaches(desc->plan);

  auto writer = artifact::ArtifactWriter::create(options.output);
  if (!writer) return writer.takeError();

  CompileSummary summary;
  std::vector<TensorPlanes> tensors;
  tensors.reserve(desc->weights.size());
  for (const model::WeightDesc& w : desc->weights) {
    planes::TensorDesc td{w.name, w.info->type, w.info->rows(), w.info->cols(), w.role, w.experts};
    auto layout = planes::planLayout(td, options.plane_form, usesHopperPrefill(options.targets));
    if (!layout) return layout.takeError();
    TensorPlanes tp{std::move(*layout), {}};
    for (size_t p = 0; p < tp.layout.planes.size(); ++p)
      tp.segments.push_back(tp.layout.derived[p] ? kDerived : (*writer)->reserveSegment(tp.layout.planes[p].bytes()));
    summary.planes += tp.layout.planes.size();
    summary.plane_bytes += tp.layout.storedBytes();
    summary.derived_bytes += tp.layout.planeBytes() - tp.layout.storedBytes();
    summary.source_bytes += tp.layout.source_bytes;
    tensors.push_back(std::move(tp));
  }
  summary.tensors = tensors.size();
  std::vector<planes::TensorLayout> layouts;
  for (const TensorPlanes& tp : tensors) layouts.push_back(tp.layout);
  codegen::buildLoadPlan(*desc, layouts);  // derived planes: expanded at load

  // GPU kernels: quantize activations before quantized matmuls, then one NVRTC image per
  // specialization and target arch (compiled before any data is written: their sizes go in the layout).
  Kernels kernels;
  if (!options.targets.empty()) {
    if (auto err = codegen::insertActivationQuantization(*desc, layouts)) return err;
    codegen::CodegenOptions co;
    co.targets = options.targets;
    co.jobs = options.jobs;
    co.cache_dir = options.kernel_cache_dir;
    co.fuse_launches = options.fuse_launches;
    co.fuse_qkv = options.fuse_qkv;
    co.fuse_glu = options.fuse_glu;
    co.fuse_pair = options.fuse_pair;
    co.fuse_norm = options.fuse_norm;
    co.fuse_prefill_pair = options.fuse_prefill_pair;
    co.mmqb_wgmma = options.mmqb_wgmma;
    co.mmqb_f16act = options.mmqb_f16act;
    co.wgmma_split = options.wgmma_split;
    co.wgmma_split_fused = options.wgmma_split_fused;
    co.wgmma_split_min_stages = options.wgmma_split_min_stages;
    auto set = codegen::generateKernels(*desc, layouts, co);
    if (!set) return set.takeError();
    kernels.set = std::move(*set);
    for (const codegen::KernelImageData& k : kernels.set.images) {
      kernels.cubin.push_back((*writer)->reserveSegment(k.cubin.size()));
      kernels.ptx.push_back((*writer)->reserveSegment(k.ptx.size() + 1));
      summary.kernel_bytes += k.cubin.size() + k.ptx.size() + 1;
    }
    summary.kernel_images = kernels.set.images.size();
    summary.kernel_specs = kernels.set.stats.unique_specs;
    summary.kernel_cache_hits = kernels.set.stats.cache_hits;
    summary.kernel_seconds = kernels.set.stats.seconds;
  }
  summary.steps = desc->plan.prefill.size();

  // Manifest size first (placeholder segments), then the data, then the final manifest.
  const size_t manifest_size = buildManifest(*desc, tensors, kernels, **writer, source, options).size();
  if (auto err = (*writer)->layout(manifest_size)) return err;

  planes::PlaneWorkers workers(options.jobs);
  uint64_t bytes_done = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorPlanes& tp = tensors[i];
    std::vector<std::vector<uint8_t>> stored(tp.layout.planes.size());  // derived planes stay empty
    std::vector<llvm::MutableArrayRef<uint8_t>> views;
    for (size_t p = 0; p < stored.size(); ++p) {
      if (!tp.layout.derived[p]) stored[p].resize(tp.layout.planes[p].bytes());
      views.emplace_back(stored[p]);
    }
    if (auto err = planes::transformTensor(tp.layout, gguf.tensorData(*desc->weights[i].info), views, workers))
      return err;
    for (size_t p = 0; p < tp.segments.size(); ++p)
      if (tp.segments[p] != kDerived)
        if (auto err = (*writer)->writeSegment(tp.segments[p], stored[p])) return err;
    bytes_done += tp.layout.source_bytes;
    if (options.progress) options.progress(i + 1, tensors.size(), bytes_done, summary.source_bytes);
  }

  for (size_t i = 0; i < kernels.set.images.size(); ++i) {
    const codegen::KernelImageData& k = kernels.set.images[i];
    if (auto err = (*writer)->writeSegment(kernels.cubin[i], k.cubin)) return err;
    std::vector<uint8_t> ptx(k.ptx.begin(), k.ptx.end());
    ptx.push_back(0);
    if (auto err = (*writer)->writeSegment(kernels.ptx[i], ptx)) return err;
  }

  hasher.join();
  if (sha256.size() != 64)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "SHA-256 of " + options.input + " failed (OpenSSL)");
  source.sha256 = sha256;
  const std::vector<uint8_t> manifest = buildManifest(*desc, tensors, kernels, **writer, source, options);
  if (manifest.size() != manifest_size)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   llvm::formatv("internal error: manifest size changed from {0} to {1} bytes",
                                                 manifest_size, manifest.size())
                                       .str());
  if (auto err = (*writer)->commit(manifest)) return err;
  summary.artifact_bytes = (*writer)->fileSize();
  return summary;
}

}  // namespace minfer
