// Scheduler: continuous batching over a BatchSession (minfer/scheduler.h has the policy).
#include "minfer/scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "runtime/cpu/thread_pool.h"
#include "runtime/serve/stop_matcher.h"

namespace minfer {

const char* finishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

namespace detail {
struct RequestState {
  uint64_t id = 0;
  std::atomic<bool> cancel{false};
  std::function<void()> wake;  // tells the scheduler that there is something to do
};
}  // namespace detail

uint64_t RequestHandle::id() const { return state_ ? state_->id : 0; }

void RequestHandle::cancel() const {
  if (!state_ || state_->cancel.exchange(true)) return;
  if (state_->wake) state_->wake();
}

struct Scheduler::Shared {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<std::unique_ptr<Running>> incoming;  // submitted, not yet seen by the driving thread
  uint64_t next_id = 1;
  int queued = 0;      // incoming + waiting (bounded by max_queue)
  bool poked = false;  // a cancel() since the driving thread last looked
  bool stopping = false;
  bool started = false;
  SchedulerMetrics metrics;
};

// One request on the driving thread.
struct Scheduler::Running {
  Running(RequestParams p, RequestCallback cb, const Tokenizer& tok, int n_vocab)
      : params(std::move(p)),
        callback(std::move(cb)),
        n_vocab(n_vocab),
        detok(tok, params.render_special),
        stop(params.stop) {}
  std::shared_ptr<detail::RequestState> state;
  RequestParams params;
  RequestCallback callback;
  std::vector<int32_t> tokens;  // prompt, then the generated tokens (the last one not yet evaluated)
  int n_cached = 0;             // positions of `tokens` held in the KV cache
  int n_generated = 0;
  int seq = -1;                 // open sequence, −1 while waiting
  bool preempted = false;       // truncated to 0; resumes when the pool covers all its tokens
  uint64_t preempted_at = 0;    // the packStep() it was preempted in (not resumed in that same one)
  bool done = false;
  int n_vocab = 0;
  // Made at admission, not at submission: it allocates ~13 bytes per vocabulary entry, and a full queue of
  // a 128k-vocabulary model would hold gigabytes of them.
  std::optional<Sampler> sampler;
  Detokenizer detok;
  serve::StopMatcher stop;
};

Scheduler::Scheduler(BatchSession& session, Tokenizer tokenizer, const SchedulerOptions& options)
    : session_(session),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      sampling_pool_(std::make_unique<cpu::ThreadPool>(std::clamp(options.sampling_threads, 1, kMaxSamplingThreads))),
      shared_(std::make_shared<Shared>()) {
  capacity_ = static_cast<int>(
      std::min<int64_t>(session_.contextLength(), int64_t{session_.totalBlocks()} * session_.blockSize()));
  shared_->metrics.kv_blocks_total = session_.totalBlocks();
  shared_->metrics.kv_blocks_used = session_.totalBlocks() - session_.freeBlocks();
}

Scheduler::~Scheduler() { stop(); }

Result<RequestHandle> Scheduler::submit(RequestParams params, RequestCallback callback, SubmitError* why) {
  SubmitError ignored;
  SubmitError& reason = why ? *why : ignored;
  reason = SubmitError::kInvalidRequest;
  const std::vector<int32_t>& prompt = params.prompt;
  if (prompt.empty()) return Status::error("prompt: empty (at least one token is needed)");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= options_.n_vocab)
      return Status::error("prompt[" + std::to_string(i) + "]: token id " + std::to_string(prompt[i]) +
                           " outside [0, " + std::to_string(options_.n_vocab) + ")");
  if (prompt.size() >= static_cast<size_t>(capacity_))
    return Status::error("prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                         std::to_string(capacity_) + " positions (at least one must remain for generation)");
  if (params.max_tokens < 1) return Status::error("max_tokens: " + std::to_string(params.max_tokens) + " must be ≥ 1");
  if (params.stop.size() > static_cast<size_t>(options_.max_stop_strings))
    return Status::error("stop: " + std::to_string(params.stop.size()) + " strings, at most " +
                         std::to_string(options_.max_stop_strings));
  for (size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].empty()) return Status::error("stop[" + std::to_string(i) + "]: empty");
    if (params.stop[i].size() > static_cast<size_t>(options_.max_stop_length))
      return Status::error("stop[" + std::to_string(i) + "]: " + std::to_string(params.stop[i].size()) +
                           " bytes, at most " + std::to_string(options_.max_stop_length));
  }

  // The Sampler allocates its repetition history up front: a request's tokens (prompt and generated, all
  // accepted) never exceed capacity() + 1, so a longer history changes nothing and only costs memory
  // (repeat_last_n comes from the request: 2^31 − 1 would be 8 GiB).
  params.sampling.repeat_last_n = std::min(params.sampling.repeat_last_n, capacity_ + 1);
  auto r = std::make_unique<Running>(std::move(params), std::move(callback), tokenizer_, options_.n_vocab);
  r->tokens = r->params.prompt;
  r->state = std::make_shared<detail::RequestState>();
  std::weak_ptr<Shared> weak = shared_;
  r->state->wake = [weak] {
    if (auto s = weak.lock()) {
      {
        std::lock_guard<std::mutex> lock(s->mutex);
        s->poked = true;
      }
      s->wake.notify_one();
    }
  };
  RequestHandle handle(r->state);
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->stopping) {
      reason = SubmitError::kStopped;
      return Status::error("the scheduler is stopped");
    }
    if (shared_->queued >= options_.max_queue) {
      reason = SubmitError::kQueueFull;
      return Status::error("queue full: " + std::to_string(shared_->queued) + " requests waiting (at most " +
                           std::to_string(options_.max_queue) + ")");
    }
    r->state->id = shared_->next_id++;
    ++shared_->queued;
    ++shared_->metrics.requests_submitted;
    ++shared_->metrics.requests_waiting;
    shared_->incoming.push_back(std::move(r));
  }
  shared_->wake.notify_one();
  return handle;
}

