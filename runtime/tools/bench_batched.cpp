// minfer-bench --parallel: llama-batched-bench's measurements over a BatchSession (bench_batched.h).
#include "runtime/tools/bench_batched.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <random>
#include <tuple>

#include "minfer/batch.h"

namespace minfer::tools {

double Series::mean() const {
  double s = 0;
  for (double v : samples) s += v;
  return samples.empty() ? 0 : s / samples.size();
}

double Series::sd() const {
  if (samples.size() < 2) return 0;
  const double m = mean();
  double s = 0;
  for (double v : samples) s += (v - m) * (v - m);
  return std::sqrt(s / (samples.size() - 1));
}

Result<std::vector<int>> parseIntList(std::string_view option, std::string_view text, int lo, int hi) {
  const std::string where = std::string(option) + " " + std::string(text) + ": ";
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  if (text.empty()) return Status::error(std::string(option) + ": empty; expected integers in " + range + " separated by commas");
  std::vector<int> out;
  size_t start = 0;
  for (int index = 0;; ++index) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::string which = "element " + std::to_string(index + 1);
    if (item.empty()) return Status::error(where + which + " is empty; expected integers in " + range + " separated by commas");
    long long v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == item.data() + item.size() && (v < lo || v > hi)))
      return Status::error(where + which + " (" + std::string(item) + ") is out of range " + range);
    if (ec != std::errc() || end != item.data() + item.size())
      return Status::error(where + which + " (\"" + std::string(item) + "\") is not an integer; expected integers in " +
                           range + " separated by commas");
    out.push_back(static_cast<int>(v));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct RunTimes {
  double prompt_s = 0, decode_s = 0, ttft_s = 0;  // T_PP, T_TG, mean time to each sequence's first token
};

// The work of one run, drawn before it is timed: B×PP prompt tokens, then TG×B decode tokens.
struct RunTokens {
  std::vector<int32_t> prompt;  // (B, PP) row-major
  std::vector<int32_t> decode;  // (TG, B) row-major
};

class BatchedRunner {
 public:
  BatchedRunner(BatchSession& session, int n_parallel, bool argmax)
      : session_(session), rows_(std::min(n_parallel, session.maxTokensPerStep())), argmax_(argmax) {
    chunks_.reserve(rows_);
    outputs_.reserve(rows_);
  }

  // One run of B sequences: the prompt phase, then TG decode steps; the sequences are closed afterwards.
  Result<RunTimes> run(int n_parallel, int n_prompt, int n_gen, const RunTokens& tokens) {
    std::vector<int> seqs;
    Status s;
    for (int b = 0; b < n_parallel && s; ++b) {
      Result<int> id = session_.openSequence();
      if (id) seqs.push_back(*id); else s = id.takeStatus();
    }
    RunTimes t;
    if (s) s = prompts(seqs, n_prompt, tokens.prompt, t);
    if (s) s = decodes(seqs, n_gen, tokens.decode, t);
    for (int seq : seqs)
      if (Status c = session_.closeSequence(seq); !c && s) s = std::move(c);
    if (!s) return s;
    return t;
  }

 private:
  // All B prompts, packed greedily within maxTokensPerStep() (one chunk per sequence per step).
  Status prompts(const std::vector<int>& seqs, int n_prompt, const std::vector<int32_t>& ids, RunTimes& t) {
    const int n_parallel = static_cast<int>(seqs.size());
    std::vector<int> done(n_parallel, 0);
    const double start = now();
    double ttft_sum = 0;
    for (int first = 0; first < n_parallel;) {
      chunks_.clear();
      int budget = session_.maxTokensPerStep();
      outputs_.clear();
      for (int b = first; b < n_parallel && budget > 0; ++b) {
        const int n = std::min(n_prompt - done[b], budget);
        chunks_.push_back({seqs[b], std::span<const int32_t>(ids.data() + size_t(b) * n_prompt + done[b], size_t(n))});
        outputs_.push_back(output(done[b] + n == n_prompt));
        budget -= n;
      }
      MINFER_RETURN_IF_ERROR(step());
      const double end = now();
      for (size_t i = 0; i < chunks_.size(); ++i) {  // chunk i is sequence first + i
        const int b = first + static_cast<int>(i);
        done[b] += static_cast<int>(chunks_[i].tokens.size());
        if (done[b] == n_prompt) ttft_sum += end - start;
      }
      while (first < n_parallel && done[first] == n_prompt) ++first;
    }
    t.prompt_s = now() - start;
    t.ttft_s = ttft_sum / n_parallel;
    return Status::ok();
  }

