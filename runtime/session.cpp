// Session: positions, batching, logits and the generate loop over one backend session.
#include <algorithm>
#include <chrono>
#include <vector>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "runtime/backend.h"

namespace minfer {

const char* stopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kEndOfGeneration: return "end of generation";
    case StopReason::kMaxTokens: return "token limit";
    case StopReason::kContextFull: return "context full";
    case StopReason::kCallback: return "stopped by caller";
  }
  return "unknown";
}

Session::Session(const Model& model, std::unique_ptr<BackendSession> backend, int n_ctx)
    : model_(model), backend_(std::move(backend)), n_ctx_(n_ctx),
      logits_(static_cast<size_t>(model.info().n_vocab)), tokens_(static_cast<size_t>(n_ctx)) {}

Session::~Session() = default;

uint64_t Session::allocatedBytes() const {
  return backend_->allocatedBytes() + logits_.size() * sizeof(float) + tokens_.size() * sizeof(int32_t);
}

uint64_t Session::kvCacheBytes() const { return backend_->kvCacheBytes(); }

std::span<const float> Session::logits() const {
  if (!has_logits_ || logits_on_device_) return {};  // row_ is an older row then
  return row_;
}

Status Session::rewind(int pos) {
  if (pos < 0 || pos > pos_)
    return Status::error("rewind to position " + std::to_string(pos) + ": must be in 0.." + std::to_string(pos_));
  has_logits_ = false;
  if (backend_->canResumeAt(pos)) {
    pos_ = pos;
    return Status::ok();
  }
  // The rings lost the window before pos: evaluate 0 .. pos−1 again (a copy: evaluate() rewrites tokens_).
  const std::vector<int32_t> again(tokens_.begin(), tokens_.begin() + pos);
  pos_ = 0;
  Status st = evaluate(again, {});
  has_logits_ = false;
  return st;
}

Status Session::evaluate(std::span<const int32_t> tokens, std::span<float> all_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int n_vocab = model_.info().n_vocab;
  if (n == 0) return Status::error("no tokens to evaluate");
  if (pos_ + n > n_ctx_)
    return Status::error(std::to_string(n) + " tokens at position " + std::to_string(pos_) +
                         " do not fit the context: " + std::to_string(pos_) + " + " + std::to_string(n) +
                         " > n_ctx " + std::to_string(n_ctx_));
  if (!all_logits.empty() && all_logits.size() != static_cast<size_t>(n) * n_vocab)
    return Status::error("all_logits has " + std::to_string(all_logits.size()) + " floats, expected " +
                         std::to_string(n) + " x " + std::to_string(n_vocab));
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= n_vocab)
      return Status::error("token id " + std::to_string(tokens[t]) + " at index " + std::to_string(t) +
                           " is outside [0, " + std::to_string(n_vocab) + ")");
  const int batch = backend_->maxBatch();
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min<int64_t>(batch, n - done);
    const bool last = done + m == n;
    // Without all_logits, the last row stays where the backend session put it (no copy: forwardLast).
    Status st = Status::ok();
    if (!all_logits.empty()) {
      st = backend_->forward(tokens.subspan(done, m), pos_, all_logits.data() + done * n_vocab, true);
    } else {
      Result<std::span<const float>> row = backend_->forwardLast(tokens.subspan(done, m), pos_);
      if (row) row_ = *row;
      else st = row.takeStatus();
    }
    if (!st) {
      has_logits_ = false;
      return st;
    }
    std::copy(tokens.begin() + done, tokens.begin() + done + m, tokens_.begin() + pos_);
    pos_ += static_cast<int>(m);
    done += m;
    if (last && !all_logits.empty()) {
      std::copy(all_logits.end() - n_vocab, all_logits.end(), logits_.begin());
      row_ = logits_;
    }
  }
  has_logits_ = true;
  logits_on_device_ = false;
  return Status::ok();
}

Result<int32_t> Session::decodeSampled(int32_t token, Sampler& sampler, std::span<TokenLogit> top) {
  if (pos_ + 1 > n_ctx_)
    return Status::error("1 token at position " + std::to_string(pos_) + " does not fit the context: n_ctx " +
                         std::to_string(n_ctx_));
  const std::span<const int32_t> one(&token, 1);
  int32_t next = 0;
  if (top.empty()) {
    Result<int32_t> id = backend_->forwardArgmax(one, pos_);
    if (!id) {
      has_logits_ = false;
      return id.takeStatus();
    }
    next = *id;
  } else {
    const std::span<const int32_t> penalized = sampler.penalizedTokens();
    const float penalty = penalized.empty() ? 1.0f : sampler.params().repeat_penalty;
    Status st = backend_->forwardTopK(one, pos_, penalty, penalized, top);
    if (!st) {
      has_logits_ = false;
      return st;
    }
    next = sampler.sampleTopK(top);
  }
  tokens_[static_cast<size_t>(pos_)] = token;
  ++pos_;
  has_logits_ = true;
  logits_on_device_ = true;
  return next;
}