void Scheduler::start() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (shared_->started || shared_->stopping) return;
  shared_->started = true;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->stopping && !thread_.joinable()) return;
    shared_->stopping = true;
  }
  shared_->wake.notify_one();
  if (thread_.joinable()) {
    thread_.join();
    return;
  }
  cancelAll();  // never started: what is left finishes here
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(shared_->mutex);
      shared_->wake.wait(lock, [&] {
        return shared_->stopping || shared_->poked || !shared_->incoming.empty() || !running_.empty() ||
               !waiting_.empty();
      });
      shared_->poked = false;
      if (shared_->stopping) break;
    }
    if (!runOnce() && (!running_.empty() || !waiting_.empty())) {
      // Work that cannot move this iteration (should not happen: see admit/packStep); do not spin.
      std::unique_lock<std::mutex> lock(shared_->mutex);
      shared_->wake.wait_for(lock, std::chrono::milliseconds(10));
    }
  }
  cancelAll();
}

// Every request still queued or running finishes "cancelled" (the scheduler is stopping).
void Scheduler::cancelAll() {
  takeIncoming();
  for (auto& r : waiting_) finish(*r, FinishReason::kCancelled);
  for (auto& r : running_) finish(*r, FinishReason::kCancelled);
  waiting_.clear();
  running_.clear();
  publishMetrics();
  deliverFinals();
}

