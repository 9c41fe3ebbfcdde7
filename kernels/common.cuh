// Shared pieces of the CUDA kernel families: launch-shape types (host and device), the quantized
// activation layout, and device helpers (f16 conversion, warp reductions, cp.async, MMA wrappers).
//
// Every kernel family lives in one kernels/<family>.cuh file that is compiled by NVRTC (no standard
// headers) with its shape and plane strides as -D constants, and included by host code (the CUDA
// runtime and the tests) for its launch shape only: device code is guarded by MINFER_DEVICE_CODE.
//
// Conventions common to every family (the "launch ABI"):
//   * Activation buffers are row-major, row t = token t of the batch, `width` elements per row, the
//     width of the execution plan's buffer (memory plan). Float buffers are f32.
//   * Dynamic sizes are kernel arguments: n_tokens by value; the position pos0 of the first token is
//     read from device memory (`const int* pos`, pos[0] = pos0) so a captured CUDA graph stays valid
//     while the position advances.
//   * Each module holds exactly one __global__ entry, extern "C", named minfer_<family>.
//   * Everything else (shapes, strides, epsilon, RoPE constants, tile sizes) is a compile-time
//     constant; the codegen passes it as -D<NAME>=<value> and records the options in the image.
//   * Each kernel declares its launch shape once, as <name>LaunchRule() (a LaunchRule: grid extents
//     as functions of n_tokens, block, dynamic shared memory); the compiler's op family copies it
//     into the artifact's launch record together with the typed argument list (compiler/codegen/ops/),
//     and <name>Launch(n_tokens) evaluates it for tests. The runtime never re-derives a launch.
#pragma once

#include "kernels/block_formats.h"
#include "kernels/stride_table.h"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MINFER_DEVICE_CODE 1
#endif

