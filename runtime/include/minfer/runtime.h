// The minfer runtime API: open an artifact, pick a backend, create sessions, tokenize, prefill,
// decode, sample and generate (DESIGN.md §1).
//
// Phases (STYLE.md "explicit phases"): Model::open maps the artifact and verifies it (structure, then
// meaning; nothing reads the mapping before both pass), then creates the backend, which resolves the
// weights and checks the execution plan (plan). Model::createSession allocates everything a session
// will ever need: activation buffers for the artifact's max batch, the KV cache for n_ctx positions,
// scratch, worker threads (allocate). prefill/decode execute the plan and allocate nothing.
//
// Units: token ids are int32 in [0, n_vocab); positions count tokens from 0; logits are float32
// rows of n_vocab values, row-major. Errors are returned as Status/Result (minfer/status.h) with
// messages naming the file, the field and the numbers; nothing here prints or exits.
//
// Thread-safety: a Model is immutable after open(); its const methods (tokenize, createSession, …)
// may be called from any number of threads at once. A Session is NOT thread-safe: use one thread at
// a time per session (different sessions of one model may run concurrently; each has its own
// buffers, KV cache and worker threads). A Session must not outlive its Model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "minfer/batch.h"
#include "minfer/sampler.h"
#include "minfer/status.h"
#include "minfer/tokenizer.h"

namespace minfer {

class ArtifactFile;
class Backend;
class BackendSession;

enum class BackendKind { kAuto, kCpu, kCuda };

// "auto", "cpu", "cuda" ↔ BackendKind. parseBackendKind errors name the accepted values.
const char* backendKindName(BackendKind kind);
Result<BackendKind> parseBackendKind(std::string_view name);

struct ModelOptions {
  // Check every data segment's XXH64 against the manifest before the first forward (the manifest's
  // own checksum is always checked). The CUDA backend hashes each plane while staging its upload and
  // each kernel image before loading it (no second read); the CPU backend hashes all segments once
  // in parallel at open (ArtifactFile::verifySegments). A mismatch fails open() naming the segment,
  // its tensor or kernel and both hashes. false (--no-verify) skips the data segments.
  bool verify_checksums = true;
};

// Facts about the opened model (from the artifact's config and memory plan).
struct ModelInfo {
  std::string architecture;  // "llama", "qwen2", "qwen3"
  std::string name;          // general.name of the source GGUF ("" when absent)
  std::string source;        // source GGUF file name
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ctx_train = 0;       // context length the model was trained with (0 when unknown)
  int n_ctx_max = 0;         // largest session context the artifact was compiled for (minfer-compile -c; 0: any)
  int max_batch = 0;         // tokens per forward pass (longer prompts are split)
  uint64_t file_bytes = 0;
};

class Session;

class Model {
 public:
  // Maps and verifies `path`, builds the tokenizer (when the artifact has one) and creates the
  // backend. kAuto picks CUDA when this build has a CUDA backend and a usable GPU exists, else the
  // CPU; backendNote() says which and why. kCuda fails when this build has no CUDA backend or no
  // usable GPU (the message says which). Errors: everything ArtifactFile::open reports, a checksum
  // mismatch (unless verify_checksums is false), an invalid tokenizer, a plan the backend cannot run.
  static Result<std::unique_ptr<Model>> open(const std::string& path, BackendKind kind = BackendKind::kAuto,
                                             const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const { return info_; }
  const char* backendName() const;                          // "cpu" / "cuda"
  const std::string& backendNote() const { return note_; }  // e.g. "auto: CUDA backend not available in this build; using cpu"
  const ArtifactFile& artifact() const { return *file_; }

  bool hasTokenizer() const { return tokenizer_ != nullptr; }
  // The artifact's tokenizer. Requires hasTokenizer().
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Token ids of `text`. add_special: BOS/EOS as the vocabulary says; parse_special: control-token
  // texts in `text` become those tokens. Error when the artifact has no tokenizer.
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_special = true,
                                        bool parse_special = false) const;
  // Text of `ids` (Tokenizer::decode). Error when the artifact has no tokenizer.
  Result<std::string> detokenize(std::span<const int32_t> ids) const;
  // True for EOS and the other end-of-generation tokens (false without a tokenizer).
  bool isEndOfGeneration(int32_t id) const;

  struct SessionOptions {
    int n_ctx = 2048;    // KV cache positions; 1 ≤ n_ctx ≤ kMaxContext (may exceed n_ctx_train, like llama.cpp)
    int n_threads = 0;   // CPU threads; 0 = the physical cores available (llama.cpp's default)
  };
  static constexpr int kMaxContext = 1 << 20;
  // Allocates a session (activations, KV cache, scratch). Errors: n_ctx out of range or above
  // info().n_ctx_max (the context the artifact was compiled for), not enough memory (the message has the
  // byte counts).
  Result<std::unique_ptr<Session>> createSession(const SessionOptions& options) const;
  // Allocates a session of many sequences over one paged KV cache (minfer/batch.h). Errors: an option
  // out of range (the message names it and the bounds), not enough memory (with the byte counts).
  Result<std::unique_ptr<BatchSession>> createBatchSession(const BatchOptions& options) const;

