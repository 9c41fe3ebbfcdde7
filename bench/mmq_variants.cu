// Variant benchmark of the prefill MMQ kernel (kernels/mmq.cuh), built by nvcc on a GPU machine with the
// kernel's -D constants plus MMQ_STAGES (scripts/device-mmq-variants.sh builds a grid of them):
// random int8 weights, group scales and mins, q8 activations; checks 256 sampled outputs against a
// float64 reference of the kernel's formula, then times the launch (CUDA events, median of 9 runs of
// 10 launches). Prints one line: variant, N, K, G, tokens, ms, TOPS (2·N·K·T / time), max rel error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/mmq.cuh"

#include "bench/cuda_check.h"

int main(int argc, char** argv) {
  using namespace minfer::kern;
  const int T = argc > 1 ? std::atoi(argv[1]) : 512;
  const char* name = argc > 2 ? argv[2] : "variant";
  constexpr int N = MMQ_N, K = MMQ_K, G = MMQ_GROUP;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> wq_d(0, 15), xq_d(-127, 127);
  std::uniform_real_distribution<float> sc_d(0.001f, 0.02f), mn_d(-0.1f, 0.0f), xd_d(0.001f, 0.05f);
  std::vector<int8_t> wq(static_cast<size_t>(N) * MMQ_Q_PITCH, 0), xq(static_cast<size_t>(T) * K);
  std::vector<float> ws(static_cast<size_t>(N) * MMQ_S_PITCH / 4), wm(static_cast<size_t>(N) * (MMQ_M_PITCH ? MMQ_M_PITCH : 4) / 4);
  std::vector<Q8Meta> xm(static_cast<size_t>(T) * K / 32);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < K; ++c) wq[static_cast<size_t>(r) * MMQ_Q_PITCH + c] = static_cast<int8_t>(wq_d(rng));
  for (auto& v : ws) v = sc_d(rng);
  for (auto& v : wm) v = mn_d(rng);
  for (auto& v : xq) v = static_cast<int8_t>(xq_d(rng));
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < K / 32; ++b) {
      int lo = 0, hi = 0;
      for (int i = 0; i < 32; ++i) (i < 16 ? lo : hi) += xq[static_cast<size_t>(t) * K + b * 32 + i];
      xm[static_cast<size_t>(t) * (K / 32) + b] = Q8Meta{xd_d(rng), static_cast<short>(lo), static_cast<short>(hi)};
    }
  int8_t *d_wq, *d_xq;
  float *d_ws, *d_wm, *d_out;
  Q8Meta* d_xm;
  CK(cudaMalloc(&d_wq, wq.size()));
  CK(cudaMalloc(&d_xq, xq.size()));
  CK(cudaMalloc(&d_ws, ws.size() * 4));
  CK(cudaMalloc(&d_wm, wm.size() * 4));
  CK(cudaMalloc(&d_xm, xm.size() * sizeof(Q8Meta)));
  CK(cudaMalloc(&d_out, static_cast<size_t>(T) * N * 4));
  CK(cudaMemcpy(d_wq, wq.data(), wq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_xq, xq.data(), xq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_ws, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_wm, wm.data(), wm.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_xm, xm.data(), xm.size() * sizeof(Q8Meta), cudaMemcpyHostToDevice));
  CK(cudaMemset(d_out, 0xff, static_cast<size_t>(T) * N * 4));  // NaN poison
  const LaunchShape sh = mmqLaunch(N, T, MMQ_TM, MMQ_TN, G, MMQ_HAS_MIN != 0);
  CK(cudaFuncSetAttribute(minfer_mmq, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sh.smem)));
  const float* bias = nullptr;
  auto launch = [&] {
    minfer_mmq<<<dim3(sh.grid.x, sh.grid.y), dim3(sh.block.x), sh.smem>>>(d_wq, d_ws, d_wm, bias, d_xq, d_xm, d_out, T);
  };
  launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> out(static_cast<size_t>(T) * N);
  CK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0, max_ref = 0;
  std::uniform_int_distribution<int> rd(0, N - 1), td(0, T - 1);
  for (int s = 0; s < 256; ++s) {
    const int r = rd(rng), t = td(rng);
    double ref = 0;
    for (int c = 0; c < K; ++c) {
      const Q8Meta& m = xm[static_cast<size_t>(t) * (K / 32) + c / 32];
      const double w = double(ws[static_cast<size_t>(r) * (MMQ_S_PITCH / 4) + c / G]) * wq[static_cast<size_t>(r) * MMQ_Q_PITCH + c] +
                       (MMQ_HAS_MIN ? double(wm[static_cast<size_t>(r) * (MMQ_M_PITCH / 4) + c / G]) : 0.0);
      ref += w * double(m.d) * xq[static_cast<size_t>(t) * K + c];
    }
    const double got = out[static_cast<size_t>(t) * N + r];
    if (!std::isfinite(got)) max_err = INFINITY;
    max_err = std::max(max_err, std::fabs(got - ref));
    max_ref = std::max(max_ref, std::fabs(ref));
  }
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> ms;
  for (int run = 0; run < 9; ++run) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < 10; ++i) launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m / 10);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double t_ms = ms[ms.size() / 2];
  std::printf("%-28s N=%6d K=%5d G=%d T=%d  %8.4f ms  %6.1f TOPS  rel %.2e  (spread %.4f..%.4f)\n", name, N, K, G, T, t_ms,
              2.0 * N * K * T / (t_ms * 1e-3) / 1e12, max_err / std::max(max_ref, 1e-30), ms.front(), ms.back());
  return 0;
}