bool Scheduler::runOnce() {
  takeIncoming();
  const size_t before = waiting_.size() + running_.size();
  finishCancelled();
  admit();
  packStep();
  bool progressed = waiting_.size() + running_.size() != before;
  if (!chunks_.empty()) {
    progressed = true;
    // The rows stay where the session keeps them (its pinned buffer on the GPU) until the next step.
    Result<BatchSession::StepOutputs> out = session_.step(chunks_, outputs_);
    const size_t want = chunks_.size() * static_cast<size_t>(options_.n_vocab);
    if (out && (out->logits.size() != want || out->argmax.size() != chunks_.size()))
      out = Status::error("the step gave " + std::to_string(out->logits.size()) + " logits and " +
                          std::to_string(out->argmax.size()) + " argmax, expected " + std::to_string(chunks_.size()) +
                          " chunks x n_vocab " + std::to_string(options_.n_vocab) + " and one per chunk");
    for (size_t i = 0; out && i < chunks_.size(); ++i)  // a token outside the vocabulary would stall or fail later
      if (outputs_[i].argmax && (out->argmax[i] < 0 || out->argmax[i] >= options_.n_vocab))
        out = Status::error("the step gave chunk " + std::to_string(i) + " the argmax " +
                            std::to_string(out->argmax[i]) + ", outside [0, " + std::to_string(options_.n_vocab) + ")");
    if (!out) {
      for (Running* r : owners_) finish(*r, FinishReason::kError, "batch step failed: " + out.status().message());
    } else {
      ++steps_;
      for (const BatchSession::Chunk& c : chunks_) evaluated_tokens_ += c.tokens.size();
      afterStep(*out);
    }
  }
  std::erase_if(running_, [](const std::unique_ptr<Running>& r) { return r->done; });
  publishMetrics();
  deliverFinals();
  return progressed;
}

void Scheduler::takeIncoming() {
  std::vector<std::unique_ptr<Running>> incoming;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    incoming.swap(shared_->incoming);
  }
  for (auto& r : incoming) waiting_.push_back(std::move(r));
}

void Scheduler::finishCancelled() {
  for (auto& r : running_)
    if (r->state->cancel) finish(*r, FinishReason::kCancelled);
  std::erase_if(running_, [](const std::unique_ptr<Running>& r) { return r->done; });
  for (auto& r : waiting_)
    if (r->state->cancel) finish(*r, FinishReason::kCancelled);
  std::erase_if(waiting_, [](const std::unique_ptr<Running>& r) { return r->done; });
}

