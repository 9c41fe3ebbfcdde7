// ThreadPool implementation: condition-variable dispatch of one static slice per thread.
#include "runtime/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

namespace minfer::cpu {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::threadsFor(int64_t n, int64_t cost) const {
  if (cost <= 0) return n_threads_;
  const int64_t work = n > INT64_MAX / cost ? INT64_MAX : n * cost;
  return static_cast<int>(std::clamp<int64_t>(work / kMinWorkPerThread, 1, n_threads_));
}

void ThreadPool::runSlice(int index) {
  if (index >= job_threads_) return;
  const int64_t begin = job_n_ * index / job_threads_;
  const int64_t end = job_n_ * (index + 1) / job_threads_;
  if (begin < end) job_fn_(job_ctx_, begin, end, index);
}

void ThreadPool::run(int64_t n, int threads, Trampoline fn, void* ctx) {
  if (threads <= 1 || n == 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_fn_ = fn;
    job_ctx_ = ctx;
    job_n_ = n;
    job_threads_ = threads;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  runSlice(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::workerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    runSlice(index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

int defaultThreads() {
  cpu_set_t mask;
  const int fallback = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return fallback;
  std::set<std::string> cores;  // one entry per physical core: the CPUs that share it
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
    std::string siblings;
    if (!std::getline(f, siblings)) return std::min(fallback, CPU_COUNT(&mask));
    cores.insert(siblings);
  }
  return cores.empty() ? fallback : static_cast<int>(cores.size());
}

}  // namespace minfer::cpu
