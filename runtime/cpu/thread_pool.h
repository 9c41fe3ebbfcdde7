// ThreadPool: a fixed set of worker threads that split a range of independent work items (rows).
//
// parallelFor(n, fn, cost) splits [0, n) into one contiguous slice per thread used (thread i of T gets
// [i·n/T, (i+1)·n/T)), runs fn(begin, end, i) on each and returns when all are done. T is the pool's
// size, or fewer when the work is small: with `cost` (multiply-adds per item) given, each thread gets
// at least kMinWorkPerThread of it, and a job worth one thread runs on the caller without waking any
// worker (a tiny model's decode step is hundreds of such jobs; waking threads for each made `-t 4`
// several times slower than `-t 1` on a loaded machine). The split is a pure function of (n, T), and
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

  // Work a thread must get before another one is woken for a job: ~0.1 ms of scalar multiply-adds,
  // several times the cost of waking a worker (futex) on a busy machine.
  static constexpr int64_t kMinWorkPerThread = int64_t{1} << 17;

  // Runs fn(int64_t begin, int64_t end, int thread) over [0, n) split as described above. `cost`:
  // multiply-adds per item (0: unknown, use every thread). Slices that would be empty are skipped;
  // n ≤ 0 does nothing.
  template <typename F>
  void parallelFor(int64_t n, F&& fn, int64_t cost = 0) {
    if (n <= 0) return;
    using Fn = std::remove_reference_t<F>;
    auto trampoline = [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<Fn*>(ctx))(b, e, t); };
    run(n, threadsFor(n, cost), trampoline, const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Threads used for n items of `cost` multiply-adds each (see parallelFor).
  int threadsFor(int64_t n, int64_t cost) const;

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t, int);
  void run(int64_t n, int threads, Trampoline fn, void* ctx);
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
  int job_threads_ = 1;
};

// llama.cpp's default thread count: the physical cores this process may run on (hyper-threads of one
// core counted once; /sys topology and the affinity mask), or hardware_concurrency() when unknown.
int defaultThreads();

}  // namespace minfer::cpu
