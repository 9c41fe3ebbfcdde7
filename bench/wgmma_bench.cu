// Variant benchmark of the Hopper prefill matmul (kernels/wgmma_matmul.cuh), built by nvcc for sm_90a on
// a GPU machine with the kernel's -D constants (scripts/device-wgmma-variants.sh builds a grid of them):
// random f16 weights (values of a Q4_K-like grid: s·q + m), f16 or q8 activations; checks 512 sampled
// outputs against a float64 reference on the same f16 operands, then times the launch (CUDA events,
// median of 9 runs of 10 launches, rotating over ≥ 512 MB of weight copies so each launch reads HBM).
// Prints one line: variant, N, K, tokens, µs, TFLOPS (2·N·K·T / time), max |err| / max |ref|.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/wgmma_matmul.cuh"

#include "bench/cuda_check.h"

static uint16_t toHalf(float f) { return __half_as_ushort(__float2half_rn(f)); }
static float fromHalf(uint16_t h) { return __half2float(__ushort_as_half(h)); }

int main(int argc, char** argv) {
  using namespace minfer::kern;
  // argv: variant name, then token counts (default 512); data is made once for the largest.
  const char* name = argc > 1 ? argv[1] : "variant";
  std::vector<int> counts;
  for (int i = 2; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts.push_back(512);
  const int T = *std::max_element(counts.begin(), counts.end());
  constexpr int N = WG_N, K = WG_K, P = WG_W_PITCH / 2;
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int> q_d(0, 15), xq_d(-127, 127);
  std::uniform_real_distribution<float> s_d(0.001f, 0.02f), m_d(-0.1f, 0.0f), x_d(-2.0f, 2.0f), xd_d(0.001f, 0.05f);
  std::vector<uint16_t> w(static_cast<size_t>(N) * P, 0);
  for (int r = 0; r < N; ++r)
    for (int g = 0; g < K / 32; ++g) {
      const float s = s_d(rng), m = m_d(rng);
      for (int c = g * 32; c < g * 32 + 32; ++c) w[static_cast<size_t>(r) * P + c] = toHalf(s * static_cast<float>(q_d(rng)) + m);
    }
  // Activations as the kernel sees them in f16 (xf), and what the launch reads (xh or xq + meta).
  std::vector<float> xf(static_cast<size_t>(T) * K);
  std::vector<uint16_t> xh(static_cast<size_t>(T) * K);
  std::vector<int8_t> xq(static_cast<size_t>(T) * K);
  std::vector<Q8Meta> xm(static_cast<size_t>(T) * ((K + 31) / 32));
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < (K + 31) / 32; ++b) {
      const float d = xd_d(rng);
      xm[static_cast<size_t>(t) * ((K + 31) / 32) + b] = Q8Meta{d, 0, 0};
      for (int c = b * 32; c < std::min(K, b * 32 + 32); ++c) {
        const size_t i = static_cast<size_t>(t) * K + c;
        if (WG_ACT == 0) {
          xh[i] = toHalf(x_d(rng));
        } else {
          xq[i] = static_cast<int8_t>(xq_d(rng));
          xh[i] = toHalf(static_cast<float>(xq[i]) * d);
        }
        xf[i] = fromHalf(xh[i]);
      }
    }
  const size_t wbytes = w.size() * 2;
  const int copies = static_cast<int>(std::max<size_t>(1, (512u << 20) / wbytes + 1));
  std::vector<uint16_t*> d_w(copies);
  for (auto& p : d_w) {
    CK(cudaMalloc(&p, wbytes));
    CK(cudaMemcpy(p, w.data(), wbytes, cudaMemcpyHostToDevice));
  }
  void* d_x;
  Q8Meta* d_xm;
  float *d_out, *d_bias;
  CK(cudaMalloc(&d_x, WG_ACT == 0 ? xh.size() * 2 : xq.size()));
  CK(cudaMemcpy(d_x, WG_ACT == 0 ? static_cast<const void*>(xh.data()) : xq.data(), WG_ACT == 0 ? xh.size() * 2 : xq.size(),
                cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_xm, xm.size() * sizeof(Q8Meta)));
  CK(cudaMemcpy(d_xm, xm.data(), xm.size() * sizeof(Q8Meta), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_bias, N * 4));
  CK(cudaMemset(d_bias, 0, N * 4));
  CK(cudaMalloc(&d_out, static_cast<size_t>(T) * N * 4));

  auto run = [&](int n_tokens) -> int {
    const LaunchShape ls = wgmmaMatmulLaunch(N, n_tokens, WG_BM, WG_BN, WG_STAGES);
    CK(cudaFuncSetAttribute(minfer_wgmma_matmul, cudaFuncAttributeMaxDynamicSharedMemorySize, ls.smem));
    const dim3 grid(ls.grid.x, ls.grid.y), block(ls.block.x);
    auto launch = [&](int i) {
      minfer_wgmma_matmul<<<grid, block, ls.smem>>>(d_w[i % copies], d_bias, d_x, d_xm, d_out, n_tokens);
    };
    CK(cudaMemset(d_out, 0xFF, static_cast<size_t>(T) * N * 4));  // NaN: an unwritten output fails the check
    launch(0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> out(static_cast<size_t>(n_tokens) * N);
    CK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
    // Every output must be written (finite); 512 sampled ones (and the last row/col) against float64.
    size_t bad = 0;
    for (float v : out) bad += !std::isfinite(v);
    double max_err = 0, max_ref = 0;
    std::uniform_int_distribution<int> t_d(0, n_tokens - 1), r_d(0, N - 1);
    for (int s = 0; s < 512; ++s) {
      const int t = s == 0 ? n_tokens - 1 : t_d(rng), r = s == 0 ? N - 1 : r_d(rng);
      double ref = 0;
      for (int c = 0; c < K; ++c)
        ref += static_cast<double>(fromHalf(w[static_cast<size_t>(r) * P + c])) * xf[static_cast<size_t>(t) * K + c];
      max_err = std::max(max_err, std::fabs(ref - out[static_cast<size_t>(t) * N + r]));
      max_ref = std::max(max_ref, std::fabs(ref));
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int run = 0; run < 9; ++run) {
      CK(cudaEventRecord(e0));
      for (int i = 0; i < 10; ++i) launch(run * 10 + i);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float m;
      CK(cudaEventElapsedTime(&m, e0, e1));
      ms.push_back(m / 10);
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double us = ms[4] * 1e3;
    std::printf("%-28s N=%6d K=%5d T=%5d %9.2f us %7.1f TFLOPS  rel_err %.2e  non-finite %zu\n", name, N, K, n_tokens, us,
                2.0 * N * K * n_tokens / (us * 1e-6) / 1e12, max_err / max_ref, bad);
    return static_cast<int>(bad != 0 || max_err / max_ref > 1e-4);
  };
  int failed = 0;
  for (const int n_tokens : counts) failed |= run(n_tokens);
  return failed;
}
