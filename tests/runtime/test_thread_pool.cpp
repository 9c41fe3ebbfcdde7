// ThreadPool: how many threads a job gets for its size, that a small job never leaves the caller, that
// the split covers every item once whatever the thread count, and the default thread count.
#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "runtime/cpu/thread_pool.h"

namespace minfer::cpu {

TEST_CASE("threadsFor: one thread per kMinWorkPerThread of work, at most the pool, at least one") {
  ThreadPool pool(4);
  const int64_t k = ThreadPool::kMinWorkPerThread;
  CHECK(pool.threadsFor(1000, 0) == 4);          // unknown cost: every thread
  CHECK(pool.threadsFor(64, 64) == 1);           // a tiny model's 64 x 64 decode matmul
  CHECK(pool.threadsFor(2, k) == 2);             // exactly two threads' worth
  CHECK(pool.threadsFor(3, k - 1) == 2);         // 3k − 3: two whole shares
  CHECK(pool.threadsFor(18944, 3585) == 4);      // a 7B's ffn_gate row block: all
  CHECK(pool.threadsFor(int64_t{1} << 40, int64_t{1} << 40) == 4);  // no overflow
}

TEST_CASE("parallelFor: a small job runs on the caller only; a large one on every thread; items once each") {
  ThreadPool pool(3);
  for (int64_t cost : {int64_t{1}, ThreadPool::kMinWorkPerThread}) {
    CAPTURE(cost);
    const int64_t n = 1000;
    std::vector<std::atomic<int>> hits(n);
    std::mutex m;
    std::set<std::thread::id> ids;
    std::set<int> slots;
    pool.parallelFor(
        n,
        [&](int64_t b, int64_t e, int t) {
          for (int64_t i = b; i < e; ++i) ++hits[i];
          std::lock_guard<std::mutex> lock(m);
          ids.insert(std::this_thread::get_id());
          slots.insert(t);
        },
        cost);
    for (int64_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
    if (cost == 1) {
      CHECK(ids == std::set<std::thread::id>{std::this_thread::get_id()});
      CHECK(slots == std::set<int>{0});
    } else {
      CHECK(slots == std::set<int>{0, 1, 2});
    }
  }
}

TEST_CASE("defaultThreads: the physical cores, between 1 and the logical CPUs") {
  const int t = defaultThreads();
  CHECK(t >= 1);
  CHECK(t <= static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace minfer::cpu
