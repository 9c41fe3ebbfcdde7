// ThreadPool implementation: condition-variable dispatch of one static slice per thread.
#include "runtime/cpu/thread_pool.h"

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

void ThreadPool::runSlice(int index) {
  const int64_t begin = job_n_ * index / n_threads_;
  const int64_t end = job_n_ * (index + 1) / n_threads_;
  if (begin < end) job_fn_(job_ctx_, begin, end, index);
}

void ThreadPool::run(int64_t n, Trampoline fn, void* ctx) {
  if (n_threads_ == 1 || n == 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_fn_ = fn;
    job_ctx_ = ctx;
    job_n_ = n;
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

}  // namespace minfer::cpu
