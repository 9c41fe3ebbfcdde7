// PlaneWorkers: a small fixed thread pool that runs row ranges of a plane transform in parallel.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "llvm/ADT/STLFunctionalExtras.h"

namespace minfer::planes {

// `threads` workers in all, the calling thread included (threads - 1 are spawned). Jobs are split
// into chunks claimed dynamically, so which thread runs which chunk varies from run to run; callers
// keep results deterministic by making every chunk write only its own, disjoint output bytes.
// One job at a time: parallelFor is not reentrant and must be called from one thread.
class PlaneWorkers {
 public:
  // threads = 0 means std::thread::hardware_concurrency() (at least 1).
  explicit PlaneWorkers(unsigned threads);
  ~PlaneWorkers();
  PlaneWorkers(const PlaneWorkers&) = delete;
  PlaneWorkers& operator=(const PlaneWorkers&) = delete;

  unsigned threads() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls fn(begin, end) for consecutive chunks [begin, end) of at most `grain` (≥ 1) items covering
  // [0, n) exactly once, and returns when every call has returned.
  void parallelFor(uint64_t n, uint64_t grain, llvm::function_ref<void(uint64_t, uint64_t)> fn);

 private:
  struct Job;
  void workerLoop();
  static void runChunks(Job& job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;  // workers wait here for a new job (or stop_)
  std::condition_variable idle_;  // parallelFor waits here for busy_ == 0
  Job* job_ = nullptr;            // the job being run, under mu_
  uint64_t generation_ = 0;       // incremented for each job, under mu_
  unsigned busy_ = 0;             // workers inside runChunks, under mu_
  bool stop_ = false;
};

}  // namespace minfer::planes
