// Hopper warpgroup MMA (sm_90a `wgmma`) building blocks shared by the kernels that issue it (wgmma_matmul.cuh,
// mmq_blocks.cuh's MMQB_WGMMA form): the fences and waits of the asynchronous MMA, the 128-byte swizzle of K-major
// tiles and their shared-memory descriptors (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate",
// "Matrix Descriptor Format", "Shared Memory Matrix Layout").
#pragma once

#include "kernels/common.cuh"

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern {

// Byte offset of 16-byte chunk `c` (0..7) of row `r` inside a tile of 128-byte rows, 128-byte swizzle: chunk c of
// row r is stored at chunk c ^ (r mod 8), so 8 consecutive rows' chunk c fall on distinct banks.
__device__ __forceinline__ int swizzled(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// wgmma shared-memory descriptor of a K-major tile of 128-byte rows in the 128-byte swizzle whose first
// row is `p` (1024-byte aligned): start address >> 4 (bits 0–13), leading byte offset 1 (unused by
// swizzled K-major layouts), stride byte offset 1024 >> 4 (8 rows; bits 32–45), swizzle mode 1 = 128 B
// (bits 62–63). Advancing K by 16 f16 adds 32 bytes to the start address (2 in the descriptor).
__device__ __forceinline__ uint64_t tileDescriptor(const void* p) {
  const uint64_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return ((a & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// wgmma.fence: orders this warp's earlier register writes (accumulators, A fragments) and shared-memory accesses
// before the warpgroup MMAs that follow. commit_group closes the MMAs issued since the last commit into a group;
// wait_group N waits until at most N groups are pending (their accumulators and A registers are then free).
__device__ __forceinline__ void wgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmmaWait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory"); }
// Orders this thread's generic-proxy writes to shared memory (st.shared, cp.async) before reads by the
// async proxy (wgmma operands) that follow a barrier.
__device__ __forceinline__ void fenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The first 1024-byte aligned address at or after `p` inside dynamic shared memory (the 128-byte swizzle repeats every
// 8 rows of 128 bytes; a kernel reserves 1024 bytes more than its tiles for this).
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return p + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(p)) & 1023)) & 1023);
}

}  // namespace minfer::kern
#endif
