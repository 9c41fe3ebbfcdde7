// GGUF/ggml tensor types and quantized block formats: layouts, sizes and reference dequantization.
//
// The one place that defines each block format. Included by the compiler's plane transforms, the
// CPU backend and the CUDA kernels (compiles under g++, clang, nvcc and NVRTC: no standard headers
// under NVRTC).
//
// Sources of the formats: the GGUF specification (ggml/docs/gguf.md, "GGML type" table) for the type
// ids; the block layouts and dequantization formulas are ggml's format definitions (ggml-common.h /
// ggml-quants.c, "dequantize_row_*"), restated here from those definitions. QK_K = 256 for the
// K-quants ("super-blocks" of 256 weights split into groups of 16 or 32).
//
// Every format also has a *decomposed* form used by the weight planes (DESIGN.md §3): for element j of
// a block,   value_j = scale[g] * q_j + min[g],   g = j / kGroupSize,
// where q_j is a small signed integer (the int8 plane), scale[g] the group's float factor (the scale
// plane) and min[g] the group's additive offset (the min plane; 0 for formats without one). The
// decomposed form evaluates the same float operations in the same order as the reference
// dequantization, so the two agree bit for bit; tests check that. For formats without a min the
// bit-exact value is scale[g] * q_j alone (adding a 0.0f min would turn a -0 into +0).
#pragma once

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#include <cstring>
#endif

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MINFER_HD __host__ __device__ inline
#else
#define MINFER_HD inline
#endif

namespace minfer {

// ggml tensor type ids, as stored in GGUF tensor infos (GGUF spec, enum ggml_type).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

constexpr int kQK_K = 256;  // weights per K-quant super-block

// Size facts for one type: weights per block and bytes per block. `known` is false for ids that are
// not ggml types (gaps and out-of-range ids); `supported` marks the types minfer compiles.
struct GgmlTypeTraits {
  const char* name;
  uint32_t block_size;   // weights per block
  uint32_t type_size;    // bytes per block
  bool known;
  bool supported;
};

MINFER_HD GgmlTypeTraits ggmlTypeTraits(uint32_t id) {
  switch (id) {
    case 0:  return {"F32", 1, 4, true, true};
    case 1:  return {"F16", 1, 2, true, true};
    case 2:  return {"Q4_0", 32, 18, true, true};
    case 3:  return {"Q4_1", 32, 20, true, true};
    case 6:  return {"Q5_0", 32, 22, true, true};
    case 7:  return {"Q5_1", 32, 24, true, true};
    case 8:  return {"Q8_0", 32, 34, true, true};
    case 9:  return {"Q8_1", 32, 36, true, false};
    case 10: return {"Q2_K", 256, 84, true, true};
    case 11: return {"Q3_K", 256, 110, true, true};
    case 12: return {"Q4_K", 256, 144, true, true};
    case 13: return {"Q5_K", 256, 176, true, true};
    case 14: return {"Q6_K", 256, 210, true, true};
    case 15: return {"Q8_K", 256, 292, true, false};
    case 16: return {"IQ2_XXS", 256, 66, true, false};
    case 17: return {"IQ2_XS", 256, 74, true, false};
    case 18: return {"IQ3_XXS", 256, 98, true, false};
    case 19: return {"IQ1_S", 256, 50, true, false};
    case 20: return {"IQ4_NL", 32, 18, true, false};
    case 21: return {"IQ3_S", 256, 110, true, false};
    case 22: return {"IQ2_S", 256, 82, true, false};
    case 23: return {"IQ4_XS", 256, 136, true, false};
    case 24: return {"I8", 1, 1, true, false};
    case 25: return {"I16", 1, 2, true, false};
    case 26: return {"I32", 1, 4, true, false};
    case 27: return {"I64", 1, 8, true, false};
    case 28: return {"F64", 1, 8, true, false};
    case 29: return {"IQ1_M", 256, 56, true, false};
    case 30: return {"BF16", 1, 2, true, true};
    case 34: return {"TQ1_0", 256, 54, true, false};
    case 35: return {"TQ2_0", 256, 66, true, false};
    case 39: return {"MXFP4", 32, 17, true, false};
    default: return {"unknown", 0, 0, false, false};
  }
}

MINFER_HD GgmlTypeTraits ggmlTypeTraits(GgmlType t) { return ggmlTypeTraits(static_cast<uint32_t>(t)); }

// ---------------------------------------------------------------------------------------------
// Scalar conversions (exact; IEEE 754 binary16 and bfloat16 to binary32).

MINFER_HD float bitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(static_cast<int>(bits));
#else
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

MINFER_HD uint32_t floatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__float_as_int(f));
#else
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