 private:
  Model() = default;
  std::unique_ptr<ArtifactFile> file_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelInfo info_;
  std::string note_;
};

// Why generate() stopped.
enum class StopReason { kEndOfGeneration, kMaxTokens, kContextFull, kCallback };
const char* stopReasonName(StopReason reason);

struct GenerateParams {
  int n_predict = 128;          // tokens to generate; < 0: until end of generation or a full context
  SamplerParams sampling;
  bool add_special = true;      // BOS/EOS around the prompt as the vocabulary says (only at position 0)
  bool parse_special = false;   // control-token texts in the prompt become those tokens
  bool stop_at_eog = true;      // stop (without emitting it) at an end-of-generation token
  bool render_special = false;  // print control tokens' text
  // Optional: receives the logits the generation computes, in order: the prompt's rows (n_prompt ×
  // n_vocab, one call), then one row per decode step (the logits after each generated token that was
  // fed back). Row r predicts the token after the r-th token of prompt + generated.
  std::function<void(std::span<const float> logits, int n_rows)> on_logits;
  // Sample each decode step's token on the device where the backend can (the CUDA backend with the
  // artifact's kernels; never with on_logits): greedy (temperature ≤ 0) by the device argmax (with a
  // repetition penalty: top-k of 1), 0 < top_k < n_vocab (top_k ≤ 256) by the device top-k and the
  // sampler's later steps on the host; the same tokens as host sampling for the same seed. Otherwise, and
  // with false, every step copies the logits row back and samples on the host.
  bool device_sampling = true;
};

struct GenerateResult {
  int n_prompt = 0;          // prompt tokens evaluated
  int n_generated = 0;       // tokens sampled and passed to the callback
  double prompt_seconds = 0; // wall time of the prompt prefill
  double generate_seconds = 0;  // wall time of sampling + decode steps
  StopReason stop = StopReason::kMaxTokens;
  std::vector<int32_t> tokens;  // the generated ids, in order
};

// Receives each generated piece (valid UTF-8, possibly empty while a multi-byte character is
// incomplete) and its token id; a final call with token −1 carries bytes held back at the end.
// Return false to stop.
using StreamCallback = std::function<bool(std::string_view piece, int32_t token)>;

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Evaluates `tokens` at positions position() .. position()+n−1 (split into batches of
  // info().max_batch), then position() += n and logits() holds the row after the last token.
  // all_logits: empty, or n × n_vocab floats that receive every row (row t = logits after token t).
  // Errors (nothing is evaluated): n == 0; a token id outside [0, n_vocab); position() + n > n_ctx
  // ("… does not fit the context"); all_logits of the wrong size.
  Status prefill(std::span<const int32_t> tokens, std::span<float> all_logits = {});
  // One token at position(); the decode plan. Errors as prefill.
  Status decode(int32_t token);

  // Logits after the last evaluated token (n_vocab floats). Empty before the first evaluation, after a
  // failed one, after rewind()/reset(), and while that row lives on the device only: inside generate()'s
  // callback once a decode step sampled on the device (GenerateParams::device_sampling; the row is copied
  // back when generate() returns). The span may point into the backend session's own memory
  // (BackendSession::forwardLast): valid until the next call on this session that evaluates tokens, rewinds or
  // resets; copy the row to keep it.
  std::span<const float> logits() const;

  int position() const { return pos_; }   // tokens in the KV cache
  int contextLength() const { return n_ctx_; }
  // Forgets the KV cache from position `pos` on (0 ≤ pos ≤ position()); reset() = rewind(0). When the
  // sliding-window layers' ring caches (schema Step.kv_ring) no longer hold the window before `pos` (a
  // rewind by more than info().max_batch positions), the tokens 0 .. pos−1 are evaluated again (as
  // llama.cpp re-processes the prompt when its SWA cache lacks them); errors are those of prefill().
  Status rewind(int pos);
  void reset() { pos_ = 0; has_logits_ = false; }

  // Tokenizes `prompt` (BOS only when position() == 0 and params.add_special), evaluates it, then
  // samples up to n_predict tokens, streaming each piece through `callback` (see StreamCallback),
  // feeding each one back with decode() before sampling the next (decode steps may sample on the device:
  // GenerateParams::device_sampling; logits() is then empty inside the callback, and ends as the row after
  // the last evaluated token once generate() returns, as with host sampling).
  // Stops at an end-of-generation
  // token, after n_predict tokens, when the context is full, or when the callback returns false.
  // An empty prompt continues from the current logits (error at position 0).
  // Errors: no tokenizer; the prompt does not fit the context ("prompt of N tokens does not fit the
  // context: position P + N > n_ctx C"); any prefill/decode error.
  Result<GenerateResult> generate(std::string_view prompt, const GenerateParams& params,
                                  const StreamCallback& callback);

  const Model& model() const { return model_; }
  uint64_t allocatedBytes() const;
  // Bytes of the KV cache, included in allocatedBytes(): every layer's K and V for n_ctx positions, a
  // sliding-window layer's ring for min(n_ctx, window + max_batch − 1) (schema Step.kv_ring).
  uint64_t kvCacheBytes() const;

 private:
  friend class Model;
  Session(const Model& model, std::unique_ptr<BackendSession> backend, int n_ctx);
  Status evaluate(std::span<const int32_t> tokens, std::span<float> all_logits);
  // decode(token) with the next token sampled on the device (Session::generate's device path): the argmax
  // when `top` is empty, else the top.size() candidates of the device top-k, finished by sampler.sampleTopK.
  // logits() is empty afterwards (logits_on_device_: row_ shows an older row) until syncLogits().
  Result<int32_t> decodeSampled(int32_t token, Sampler& sampler, std::span<TokenLogit> top);
  Status syncLogits();

  const Model& model_;
  std::unique_ptr<BackendSession> backend_;
  int n_ctx_ = 0;
  int pos_ = 0;
  bool has_logits_ = false;
  bool logits_on_device_ = false;  // the latest row was sampled on the device: row_ is older
  std::vector<float> logits_;  // (n_vocab)
  // What logits() shows while has_logits_: logits_, or the backend session's own row (BackendSession::forwardLast,
  // valid until its next call).
  std::span<const float> row_;
  std::vector<int32_t> tokens_;  // (n_ctx) the token at each position < pos_, for rewind()'s re-evaluation
};

}  // namespace minfer
