// minfer-bench --parallel: many sequences through the public BatchSession API, with llama.cpp's
// llama-batched-bench definitions (tools/batched-bench/batched-bench.cpp).
//
// For each (PP, TG, B): B sequences are opened in an empty BatchSession; each gets a prompt of PP random
// tokens, all evaluated together (BatchSession::step, chunks packed within maxTokensPerStep(): the prompt
// phase); then TG decode steps, each feeding one random token to every sequence (B tokens per step, split
// into several steps where B > maxTokensPerStep()). Logits rows are copied back every step, as llama-batched-bench
// does; nothing is sampled. BatchedBenchOptions::argmax brings back each sequence's argmax instead (BatchSession::
// Output::argmax: computed on the GPU by the CUDA backend), what minfer-server does for greedy requests: the
// last prompt chunk's and every decode step's, and nothing for the chunks before a prompt's last. Per repetition:
//   prompt t/s  = B·PP / T_PP                (llama-batched-bench's S_PP)
//   decode t/s  = B·TG / T_TG                (S_TG: the aggregate decode rate)
//   total t/s   = B·(PP+TG) / (T_PP + T_TG)  (S)
//   TTFT        = mean over the B sequences of the time from the start of the prompt phase to the end of
//                 the step that evaluated the sequence's last prompt token (its logits give the first token)
//   ITL         = T_TG / TG                  (mean time between two tokens of one sequence while decoding)
// Each configuration runs once as warm-up, then `reps` times; the sequences are closed (their KV blocks
// released) after every run. Whatever the backend's BatchSession does is measured: on a backend without
// batched kernels (BatchSession::batchedKernels() false) a step runs the sequences one after another.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "minfer/runtime.h"
#include "minfer/status.h"

namespace minfer::tools {

// One per-repetition series: mean and sample standard deviation (n − 1), as llama-bench's avg/stddev.
struct Series {
  std::vector<double> samples;
  double mean() const;
  double sd() const;
};

struct BatchedResult {
  int n_prompt = 0;    // PP: prompt tokens per sequence
  int n_gen = 0;       // TG: decode steps (tokens generated per sequence)
  int n_parallel = 0;  // B: sequences
  Series prompt_ts, decode_ts, total_ts;  // tokens per second
  Series ttft_ms, itl_ms;                 // milliseconds
  // N_KV: KV positions the B sequences hold at the end, B·(PP + TG).
  int64_t nKv() const { return int64_t{n_parallel} * (n_prompt + n_gen); }
};

struct BatchedBenchOptions {
  std::vector<int> parallel;  // B values, each in 1..kMaxParallel
  std::vector<int> prompts;   // PP values, each ≥ 1
  std::vector<int> gens;      // TG values, each ≥ 1
  int reps = 5;
  int n_threads = 0;
  unsigned seed = 1;
  bool argmax = false;  // each step brings back the argmax instead of the logits rows (see above)
};

constexpr int kMaxParallel = 4096;  // BatchOptions::n_seq_max's bound

// Runs every (PP, TG, B) combination on `model` (PP outermost, then TG, then B, as llama-batched-bench
// lists them). `batched_kernels` is set from the BatchSession. Errors: BatchSession creation (context
// too long for the artifact, memory) and step failures, with the configuration named.
Result<std::vector<BatchedResult>> runBatchedBench(const Model& model, const BatchedBenchOptions& options,
                                                   bool& batched_kernels);

// Parses a comma-separated list of integers in [lo, hi] ("1,8,32"). Errors name `option`, the whole
// value and the element at fault: empty elements, non-digits, values out of range.
Result<std::vector<int>> parseIntList(std::string_view option, std::string_view text, int lo, int hi);

}  // namespace minfer::tools