Status Session::syncLogits() {
  MINFER_RETURN_IF_ERROR(backend_->lastLogits(logits_.data()));
  row_ = logits_;
  logits_on_device_ = false;
  return Status::ok();
}

Status Session::prefill(std::span<const int32_t> tokens, std::span<float> all_logits) {
  return evaluate(tokens, all_logits);
}

Status Session::decode(int32_t token) { return evaluate(std::span<const int32_t>(&token, 1), {}); }

Result<GenerateResult> Session::generate(std::string_view prompt, const GenerateParams& params,
                                         const StreamCallback& callback) {
  using Clock = std::chrono::steady_clock;
  if (!model_.hasTokenizer()) return Status::error(model_.artifact().path() + ": the artifact has no tokenizer");
  const Tokenizer& tok = model_.tokenizer();
  const int n_vocab = model_.info().n_vocab;
  GenerateResult result;

  std::vector<int32_t> ids = tok.encode(prompt, params.add_special && pos_ == 0, params.parse_special);
  if (ids.empty() && (pos_ == 0 || logits().empty()))
    return Status::error("the prompt is empty and there is nothing to continue from");
  if (pos_ + static_cast<int64_t>(ids.size()) > n_ctx_)
    return Status::error("prompt of " + std::to_string(ids.size()) + " tokens does not fit the context: position " +
                         std::to_string(pos_) + " + " + std::to_string(ids.size()) + " > n_ctx " +
                         std::to_string(n_ctx_));
  Sampler sampler(params.sampling, n_vocab);
  for (int32_t id : ids) sampler.accept(id);

  // Decode steps sample on the device when the backend can do what the sampler would (GenerateParams::
  // device_sampling): greedy without a penalty by the argmax; else top_k candidates (1 when greedy) from the
  // device top-k, whose penalty list (≤ repeat_last_n distinct tokens) must fit the request.
  const SamplerParams& sp = params.sampling;
  const DeviceSampling dev = params.device_sampling && !params.on_logits ? backend_->deviceSampling() : DeviceSampling{};
  const bool penalty = sp.repeat_penalty != 1.0f && sp.repeat_last_n > 0;
  const bool device_argmax = samplesArgmax(sp) && dev.argmax;
  int device_k = device_argmax ? 0 : sp.temperature <= 0.0f ? 1 : sp.top_k > 0 && sp.top_k < n_vocab ? sp.top_k : 0;
  if (device_k > dev.top_k_max || (penalty && (!(sp.repeat_penalty > 0.0f) || sp.repeat_last_n > dev.penalized_max)))
    device_k = 0;
  std::vector<TokenLogit> top(static_cast<size_t>(device_k));
  const bool on_device = device_argmax || device_k > 0;

  const Clock::time_point t0 = Clock::now();
  if (!ids.empty()) {
    std::vector<float> rows;
    if (params.on_logits) rows.resize(ids.size() * static_cast<size_t>(n_vocab));
    MINFER_RETURN_IF_ERROR(prefill(ids, rows));
    if (params.on_logits) params.on_logits(rows, static_cast<int>(ids.size()));
  }
  const Clock::time_point t1 = Clock::now();
  result.n_prompt = static_cast<int>(ids.size());
  result.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  Detokenizer detok(tok, params.render_special);
  result.stop = StopReason::kMaxTokens;
  int32_t sampled = -1;  // the token the device path sampled for this step (−1: sample the host's logits)
  for (int i = 0; params.n_predict < 0 || i < params.n_predict; ++i) {
    const int32_t next = sampled >= 0 ? sampled : sampler.sample(logits());
    sampler.accept(next);
    if (params.stop_at_eog && tok.isEndOfGeneration(next)) {
      result.stop = StopReason::kEndOfGeneration;
      break;
    }
    result.tokens.push_back(next);
    ++result.n_generated;
    if (!callback(detok.push(next), next)) {
      result.stop = StopReason::kCallback;
      break;
    }
    if (params.n_predict >= 0 && i + 1 == params.n_predict) break;  // no need to evaluate the last token
    if (pos_ >= n_ctx_) {
      result.stop = StopReason::kContextFull;
      break;
    }
    if (on_device) {
      Result<int32_t> r = decodeSampled(next, sampler, top);
      if (!r) return r.takeStatus();
      sampled = *r;
      continue;
    }
    MINFER_RETURN_IF_ERROR(decode(next));
    if (params.on_logits) params.on_logits(logits(), 1);
  }
  if (logits_on_device_) MINFER_RETURN_IF_ERROR(syncLogits());  // logits() as after host sampling
  const std::string tail = detok.flush();
  if (!tail.empty()) callback(tail, -1);
  result.generate_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return result;
}

}  // namespace minfer