  // TG steps of one token per sequence (split where B exceeds maxTokensPerStep()).
  Status decodes(const std::vector<int>& seqs, int n_gen, const std::vector<int32_t>& ids, RunTimes& t) {
    const int n_parallel = static_cast<int>(seqs.size());
    const double start = now();
    for (int g = 0; g < n_gen; ++g)
      for (int first = 0; first < n_parallel; first += rows_) {
        chunks_.clear();
        outputs_.clear();
        for (int b = first; b < std::min(n_parallel, first + rows_); ++b) {
          chunks_.push_back({seqs[b], std::span<const int32_t>(ids.data() + size_t(g) * n_parallel + b, 1)});
          outputs_.push_back(output(true));
        }
        MINFER_RETURN_IF_ERROR(step());
      }
    t.decode_s = now() - start;
    return Status::ok();
  }

  // What a chunk's step brings back (BatchedBenchOptions::argmax): its logits row (every chunk: llama-batched-bench
  // asks for the logits of every token it adds), or the argmax alone where the chunk ends its prompt or decodes.
  BatchSession::Output output(bool last) const {
    return argmax_ ? BatchSession::Output{.logits = false, .argmax = last} : BatchSession::Output{};
  }

  // One step, its outputs left where the session keeps them (llama-batched-bench's llama_decode leaves the logits in
  // its pinned output buffer too; neither reads them).
  Status step() {
    Result<BatchSession::StepOutputs> out = session_.step(chunks_, outputs_);
    return out ? Status::ok() : out.takeStatus();
  }

  BatchSession& session_;
  int rows_;  // chunks per step at most
  bool argmax_;
  std::vector<BatchSession::Chunk> chunks_;
  std::vector<BatchSession::Output> outputs_;  // (chunks_.size())
};

RunTokens drawTokens(std::mt19937& rng, int n_vocab, int n_parallel, int n_prompt, int n_gen) {
  std::uniform_int_distribution<int32_t> token(0, n_vocab - 1);
  RunTokens r;
  r.prompt.resize(size_t(n_parallel) * n_prompt);
  r.decode.resize(size_t(n_gen) * n_parallel);
  for (int32_t& id : r.prompt) id = token(rng);
  for (int32_t& id : r.decode) id = token(rng);
  return r;
}

}  // namespace

Result<std::vector<BatchedResult>> runBatchedBench(const Model& model, const BatchedBenchOptions& options,
                                                   bool& batched_kernels) {
  const int n_vocab = model.info().n_vocab;
  const int max_prompt = *std::max_element(options.prompts.begin(), options.prompts.end());
  const int max_gen = *std::max_element(options.gens.begin(), options.gens.end());
  std::mt19937 rng(options.seed);
  std::vector<BatchedResult> results;
  for (int n_parallel : options.parallel) {
    BatchOptions batch;
    batch.n_ctx = max_prompt + max_gen;
    batch.n_seq_max = n_parallel;
    batch.n_threads = options.n_threads;
    Result<std::unique_ptr<BatchSession>> session = model.createBatchSession(batch);
    if (!session)
      return Status::error("--parallel " + std::to_string(n_parallel) + " (-p " + std::to_string(max_prompt) + " + -n " +
                           std::to_string(max_gen) + " = " + std::to_string(batch.n_ctx) +
                           " positions per sequence): " + session.status().message());
    batched_kernels = (*session)->batchedKernels();
    BatchedRunner runner(**session, n_parallel, options.argmax);
    for (int n_prompt : options.prompts)
      for (int n_gen : options.gens) {
        BatchedResult r{.n_prompt = n_prompt, .n_gen = n_gen, .n_parallel = n_parallel};
        for (int i = -1; i < options.reps; ++i) {  // -1: the warm-up run
          const RunTokens tokens = drawTokens(rng, n_vocab, n_parallel, n_prompt, n_gen);
          Result<RunTimes> t = runner.run(n_parallel, n_prompt, n_gen, tokens);
          if (!t)
            return Status::error("-p " + std::to_string(n_prompt) + " -n " + std::to_string(n_gen) + " --parallel " +
                                 std::to_string(n_parallel) + ": " + t.status().message());
          if (i < 0) continue;
          const double b = n_parallel;
          r.prompt_ts.samples.push_back(b * n_prompt / t->prompt_s);
          r.decode_ts.samples.push_back(b * n_gen / t->decode_s);
          r.total_ts.samples.push_back(b * (n_prompt + n_gen) / (t->prompt_s + t->decode_s));
          r.ttft_ms.samples.push_back(1e3 * t->ttft_s);
          r.itl_ms.samples.push_back(1e3 * t->decode_s / n_gen);
        }
        results.push_back(std::move(r));
      }
  }
  std::stable_sort(results.begin(), results.end(), [](const BatchedResult& a, const BatchedResult& b) {
    return std::tie(a.n_prompt, a.n_gen) < std::tie(b.n_prompt, b.n_gen);
  });
  return results;
}

}  // namespace minfer::tools
