// Scheduler: continuous batching of generation requests over one BatchSession (issue 14).
//
// Requests are queued on submit(); one thread (the scheduler's own after start(), or the caller of
// runOnce()) drives the BatchSession. Every iteration:
//   1. cancelled requests finish ("cancelled") and give their blocks back;
//   2. waiting requests are admitted in arrival order (FIFO, no overtaking) while a sequence id is free,
//      no preempted request waits to resume, and the free KV blocks cover the whole prompt beyond what
//      each running sequence needs to evaluate its pending tokens and one more;
//   3. one step is packed within BatchSession::maxTokensPerStep(): first one decode token for each
//      running sequence (a rotating start, so that none starves when they exceed the budget), then prompt
//      chunks in arrival order with what is left (chunked prefill, Sarathi/vLLM style);
//   4. when a decode token needs a KV block and none is free, the youngest other running request is
//      preempted by recomputation (truncate(seq, 0): its blocks return to the pool; it keeps its
//      sequence id and the tokens generated so far, and resumes, before any new admission, when the
//      pool covers all its tokens, by evaluating prompt + generated tokens again). Never a crash: a
//      request that alone cannot grow (its tokens fill the context or the whole pool) finishes "length";
//   5. for each sequence whose chunk reached its last token, the next token is sampled with the
//      request's own Sampler (prompt tokens accepted first, as Session::generate does), checked for
//      end of generation, detokenized (Detokenizer: valid UTF-8 only) and matched against the stop
//      strings; the text so far is streamed to the request's callback. A request whose sampler takes the
//      argmax (samplesArgmax: greedy, no penalty) gets it from the step (BatchSession::Output::argmax: on the
//      GPU, 4 bytes back instead of its logits row); the others' rows are sampled on up to
//      SchedulerOptions::sampling_threads threads, each row by one thread with its request's Sampler, then
//      accepted in row order on the driving thread: the tokens do not depend on the thread count.
// A step the BatchSession refuses (a backend failure) finishes the requests in it with "error"; the
// scheduler keeps serving the others.
//
// Stop strings are matched on the generated text across token boundaries: text that could be the
// start of a stop string is held back until it is known not to be one; a matched stop string and
// everything after it are not emitted (OpenAI's `stop`).
//
// Units: token ids int32 in [0, n_vocab); counts in tokens; times in seconds (steady clock).
// Thread-safety: submit(), metrics() and RequestHandle::cancel() may be called from any thread.
// Callbacks run on the driving thread, outside the scheduler's lock: they must be quick (hand the text
// to another thread) and may call submit() and cancel(). The Scheduler must not outlive its
// BatchSession; its destructor stops the driving thread and finishes what is left with "cancelled".
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "minfer/batch.h"
#include "minfer/sampler.h"
#include "minfer/status.h"
#include "minfer/tokenizer.h"

namespace minfer {
namespace cpu {
class ThreadPool;
}

struct RequestParams {
  std::vector<int32_t> prompt;    // token ids (BOS included if wanted); 1 ≤ size < capacity (below)
  SamplerParams sampling;         // repeat_last_n > Scheduler::capacity() + 1 is clamped to it (the same history)
  int max_tokens = 16;            // tokens to generate at most; ≥ 1 ("length" when reached)
  std::vector<std::string> stop;  // stop strings: each non-empty; at most SchedulerOptions::max_stop_strings
  bool stop_at_eog = true;        // an end-of-generation token ends the request ("stop"), not emitted
  bool render_special = false;    // emit control tokens' text
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
// "stop", "length", "cancelled", "error" (the first two are OpenAI's finish_reason values).
const char* finishReasonName(FinishReason reason);

// What a request's callback receives: text as it is generated, then one final event.
struct RequestEvent {
  std::string_view text;  // new text: valid UTF-8, never a held-back stop-string prefix; may be empty
  bool finished = false;  // the last event of the request; the fields below are set on it
  FinishReason finish_reason = FinishReason::kStop;
  int prompt_tokens = 0;      // usage: tokens of the prompt
  int completion_tokens = 0;  // usage: tokens generated (an end-of-generation token that ended it not counted)
  std::string_view error;     // kError: what failed
};
using RequestCallback = std::function<void(const RequestEvent& event)>;

// The most threads SchedulerOptions::sampling_threads takes (more would only wait: a step has at most
// BatchSession::maxSequences() rows to sample).
constexpr int kMaxSamplingThreads = 256;

struct SchedulerOptions {
  int n_vocab = 0;              // logits row length (ModelInfo::n_vocab); ≥ 1
  int max_queue = 4096;         // waiting requests at most; submit() fails beyond
  int max_stop_strings = 16;    // stop strings per request at most
  int max_stop_length = 256;    // bytes per stop string at most
  // Threads that sample a step's rows (the driving thread and sampling_threads − 1 workers, started with the
  // Scheduler); clamped to 1 … kMaxSamplingThreads. 32 rows of a 152,064-token vocabulary took 2.8 ms greedy and
  // 4.4 ms at top-k 40 on one thread of the build machine, against a 6.3 ms GPU step (BENCHMARKS.md, issue 14); a
  // thread is woken for each row's worth of n_vocab logit visits (cpu::ThreadPool's kMinWorkPerThread).
  int sampling_threads = 1;
};

// Counters for /metrics. Cumulative counters only grow; gauges are as of the last iteration.
struct SchedulerMetrics {
  uint64_t requests_submitted = 0;
  uint64_t requests_finished[4] = {};  // indexed by FinishReason
  uint64_t prompt_tokens = 0;          // tokens of admitted prompts (usage; recomputation not counted)
  uint64_t generated_tokens = 0;       // tokens generated (completion_tokens summed)
  uint64_t evaluated_tokens = 0;       // tokens evaluated by steps (prompts, decodes and recomputation)
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  int requests_waiting = 0;  // gauge: queued, not yet admitted
  int requests_running = 0;  // gauge: admitted (holding a sequence), preempted ones included
  int kv_blocks_used = 0;    // gauge: totalBlocks() − freeBlocks()
  int kv_blocks_total = 0;
};

// Why submit() refused a request: the request itself is wrong (a client error: HTTP 400), or the
// scheduler cannot take it now (the server is busy or going away: HTTP 503; retrying later may work).
enum class SubmitError { kInvalidRequest, kQueueFull, kStopped };

namespace detail {
struct RequestState;
}

// The caller's side of a submitted request.
class RequestHandle {
 public:
  RequestHandle() = default;
  uint64_t id() const;  // 1, 2, … in submission order; 0 for an empty handle
  // Asks the scheduler to end the request: at its next iteration it finishes with kCancelled (unless it
  // finished before) and its blocks return to the pool. Thread-safe, idempotent.
  void cancel() const;