// binary16 → binary32, exact for every input (subnormals, ±inf, NaN payloads).
MINFER_HD float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return bitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return bitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bitsToFloat(sign);
  // Subnormal half: normalize into a binary32 normal.
  uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return bitsToFloat(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
}

// binary32 → binary16, round to nearest even (used for f16 planes, activations and the KV cache).
MINFER_HD uint16_t floatToHalf(float f) {
  const uint32_t x = floatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0u));
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to ±inf
  if (absx < 0x38800000u) {                                               // half subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t h = ((absx >> 13) - (112u << 10));
  const uint32_t rem = absx & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

MINFER_HD float bf16ToFloat(uint16_t b) { return bitsToFloat(static_cast<uint32_t>(b) << 16); }

MINFER_HD uint16_t readU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
MINFER_HD uint32_t readU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// ---------------------------------------------------------------------------------------------
// Block layouts. Half-precision fields are stored as raw binary16 bits (uint16_t). All fields are
// byte-aligned in the file; the structs have no padding (checked below).

struct BlockQ4_0 {      // 32 weights: w = d * (q - 8), q = 4-bit
  uint16_t d;
  uint8_t qs[16];       // element j < 16 in the low nibble of qs[j], element j + 16 in the high nibble
};
struct BlockQ4_1 {      // 32 weights: w = d * q + m
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {      // 32 weights: w = d * (q - 16), q = 5-bit: nibble + bit j of qh << 4
  uint16_t d;
  uint8_t qh[4];        // little-endian uint32: bit j is the 5th bit of element j
  uint8_t qs[16];
};
struct BlockQ5_1 {      // 32 weights: w = d * q + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {      // 32 weights: w = d * q, q int8
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ2_K {      // 256 weights, 16 groups of 16: w = d*(sc&15) * q - dmin*(sc>>4), q = 2-bit
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {      // 256 weights, 16 groups of 16: w = d*(sc-32) * (q - 4*!hbit), q = 2 low bits
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];   // 16 6-bit scales, packed (see q3kScales)
  uint16_t d;
};
struct BlockQ4_K {      // 256 weights, 8 groups of 32: w = d*sc * q - dmin*m, q = 4-bit
  uint16_t d, dmin;
  uint8_t scales[12];   // 8 6-bit scales and 8 6-bit mins, packed (see kScaleMin)
  uint8_t qs[128];
};
struct BlockQ5_K {      // 256 weights, 8 groups of 32: w = d*sc * q - dmin*m, q = 5-bit
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {      // 256 weights, 16 groups of 16: w = d*sc * (q - 32), q = 6-bit
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block size");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block size");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block size");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block size");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block size");
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block size");
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block size");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block size");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block size");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block size");

// ---------------------------------------------------------------------------------------------
// Compile-time facts of each quantized block format, the role of ggml-cuda's
// ggml_cuda_type_traits<T> (qk, qr, qi): code that needs "weights per block" asks BlockTraits<T>.
//   Block       the block struct above (field byte offsets: offsetof(Block, field) on the host)
//   kWeights    weights per block (ggml's qk)
//   kBytes      bytes per block, sizeof(Block)
//   kGroupSize  weights per scale group (the scale plane's group size)
//   kGroups     scale groups per block
//   kHasMin     the decomposed form has a min (a `min` plane)
//   kQBias      subtracted from the stored unsigned q to give the decomposed q (0: q is as stored)
// ggmlTypeTraits(), groupSize() and hasMin() give the same numbers at run time (tests/planes checks
// that they agree).
// Host only: NVRTC emits these static members into every cubin as device globals (measured: +14 KB per
// image), so device code does not see them.
#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__)
template <typename B, int W, int G, bool M, int Bias>
struct BlockTraitsOf {
  using Block = B;
  static constexpr int kWeights = W;
  static constexpr int kBytes = static_cast<int>(sizeof(B));
  static constexpr int kGroupSize = G;
  static constexpr int kGroups = W / G;
  static constexpr bool kHasMin = M;
  static constexpr int kQBias = Bias;
};

template <GgmlType T> struct BlockTraits;  // defined for the quantized formats above
template <> struct BlockTraits<GgmlType::Q4_0> : BlockTraitsOf<BlockQ4_0, 32, 32, false, 8> {};
template <> struct BlockTraits<GgmlType::Q4_1> : BlockTraitsOf<BlockQ4_1, 32, 32, true, 0> {};
template <> struct BlockTraits<GgmlType::Q5_0> : BlockTraitsOf<BlockQ5_0, 32, 32, false, 16> {};
template <> struct BlockTraits<GgmlType::Q5_1> : BlockTraitsOf<BlockQ5_1, 32, 32, true, 0> {};
template <> struct BlockTraits<GgmlType::Q8_0> : BlockTraitsOf<BlockQ8_0, 32, 32, false, 0> {};
template <> struct BlockTraits<GgmlType::Q2_K> : BlockTraitsOf<BlockQ2_K, kQK_K, 16, true, 0> {
  static constexpr int kScaleBits = 4;   // scales[g]: the scale in the low 4 bits, the min in the high 4
};
template <> struct BlockTraits<GgmlType::Q3_K> : BlockTraitsOf<BlockQ3_K, kQK_K, 16, false, 4> {
  static constexpr int kScaleBias = 32;  // the 6-bit scales (q3kScales) are stored biased by +32
};
template <> struct BlockTraits<GgmlType::Q4_K> : BlockTraitsOf<BlockQ4_K, kQK_K, 32, true, 0> {};
template <> struct BlockTraits<GgmlType::Q5_K> : BlockTraitsOf<BlockQ5_K, kQK_K, 32, true, 0> {};
template <> struct BlockTraits<GgmlType::Q6_K> : BlockTraitsOf<BlockQ6_K, kQK_K, 16, false, 32> {};
#endif  // host only

// ---------------------------------------------------------------------------------------------
// Packed-scale helpers.

// Q4_K / Q5_K: scale and min of group j (0..7) from the 12-byte packing: groups 0..3 keep 6 bits in
// the low bits of bytes j and j+4; groups 4..7 take 4 low bits from byte j+4 and their top 2 bits
// from the top of bytes j-4 (scale) and j (min).
MINFER_HD void kScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K: the 16 6-bit scales (0..63, to be biased by −32). Low 4 bits: the low nibble of byte j for
// groups 0..7, the high nibble of byte j − 8 for groups 8..15. High 2 bits: bit pair j / 4 of byte
// 8 + j % 4.
MINFER_HD void q3kScales(const uint8_t* packed, int8_t* out16) {
  for (int j = 0; j < 16; ++j) {
    const int low = (j < 8) ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
    const int high = (packed[8 + (j % 4)] >> (2 * (j / 4))) & 3;
    out16[j] = static_cast<int8_t>(low | (high << 4));
  }
}

// ---------------------------------------------------------------------------------------------
// Decomposed form (for planes): group size and per-element (q, scale, min) of one block.

// Weights per scale group (the `scale` plane's group size); 1 for float types.
MINFER_HD int groupSize(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q6_K: return 16;
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K: return 32;
    default: return 1;
  }
}

