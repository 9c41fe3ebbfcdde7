// KvBlockAllocator: block tables grow and shrink by whole blocks, the free stack is deterministic, and a
// grow undone by shrink leaves the allocator exactly as it was.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "runtime/kv_blocks.h"

namespace minfer {
namespace {

std::vector<int32_t> tableOf(const KvBlockAllocator& a, int seq) {
  const std::span<const int32_t> t = a.table(seq);
  return {t.begin(), t.end()};
}

TEST_CASE("blocksFor and needed round positions up to whole blocks") {
  const KvBlockAllocator a(/*n_seq=*/3, /*n_ctx=*/37, /*block_size=*/8, /*total=*/11);
  CHECK(a.blockSize() == 8);
  CHECK(a.totalBlocks() == 11);
  CHECK(a.freeBlocks() == 11);
  CHECK(a.blocksFor(0) == 0);
  CHECK(a.blocksFor(1) == 1);
  CHECK(a.blocksFor(8) == 1);
  CHECK(a.blocksFor(9) == 2);
  CHECK(a.blocksFor(37) == 5);
  CHECK(a.needed(1, 17) == 3);
  CHECK(a.needed(1, 0) == 0);
}

TEST_CASE("grow takes the lowest free ids in order, shrink returns them, sequences never share a block") {
  KvBlockAllocator a(3, 40, 4, 10);
  REQUIRE(a.grow(0, 5));   // 2 blocks
  REQUIRE(a.grow(2, 3));   // 1 block
  REQUIRE(a.grow(0, 9));   // +1 block
  CHECK(tableOf(a, 0) == std::vector<int32_t>{0, 1, 3});
  CHECK(tableOf(a, 2) == std::vector<int32_t>{2});
  CHECK(tableOf(a, 1).empty());
  CHECK(a.freeBlocks() == 6);
  CHECK(a.needed(0, 12) == 0);  // 3 blocks of 4 hold 12 positions
  CHECK(a.needed(0, 13) == 1);

  a.shrink(0, 4);  // keeps block 0 (positions 0..3)
  CHECK(tableOf(a, 0) == std::vector<int32_t>{0});
  CHECK(a.freeBlocks() == 8);
  REQUIRE(a.grow(1, 10));  // 3 blocks: the released ones come back first (last released on top)
  CHECK(tableOf(a, 1) == std::vector<int32_t>{1, 3, 4});

  std::set<int32_t> used;
  size_t n = 0;
  for (int s = 0; s < 3; ++s)
    for (int32_t b : a.table(s)) used.insert(b), ++n;
  CHECK(used.size() == n);
  CHECK(static_cast<int>(n) + a.freeBlocks() == a.totalBlocks());
}

TEST_CASE("grow refuses without taking anything when the pool or the context is too small") {
  KvBlockAllocator a(2, 20, 4, 6);  // a sequence holds at most 5 blocks
  REQUIRE(a.grow(0, 13));           // 4 blocks, 2 free
  CHECK_FALSE(a.grow(1, 9));        // needs 3
  CHECK(a.freeBlocks() == 2);
  CHECK(tableOf(a, 1).empty());
  CHECK_FALSE(a.grow(0, 21));       // 6 blocks > ceil(20 / 4)
  CHECK(tableOf(a, 0).size() == 4);
  CHECK(a.grow(1, 8));              // exactly the 2 left
  CHECK(a.freeBlocks() == 0);
  CHECK(a.grow(1, 8));              // nothing needed: no-op success
  CHECK_FALSE(a.grow(1, 9));
}

TEST_CASE("grow then shrink in reverse order restores the free stack exactly (a failed step leaves no trace)") {
  KvBlockAllocator a(3, 64, 2, 30);
  REQUIRE(a.grow(0, 7));
  REQUIRE(a.grow(1, 3));
  a.shrink(0, 2);  // scramble the free stack a little
  const std::vector<int32_t> t0 = tableOf(a, 0), t1 = tableOf(a, 1), t2 = tableOf(a, 2);
  // What the next allocations would take, before and after the round trip.
  KvBlockAllocator probe = a;
  REQUIRE(probe.grow(2, 20));
  const std::vector<int32_t> next = tableOf(probe, 2);

  REQUIRE(a.grow(1, 11));
  REQUIRE(a.grow(0, 9));
  REQUIRE(a.grow(2, 5));
  a.shrink(2, 0);
  a.shrink(0, 2);
  a.shrink(1, 3);
  CHECK(tableOf(a, 0) == t0);
  CHECK(tableOf(a, 1) == t1);
  CHECK(tableOf(a, 2) == t2);
  REQUIRE(a.grow(2, 20));
  CHECK(tableOf(a, 2) == next);
}

TEST_CASE("table data stays put as a sequence grows to its full context (backends hold the pointer)") {
  KvBlockAllocator a(2, 33, 4, 18);
  const int32_t* before = a.table(1).data();
  for (int len = 1; len <= 33; ++len) REQUIRE(a.grow(1, len));
  CHECK(a.table(1).data() == before);
  CHECK(a.table(1).size() == 9);
  a.shrink(1, 0);
  CHECK(a.freeBlocks() == 18);
}

}  // namespace
}  // namespace minfer