namespace minfer::kern {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Grid, block and dynamic shared memory of one launch.
struct LaunchShape {
  Dim3 grid;
  Dim3 block;
  unsigned smem = 0;  // dynamic shared memory, bytes (above 48 KiB the runtime raises the limit)
};

MINFER_HD unsigned ceilDiv(unsigned a, unsigned b) { return (a + b - 1) / b; }

// One grid extent as a function of the call's n_tokens: ⌈(per_token·n_tokens + constant) / divisor⌉
// (64-bit intermediate). The artifact's launch records carry it (schema GridExtent).
struct GridExtent {
  unsigned per_token = 0, constant = 1, divisor = 1;
  MINFER_HD unsigned at(unsigned n_tokens) const {
    const unsigned long long v = static_cast<unsigned long long>(per_token) * n_tokens + constant;
    return static_cast<unsigned>((v + divisor - 1) / divisor);
  }
};
// ⌈per_token·n_tokens / divisor⌉, and a fixed extent.
MINFER_HD GridExtent perToken(unsigned per_token, unsigned divisor = 1) { return {per_token, 0, divisor}; }
MINFER_HD GridExtent fixedExtent(unsigned n) { return {0, n, 1}; }

// A kernel's launch shape as a function of n_tokens, declared once per kernel (kernels/<family>.cuh
// <name>LaunchRule) and carried by the artifact's launch records (schema Launch): grid (x, y, z), or
// grid_large once n_tokens ≥ large_from (0: never); threads per block; dynamic shared memory.
struct LaunchRule {
  GridExtent grid[3] = {fixedExtent(1), fixedExtent(1), fixedExtent(1)};
  GridExtent grid_large[3] = {fixedExtent(1), fixedExtent(1), fixedExtent(1)};
  unsigned large_from = 0;
  Dim3 block;
  unsigned smem = 0;
  MINFER_HD LaunchShape at(unsigned n_tokens) const {
    const GridExtent* g = large_from > 0 && n_tokens >= large_from ? grid_large : grid;
    LaunchShape s;
    s.grid.x = g[0].at(n_tokens);
    s.grid.y = g[1].at(n_tokens);
    s.grid.z = g[2].at(n_tokens);
    s.block = block;
    s.smem = smem;
    return s;
  }
};

// Quantized activations (QuantizeAct output, "q8" buffers), per 32 consecutive values of a row:
//   q_i = round_half_even(x_i / d) ∈ [−127, 127] with d = max|x_i| / 127 (computed as x_i · (1/d);
//   d = 0 and q = 0 for an all-zero block), and the integer sums of q over each half of 16.
// A q8 buffer of width K (K % 32 == 0) for max_batch rows is laid out as
//   qs:   max_batch × K int8, row t at byte t·K
//   meta: max_batch × (K/32) Q8Meta, starting at byte max_batch·K, entry (t, b) at index t·(K/32) + b.
// The dequantized activation is d·q; matmuls on q8 inputs compute exactly W·(d·q) up to f32 rounding.
struct Q8Meta {
  float d;        // block scale
  short sum_lo;   // Σ q over elements 0..15 of the block
  short sum_hi;   // Σ q over elements 16..31
};
static_assert(sizeof(Q8Meta) == 8, "Q8Meta is 8 bytes");
constexpr unsigned kQ8Block = 32;

// Bytes of a q8 buffer of width k for max_batch rows.
MINFER_HD unsigned long long q8BufferBytes(unsigned max_batch, unsigned k) {
  return static_cast<unsigned long long>(max_batch) * k +
         static_cast<unsigned long long>(max_batch) * (k / kQ8Block) * sizeof(Q8Meta);
}
MINFER_HD unsigned long long q8MetaOffset(unsigned max_batch, unsigned k) {
  return static_cast<unsigned long long>(max_batch) * k;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
// +infinity in device code (NVRTC has no <cmath>, hence no INFINITY).
#define MINFER_INF __int_as_float(0x7f800000)

namespace minfer::kern {

__device__ __forceinline__ float h2f(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ uint16_t f2h(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float bf2f(uint16_t b) { return __int_as_float(static_cast<int>(b) << 16); }

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warpSumInt(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Asynchronous global → shared copies (sm_80+) to a shared-state-space address (__cvta_generic_to_shared). `bytes`
// is 4, 8 or 16; when `valid` is false the destination is zero-filled and nothing is read (src must still be a
// mapped address).
template <int kBytes>
__device__ __forceinline__ void cpAsyncShared(unsigned smem, const void* gmem, bool valid) {
  const int src_size = valid ? kBytes : 0;
  if (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem), "r"(src_size));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem), "l"(gmem), "n"(kBytes), "r"(src_size));
}
// The same to a generic pointer into shared memory (cpAsyncShared: to a shared-state-space address).
template <int kBytes>
__device__ __forceinline__ void cpAsync(void* smem, const void* gmem, bool valid) {
  cpAsyncShared<kBytes>(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are outstanding. The copies are then
// visible to this thread; other threads see them after a barrier (__syncwarp / __syncthreads).
template <int kPending>
__device__ __forceinline__ void cpAsyncWait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory"); }

// int8 tensor-core MMA (sm_80+): D(16×8, s32) = A(16×K, s8, row-major) · B(K×8, s8, col-major).
// Fragment layouts (PTX ISA, "mma.m16n8k32" / "mma.m16n8k16" for .s8): g = lane / 4, t = lane % 4;
//   A k32: a0 (row g, k 4t..4t+3), a1 (row g+8, same k), a2 (row g, k 16+4t..), a3 (row g+8, k 16+4t..)
//   A k16: a0 (row g, k 4t..4t+3), a1 (row g+8)
//   B k32: b0 (k 4t..4t+3, col g), b1 (k 16+4t.., col g);  B k16: b0 (k 4t.., col g)
//   D:     d0, d1 (row g, cols 2t, 2t+1), d2, d3 (row g+8, cols 2t, 2t+1)
__device__ __forceinline__ void mmaS8K32(int d[4], const int a[4], const int b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void mmaS8K16(int d[4], const int a[2], int b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
}

// f16 MMA (sm_80+): D(16×8, f32) += A(16×16, f16, row) · B(16×8, f16, col). Fragments (PTX ISA,
// "mma.m16n8k16" .f16): g = lane / 4, t = lane % 4; a0 (row g, k 2t..2t+1), a1 (row g+8), a2 (row g,
// k 8+2t..), a3 (row g+8, k 8+2t..); b0 (k 2t..2t+1, col g), b1 (k 8+2t..); d0,d1 (row g, cols 2t, 2t+1),
// d2,d3 (row g+8).
__device__ __forceinline__ void mmaF16(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix (sm_75+): four (x4) or two (x2) 8×8 matrices of 16-bit elements, i.e. 8 rows × 16 bytes each;
// lanes 8q..8q+7 give the row addresses of matrix q, and lane l receives bytes 4(l%4)..4(l%4)+3 of row l/4
// of each matrix: exactly the s8 MMA fragments when the matrices are the 16-byte halves of the tiles
// (PTX ISA, "ldmatrix").
__device__ __forceinline__ void ldmatrixX4Shared(int r[4], unsigned smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}
// From a generic pointer; ldmatrixX4Shared takes a shared-state-space address (__cvta_generic_to_shared), so a
// kernel can hoist a row's address out of its loops and give the unrolled offsets as immediates.
__device__ __forceinline__ void ldmatrixX4(int r[4], const int8_t* row) {
  ldmatrixX4Shared(r, static_cast<unsigned>(__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void ldmatrixX2(int r[2], const int8_t* row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

__device__ __forceinline__ int dp4a(int a, int b, int c) {
  int d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The q8 form of one block of 32 consecutive values held by 32 / V consecutive lanes, V values each
// (lane g of the group: elements V·g … V·g + V − 1): d = max|x| / 127, q = rint(x · (1/d)) clamped to
// ±127 (0 when d = 0), and the sums of q over elements 0..15 and 16..31. IEEE division and
// multiplication, so a host mirror reproduces q and d bit for bit. Every lane of each group calls it (with
// zeros past the data; `store` false there): lane g writes its V values of q at qs + V·g, lane 0 of the
// group writes *meta. The definition of OpKind QuantizeAct (quantize_act.cuh) and of the q8 outputs fused
// into other kernels (RMS_Q8, EW_Q8, ATT_Q8).
template <int V>
__device__ __forceinline__ void quantizeBlock(const float (&x)[V], int8_t* qs, Q8Meta* meta, bool store) {
  static_assert(V == 1 || V == 4 || V == 8, "1, 4 or 8 values per lane");
  constexpr int kGroup = 32 / V;
  const int g = threadIdx.x % kGroup;
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) amax = fmaxf(amax, fabsf(x[j]));
#pragma unroll
  for (int o = 1; o < kGroup; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  unsigned packed[V == 8 ? 2 : 1] = {};
  int sum = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    int q = static_cast<int>(rintf(x[j] * id));
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    sum += q;
    packed[j / 4] |= (static_cast<unsigned>(q) & 0xffu) << (8 * (j % 4));
  }
  int lo = g < kGroup / 2 ? sum : 0, hi = g < kGroup / 2 ? 0 : sum;
#pragma unroll
  for (int o = 1; o < kGroup; o <<= 1) {
    lo += __shfl_xor_sync(0xffffffffu, lo, o);
    hi += __shfl_xor_sync(0xffffffffu, hi, o);
  }
  if (!store) return;
  if constexpr (V == 8) *reinterpret_cast<uint2*>(qs + 8 * g) = make_uint2(packed[0], packed[1]);
  else if constexpr (V == 4) *reinterpret_cast<unsigned*>(qs + 4 * g) = packed[0];
  else qs[g] = static_cast<int8_t>(packed[0]);
  if (g == 0) {
    Q8Meta m;
    m.d = d;
    m.sum_lo = static_cast<short>(lo);
    m.sum_hi = static_cast<short>(hi);
    *meta = m;
  }
}

// Programmatic dependent launch (schema Launch.overlap; sm_90 and later). The runtime may launch a
// kernel while the previous kernel of its stream is still running. Every kernel entry therefore starts
// with overlapPrologue() (or prefetches or reads the positions, then calls it; a block with nothing to do may return
// before it): griddepcontrol.wait returns once the previous kernel has completed and its writes are visible, so
// nothing before it may touch memory an earlier kernel writes or this kernel writes (only weight planes, which no
// decode or prefill kernel writes, and the step's positions — `pos`, a batch step's row positions — which the host
// uploads before the step's first kernel and no kernel writes, may be read before it).
// griddepcontrol.launch_dependents then lets the next kernel start its own prologue: once every block of this grid
// has passed this point (or exited), at most one kernel ahead. Launched
// normally, or on older GPUs, both are no-ops. (PTX ISA: griddepcontrol; CUDA programming guide,
// "Programmatic Dependent Launch and Synchronization".)
__device__ __forceinline__ void overlapPrologue() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Starts moving [p, p + bytes) from HBM into L2 without waiting (sm_90 bulk prefetch; p 16-byte aligned,
// bytes a multiple of 16); a no-op before sm_90. For weight rows a kernel will read after overlapPrologue().
__device__ __forceinline__ void prefetchL2(const void* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace minfer::kern

#endif  // MINFER_DEVICE_CODE
