// PlaneWorkers: fixed thread pool with dynamically claimed chunks (see plane_workers.h).
#include "compiler/planes/plane_workers.h"

#include <algorithm>
#include <atomic>

namespace minfer::planes {

struct PlaneWorkers::Job {
  llvm::function_ref<void(uint64_t, uint64_t)> fn;
  uint64_t n;
  uint64_t grain;
  std::atomic<uint64_t> next{0};
};

PlaneWorkers::PlaneWorkers(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads - 1);
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { workerLoop(); });
}

PlaneWorkers::~PlaneWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void PlaneWorkers::runChunks(Job& job) {
  for (;;) {
    const uint64_t begin = job.next.fetch_add(job.grain, std::memory_order_relaxed);
    if (begin >= job.n) return;
    job.fn(begin, std::min(job.n, begin + job.grain));
  }
}

void PlaneWorkers::workerLoop() {
  uint64_t seen = 0;
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;  // null when this worker woke after the job had already finished
      if (job) ++busy_;
    }
    if (!job) continue;
    runChunks(*job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) idle_.notify_all();
    }
  }
}

void PlaneWorkers::parallelFor(uint64_t n, uint64_t grain, llvm::function_ref<void(uint64_t, uint64_t)> fn) {
  if (n == 0) return;
  grain = std::max<uint64_t>(1, grain);
  Job job{fn, n, grain};
  if (workers_.empty() || n <= grain) {
    runChunks(job);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    ++generation_;
  }
  wake_.notify_all();
  runChunks(job);
  // Every chunk is claimed; wait for the workers still running theirs, then retire the job so a
  // worker waking late sees no job (it checks job_ under the same lock).
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return busy_ == 0; });
  job_ = nullptr;
}

}  // namespace minfer::planes