// True for formats whose decomposed form has a non-zero additive offset (a `min` plane).
MINFER_HD bool hasMin(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q2_K ||
         t == GgmlType::Q4_K || t == GgmlType::Q5_K;
}

// Decomposes one block of a quantized type into q (block_size int8), scale and min (block_size /
// groupSize floats each; min is written only when hasMin). Returns false for non-quantized types.
// Ranges of q: Q4_0 −8..7, Q4_1 0..15, Q5_0 −16..15, Q5_1 0..31, Q8_0 −128..127 (as stored),
// Q2_K 0..3, Q3_K −4..3, Q4_K 0..15, Q5_K 0..31, Q6_K −32..31.
MINFER_HD bool decomposeBlock(GgmlType t, const uint8_t* block, int8_t* q, float* scale, float* min) {
  switch (t) {
    case GgmlType::Q4_0: {
      const uint8_t* qs = block + 2;
      scale[0] = halfToFloat(readU16(block));
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>((qs[j] & 0xF) - 8);
        q[j + 16] = static_cast<int8_t>((qs[j] >> 4) - 8);
      }
      return true;
    }
    case GgmlType::Q4_1: {
      const uint8_t* qs = block + 4;
      scale[0] = halfToFloat(readU16(block));
      min[0] = halfToFloat(readU16(block + 2));
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>(qs[j] & 0xF);
        q[j + 16] = static_cast<int8_t>(qs[j] >> 4);
      }
      return true;
    }
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool with_min = (t == GgmlType::Q5_1);
      const uint8_t* p = block + (with_min ? 4 : 2);
      const uint32_t qh = readU32(p);
      const uint8_t* qs = p + 4;
      const int bias = with_min ? 0 : 16;
      scale[0] = halfToFloat(readU16(block));
      if (with_min) min[0] = halfToFloat(readU16(block + 2));
      for (int j = 0; j < 16; ++j) {
        const int h0 = ((qh >> j) & 1) << 4;
        const int h1 = ((qh >> (j + 16)) & 1) << 4;
        q[j] = static_cast<int8_t>(((qs[j] & 0xF) | h0) - bias);
        q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | h1) - bias);
      }
      return true;
    }
    case GgmlType::Q8_0: {
      scale[0] = halfToFloat(readU16(block));
      for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(block[2 + j]);
      return true;
    }
    case GgmlType::Q2_K: {
      const uint8_t* scales = block;
      const uint8_t* qs = block + 16;
      const float d = halfToFloat(readU16(block + 80));
      const float dmin = halfToFloat(readU16(block + 82));
      // Element e = 128*n + 32*s + 16*h + l  (n half, s shift index, h sub-half, l < 16) takes bits
      // 2s..2s+1 of qs[32n + 16h + l]; its group is e / 16 = 8n + 2s + h.
      for (int g = 0; g < 16; ++g) {
        scale[g] = d * static_cast<float>(scales[g] & 0xF);
        min[g] = -(dmin * static_cast<float>(scales[g] >> 4));
      }
      for (int e = 0; e < 256; ++e) {
        const int n = e / 128, s = (e % 128) / 32, h = (e % 32) / 16, l = e % 16;
        q[e] = static_cast<int8_t>((qs[32 * n + 16 * h + l] >> (2 * s)) & 3);
      }
      return true;
    }
    case GgmlType::Q3_K: {
      const uint8_t* hmask = block;
      const uint8_t* qs = block + 32;
      int8_t sc[16];
      q3kScales(block + 96, sc);
      const float d = halfToFloat(readU16(block + 108));
      for (int g = 0; g < 16; ++g) scale[g] = d * static_cast<float>(sc[g] - 32);
      // Element e = 128*n + 32*s + 16*h + l: low bits 2s..2s+1 of qs[32n + 16h + l]; high bit is bit
      // (4n + s) of hmask[16h + l]; a clear high bit subtracts 4.
      for (int e = 0; e < 256; ++e) {
        const int n = e / 128, s = (e % 128) / 32, h = (e % 32) / 16, l = e % 16;
        const int low = (qs[32 * n + 16 * h + l] >> (2 * s)) & 3;
        const int hbit = (hmask[16 * h + l] >> (4 * n + s)) & 1;
        q[e] = static_cast<int8_t>(low - (hbit ? 0 : 4));
      }
      return true;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = (t == GgmlType::Q5_K);
      const float d = halfToFloat(readU16(block));
      const float dmin = halfToFloat(readU16(block + 2));
      const uint8_t* scales = block + 4;
      const uint8_t* qh = block + 16;
      const uint8_t* qs = block + (five ? 48 : 16);
      for (int g = 0; g < 8; ++g) {
        uint8_t sc, m;
        kScaleMin(g, scales, &sc, &m);
        scale[g] = d * static_cast<float>(sc);
        min[g] = -(dmin * static_cast<float>(m));
      }
      // Element e = 64*c + 32*h + l: nibble h of qs[32c + l]; Q5_K's 5th bit is bit (2c + h) of qh[l].
      for (int e = 0; e < 256; ++e) {
        const int c = e / 64, h = (e % 64) / 32, l = e % 32;
        int v = (qs[32 * c + l] >> (4 * h)) & 0xF;
        if (five) v |= ((qh[l] >> (2 * c + h)) & 1) << 4;
        q[e] = static_cast<int8_t>(v);
      }
      return true;
    }
    case GgmlType::Q6_K: {
      const uint8_t* ql = block;
      const uint8_t* qh = block + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
      const float d = halfToFloat(readU16(block + 208));
      for (int g = 0; g < 16; ++g) scale[g] = d * static_cast<float>(sc[g]);
      // Element e = 128*n + 32*k + l (k quarter 0..3): low nibble (k even) or high nibble (k odd) of
      // ql[64n + 32*(k%2) + l]; 2 high bits are bits 2k..2k+1 of qh[32n + l].
      for (int e = 0; e < 256; ++e) {
        const int n = e / 128, k = (e % 128) / 32, l = e % 32;
        const int low = (ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
        const int high = (qh[32 * n + l] >> (2 * k)) & 3;
        q[e] = static_cast<int8_t>((low | (high << 4)) - 32);
      }
      return true;
    }
    default:
      return false;
  }
}

