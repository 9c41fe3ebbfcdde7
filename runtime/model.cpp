// Model: maps and verifies an artifact, builds its tokenizer and backend, and creates sessions.
#include <algorithm>
#include <cstdlib>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "runtime/backend.h"
#include "runtime/batch_session.h"
#if MINFER_HAVE_CUDA_BACKEND
#include "runtime/cuda/cuda_backend.h"
#endif

namespace minfer {
namespace {

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

// The artifact's tokenizer table as the tokenizer's plain-data Vocabulary.
Vocabulary vocabularyFrom(const fb::Tokenizer& t) {
  Vocabulary v;
  v.model = str(t.model_name());
  if (v.model.empty()) v.model = t.model() == fb::TokenizerModel::Bpe ? "gpt2" : "llama";
  v.pre = str(t.pre());
  if (t.tokens()) {
    v.tokens.reserve(t.tokens()->size());
    for (const flatbuffers::String* s : *t.tokens()) v.tokens.push_back(s->str());
  }
  if (t.scores()) v.scores.assign(t.scores()->begin(), t.scores()->end());
  if (t.token_types()) v.token_types.assign(t.token_types()->begin(), t.token_types()->end());
  if (t.merges()) {
    v.merges.reserve(t.merges()->size());
    for (const flatbuffers::String* s : *t.merges()) v.merges.push_back(s->str());
  }
  v.bos_id = t.bos_id();
  v.eos_id = t.eos_id();
  v.unk_id = t.unk_id();
  v.pad_id = t.pad_id();
  v.eot_id = t.eot_id();  // format 1.2; -1 (the schema default) in 1.1 artifacts
  v.eom_id = t.eom_id();
  v.add_bos = t.add_bos();
  v.add_eos = t.add_eos();
  v.add_space_prefix = t.add_space_prefix();
  return v;
}

}  // namespace

const char* backendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "unknown";
}

Result<BackendKind> parseBackendKind(std::string_view name) {
  for (BackendKind k : {BackendKind::kAuto, BackendKind::kCpu, BackendKind::kCuda})
    if (name == backendKindName(k)) return k;
  return Status::error("unknown device '" + std::string(name) + "' (expected auto, cpu or cuda)");
}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::open(const std::string& path, BackendKind kind, const ModelOptions& options) {
  std::unique_ptr<Model> model(new Model());
  // Map + verify (structure, then meaning).
  Result<std::unique_ptr<ArtifactFile>> file = ArtifactFile::open(path);
  if (!file) return file.takeStatus();
  model->file_ = std::move(*file);
  const fb::Artifact* m = model->file_->manifest();

  // Model facts.
  const fb::ModelConfig* c = m->config();
  ModelInfo& info = model->info_;
  info.architecture = str(c->architecture());
  info.name = str(c->name());
  info.source = m->source() ? str(m->source()->name()) : std::string();
  info.n_vocab = static_cast<int>(c->n_vocab());
  info.n_embd = static_cast<int>(c->n_embd());
  info.n_layer = static_cast<int>(c->n_layer());
  info.n_head = static_cast<int>(c->n_head());
  info.n_head_kv = static_cast<int>(c->n_head_kv());
  info.head_dim = static_cast<int>(c->head_dim());
  info.n_ctx_train = static_cast<int>(std::min<uint32_t>(c->n_ctx_train(), INT32_MAX));
  info.n_ctx_max = static_cast<int>(std::min<uint32_t>(c->n_ctx_max(), INT32_MAX));  // 1.4; 0 in older artifacts
  info.max_batch = m->memory() ? static_cast<int>(m->memory()->max_batch()) : 0;
  info.file_bytes = model->file_->fileSize();

  // Tokenizer.
  if (m->tokenizer() && m->tokenizer()->tokens() && m->tokenizer()->tokens()->size() > 0) {
    Result<Tokenizer> tok = Tokenizer::create(vocabularyFrom(*m->tokenizer()));
    if (!tok) return tok.takeStatus().withContext(path + ": tokenizer: ");
    if (tok->nTokens() != info.n_vocab)
      return Status::error(path + ": tokenizer has " + std::to_string(tok->nTokens()) +
                           " tokens, config.n_vocab is " + std::to_string(info.n_vocab));
    model->tokenizer_ = std::make_unique<Tokenizer>(std::move(*tok));
  }

  // Backend.
#if MINFER_HAVE_CUDA_BACKEND
  // cuda: the GPU or a clear error; auto: the GPU when the driver, a GPU and a usable kernel image are
  // all present, else the CPU with a note saying why.
  if (kind == BackendKind::kCuda || kind == BackendKind::kAuto) {
    CudaBackendOptions cuda_options;
    cuda_options.verify_checksums = options.verify_checksums;  // hashed while staging the upload
    Result<std::unique_ptr<cuda::CudaBackend>> cb = cuda::CudaBackend::create(*model->file_, cuda_options);
    if (cb) {
      model->note_ = std::string(kind == BackendKind::kAuto ? "auto: " : "") + "cuda: " + (*cb)->note();
      model->backend_ = std::move(*cb);
      return model;
    }
    if (kind == BackendKind::kCuda) return cb.takeStatus().withContext(path + ": --device cuda: ");
    model->note_ = "auto: " + cb.status().message() + "; using cpu";
  }
#else
  if (kind == BackendKind::kCuda)
    return Status::error(path + ": CUDA backend not available in this build (use --device cpu or auto)");
  if (kind == BackendKind::kAuto) model->note_ = "auto: CUDA backend not available in this build; using cpu";
#endif
  // The CPU reads planes straight from the mapping (no upload pass to hash in): one parallel pass
  // over every segment before the plan phase. (After a CUDA attempt that failed on a mismatch, this
  // reports the same segment.)
  if (options.verify_checksums) MINFER_RETURN_IF_ERROR(model->file_->verifySegments());
  Result<std::unique_ptr<Backend>> backend = createCpuBackend(*model->file_);
  if (!backend) return backend.takeStatus();
  model->backend_ = std::move(*backend);
  return model;
}

