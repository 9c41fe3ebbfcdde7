// CK(call): a CUDA runtime call in a standalone benchmark's main(); on failure prints the file, line, call and
// cudaGetErrorString, then returns 1 from the enclosing function.
#pragma once

#include <cstdio>

#include <cuda_runtime.h>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)