// Q6_K: the four weights l, l + 32, l + 64, l + 96 (l < 32) of one 128-weight half of a block (ql, qh, sc: that
// half's 64 low-nibble bytes, 32 high-bit bytes and 8 scales; y: its 128 floats), in the format definition's order.
MINFER_HD void q6kQuad(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, float d, int l, float* y) {
  const int is = l / 16;
  const int q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
  const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
  const int q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
  const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
  y[l + 0] = d * sc[is + 0] * q1;
  y[l + 32] = d * sc[is + 2] * q2;
  y[l + 64] = d * sc[is + 4] * q3;
  y[l + 96] = d * sc[is + 6] * q4;
}

// ---------------------------------------------------------------------------------------------
// Reference dequantization of one block to float, written in the loop order of the format
// definitions (independent of decomposeBlock; tests check that both agree bit for bit).
// `out` receives block_size floats. Returns false for types without a reference here.
MINFER_HD bool dequantizeBlock(GgmlType t, const uint8_t* b, float* out) {
  switch (t) {
    case GgmlType::F32: out[0] = bitsToFloat(readU32(b)); return true;
    case GgmlType::F16: out[0] = halfToFloat(readU16(b)); return true;
    case GgmlType::BF16: out[0] = bf16ToFloat(readU16(b)); return true;
    case GgmlType::Q4_0: {
      const float d = halfToFloat(readU16(b));
      for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>((b[2 + j] & 0xF) - 8) * d;
        out[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
      }
      return true;
    }
    case GgmlType::Q4_1: {
      const float d = halfToFloat(readU16(b)), m = halfToFloat(readU16(b + 2));
      for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>(b[4 + j] & 0xF) * d + m;
        out[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
      }
      return true;
    }
    case GgmlType::Q5_0: {
      const float d = halfToFloat(readU16(b));
      const uint32_t qh = readU32(b + 2);
      for (int j = 0; j < 16; ++j) {
        const uint32_t xh0 = ((qh >> j) << 4) & 0x10;
        const uint32_t xh1 = (qh >> (j + 12)) & 0x10;
        out[j] = static_cast<float>(static_cast<int>((b[6 + j] & 0xF) | xh0) - 16) * d;
        out[j + 16] = static_cast<float>(static_cast<int>((b[6 + j] >> 4) | xh1) - 16) * d;
      }
      return true;
    }
    case GgmlType::Q5_1: {
      const float d = halfToFloat(readU16(b)), m = halfToFloat(readU16(b + 2));
      const uint32_t qh = readU32(b + 4);
      for (int j = 0; j < 16; ++j) {
        const uint32_t xh0 = ((qh >> j) << 4) & 0x10;
        const uint32_t xh1 = (qh >> (j + 12)) & 0x10;
        out[j] = static_cast<float>((b[8 + j] & 0xF) | xh0) * d + m;
        out[j + 16] = static_cast<float>((b[8 + j] >> 4) | xh1) * d + m;
      }
      return true;
    }
    case GgmlType::Q8_0: {
      const float d = halfToFloat(readU16(b));
      for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      return true;
    }
    case GgmlType::Q2_K: {
      const float d = halfToFloat(readU16(b + 80)), dmin = halfToFloat(readU16(b + 82));
      const uint8_t* q = b + 16;
      int is = 0;
      float* y = out;
      for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
          uint8_t sc = b[is++];
          float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l] >> shift) & 3) - ml;
          sc = b[is++];
          dl = d * static_cast<float>(sc & 0xF);
          ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16] >> shift) & 3) - ml;
          shift += 2;
        }
        q += 32;
      }
      return true;
    }
    case GgmlType::Q3_K: {
      // Scale unpacking with ggml's 32-bit masks (kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f).
      uint32_t aux[4];
      aux[0] = readU32(b + 96);
      aux[1] = readU32(b + 100);
      aux[2] = readU32(b + 104);
      const uint32_t tmp = aux[2];
      aux[2] = ((aux[0] >> 4) & 0x0f0f0f0fu) | (((tmp >> 4) & 0x03030303u) << 4);
      aux[3] = ((aux[1] >> 4) & 0x0f0f0f0fu) | (((tmp >> 6) & 0x03030303u) << 4);
      aux[0] = (aux[0] & 0x0f0f0f0fu) | (((tmp >> 0) & 0x03030303u) << 4);
      aux[1] = (aux[1] & 0x0f0f0f0fu) | (((tmp >> 2) & 0x03030303u) << 4);
      int8_t scales[16];
      for (int i = 0; i < 16; ++i) scales[i] = static_cast<int8_t>((aux[i / 4] >> (8 * (i % 4))) & 0xFF);
      const float d_all = halfToFloat(readU16(b + 108));
      const uint8_t* q = b + 32;
      const uint8_t* hm = b;
      uint8_t m = 1;
      int is = 0;
      float* y = out;
      for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
          float dl = d_all * static_cast<float>(scales[is++] - 32);
          for (int l = 0; l < 16; ++l)
            *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
          dl = d_all * static_cast<float>(scales[is++] - 32);
          for (int l = 0; l < 16; ++l)
            *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3) -
                                           ((hm[l + 16] & m) ? 0 : 4));
          shift += 2;
          m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
      }
      return true;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = (t == GgmlType::Q5_K);
      const float d = halfToFloat(readU16(b)), dmin = halfToFloat(readU16(b + 2));
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* ql = b + (five ? 48 : 16);
      int is = 0;
      uint8_t u1 = 1, u2 = 2;
      float* y = out;
      for (int j = 0; j < 256; j += 64) {
        uint8_t sc, m;
        kScaleMin(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        kScaleMin(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; ++l)
          *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l)
          *y++ = d2 * static_cast<float>((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 = static_cast<uint8_t>(u1 << 2);
        u2 = static_cast<uint8_t>(u2 << 2);
      }
      return true;
    }
    case GgmlType::Q6_K: {
      const float d = halfToFloat(readU16(b + 208));
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      float* y = out;
      for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
          q6kQuad(ql, qh, sc, d, l, y);
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
      }
      return true;
    }
    default:
      return false;
  }
}