const char* Model::backendName() const { return backend_->name(); }

Result<std::vector<int32_t>> Model::tokenize(std::string_view text, bool add_special, bool parse_special) const {
  if (!tokenizer_) return Status::error(file_->path() + ": the artifact has no tokenizer");
  return tokenizer_->encode(text, add_special, parse_special);
}

Result<std::string> Model::detokenize(std::span<const int32_t> ids) const {
  if (!tokenizer_) return Status::error(file_->path() + ": the artifact has no tokenizer");
  return tokenizer_->decode(ids);
}

bool Model::isEndOfGeneration(int32_t id) const { return tokenizer_ && tokenizer_->isEndOfGeneration(id); }

Result<std::unique_ptr<Session>> Model::createSession(const SessionOptions& options) const {
  if (options.n_ctx < 1 || options.n_ctx > kMaxContext)
    return Status::error(file_->path() + ": context length n_ctx = " + std::to_string(options.n_ctx) +
                         " is out of range 1.." + std::to_string(kMaxContext));
  if (info_.n_ctx_max > 0 && options.n_ctx > info_.n_ctx_max)
    return Status::error(file_->path() + ": context length n_ctx = " + std::to_string(options.n_ctx) +
                         " is larger than the " + std::to_string(info_.n_ctx_max) +
                         " the artifact was compiled for (config.n_ctx_max; recompile with a larger -c)");
  if (options.n_threads < 0)
    return Status::error("n_threads = " + std::to_string(options.n_threads) + " must be ≥ 0 (0: the physical cores)");
  Result<std::unique_ptr<BackendSession>> bs =
      backend_->createSession(BackendSessionConfig{options.n_ctx, options.n_threads});
  if (!bs) return bs.takeStatus();
  return std::unique_ptr<Session>(new Session(*this, std::move(*bs), options.n_ctx));
}

namespace {

// "name = value is out of range lo..hi"
Status outOfRange(const std::string& path, const char* name, int64_t value, int64_t lo, int64_t hi,
                  const std::string& why = "") {
  return Status::error(path + ": BatchOptions::" + name + " = " + std::to_string(value) + " is out of range " +
                       std::to_string(lo) + ".." + std::to_string(hi) + why);
}

}  // namespace

Result<std::unique_ptr<BatchSession>> Model::createBatchSession(const BatchOptions& options) const {
  const std::string& path = file_->path();
  const int ctx_max = info_.n_ctx_max > 0 ? std::min(info_.n_ctx_max, kMaxContext) : kMaxContext;
  if (options.n_ctx < 1 || options.n_ctx > ctx_max)
    return outOfRange(path, "n_ctx", options.n_ctx, 1, ctx_max,
                      info_.n_ctx_max > 0 ? " (config.n_ctx_max: the context the artifact was compiled for)" : "");
  if (options.n_seq_max < 1 || options.n_seq_max > 4096) return outOfRange(path, "n_seq_max", options.n_seq_max, 1, 4096);
  const int bs = options.block_size;
  if (bs < 1 || bs > 1024 || (bs & (bs - 1)) != 0)
    return outOfRange(path, "block_size", bs, 1, 1024, " or not a power of two");
  const int64_t per_seq = (int64_t{options.n_ctx} + bs - 1) / bs;
  const int64_t most = std::min<int64_t>(int64_t{options.n_seq_max} * per_seq, (int64_t{1} << 30) / bs);
  if (options.n_blocks < 0 || options.n_blocks > most)
    return outOfRange(path, "n_blocks", options.n_blocks, 0, most,
                      " (at most n_seq_max x ceil(n_ctx / block_size), and 2^30 positions in all; 0: that product)");
  const int64_t n_blocks = options.n_blocks > 0 ? options.n_blocks : int64_t{options.n_seq_max} * per_seq;
  if (n_blocks * bs > (int64_t{1} << 30))
    return Status::error(path + ": a KV pool of n_seq_max " + std::to_string(options.n_seq_max) + " x " +
                         std::to_string(per_seq) + " blocks of " + std::to_string(bs) +
                         " positions exceeds 2^30 positions; set BatchOptions::n_blocks lower");
  if (options.n_threads < 0)
    return Status::error(path + ": BatchOptions::n_threads = " + std::to_string(options.n_threads) +
                         " must be ≥ 0 (0: the physical cores)");
  const BatchConfig config{.n_ctx = options.n_ctx,
                           .n_seq_max = options.n_seq_max,
                           .n_blocks = static_cast<int>(n_blocks),
                           .block_size = bs,
                           .n_threads = options.n_threads,
                           .max_tokens = info_.max_batch,
                           .n_vocab = info_.n_vocab};
  if (!options.sequential) {
    Result<std::unique_ptr<BatchSession>> batched = backend_->createBatchSession(config);
    if (!batched) return batched.takeStatus();
    if (*batched) return std::move(*batched);
  }
  return createSequentialBatchSession(*backend_, config);
}

}  // namespace minfer
