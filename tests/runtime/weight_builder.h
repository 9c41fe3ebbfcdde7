// Test helper: random GGUF-style weights of any supported type and the planes the CPU backend reads.
//
// A RandomWeight holds the source blocks (as a GGUF tensor would) and their reference values
// (dequantizeBlock, the format definition). buildPlanes() lays them out as planes with deliberately
// non-minimal row pitches and group pitches, with the padding filled with 0xCD, so that any reader
// that does not go through the stride table reads garbage.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/stride_table.h"
#include "runtime/cpu/cpu_ops.h"

namespace minfer::test {

struct RandomWeight {
  GgmlType type = GgmlType::F32;
  uint64_t rows = 0, cols = 0;
  std::vector<uint8_t> source;  // rows × (cols / block_size) blocks, GGUF order
  std::vector<float> values;    // rows × cols, dequantizeBlock of the source (the reference)
};

// Random blocks of `type` (quantized: random q bits, scale fields of magnitude ~`scale` / 16;
// float types: uniform values in [−scale, scale] rounded to the type). cols must be a multiple of
// the block size.
RandomWeight makeRandomWeight(GgmlType type, uint64_t rows, uint64_t cols, std::mt19937_64& rng, float scale = 1.0f);

struct BuiltPlane {
  StrideTable table;
  std::vector<uint8_t> bytes;  // exactly table.bytes()
};

struct PlaneOptions {
  bool matmul = true;          // dense plane (float types) or i8 + scale (+ min) (quantized types)
  bool blocks = false;         // a kBlocks plane (the source rows)
  uint32_t extra_pitch = 16;   // bytes of padding added to every row pitch
  uint32_t group_pitch = 4;    // scale/min planes: bytes between groups (≥ 4)
};

std::vector<BuiltPlane> buildPlanes(const RandomWeight& w, const PlaneOptions& options);

// Views of built planes (which must outlive the views).
cpu::WeightPlanes viewPlanes(const std::vector<BuiltPlane>& planes, const char* name);

std::vector<float> randomFloats(size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f);

// max|a − ref| / max|ref|
double maxRelError(const float* a, const double* ref, size_t n);

}  // namespace minfer::test