// FIFO admission: the head waits until a sequence id and the blocks of its whole prompt are free, beyond
// what each running sequence needs for its pending tokens and one more; preempted requests resume first.
void Scheduler::admit() {
  const int block = session_.blockSize();
  while (!waiting_.empty()) {
    if (session_.openSequences() >= session_.maxSequences()) return;
    int reserve = 0;
    for (const auto& r : running_) {
      if (r->preempted) return;
      reserve += session_.blocksNeeded(r->seq, static_cast<int>(r->tokens.size()) - r->n_cached + 1);
    }
    Running& head = *waiting_.front();
    const int need = static_cast<int>((head.tokens.size() + block - 1) / block);
    if (!running_.empty() && need + reserve > session_.freeBlocks()) return;
    Result<int> seq = session_.openSequence();
    if (!seq) {  // cannot happen with openSequences() < maxSequences(); the request is not lost
      finish(head, FinishReason::kError, "openSequence: " + seq.status().message());
      waiting_.pop_front();
      continue;
    }
    head.seq = *seq;
    if (!head.sampler) {  // first admission (a preempted request keeps its sampler and history)
      head.sampler.emplace(head.params.sampling, head.n_vocab);
      for (int32_t id : head.tokens) head.sampler->accept(id);  // as Session::generate: the prompt counts for penalties
    }
    prompt_tokens_ += head.params.prompt.size();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::packStep() {
  chunks_.clear();
  owners_.clear();
  outputs_.clear();
  ++packs_;
  int budget = session_.maxTokensPerStep();
  int reserved = 0;  // blocks the chunks packed so far will take
  int free = session_.freeBlocks();
  auto scheduled = [&](const Running* r) { return std::find(owners_.begin(), owners_.end(), r) != owners_.end(); };
  auto add = [&](Running& r, int n, int blocks) {
    chunks_.push_back({r.seq, std::span<const int32_t>(r.tokens.data() + r.n_cached, static_cast<size_t>(n))});
    owners_.push_back(&r);
    const bool samples = static_cast<size_t>(r.n_cached + n) == r.tokens.size();  // else a prompt chunk before the last
    const bool argmax = samples && samplesArgmax(r.params.sampling);
    outputs_.push_back({.logits = samples && !argmax, .argmax = argmax});
    reserved += blocks;
    free -= blocks;
    budget -= n;
  };

  // Decode tokens first: one per running sequence whose prompt is evaluated, from a rotating start.
  std::vector<Running*> decoders;
  for (auto& r : running_)
    if (!r->preempted && r->n_cached > 0 && static_cast<size_t>(r->n_cached) + 1 == r->tokens.size())
      decoders.push_back(r.get());
  if (!decoders.empty()) std::rotate(decoders.begin(), decoders.begin() + rotation_++ % decoders.size(), decoders.end());
  for (Running* d : decoders) {
    if (budget == 0) break;
    if (d->preempted) continue;  // a victim of an earlier decoder this step
    const int need = session_.blocksNeeded(d->seq, 1);
    while (need > free) {
      // The youngest request that holds blocks and is not in this step gives them back (possibly d).
      Running* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it)
        if (!(*it)->preempted && !(*it)->done && (*it)->n_cached > 0 && !scheduled(it->get())) victim = it->get();
      if (!victim) break;
      preempt(*victim);
      free = session_.freeBlocks() - reserved;
      if (victim == d) break;
    }
    if (d->preempted || need > free) continue;
    add(*d, 1, need);
  }

  // Prompt chunks (new prompts and the recomputation of resumed requests) with what is left, in arrival
  // order. A preempted request resumes when the pool covers all its tokens; later ones wait behind it.
  bool resume_blocked = false;
  for (auto& rp : running_) {
    if (budget == 0) break;
    Running& r = *rp;
    if (r.done || scheduled(&r)) continue;
    if (r.preempted) {
      const int need_all = session_.blocksNeeded(r.seq, static_cast<int>(r.tokens.size()));
      if (resume_blocked || r.preempted_at == packs_ || need_all > free) {
        resume_blocked = true;
        continue;
      }
      r.preempted = false;
    }
    int n = std::min<int>(budget, static_cast<int>(r.tokens.size()) - r.n_cached);
    if (n <= 0) continue;
    if (session_.blocksNeeded(r.seq, n) > free) {  // the longest chunk that fits the free blocks
      int lo = 0, hi = n;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (session_.blocksNeeded(r.seq, mid) <= free) lo = mid; else hi = mid - 1;
      }
      n = lo;
    }
    if (n > 0) add(r, n, session_.blocksNeeded(r.seq, n));
  }
}

void Scheduler::preempt(Running& r) {
  if (Status s = session_.truncate(r.seq, 0); !s) {
    finish(r, FinishReason::kError, "truncate: " + s.message());
    return;
  }
  r.n_cached = 0;
  r.preempted = true;
  r.preempted_at = packs_;  // the step being packed (counted whether or not it runs: a failed step
                            // must not keep the request from resuming)
  ++preemptions_;
}

void Scheduler::afterStep(const BatchSession::StepOutputs& out) {
  const size_t n_vocab = static_cast<size_t>(options_.n_vocab);
  sample_rows_.clear();
  sampled_.assign(owners_.size(), -1);  // per chunk: its token (−1: a prompt chunk before the last, or finished)
  for (size_t i = 0; i < owners_.size(); ++i) {
    Running& r = *owners_[i];
    if (r.done) continue;
    r.n_cached += static_cast<int>(chunks_[i].tokens.size());
    if (outputs_[i].argmax) sampled_[i] = out.argmax[i];      // the greedy token, sampled on the device
    else if (outputs_[i].logits) sample_rows_.push_back(i);   // sampled from its row below
  }
  // Each row by one thread with its own request's Sampler (a request has one chunk per step), then accepted in row
  // order here: the same tokens as one thread gives.
  // Cost: one visit per logit (a small vocabulary's rows stay on the driving thread).
  sampling_pool_->parallelFor(
      static_cast<int64_t>(sample_rows_.size()),
      [&](int64_t begin, int64_t end, int) {
        for (int64_t j = begin; j < end; ++j) {
          const size_t i = sample_rows_[static_cast<size_t>(j)];
          sampled_[i] = owners_[i]->sampler->sample(out.logits.subspan(i * n_vocab, n_vocab));
        }
      },
      static_cast<int64_t>(n_vocab));
  for (size_t i = 0; i < owners_.size(); ++i)
    if (sampled_[i] >= 0) acceptToken(*owners_[i], sampled_[i]);
}

