// Benchmark of the small-batch matmul (kernels/gemm_small.cuh), built by nvcc on a GPU machine with the
// kernel's -D constants (scripts/device-gemm-small.sh builds the 7B's shapes): a random kI8 plane of a Q4_K-like
// weight (q ∈ 0..15 with SB_BITS 8, or the 4-bit kPacked form with SB_BITS 4), scales and mins per group of
// SB_GROUP, q8 activations for 64 rows; checks the outputs of each row count against a float64 reference of
// the same definition (the first and last 40 weight rows, every 97th between), then times the launch (CUDA events, median of 9 runs of 20 launches, rotating over
// ≥ 512 MB of weight copies so each launch reads HBM). Prints one line per row count: N, K, splits, rows,
// µs, GB/s of the plane read, max |err| / max |ref|.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/gemm_small.cuh"

#include "bench/cuda_check.h"

int main() {
  using minfer::kern::Q8Meta;
  constexpr int N = SB_N, K = SB_K, G = SB_GROUP, R = 64;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> q4(0, 15), q8(-127, 127);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  const size_t plane_bytes = static_cast<size_t>(SB_PITCH) * N;
  std::vector<uint8_t> plane(plane_bytes, 0);
  std::vector<int> q(static_cast<size_t>(N) * K);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < K; ++c) {
      const int v = q4(rng);
      q[static_cast<size_t>(r) * K + c] = v + SB_Q_OFFSET;
      if (SB_BITS == 8) {
        plane[static_cast<size_t>(r) * SB_PITCH + c] = static_cast<uint8_t>(v + SB_Q_OFFSET);
      } else {
        uint8_t& b = plane[static_cast<size_t>(r) * SB_PITCH + (c / 32) * 16 + c % 16];
        b |= static_cast<uint8_t>(v << ((c % 32) < 16 ? 0 : 4));
      }
    }
  std::vector<float> sc(static_cast<size_t>(N) * (SB_S_PITCH / 4)), mn(sc.size());
  for (int r = 0; r < N; ++r)
    for (int g = 0; g < K / G; ++g) {
      sc[static_cast<size_t>(r) * (SB_S_PITCH / 4) + g] = 0.01f * u(rng);
      mn[static_cast<size_t>(r) * (SB_S_PITCH / 4) + g] = -0.05f * u(rng);
    }
  std::vector<int8_t> xq(static_cast<size_t>(R) * K);
  std::vector<Q8Meta> xm(static_cast<size_t>(R) * (K / 32));
  for (int t = 0; t < R; ++t)
    for (int b = 0; b < K / 32; ++b) {
      int lo = 0, hi = 0;
      for (int i = 0; i < 32; ++i) {
        const int v = q8(rng);
        xq[static_cast<size_t>(t) * K + 32 * b + i] = static_cast<int8_t>(v);
        (i < 16 ? lo : hi) += v;
      }
      xm[static_cast<size_t>(t) * (K / 32) + b] = {0.02f * u(rng), static_cast<short>(lo), static_cast<short>(hi)};
    }
  // Weight copies rotated through so that each launch streams its plane from HBM.
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / plane_bytes + 1));
  std::vector<uint8_t*> d_w(copies);
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&d_w[i], plane_bytes));
    CK(cudaMemcpy(d_w[i], plane.data(), plane_bytes, cudaMemcpyHostToDevice));
  }
  float *d_s, *d_m, *d_out, *d_partial;
  int8_t* d_xq;
  Q8Meta* d_xm;
  unsigned* d_cnt;
  CK(cudaMalloc(&d_s, sc.size() * 4));
  CK(cudaMalloc(&d_m, mn.size() * 4));
  CK(cudaMalloc(&d_out, static_cast<size_t>(R) * N * 4));
  CK(cudaMalloc(&d_partial, std::max<unsigned long long>(4, minfer::kern::gemmSmallScratchBytes(N, SB_SPLITS))));
  CK(cudaMalloc(&d_xq, xq.size()));
  CK(cudaMalloc(&d_xm, xm.size() * sizeof(Q8Meta)));
  CK(cudaMalloc(&d_cnt, minfer::kern::gemmSmallCounterBytes(N)));
  CK(cudaMemset(d_cnt, 0, minfer::kern::gemmSmallCounterBytes(N)));
  CK(cudaMemcpy(d_s, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_m, mn.data(), mn.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_xq, xq.data(), xq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_xm, xm.data(), xm.size() * sizeof(Q8Meta), cudaMemcpyHostToDevice));
  const minfer::kern::LaunchShape sh = minfer::kern::gemmSmallLaunch(N, SB_SPLITS);
  const dim3 grid(sh.grid.x, sh.grid.y), block(sh.block.x);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int rows : {1, 2, 8, 16, 32, 64}) {
    minfer_gemm_small<<<grid, block>>>(d_w[0], d_s, d_m, nullptr, d_xq, d_xm, d_out, d_partial, d_cnt, rows);
    CK(cudaDeviceSynchronize());
    std::vector<float> got(static_cast<size_t>(rows) * N);
    CK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
    double max_err = 0, max_ref = 0;
    for (int t = 0; t < rows; ++t)
      for (int r = 0; r < N; r += (r < 40 || r + 40 >= N) ? 1 : 97) {  // edges and a sample
        double ref = 0;
        for (int b = 0; b < K / 32; ++b) {
          const Q8Meta& m = xm[static_cast<size_t>(t) * (K / 32) + b];
          for (int i = 0; i < 32; ++i) {
            const int c = 32 * b + i, g = c / G;
            const double w = static_cast<double>(sc[static_cast<size_t>(r) * (SB_S_PITCH / 4) + g]) *
                                 q[static_cast<size_t>(r) * K + c] +
                             (SB_HAS_MIN ? mn[static_cast<size_t>(r) * (SB_S_PITCH / 4) + g] : 0.0);
            ref += w * m.d * xq[static_cast<size_t>(t) * K + c];
          }
        }
        max_ref = std::max(max_ref, std::fabs(ref));
        max_err = std::max(max_err, std::fabs(ref - got[static_cast<size_t>(t) * N + r]));
      }
    std::vector<float> ms;
    for (int rep = 0; rep < 9; ++rep) {
      CK(cudaEventRecord(e0));
      for (int i = 0; i < 20; ++i)
        minfer_gemm_small<<<grid, block>>>(d_w[(rep * 20 + i) % copies], d_s, d_m, nullptr, d_xq, d_xm, d_out, d_partial,
                                           d_cnt, rows);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t / 20);
    }
    std::sort(ms.begin(), ms.end());
    const double us = ms[4] * 1e3;
    std::printf("gemm_small bits %d group %d N %d K %d splits %d rows %2d: %8.2f us %7.0f GB/s  err %.2e\n", SB_BITS, G,
                N, K, SB_SPLITS, rows, us, plane_bytes / us * 1e-3, max_err / max_ref);
  }
  return 0;
}