 private:
  friend class Scheduler;
  explicit RequestHandle(std::shared_ptr<detail::RequestState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::RequestState> state_;
};

class Scheduler {
 public:
  // `session` must have no open sequences. `tokenizer` detokenizes and says which ids end generation.
  Scheduler(BatchSession& session, Tokenizer tokenizer, const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; `callback` receives its text and its final event (see RequestEvent). Errors
  // (nothing is queued; messages name the field and the numbers), with `*why` set when `why` is given:
  // kInvalidRequest: empty prompt; a token id outside [0, n_vocab); a prompt of ≥ capacity() tokens;
  // max_tokens < 1; too many, empty or too long stop strings. kQueueFull: max_queue requests are waiting.
  // kStopped: stop() was called.
  Result<RequestHandle> submit(RequestParams params, RequestCallback callback, SubmitError* why = nullptr);

  // Starts the thread that drives the session (iterates while there is work, sleeps otherwise).
  void start();
  // Stops the driving thread; requests still queued or running finish with kCancelled. Idempotent.
  void stop();
  // One iteration on the calling thread (tests; never together with start()). False when there was
  // nothing to do.
  bool runOnce();

  SchedulerMetrics metrics() const;
  // Positions one request can hold: min(contextLength(), totalBlocks() × blockSize()).
  int capacity() const { return capacity_; }

 private:
  struct Running;
  struct Shared;
  void takeIncoming();
  void finishCancelled();
  void admit();
  void packStep();
  void preempt(Running& r);
  void finish(Running& r, FinishReason reason, std::string_view error = {});
  void afterStep(const BatchSession::StepOutputs& out);  // the step's rows (chunks, n_vocab) and argmax
  void acceptToken(Running& r, int32_t token);
  void publishMetrics();
  void deliverFinals();
  void cancelAll();
  void loop();

  BatchSession& session_;
  Tokenizer tokenizer_;
  SchedulerOptions options_;
  int capacity_ = 0;
  uint64_t rotation_ = 0;
  uint64_t packs_ = 0;  // packStep() calls so far (the step a preemption happened in)

  // Owned by the driving thread.
  std::deque<std::unique_ptr<Running>> waiting_;
  std::vector<std::unique_ptr<Running>> running_;  // arrival order
  std::vector<BatchSession::Chunk> chunks_;        // the step being packed
  std::vector<Running*> owners_;                   // (chunks_.size()) the request of each chunk
  // (chunks_.size()) what each chunk's step brings back: nothing for a prompt chunk before the prompt's last, the
  // argmax alone where the request's sampler would take it (samplesArgmax), else the logits row.
  std::vector<BatchSession::Output> outputs_;
  struct Final {                                   // a final event held until the metrics are published
    RequestCallback callback;
    std::string text, error;
    FinishReason reason = FinishReason::kStop;
    int prompt_tokens = 0, completion_tokens = 0;
  };
  std::vector<Final> finals_;
  uint64_t finished_[4] = {}, prompt_tokens_ = 0, generated_tokens_ = 0, evaluated_tokens_ = 0, steps_ = 0,
           preemptions_ = 0;

  std::unique_ptr<cpu::ThreadPool> sampling_pool_;  // options_.sampling_threads (afterStep)
  std::vector<size_t> sample_rows_;                // the step's rows that sample a token (afterStep)
  std::vector<int32_t> sampled_;                   // (chunks_.size()) each chunk's token, −1 for none (afterStep)

  std::shared_ptr<Shared> shared_;  // submissions, wake-ups and metrics, shared with other threads
  std::thread thread_;
};

}  // namespace minfer