// The eighth `part` (0 … 7) of dequantizeBlock's loop for a Q4_K, Q5_K or Q6_K block, so that eight threads can
// dequantize one block at once (kernels/embed.cuh): the same operations in the same order on the same bytes, so
// `out` (the block's 256 floats) receives dequantizeBlock's values bit for bit in the part's 32 positions:
//   Q4_K, Q5_K: iteration j = 64·(part / 2) of the loop, its first (part even) or second 32 weights;
//   Q6_K: half n = part / 4 of the block, l in [8·(part % 4), +8) and its four weights l, l+32, l+64, l+96.
// Returns false for other types (dequantizeBlock then).
MINFER_HD bool dequantizeBlockPart(GgmlType t, const uint8_t* b, int part, float* out) {
  switch (t) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = (t == GgmlType::Q5_K);
      const int it = part / 2, second = part % 2;
      const float d = halfToFloat(readU16(b)), dmin = halfToFloat(readU16(b + 2));
      const uint8_t* qh = b + 16;
      const uint8_t* ql = b + (five ? 48 : 16) + 32 * it;
      const uint8_t u = static_cast<uint8_t>((second ? 2 : 1) << (2 * it));
      uint8_t sc, m;
      kScaleMin(2 * it + second, b + 4, &sc, &m);
      const float dl = d * sc, ml = dmin * m;
      float* y = out + 64 * it + 32 * second;
      for (int l = 0; l < 32; ++l)
        y[l] = dl * static_cast<float>((second ? ql[l] >> 4 : ql[l] & 0xF) + (five && (qh[l] & u) ? 16 : 0)) - ml;
      return true;
    }
    case GgmlType::Q6_K: {
      const int n = part / 4;
      const float d = halfToFloat(readU16(b + 208));
      const uint8_t* ql = b + 64 * n;
      const uint8_t* qh = b + 128 + 32 * n;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
      float* y = out + 128 * n;
      for (int l = 8 * (part % 4); l < 8 * (part % 4) + 8; ++l) {
        q6kQuad(ql, qh, sc, d, l, y);
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace minfer