void Scheduler::acceptToken(Running& r, int32_t token) {
  r.sampler->accept(token);
  if (r.params.stop_at_eog && tokenizer_.isEndOfGeneration(token)) {
    finish(r, FinishReason::kStop);
    return;
  }
  r.tokens.push_back(token);
  ++r.n_generated;
  const std::string text = r.stop.push(r.detok.push(token));
  if (r.stop.matched()) {
    RequestEvent piece;
    piece.text = text;
    if (!text.empty()) r.callback(piece);
    finish(r, FinishReason::kStop);
    return;
  }
  if (!text.empty()) {
    RequestEvent piece;
    piece.text = text;
    r.callback(piece);
  }
  // The next token would need position tokens.size() − 1: past the capacity, the request cannot grow.
  if (r.n_generated >= r.params.max_tokens || r.tokens.size() > static_cast<size_t>(capacity_))
    finish(r, FinishReason::kLength);
}

void Scheduler::finish(Running& r, FinishReason reason, std::string_view error) {
  if (r.done) return;
  r.done = true;
  std::string tail;
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
    if (!r.stop.matched()) tail = r.stop.push(r.detok.flush());
    if (r.stop.matched()) reason = FinishReason::kStop;
    else tail += r.stop.flush();
  }
  if (r.seq >= 0) {
    (void)session_.closeSequence(r.seq);  // fails only for a sequence that is not open: nothing to free then
    r.seq = -1;
  }
  ++finished_[static_cast<int>(reason)];
  generated_tokens_ += static_cast<uint64_t>(r.n_generated);
  Final f;
  f.callback = std::move(r.callback);
  f.text = std::move(tail);
  f.error = std::string(error);
  f.reason = reason;
  f.prompt_tokens = static_cast<int>(r.params.prompt.size());
  f.completion_tokens = r.n_generated;
  finals_.push_back(std::move(f));
}

// Final events go out after the metrics are published, so that a client holding its answer sees metrics
// that count it (blocks freed, request finished).
void Scheduler::deliverFinals() {
  std::vector<Final> finals;
  finals.swap(finals_);
  for (Final& f : finals) {
    RequestEvent last;
    last.text = f.text;
    last.finished = true;
    last.finish_reason = f.reason;
    last.prompt_tokens = f.prompt_tokens;
    last.completion_tokens = f.completion_tokens;
    last.error = f.error;
    f.callback(last);
  }
}

void Scheduler::publishMetrics() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  SchedulerMetrics& m = shared_->metrics;
  for (int i = 0; i < 4; ++i) m.requests_finished[i] = finished_[i];
  m.prompt_tokens = prompt_tokens_;
  m.generated_tokens = generated_tokens_;
  m.evaluated_tokens = evaluated_tokens_;
  m.steps = steps_;
  m.preemptions = preemptions_;
  shared_->queued = static_cast<int>(waiting_.size() + shared_->incoming.size());
  m.requests_waiting = shared_->queued;
  m.requests_running = static_cast<int>(running_.size());
  m.kv_blocks_total = session_.totalBlocks();
  m.kv_blocks_used = session_.totalBlocks() - session_.freeBlocks();
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->metrics;
}

}  // namespace minfer
