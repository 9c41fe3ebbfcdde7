// Hopper warpgroup MMA (sm_90a `wgmma`) building blocks shared by the kernels that issue it (wgmma_matmul.cuh,
// mmq_blocks.cuh's MMQB_WGMMA form): the fences and waits of the asynchronous MMA, the 128-byte swizzle of K-major
// tiles and their shared-memory descriptors, the MMA with A in registers (PTX ISA, "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate", "Matrix Descriptor Format", "Shared Memory Matrix Layout").
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
__device__ __forceinline__ void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Orders this thread's generic-proxy writes to shared memory (st.shared, cp.async) before reads by the
// async proxy (wgmma operands) that follow a barrier.
__device__ __forceinline__ void fenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The first 1024-byte aligned address at or after `p` inside dynamic shared memory (the 128-byte swizzle repeats every
// 8 rows of 128 bytes; a kernel reserves 1024 bytes more than its tiles for this).
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return p + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(p)) & 1023)) & 1023);
}

// D(64 × 8·NI, f32) += A(64 × 16, f16, from registers) · B(16 × 8·NI, f16, K-major in shared memory, descriptor b),
// for one warpgroup (sm_90a; PTX ISA, "wgmma.mma_async" with A in registers), NI = 2, 4 or 8: lane l of warp w holds A
// rows 16w + l/4 (+8) as mma.m16n8k16's fragment (a0, a1: k 2(l%4) …, a2, a3: k 8 + 2(l%4) …) and the accumulators of
// those rows, columns 8j + 2(l%4) (+1), as d[j][2h + e] (row +8h, column +e): mma.sync's acc[ni][e] for ni = j. The A
// registers must stay unchanged until a wgmmaWait retires the MMA (its caller waits before writing new ones).
template <int kNi>
__device__ __forceinline__ void wgmmaRegA(float (&d)[kNi][4], const unsigned (&a)[4], uint64_t b);
template <>
__device__ __forceinline__ void wgmmaRegA<2>(float (&d)[2][4], const unsigned (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmmaRegA<4>(float (&d)[4][4], const unsigned (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmmaRegA<8>(float (&d)[8][4], const unsigned (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

}  // namespace minfer::kern
#endif
