// KvBlockAllocator: the block bookkeeping of a paged KV cache (Kwon et al. 2023, vLLM's paged attention).
//
// A pool of `total` blocks of `block_size` positions; block ids are 0..total−1 and address block b's
// positions at cache slots b·block_size .. b·block_size + block_size − 1 (the cache itself lives in the
// backend). Each of `n_seq` sequence slots has a block table: entry i holds the block of its positions
// i·block_size .. (i+1)·block_size − 1. Free blocks sit on a stack, lowest id on top at construction, so
// allocation is deterministic; shrinking pushes the released blocks back in the reverse order of their
// allocation, which makes grow-then-shrink restore the free stack exactly (a failed step leaves no trace).
//
// Phases: the constructor allocates everything (the free stack and every table at its full capacity,
// ceil(n_ctx / block_size) entries); grow/shrink only move ids and never allocate, and a table's data()
// stays valid for the allocator's lifetime (backends keep pointers to it during a step).
// Thread-safety: none; one thread owns it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace minfer {

class KvBlockAllocator {
 public:
  // n_seq sequence slots of at most n_ctx positions each, over `total` blocks of block_size positions.
  // Requires n_seq ≥ 1, n_ctx ≥ 1, block_size ≥ 1, total ≥ 0 (the caller validates the options).
  KvBlockAllocator(int n_seq, int n_ctx, int block_size, int total);

  int blockSize() const { return block_size_; }
  int totalBlocks() const { return total_; }
  int freeBlocks() const { return static_cast<int>(free_.size()); }
  // Blocks that cover `positions` positions: ceil(positions / block_size).
  int blocksFor(int64_t positions) const {
    return static_cast<int>((positions + block_size_ - 1) / block_size_);
  }
  // Blocks sequence `seq` must take to hold `positions` positions (0 when its table already covers them).
  int needed(int seq, int64_t positions) const;
  // Takes needed(seq, positions) blocks from the free stack onto seq's table. Returns false (and takes
  // nothing) when fewer are free or positions > n_ctx.
  bool grow(int seq, int64_t positions);
  // Releases seq's blocks beyond blocksFor(positions), last first (shrink(seq, 0) empties its table).
  void shrink(int seq, int64_t positions);
  // seq's block table: block ids of its positions 0, block_size, 2·block_size, …
  std::span<const int32_t> table(int seq) const { return tables_[static_cast<size_t>(seq)]; }

 private:
  int block_size_;
  int total_;
  int max_per_seq_;                          // ceil(n_ctx / block_size): a table's capacity
  std::vector<int32_t> free_;                // the free stack (top = back); capacity = total
  std::vector<std::vector<int32_t>> tables_; // (n_seq) tables, each reserved to max_per_seq_
};

}  // namespace minfer
