// ThreadPool: a fixed set of worker threads that split a range of independent work items (rows).
//
// parallelFor(n, fn) splits [0, n) into one contiguous slice per thread (thread i gets
// [i·n/T, (i+1)·n/T)), runs fn(begin, end, i) on each and returns when all are done. The split is a
// pure function of (n, T), so which thread computes which row never changes from call to call, and
// since each output element is computed by exactly one thread with a fixed loop order, results do
// not depend on the thread count. The calling thread runs slice 0. No allocation per call: the
// callable is passed by reference (type-erased through a function pointer), never copied.
//
// Thread-safety: one parallelFor at a time per pool (a Session owns its pool and is itself
// single-threaded). fn must not call parallelFor on the same pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace minfer::cpu {

class ThreadPool {
 public:
  // n_threads ≥ 1 (the caller counts as one; n_threads − 1 workers are started).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return n_threads_; }

  // Runs fn(int64_t begin, int64_t end, int thread) over [0, n) split as described above. Slices
  // that would be empty are skipped; n ≤ 0 does nothing.
  template <typename F>
  void parallelFor(int64_t n, F&& fn) {
    if (n <= 0) return;
    using Fn = std::remove_reference_t<F>;
    auto trampoline = [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<Fn*>(ctx))(b, e, t); };
    run(n, trampoline, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t, int);
  void run(int64_t n, Trampoline fn, void* ctx);
  void workerLoop(int index);
  void runSlice(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;   // workers wait for a new generation
  std::condition_variable done_;   // the caller waits for pending_ == 0
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  // The current job (written under mutex_ before generation_ is bumped).
  Trampoline job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
};

}  // namespace minfer::cpu
