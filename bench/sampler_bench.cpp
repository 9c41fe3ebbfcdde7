// Host sampling cost of one batched step (not a test: record the numbers in BENCHMARKS.md): `rows` Samplers, one per
// sequence, each drawing from its own row of n_vocab logits, as the server's scheduler does after every step.
//   minfer-bench-sampler [n_vocab=152064] [rows=32] [temperature=0] [repeat_penalty=1] [steps=20] [threads=1]
// The rows are split over `threads` threads as the scheduler splits them (SchedulerOptions::sampling_threads: a
// cpu::ThreadPool, contiguous slices of rows). Prints the mean milliseconds per step (all rows) and a checksum of the
// tokens (the same for every thread count). The logits (rows × n_vocab, random
// values on a coarse grid, so ties occur) are larger than the caches, as the step's pinned rows are.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <vector>

#include "minfer/sampler.h"
#include "minfer/scheduler.h"
#include "runtime/cpu/thread_pool.h"

int main(int argc, char** argv) {
  const auto arg = [&](int i, double fallback) { return argc > i ? std::atof(argv[i]) : fallback; };
  const int n_vocab = static_cast<int>(arg(1, 152064)), rows = static_cast<int>(arg(2, 32)), steps = static_cast<int>(arg(5, 20));
  const int threads = static_cast<int>(arg(6, 1));
  if (n_vocab < 1 || rows < 1 || steps < 1 || threads < 1 || threads > minfer::kMaxSamplingThreads) {
    std::fprintf(stderr, "minfer-bench-sampler: n_vocab, rows and steps must be ≥ 1, threads 1 … 256\n");
    return 2;
  }
  minfer::SamplerParams p;
  p.temperature = static_cast<float>(arg(3, 0.0));
  p.repeat_penalty = static_cast<float>(arg(4, 1.0));
  std::mt19937 rng(1);
  std::vector<float> logits(static_cast<size_t>(n_vocab) * rows);
  for (float& l : logits) l = static_cast<float>(rng() % 10000) / 100.0f;
  std::vector<minfer::Sampler> samplers;
  for (int r = 0; r < rows; ++r) {
    samplers.emplace_back(p, n_vocab);
    for (int t = 0; t < 64; ++t) samplers.back().accept(static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab)));
  }
  minfer::cpu::ThreadPool pool(threads);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  long long checksum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    pool.parallelFor(
        rows,
        [&](int64_t begin, int64_t end, int) {
          for (int64_t r = begin; r < end; ++r)
            tokens[static_cast<size_t>(r)] = samplers[static_cast<size_t>(r)].sample(
                std::span<const float>(logits.data() + static_cast<size_t>(r) * n_vocab, static_cast<size_t>(n_vocab)));
        },
        n_vocab);
    for (int32_t t : tokens) checksum += t;
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("n_vocab %d, rows %d, temperature %g, repeat_penalty %g, threads %d: %.3f ms per step "
              "(token checksum %lld)\n",
              n_vocab, rows, p.temperature, p.repeat_penalty, threads,
              std::chrono::duration<double, std::milli>(t1 - t0).count() / steps, checksum);
  return 0;
}
