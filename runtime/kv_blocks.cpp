// KvBlockAllocator: free stack and per-sequence block tables of a paged KV cache.
#include "runtime/kv_blocks.h"

#include <algorithm>
#include <cassert>

namespace minfer {

KvBlockAllocator::KvBlockAllocator(int n_seq, int n_ctx, int block_size, int total)
    : block_size_(block_size), total_(total), max_per_seq_(static_cast<int>((int64_t{n_ctx} + block_size - 1) / block_size)),
      tables_(static_cast<size_t>(n_seq)) {
  assert(n_seq >= 1 && n_ctx >= 1 && block_size >= 1 && total >= 0);
  free_.reserve(static_cast<size_t>(total));
  for (int b = total - 1; b >= 0; --b) free_.push_back(b);  // block 0 on top
  for (std::vector<int32_t>& t : tables_) t.reserve(static_cast<size_t>(max_per_seq_));
}

int KvBlockAllocator::needed(int seq, int64_t positions) const {
  const int have = static_cast<int>(tables_[static_cast<size_t>(seq)].size());
  return std::max(0, blocksFor(positions) - have);
}

bool KvBlockAllocator::grow(int seq, int64_t positions) {
  const int n = needed(seq, positions);
  if (n > freeBlocks() || blocksFor(positions) > max_per_seq_) return false;
  std::vector<int32_t>& t = tables_[static_cast<size_t>(seq)];
  for (int i = 0; i < n; ++i) {
    t.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlockAllocator::shrink(int seq, int64_t positions) {
  std::vector<int32_t>& t = tables_[static_cast<size_t>(seq)];
  const size_t keep = static_cast<size_t>(std::max(0, blocksFor(positions)));
  while (t.size() > keep) {
    free_.push_back(t.back());
    t.pop_back();
  }
}

}  // namespace minfer
