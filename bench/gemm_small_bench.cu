// Benchmark of the small-batch matmul on kI8 / kPacked planes (kernels/gemm_small.cuh), built by nvcc on a GPU
// machine with the kernel's SB_* constants (scripts/device-gemm-small.sh builds the 7B's shapes): a random kI8 plane of a Q4_K-like weight (q ∈ 0..15 with SB_BITS 8,
//     or the 4-bit kPacked form with SB_BITS 4), scales and mins per group of SB_GROUP;
// q8 activations for 64 rows; checks the outputs of each row count against a float64 reference of the same
// definition (the first and last 40 weight rows, every 97th between), then times the launch (CUDA events, median
// of 9 runs of 20 launches, rotating over ≥ 512 MB of weight copies so each launch reads HBM). Prints one line
// per row count: N, K, splits, rows, µs, GB/s of the plane read, max |err| / max |ref|.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/gemm_small.cuh"

#include "bench/cuda_check.h"

namespace {

using minfer::kern::Q8Meta;
constexpr int kRows = 64;

// Random q8 activations for kRows rows of width k (values ±127, d 0.01 … 0.03, the half sums).
void randomActivations(int k, std::mt19937& rng, std::vector<int8_t>& xq, std::vector<Q8Meta>& xm) {
  std::uniform_int_distribution<int> q8(-127, 127);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  xq.resize(static_cast<size_t>(kRows) * k);
  xm.resize(static_cast<size_t>(kRows) * (k / 32));
  for (int t = 0; t < kRows; ++t)
    for (int b = 0; b < k / 32; ++b) {
      int lo = 0, hi = 0;
      for (int i = 0; i < 32; ++i) {
        const int v = q8(rng);
        xq[static_cast<size_t>(t) * k + 32 * b + i] = static_cast<int8_t>(v);
        (i < 16 ? lo : hi) += v;
      }
      xm[static_cast<size_t>(t) * (k / 32) + b] = {0.02f * u(rng), static_cast<short>(lo), static_cast<short>(hi)};
    }
}

// Median µs of one launch (9 runs of 20 launches; launch(i) launches on weight copy i % copies).
template <class Launch>
int medianMicros(Launch launch, int copies, double* us) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int rep = 0; rep < 9; ++rep) {
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i) launch((rep * 20 + i) % copies);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / 20);
  }
  std::sort(ms.begin(), ms.end());
  *us = ms[4] * 1e3;
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 0;
}

// `copies` device copies of `plane` (at least 2, ≥ 512 MB together) so that each launch streams from HBM.
int weightCopies(const std::vector<uint8_t>& plane, std::vector<uint8_t*>& d_w) {
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / plane.size() + 1));
  d_w.resize(copies);
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&d_w[i], plane.size()));
    CK(cudaMemcpy(d_w[i], plane.data(), plane.size(), cudaMemcpyHostToDevice));
  }
  return 0;
}

// The host activations (randomActivations) and the device weight copies (weightCopies).
int activationsAndCopies(int k, std::mt19937& rng, const std::vector<uint8_t>& plane, std::vector<int8_t>& xq,
                         std::vector<Q8Meta>& xm, std::vector<uint8_t*>& d_w) {
  randomActivations(k, rng, xq, xm);
  return weightCopies(plane, d_w);
}

// The call's device buffers: the q8 activations, the output (kRows × N f32), the split-K scratch and counters.
struct DeviceCall {
  int8_t* xq = nullptr;
  Q8Meta* xm = nullptr;
  float* out = nullptr;
  float* partial = nullptr;
  unsigned* cnt = nullptr;
};
int deviceCall(const std::vector<int8_t>& xq, const std::vector<Q8Meta>& xm, int n, unsigned long long scratch_bytes,
               unsigned long long counter_bytes, DeviceCall& c) {
  CK(cudaMalloc(&c.out, static_cast<size_t>(kRows) * n * 4));
  CK(cudaMalloc(&c.partial, std::max<unsigned long long>(4, scratch_bytes)));
  CK(cudaMalloc(&c.xq, xq.size()));
  CK(cudaMalloc(&c.xm, xm.size() * sizeof(Q8Meta)));
  CK(cudaMalloc(&c.cnt, counter_bytes));
  CK(cudaMemset(c.cnt, 0, counter_bytes));
  CK(cudaMemcpy(c.xq, xq.data(), xq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(c.xm, xm.data(), xm.size() * sizeof(Q8Meta), cudaMemcpyHostToDevice));
  return 0;
}

}  // namespace

int main() {
  constexpr int N = SB_N, K = SB_K, G = SB_GROUP;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> q4(0, 15);
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
  std::vector<int8_t> xq;
  std::vector<Q8Meta> xm;
  std::vector<uint8_t*> d_w;
  if (activationsAndCopies(K, rng, plane, xq, xm, d_w)) return 1;
  const int copies = static_cast<int>(d_w.size());
  float *d_s, *d_m;
  CK(cudaMalloc(&d_s, sc.size() * 4));
  CK(cudaMalloc(&d_m, mn.size() * 4));
  CK(cudaMemcpy(d_s, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_m, mn.data(), mn.size() * 4, cudaMemcpyHostToDevice));
  DeviceCall c;
  if (deviceCall(xq, xm, N, minfer::kern::gemmSmallScratchBytes(N, SB_SPLITS), minfer::kern::gemmSmallCounterBytes(N), c))
    return 1;
  const minfer::kern::LaunchShape sh = minfer::kern::gemmSmallLaunch(N, SB_SPLITS);
  const dim3 grid(sh.grid.x, sh.grid.y), block(sh.block.x);
  for (int rows : {1, 2, 8, 16, 32, 64}) {
    minfer_gemm_small<<<grid, block>>>(d_w[0], d_s, d_m, nullptr, c.xq, c.xm, c.out, c.partial, c.cnt, rows);
    CK(cudaDeviceSynchronize());
    std::vector<float> got(static_cast<size_t>(rows) * N);
    CK(cudaMemcpy(got.data(), c.out, got.size() * 4, cudaMemcpyDeviceToHost));
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
    double us = 0;
    if (medianMicros([&](int i) {
          minfer_gemm_small<<<grid, block>>>(d_w[i], d_s, d_m, nullptr, c.xq, c.xm, c.out, c.partial, c.cnt, rows);
        }, copies, &us))
      return 1;
    std::printf("gemm_small bits %d group %d N %d K %d splits %d rows %2d: %8.2f us %7.0f GB/s  err %.2e\n", SB_BITS, G,
                N, K, SB_SPLITS, rows, us, plane_bytes / us * 1e-3, max_err / max_ref);
  }
  return 0;
}
