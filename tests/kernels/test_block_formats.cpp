// Tests for kernels/block_formats.h: hand-packed blocks of every format, decomposed vs reference
// dequantization, half/bf16 conversions, type traits, and the dequantized fixture tensors.
//
// The expected values here never come from the code under test: blocks are packed by small packers
// written from the format definitions (in the quantizers' loop order, not the dequantizers'), and
// the expected elements are the exact mathematical values scale*q + min computed in double, which
// the construction guarantees to be representable in float (checked), so the reference must
// reproduce them bit for bit.
#include "kernels/block_formats.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "tests/test_support.h"

namespace {

using minfer::GgmlType;

// ---------------------------------------------------------------------------------------------
// Independent scalar helpers.

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float floatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// IEEE 754 binary16 value by its definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormal
// (-1)^s * 2^-14 * m/1024; e = 31 is inf (m = 0) or NaN.
double halfValue(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double mag;
  if (e == 31) {
    mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), -24);
  } else {
    mag = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return s ? -mag : mag;
}

// bfloat16 value by its definition (8-bit exponent, bias 127, 7-bit fraction).
double bf16Value(uint16_t b) {
  const int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
  double mag;
  if (e == 255) {
    mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), -133);
  } else {
    mag = std::ldexp(static_cast<double>(128 + m), e - 134);
  }
  return s ? -mag : mag;
}

// Nearest binary16 value (ties to even) of a finite double, as a double; ±inf on overflow. The
// rounding is done by std::nearbyint in the default round-to-nearest-even mode, at the spacing of
// halves of that magnitude (2^-24 below 2^-14).
double nearestHalfValue(double x) {
  const double a = std::fabs(x);
  double ulp;
  if (a < std::ldexp(1.0, -14)) {
    ulp = std::ldexp(1.0, -24);
  } else {
    int e;
    std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
    ulp = std::ldexp(1.0, e - 11);
  }
  double r = std::nearbyint(a / ulp) * ulp;
  if (r >= 65536.0) r = std::numeric_limits<double>::infinity();
  return std::signbit(x) ? -r : r;
}

void putU16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b.at(at) = static_cast<uint8_t>(v & 0xFF);
  b.at(at + 1) = static_cast<uint8_t>(v >> 8);
}

// ---------------------------------------------------------------------------------------------
// Checking one hand-built block.

// One hand-built block and the element values it must decode to.
struct Built {
  std::vector<uint8_t> bytes;
  std::vector<double> value;  // exact value of each element (NaN where the math gives NaN)
  std::vector<int> q;         // decomposed q of each element (documented ranges)
  std::vector<double> scale;  // per group
  std::vector<double> min;    // per group (formats with a min plane)
};

std::string describe(GgmlType t, const std::string& label) {
  return std::string(minfer::ggmlTypeTraits(t).name) + " " + label;
}

// The exact value `x` as a float; a construction error (not a failure of the code under test) if
// the test chose values whose exact result is not representable.
bool exactFloat(double x, float* out) {
  *out = static_cast<float>(x);
  return std::isnan(x) || static_cast<double>(*out) == x;
}

// The eight parts of dequantizeBlockPart (K-quants; kernels/embed.cuh's eight threads per block) against `whole`,
// dequantizeBlock's values of `block`: every element written by exactly one part, with the same bits.
void checkParts(GgmlType t, const std::vector<uint8_t>& block, const std::vector<float>& whole) {
  constexpr uint32_t kPoison = 0x7fc0dead;  // a NaN no dequantization writes
  std::vector<float> parts(whole.size(), floatFromBits(kPoison));
  for (int part = 0; part < 8; ++part) {
    std::vector<float> one(whole.size(), floatFromBits(kPoison));
    const bool has = minfer::dequantizeBlockPart(t, block.data(), part, one.data());
    const bool k_quant = t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
    REQUIRE(has == k_quant);
    if (!has) return;
    int written = 0;
    for (size_t e = 0; e < whole.size(); ++e) {
      if (bitsOf(one[e]) == kPoison) continue;
      ++written;
      CHECK_MESSAGE(bitsOf(parts[e]) == kPoison, "element " << e << " written by two parts");
      parts[e] = one[e];
    }
    CHECK(written == 32);
  }
  int bad = 0;
  for (size_t e = 0; e < whole.size(); ++e)
    if (bitsOf(parts[e]) != bitsOf(whole[e]) && ++bad <= 5)
      FAIL_CHECK("element " << e << ": dequantizeBlockPart gave " << hex(bitsOf(parts[e])) << ", dequantizeBlock "
                            << hex(bitsOf(whole[e])));
  CHECK(bad == 0);
}

// dequantizeBlock and decomposeBlock on `b` against the values the test built. Block, q, scale and
// min buffers are heap-allocated at their exact sizes so ASan catches any access past them.
void checkBuilt(GgmlType t, const Built& b, const std::string& label) {
  const auto tr = minfer::ggmlTypeTraits(t);
  const int bs = static_cast<int>(tr.block_size);
  INFO(describe(t, label));
  REQUIRE(b.bytes.size() == tr.type_size);
  REQUIRE(b.value.size() == static_cast<size_t>(bs));

  std::vector<float> out(bs);
  const std::vector<uint8_t> block = b.bytes;
  REQUIRE(minfer::dequantizeBlock(t, block.data(), out.data()));
  int bad = 0;
  for (int e = 0; e < bs; ++e) {
    float want;
    REQUIRE_MESSAGE(exactFloat(b.value[e], &want),
                    "test construction: element " << e << " value " << b.value[e] << " is not a float");
    const bool ok = std::isnan(b.value[e]) ? std::isnan(out[e]) : bitsOf(out[e]) == bitsOf(want);
    if (!ok && ++bad <= 5) {
      FAIL_CHECK("element " << e << " (group " << e / minfer::groupSize(t) << "): expected " << want << " ("
                            << hex(bitsOf(want)) << "), dequantizeBlock gave " << out[e] << " ("
                            << hex(bitsOf(out[e])) << ")");
    }
  }
  CHECK_MESSAGE(bad == 0, bad << " of " << bs << " elements wrong");
  checkParts(t, block, out);

  if (b.q.empty()) return;  // a case that checks the values only
  const int gs = minfer::groupSize(t);
  const int groups = bs / gs;
  REQUIRE(b.scale.size() == static_cast<size_t>(groups));
  std::vector<int8_t> q(bs);
  std::vector<float> scale(groups), min(groups, -12345.0f);
  REQUIRE(minfer::decomposeBlock(t, block.data(), q.data(), scale.data(), min.data()));
  bad = 0;
  for (int e = 0; e < bs; ++e) {
    if (q[e] != b.q[e] && ++bad <= 5)
      FAIL_CHECK("decomposed q of element " << e << ": expected " << b.q[e] << ", got " << int(q[e]));
  }
  for (int g = 0; g < groups; ++g) {
    float want = 0;
    REQUIRE(exactFloat(b.scale[g], &want));
    if (!(std::isnan(b.scale[g]) ? std::isnan(scale[g]) : bitsOf(scale[g]) == bitsOf(want)) && ++bad <= 5)
      FAIL_CHECK("decomposed scale of group " << g << ": expected " << want << ", got " << scale[g]);
    if (minfer::hasMin(t)) {
      REQUIRE(exactFloat(b.min[g], &want));
      if (!(std::isnan(b.min[g]) ? std::isnan(min[g]) : bitsOf(min[g]) == bitsOf(want)) && ++bad <= 5)
        FAIL_CHECK("decomposed min of group " << g << ": expected " << want << ", got " << min[g]);
    } else if (min[g] != -12345.0f && ++bad <= 5) {
      FAIL_CHECK("decomposeBlock wrote min[" << g << "] for a format without a min plane");
    }
  }
  CHECK_MESSAGE(bad == 0, bad << " decomposed fields wrong");
}

// n values in 0..r-1 (n a multiple of r): every aligned span of r elements is a pseudo-random
// permutation of 0..r-1 (fixed-seed Fisher-Yates), so every value, and every high-bit combination,
// appears in every span, and no two positions are tied by a structural relation (such as elements
// e and e + r/2 sharing their low bits) that could hide a mixed-up element order.
std::vector<int> permutationPattern(int n, int r, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> out(n);
  for (int base = 0; base < n; base += r) {
    for (int i = 0; i < r; ++i) out[base + i] = i;
    for (int i = r - 1; i > 0; --i) std::swap(out[base + i], out[base + static_cast<int>(rng() % (i + 1))]);
  }
  return out;
}

// (d, dmin) half pairs: ordinary, negative, subnormal, negative subnormal and -0, largest finite.
// Chosen so every exact element value below fits in a float's 24-bit significand (checked).
struct HalfPair {
  uint16_t d, dmin;
  const char* what;
};
const HalfPair kPairs[] = {
    {0x3C00, 0xBA00, "d=1 dmin=-0.75"},
    {0xBA00, 0x3C00, "d=-0.75 dmin=1"},
    {0x0001, 0x03FF, "d=2^-24 (smallest subnormal) dmin=0x03FF (largest subnormal)"},
    {0x8001, 0x8000, "d=-2^-24 dmin=-0"},
    {0x03FF, 0x8001, "d=0x03FF dmin=-2^-24"},
    {0x8000, 0x2E66, "d=-0 dmin=0.0999755859375"},
    {0x2E66, 0x1C00, "d=0.0999755859375 dmin=2^-8"},
    {0x7BFF, 0x7800, "d=65504 (largest finite) dmin=32768"},
    {0xC500, 0xFBFF, "d=-5 dmin=-65504"},
};

std::string pairLabel(const HalfPair& p) { return p.what; }

// ---------------------------------------------------------------------------------------------
// Packers, from the format definitions (ggml block_* structs; element order as the quantizers
// quantize_row_*_ref write it).

// Q4_0: half d; qs[16]: byte j = (element j + 8) | (element j+16 + 8) << 4.  value = d * q, q -8..7.
Built buildQ4_0(uint16_t d) {
  Built b;
  b.bytes.assign(18, 0);
  putU16(b.bytes, 0, d);
  const std::vector<int> u = permutationPattern(32, 16, 40);
  for (int j = 0; j < 16; ++j) b.bytes[2 + j] = static_cast<uint8_t>(u[j] | (u[j + 16] << 4));
  for (int e = 0; e < 32; ++e) {
    b.q.push_back(u[e] - 8);
    b.value.push_back(halfValue(d) * (u[e] - 8));
  }
  b.scale = {halfValue(d)};
  return b;
}

// Q4_1: half d, half m; qs as Q4_0 without the offset.  value = d * q + m, q 0..15.
Built buildQ4_1(uint16_t d, uint16_t m) {
  Built b;
  b.bytes.assign(20, 0);
  putU16(b.bytes, 0, d);
  putU16(b.bytes, 2, m);
  const std::vector<int> u = permutationPattern(32, 16, 41);
  for (int j = 0; j < 16; ++j) b.bytes[4 + j] = static_cast<uint8_t>(u[j] | (u[j + 16] << 4));
  for (int e = 0; e < 32; ++e) {
    b.q.push_back(u[e]);
    b.value.push_back(halfValue(d) * u[e] + halfValue(m));
  }
  b.scale = {halfValue(d)};
  b.min = {halfValue(m)};
  return b;
}

// Q5_0 / Q5_1: half d (, half m); qh = little-endian u32 whose bit e is bit 4 of element e;
// qs[16] = low nibbles as Q4_0.  Q5_0: value = d * q, q = u - 16; Q5_1: value = d * u + m.
Built buildQ5(bool with_min, uint16_t d, uint16_t m) {
  Built b;
  const size_t qh_at = with_min ? 4 : 2;
  b.bytes.assign(with_min ? 24 : 22, 0);
  putU16(b.bytes, 0, d);
  if (with_min) putU16(b.bytes, 2, m);
  const std::vector<int> u = permutationPattern(32, 32, with_min ? 51 : 50);  // all 32 differ
  uint32_t qh = 0;
  for (int e = 0; e < 32; ++e) qh |= static_cast<uint32_t>((u[e] >> 4) & 1) << e;
  for (int k = 0; k < 4; ++k) b.bytes[qh_at + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b.bytes[qh_at + 4 + j] = static_cast<uint8_t>((u[j] & 15) | ((u[j + 16] & 15) << 4));
  for (int e = 0; e < 32; ++e) {
    if (with_min) {
      b.q.push_back(u[e]);
      b.value.push_back(halfValue(d) * u[e] + halfValue(m));
    } else {
      b.q.push_back(u[e] - 16);
      b.value.push_back(halfValue(d) * (u[e] - 16));
    }
  }
  b.scale = {halfValue(d)};
  if (with_min) b.min = {halfValue(m)};
  return b;
}

// Q8_0: half d; qs[32] int8.  value = d * q. All 32 q differ and include -128, 0 and 127.
Built buildQ8_0(uint16_t d) {
  Built b;
  b.bytes.assign(34, 0);
  putU16(b.bytes, 0, d);
  for (int e = 0; e < 32; ++e) {
    int q = (e * 37 + 11) % 256 - 128;  // distinct: 37 is invertible mod 256; q = 0 at e = 17
    if (e == 3) q = -128;
    if (e == 30) q = 127;
    b.bytes[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(q));
    b.q.push_back(q);
    b.value.push_back(halfValue(d) * q);
  }
  b.scale = {halfValue(d)};
  return b;
}

// The 2-bit field layout shared by Q2_K and Q3_K (quantize_row_q2_K_ref): for j in {0, 128} and
// l < 32, qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6.
void pack2bit(const std::vector<int>& low2, uint8_t* qs) {
  for (int j = 0; j < 256; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<uint8_t>(low2[j + l] | (low2[j + l + 32] << 2) | (low2[j + l + 64] << 4) |
                                           (low2[j + l + 96] << 6));
}

// Q2_K: scales[16] (byte g = sc | m << 4, 4 bits each), qs[64] (2-bit fields), half d, half dmin.
// value = (d * sc[g]) * q - dmin * m[g], g = e / 16, q 0..3.
Built buildQ2_K(uint16_t d, uint16_t dmin) {
  Built b;
  b.bytes.assign(84, 0);
  int sc[16], mn[16];
  for (int g = 0; g < 16; ++g) {
    sc[g] = (7 * g + 3) % 16;  // all 16 values, 0 and 15 included
    mn[g] = (5 * g + 11) % 16;
    b.bytes[g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
  }
  const std::vector<int> u = permutationPattern(256, 4, 102);
  pack2bit(u, b.bytes.data() + 16);
  putU16(b.bytes, 80, d);
  putU16(b.bytes, 82, dmin);
  const double D = halfValue(d), M = halfValue(dmin);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 16;
    b.q.push_back(u[e]);
    b.value.push_back((D * sc[g]) * u[e] - M * mn[g]);
  }
  for (int g = 0; g < 16; ++g) {
    b.scale.push_back(D * sc[g]);
    b.min.push_back(-(M * mn[g]));
  }
  return b;
}

// Q3_K biased 6-bit scales (scale = s - 32): below 32 (negative), 0, 32 (zero scale), 63, and every
// high-bit pair in every position j % 4.
const int kQ3Scales[16] = {0, 63, 9, 54, 17, 46, 31, 32, 33, 5, 58, 40, 24, 12, 50, 45};

// Q3_K: hmask[32], qs[64], scales[12], half d (quantize_row_q3_K_ref). L = q + 4 in 0..7; its bit 2
// goes to bit e / 32 of hmask[e % 32], its low 2 bits to the 2-bit fields. Scale packing: low
// nibble of s[j] in the low (j < 8) or high (j >= 8) nibble of byte j % 8; bits 4..5 of s[j] in
// bits 2*(j/4) of byte 8 + j % 4.  value = (d * (s[g] - 32)) * q, g = e / 16, q -4..3.
Built buildQ3_K(uint16_t d) {
  Built b;
  b.bytes.assign(110, 0);
  const std::vector<int> L = permutationPattern(256, 8, 113);
  std::vector<int> low2(256);
  for (int e = 0; e < 256; ++e) {
    low2[e] = L[e] & 3;
    if (L[e] & 4) b.bytes[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
  }
  pack2bit(low2, b.bytes.data() + 32);
  uint8_t* scales = b.bytes.data() + 96;
  for (int j = 0; j < 16; ++j) {
    const int s = kQ3Scales[j];
    if (j < 8)
      scales[j] = static_cast<uint8_t>(s & 15);
    else
      scales[j - 8] |= static_cast<uint8_t>((s & 15) << 4);
    scales[8 + j % 4] |= static_cast<uint8_t>((s >> 4) << (2 * (j / 4)));
  }
  putU16(b.bytes, 108, d);
  const double D = halfValue(d);
  for (int e = 0; e < 256; ++e) {
    const int q = L[e] - 4;
    b.q.push_back(q);
    b.value.push_back((D * (kQ3Scales[e / 16] - 32)) * q);
  }
  for (int g = 0; g < 16; ++g) b.scale.push_back(D * (kQ3Scales[g] - 32));
  return b;
}

// Q4_K / Q5_K 6-bit scales and mins: groups 4..7 have high bits set (values >= 16, up to 63).
const int kKScales[8] = {5, 63, 17, 40, 58, 16, 47, 34};
const int kKMins[8] = {62, 0, 33, 21, 19, 63, 48, 7};

// Q4_K/Q5_K scale packing (quantize_row_q4_K_ref): groups j < 4 store sc in scales[j] and m in
// scales[j+4] (6 bits); groups j >= 4 store the low nibbles in scales[j+4] (sc low, m high) and
// the top 2 bits of sc / m in bits 6..7 of scales[j-4] / scales[j].
void packKScales(uint8_t* scales) {
  for (int j = 0; j < 8; ++j) {
    const int ls = kKScales[j], lm = kKMins[j];
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(ls);
      scales[j + 4] = static_cast<uint8_t>(lm);
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls & 15) | ((lm & 15) << 4));
      scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
}

// Q4_K: half d, half dmin, scales[12], qs[128]: for each 64-element chunk c, qs[32c + l] =
// L[64c + l] | L[64c + l + 32] << 4. Q5_K adds qh[32] after scales: bit e / 32 of qh[e % 32] is
// bit 4 of L[e].  value = (d * sc[g]) * q - dmin * m[g], g = e / 32.
Built buildQ45_K(bool five, uint16_t d, uint16_t dmin) {
  Built b;
  b.bytes.assign(five ? 176 : 144, 0);
  putU16(b.bytes, 0, d);
  putU16(b.bytes, 2, dmin);
  packKScales(b.bytes.data() + 4);
  const std::vector<int> L = five ? permutationPattern(256, 32, 135) : permutationPattern(256, 16, 124);
  uint8_t* qs = b.bytes.data() + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>((L[64 * c + l] & 15) | ((L[64 * c + l + 32] & 15) << 4));
  if (five)
    for (int e = 0; e < 256; ++e)
      if (L[e] & 16) b.bytes[16 + e % 32] |= static_cast<uint8_t>(1u << (e / 32));
  const double D = halfValue(d), M = halfValue(dmin);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 32;
    b.q.push_back(L[e]);
    b.value.push_back((D * kKScales[g]) * L[e] - M * kKMins[g]);
  }
  for (int g = 0; g < 8; ++g) {
    b.scale.push_back(D * kKScales[g]);
    b.min.push_back(-(M * kKMins[g]));
  }
  return b;
}

// Q6_K int8 scales: both extremes, negatives and positives.
const int kQ6Scales[16] = {-128, 127, -1, 1, 64, -77, 33, -5, 100, -100, 2, -33, 17, -64, 90, -9};

// Q6_K: ql[128], qh[64], scales[16] int8, half d (quantize_row_q6_K_ref). L = q + 32 in 0..63; per
// half j in {0, 128} and l < 32: ql[j/2 + l] = low nibbles of L[j+l] | L[j+l+64] << 4,
// ql[j/2 + l + 32] = L[j+l+32] | L[j+l+96] << 4, qh[j/4 + l] = the 2 high bits of L[j+l],
// L[j+l+32], L[j+l+64], L[j+l+96] at bits 0, 2, 4, 6.  value = (d * sc[g]) * q, g = e / 16.
Built buildQ6_K(uint16_t d) {
  Built b;
  b.bytes.assign(210, 0);
  const std::vector<int> L = permutationPattern(256, 64, 146);
  uint8_t* ql = b.bytes.data();
  uint8_t* qh = b.bytes.data() + 128;
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      ql[j / 2 + l] = static_cast<uint8_t>((L[j + l] & 15) | ((L[j + l + 64] & 15) << 4));
      ql[j / 2 + l + 32] = static_cast<uint8_t>((L[j + l + 32] & 15) | ((L[j + l + 96] & 15) << 4));
      qh[j / 4 + l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                           ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
  }
  for (int g = 0; g < 16; ++g) b.bytes[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(kQ6Scales[g]));
  putU16(b.bytes, 208, d);
  const double D = halfValue(d);
  for (int e = 0; e < 256; ++e) {
    const int q = L[e] - 32;
    b.q.push_back(q);
    b.value.push_back((D * kQ6Scales[e / 16]) * q);
  }
  for (int g = 0; g < 16; ++g) b.scale.push_back(D * kQ6Scales[g]);
  return b;
}

const GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                GgmlType::Q5_K, GgmlType::Q6_K};

// The builder of each quantized type for one (d, dmin) pair.
Built build(GgmlType t, uint16_t d, uint16_t dmin) {
  switch (t) {
    case GgmlType::Q4_0: return buildQ4_0(d);
    case GgmlType::Q4_1: return buildQ4_1(d, dmin);
    case GgmlType::Q5_0: return buildQ5(false, d, dmin);
    case GgmlType::Q5_1: return buildQ5(true, d, dmin);
    case GgmlType::Q8_0: return buildQ8_0(d);
    case GgmlType::Q2_K: return buildQ2_K(d, dmin);
    case GgmlType::Q3_K: return buildQ3_K(d);
    case GgmlType::Q4_K: return buildQ45_K(false, d, dmin);
    case GgmlType::Q5_K: return buildQ45_K(true, d, dmin);
    case GgmlType::Q6_K: return buildQ6_K(d);
    default: return {};
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// 1. Hand-built blocks.

TEST_CASE("hand-built blocks of every quantized type decode to their exact values") {
  for (GgmlType t : kQuantTypes) {
    for (const HalfPair& p : kPairs) {
      const Built b = build(t, p.d, p.dmin);
      checkBuilt(t, b, pairLabel(p));
    }
  }
}

TEST_CASE("dequantizeBlockPart: eight parts of random K-quant blocks give dequantizeBlock's bits") {
  std::mt19937 gen(20261202);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    INFO(std::string(minfer::ggmlTypeTraits(t).name));
    const auto tr = minfer::ggmlTypeTraits(t);
    for (int i = 0; i < 200; ++i) {
      std::vector<uint8_t> block(tr.type_size);
      for (uint8_t& v : block) v = static_cast<uint8_t>(gen());
      // Finite scales (f16 exponent below 31) in most blocks, so that the values compared are numbers.
      const size_t d_at = t == GgmlType::Q6_K ? 209 : 1;
      if (i % 8) block[d_at] &= 0x7b;
      if (i % 8 && t != GgmlType::Q6_K) block[3] &= 0x7b;
      std::vector<float> whole(tr.block_size);
      REQUIRE(minfer::dequantizeBlock(t, block.data(), whole.data()));
      checkParts(t, block, whole);
    }
  }
}

TEST_CASE("hand-built blocks: the test's own construction is not degenerate") {
  // Guards the construction above: a pattern of zeros or of equal values would let a wrong
  // element order pass.
  for (GgmlType t : kQuantTypes) {
    INFO(std::string(minfer::ggmlTypeTraits(t).name));
    const Built b = build(t, 0x3C00, 0xBA00);
    const std::set<double> distinct(b.value.begin(), b.value.end());
    const size_t bs = minfer::ggmlTypeTraits(t).block_size;
    // 32-element blocks: at least 16 distinct values (all 32 for 5- and 8-bit q); K-quants: at
    // least 48 (Q2_K: 16 groups x 4 levels, some coincide).
    CHECK(distinct.size() >= (bs == 32 ? 16u : 48u));
    CHECK(std::count(b.bytes.begin(), b.bytes.end(), 0) < static_cast<long>(b.bytes.size() / 4));
  }
  const auto distinctValues = [](const Built& b) { return std::set<double>(b.value.begin(), b.value.end()).size(); };
  CHECK(distinctValues(buildQ8_0(0x3C00)) == 32);
  CHECK(distinctValues(buildQ5(false, 0x3C00, 0)) == 32);
  CHECK(distinctValues(buildQ5(true, 0x3C00, 0x3800)) == 32);
}

TEST_CASE("hand-built blocks with infinite and NaN d") {
  // d = ±inf: q = 0 gives NaN, other q give ±inf; d = NaN: every element NaN.
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q3_K}) {
    for (uint16_t d : {uint16_t{0x7C00}, uint16_t{0xFC00}, uint16_t{0x7E00}}) {
      Built b = build(t, d, 0);
      b.q.clear();  // decomposed scale is checked by the random test; here only the values
      checkBuilt(t, b, "d=" + hex(d));
    }
  }
}

TEST_CASE("single-bit changes move exactly the elements the format says") {
  // Flips one bit of one qh / hmask / high-bit byte and checks which elements change, from the
  // format definitions: Q5_0 qh bit e -> element e; Q3_K hmask[i] bit k -> element 32k + i;
  // Q5_K qh[i] bit k -> element 32k + i; Q6_K qh[32n + l] bits 2k..2k+1 -> element 128n + 32k + l.
  struct Flip {
    GgmlType t;
    size_t byte;
    int bit;
    int element;
  };
  const Flip flips[] = {
      {GgmlType::Q5_0, 2 + 0, 3, 3},       {GgmlType::Q5_0, 2 + 2, 5, 21},
      {GgmlType::Q5_1, 4 + 3, 7, 31},      {GgmlType::Q5_1, 4 + 1, 0, 8},
      {GgmlType::Q3_K, 0 + 5, 0, 5},       {GgmlType::Q3_K, 0 + 20, 6, 212},
      {GgmlType::Q3_K, 0 + 31, 7, 255},    {GgmlType::Q5_K, 16 + 0, 0, 0},
      {GgmlType::Q5_K, 16 + 17, 5, 177},   {GgmlType::Q5_K, 16 + 31, 7, 255},
      {GgmlType::Q6_K, 128 + 3, 0, 3},     {GgmlType::Q6_K, 128 + 7, 3, 39},
      {GgmlType::Q6_K, 128 + 33, 4, 193},  {GgmlType::Q6_K, 128 + 63, 7, 255},
  };
  for (const Flip& f : flips) {
    INFO(std::string(minfer::ggmlTypeTraits(f.t).name) << " byte " << f.byte << " bit " << f.bit);
    const Built b = build(f.t, 0x3C00, 0x3800);
    std::vector<uint8_t> flipped = b.bytes;
    flipped[f.byte] ^= static_cast<uint8_t>(1u << f.bit);
    const int bs = static_cast<int>(minfer::ggmlTypeTraits(f.t).block_size);
    std::vector<float> a(bs), c(bs);
    REQUIRE(minfer::dequantizeBlock(f.t, b.bytes.data(), a.data()));
    REQUIRE(minfer::dequantizeBlock(f.t, flipped.data(), c.data()));
    std::vector<int> changed;
    for (int e = 0; e < bs; ++e)
      if (bitsOf(a[e]) != bitsOf(c[e])) changed.push_back(e);
    REQUIRE(changed.size() == 1);
    CHECK(changed[0] == f.element);
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Decomposed form vs reference, random blocks.

namespace {

// Offsets of the half fields (d, then dmin/m where present) of each quantized block.
std::vector<size_t> halfFieldOffsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

// Documented q range of each quantized type's decomposed form.
std::pair<int, int> qRange(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {-8, 7};
    case GgmlType::Q4_1: return {0, 15};
    case GgmlType::Q5_0: return {-16, 15};
    case GgmlType::Q5_1: return {0, 31};
    case GgmlType::Q8_0: return {-128, 127};
    case GgmlType::Q2_K: return {0, 3};
    case GgmlType::Q3_K: return {-4, 3};
    case GgmlType::Q4_K: return {0, 15};
    case GgmlType::Q5_K: return {0, 31};
    case GgmlType::Q6_K: return {-32, 31};
    default: return {0, -1};
  }
}

// A random finite half: usually of magnitude in [1e-3, 2] with a random sign, sometimes any
// finite bit pattern (subnormals, zeros, up to 65504).
uint16_t randomHalf(std::mt19937& rng) {
  if (rng() % 4 == 0) {
    uint16_t h;
    do h = static_cast<uint16_t>(rng()); while (((h >> 10) & 31) == 31);
    return h;
  }
  std::uniform_real_distribution<double> mag(1e-3, 2.0);
  const double v = mag(rng);
  // Nearest half by the independent rounding above, then its bits by search over the exponent.
  const double hv = nearestHalfValue(v);
  int e;
  std::frexp(hv, &e);
  uint16_t bits;
  if (hv < std::ldexp(1.0, -14)) {
    bits = static_cast<uint16_t>(hv / std::ldexp(1.0, -24));
  } else {
    const int he = e - 1 + 15;  // biased exponent
    const int m = static_cast<int>(hv / std::ldexp(1.0, e - 11)) - 1024;
    bits = static_cast<uint16_t>((he << 10) | m);
  }
  if (rng() & 1) bits |= 0x8000;
  return bits;
}

}  // namespace

TEST_CASE("decomposeBlock and dequantizeBlock agree bit for bit on random blocks") {
  std::mt19937 rng(20240611);
  for (GgmlType t : kQuantTypes) {
    const auto tr = minfer::ggmlTypeTraits(t);
    const int bs = static_cast<int>(tr.block_size), gs = minfer::groupSize(t), groups = bs / gs;
    const auto [qlo, qhi] = qRange(t);
    INFO(std::string(tr.name));
    REQUIRE(gs > 1);
    REQUIRE(bs % gs == 0);
    const int kBlocks = bs == 32 ? 4000 : 1000;
    int bad = 0, bad_q = 0, min_written = 0;
    std::set<int> seen_q;
    for (int it = 0; it < kBlocks; ++it) {
      std::vector<uint8_t> block(tr.type_size);  // exact size: ASan catches reads past the block
      for (auto& x : block) x = static_cast<uint8_t>(rng());
      for (size_t off : halfFieldOffsets(t)) {
        const uint16_t h = randomHalf(rng);
        REQUIRE(std::isfinite(halfValue(h)));
        putU16(block, off, h);
      }
      std::vector<float> ref(bs), scale(groups), min(groups, std::numeric_limits<float>::quiet_NaN());
      std::vector<int8_t> q(bs);
      REQUIRE(minfer::dequantizeBlock(t, block.data(), ref.data()));
      REQUIRE(minfer::decomposeBlock(t, block.data(), q.data(), scale.data(), min.data()));
      if (!minfer::hasMin(t))
        for (float m : min) min_written += !std::isnan(m);
      for (int e = 0; e < bs; ++e) {
        seen_q.insert(q[e]);
        if (q[e] < qlo || q[e] > qhi) {
          if (++bad_q <= 3) FAIL_CHECK("block " << it << " element " << e << ": q = " << int(q[e]) << " out of range");
          continue;
        }
        const int g = e / gs;
        float v = scale[g] * static_cast<float>(q[e]);
        if (minfer::hasMin(t)) v = v + min[g];
        if (bitsOf(v) != bitsOf(ref[e]) && ++bad <= 5) {
          FAIL_CHECK("block " << it << " element " << e << ": scale*q+min = " << v << " (" << hex(bitsOf(v))
                              << "), dequantizeBlock = " << ref[e] << " (" << hex(bitsOf(ref[e])) << ")");
        }
      }
    }
    CHECK(bad == 0);
    CHECK(bad_q == 0);
    CHECK(min_written == 0);
    // Random bytes reach both ends of the range.
    CHECK(seen_q.count(qlo) == 1);
    CHECK(seen_q.count(qhi) == 1);
    CHECK(static_cast<int>(seen_q.size()) == qhi - qlo + 1);
  }
}

TEST_CASE("decomposeBlock and dequantizeBlock refuse non-quantized and unsupported types") {
  std::vector<uint8_t> block(512, 0x5A);
  std::vector<int8_t> q(512);
  std::vector<float> out(512), scale(512), min(512);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    CHECK_FALSE(minfer::decomposeBlock(t, block.data(), q.data(), scale.data(), min.data()));
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::IQ2_XXS, GgmlType::IQ4_NL, GgmlType::I8,
                     GgmlType::F64, GgmlType::TQ1_0, GgmlType::MXFP4}) {
    INFO(std::string(minfer::ggmlTypeTraits(t).name));
    CHECK_FALSE(minfer::decomposeBlock(t, block.data(), q.data(), scale.data(), min.data()));
    CHECK_FALSE(minfer::dequantizeBlock(t, block.data(), out.data()));
  }
}

// ---------------------------------------------------------------------------------------------
// 3. Scalar conversions.

TEST_CASE("halfToFloat is exact for all 65536 inputs") {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = minfer::halfToFloat(static_cast<uint16_t>(h));
    const double want = halfValue(static_cast<uint16_t>(h));
    uint32_t want_bits;
    if (std::isnan(want)) {
      // Documented: NaN payload and sign carried over (payload in the top fraction bits).
      want_bits = ((h & 0x8000u) << 16) | 0x7F800000u | ((h & 0x3FFu) << 13);
    } else {
      want_bits = bitsOf(static_cast<float>(want));
      REQUIRE(static_cast<double>(static_cast<float>(want)) == want);
    }
    if (bitsOf(got) != want_bits && ++bad <= 5)
      FAIL_CHECK("halfToFloat(" << hex(h) << ") = " << got << " (" << hex(bitsOf(got)) << "), expected "
                                << hex(want_bits));
  }
  CHECK(bad == 0);
  // Spot values by hand (guards the ldexp reference itself).
  CHECK(minfer::halfToFloat(0x3C00) == 1.0f);
  CHECK(minfer::halfToFloat(0xC000) == -2.0f);
  CHECK(minfer::halfToFloat(0x7BFF) == 65504.0f);
  CHECK(minfer::halfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(minfer::halfToFloat(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(minfer::halfToFloat(0x0400) == std::ldexp(1.0f, -14));
  CHECK(bitsOf(minfer::halfToFloat(0x8000)) == 0x80000000u);
  CHECK(bitsOf(minfer::halfToFloat(0x7C00)) == 0x7F800000u);
  CHECK(bitsOf(minfer::halfToFloat(0xFC00)) == 0xFF800000u);
}

TEST_CASE("F16, BF16 and F32 blocks decode their little-endian bytes exactly") {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint8_t bytes[2] = {static_cast<uint8_t>(h & 0xFF), static_cast<uint8_t>(h >> 8)};
    float f16 = 0, bf = 0;
    REQUIRE(minfer::dequantizeBlock(GgmlType::F16, bytes, &f16));
    REQUIRE(minfer::dequantizeBlock(GgmlType::BF16, bytes, &bf));
    const double want16 = halfValue(static_cast<uint16_t>(h));
    const double wantbf = bf16Value(static_cast<uint16_t>(h));
    const bool ok16 = std::isnan(want16) ? std::isnan(f16) && std::signbit(f16) == std::signbit(want16)
                                         : bitsOf(f16) == bitsOf(static_cast<float>(want16));
    // bfloat16 is the top half of a binary32: all patterns, NaN payloads included, map by a shift.
    const bool okbf = std::isnan(wantbf) ? bitsOf(bf) == (h << 16)
                                         : bitsOf(bf) == bitsOf(static_cast<float>(wantbf)) &&
                                               static_cast<double>(static_cast<float>(wantbf)) == wantbf;
    if ((!ok16 || !okbf) && ++bad <= 5)
      FAIL_CHECK("bits " << hex(h) << ": F16 -> " << f16 << " (want " << want16 << "), BF16 -> " << bf
                         << " (want " << wantbf << ")");
    if (minfer::bf16ToFloat(static_cast<uint16_t>(h)) != bf && !std::isnan(bf) && ++bad <= 5)
      FAIL_CHECK("bf16ToFloat(" << hex(h) << ") differs from dequantizeBlock(BF16)");
  }
  CHECK(bad == 0);
  CHECK(minfer::bf16ToFloat(0x3F80) == 1.0f);
  CHECK(minfer::bf16ToFloat(0xC0A0) == -5.0f);
  CHECK(minfer::bf16ToFloat(0x0001) == std::ldexp(1.0f, -133));

  const uint32_t f32_patterns[] = {0x3F800000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu,
                                   0xFF800000u, 0x7FC00000u, 0xC2F6E979u, 0x3EAAAAABu, 0x12345678u};
  for (uint32_t u : f32_patterns) {
    const uint8_t bytes[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u >> 16),
                              static_cast<uint8_t>(u >> 24)};
    float got = 0;
    REQUIRE(minfer::dequantizeBlock(GgmlType::F32, bytes, &got));
    CHECK_MESSAGE(bitsOf(got) == u, "F32 " << hex(u) << " -> " << hex(bitsOf(got)));
  }
}

TEST_CASE("floatToHalf round-trips every finite half and infinities") {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) == 31 && (h & 0x3FF) != 0) continue;  // NaN: tested below
    const float f = static_cast<float>(halfValue(static_cast<uint16_t>(h)));
    const uint16_t back = minfer::floatToHalf(f);
    if (back != h && ++bad <= 5) FAIL_CHECK("floatToHalf(" << f << ") = " << hex(back) << ", expected " << hex(h));
  }
  CHECK(bad == 0);
}

TEST_CASE("floatToHalf rounds to nearest, ties to even, at every halfway point") {
  // For each pair of adjacent finite halves a < b (both signs): the midpoint (exact in float: 12
  // significant bits) goes to the one with the even bit pattern; one float ulp either side goes
  // to the nearer one.
  int bad = 0;
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint16_t a = static_cast<uint16_t>(h | sign), b = static_cast<uint16_t>((h + 1) | sign);
      const double mid = (halfValue(a) + halfValue(b)) / 2;
      const float fmid = static_cast<float>(mid);
      REQUIRE(static_cast<double>(fmid) == mid);
      const uint16_t even = (a & 1) ? b : a;
      const float toward_a = std::nextafter(fmid, static_cast<float>(halfValue(a)));
      const float toward_b = std::nextafter(fmid, static_cast<float>(halfValue(b)));
      const uint16_t g_mid = minfer::floatToHalf(fmid), g_a = minfer::floatToHalf(toward_a),
                     g_b = minfer::floatToHalf(toward_b);
      if ((g_mid != even || g_a != a || g_b != b) && ++bad <= 5)
        FAIL_CHECK("between " << hex(a) << " and " << hex(b) << ": midpoint -> " << hex(g_mid) << " (want "
                              << hex(even) << "), below -> " << hex(g_a) << ", above -> " << hex(g_b));
    }
  }
  CHECK(bad == 0);
  // Zero and the smallest subnormal: 2^-25 is a tie that goes to (even) zero.
  CHECK(minfer::floatToHalf(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(minfer::floatToHalf(-std::ldexp(1.0f, -25)) == 0x8000);
  CHECK(minfer::floatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(minfer::floatToHalf(std::ldexp(1.0f, -40)) == 0x0000);
  CHECK(minfer::floatToHalf(-std::ldexp(1.0f, -149)) == 0x8000);
  CHECK(minfer::floatToHalf(-0.0f) == 0x8000);
  // Rounding up from the largest subnormal into the smallest normal.
  CHECK(minfer::floatToHalf(std::nextafter(static_cast<float>(std::ldexp(1023.5, -24)), 1.0f)) == 0x0400);
}

TEST_CASE("floatToHalf overflow, infinities and NaN") {
  // 65520 is the tie between 65504 (0x7BFF, odd) and 65536: it rounds to even, i.e. to infinity.
  CHECK(minfer::floatToHalf(65520.0f) == 0x7C00);
  CHECK(minfer::floatToHalf(-65520.0f) == 0xFC00);
  CHECK(minfer::floatToHalf(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(minfer::floatToHalf(65504.0f) == 0x7BFF);
  CHECK(minfer::floatToHalf(1e6f) == 0x7C00);
  CHECK(minfer::floatToHalf(std::numeric_limits<float>::max()) == 0x7C00);
  CHECK(minfer::floatToHalf(-std::numeric_limits<float>::max()) == 0xFC00);
  CHECK(minfer::floatToHalf(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(minfer::floatToHalf(-std::numeric_limits<float>::infinity()) == 0xFC00);
  for (uint32_t nan_bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7F802000u, 0xFFBFFFFFu, 0x7FFFFFFFu}) {
    const uint16_t h = minfer::floatToHalf(floatFromBits(nan_bits));
    INFO("NaN " << hex(nan_bits) << " -> " << hex(h));
    CHECK((h & 0x7C00) == 0x7C00);
    CHECK((h & 0x03FF) != 0);  // still NaN, not inf
    CHECK((h >> 15) == (nan_bits >> 31));
  }
}

TEST_CASE("floatToHalf matches an independent nearest-even rounding on random floats") {
  std::mt19937 rng(7);
  int bad = 0;
  for (int i = 0; i < 400000; ++i) {
    // Exponents from 2^-27 to 2^17: below the subnormals, across every half binade, past overflow.
    const uint32_t exp = 100 + rng() % 45;
    const uint32_t bits = (rng() & 0x80000000u) | (exp << 23) | (rng() & 0x7FFFFFu);
    const float f = floatFromBits(bits);
    const double want = nearestHalfValue(f);
    const float got = minfer::halfToFloat(minfer::floatToHalf(f));
    if ((static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) && ++bad <= 5)
      FAIL_CHECK("floatToHalf(" << f << " = " << hex(bits) << ") -> " << got << ", nearest half is " << want);
  }
  CHECK(bad == 0);
}

// ---------------------------------------------------------------------------------------------
// 4. Type traits.

TEST_CASE("ggmlTypeTraits: sizes of the supported types, unknown ids") {
  struct Want {
    GgmlType t;
    const char* name;
    uint32_t block_size;
    size_t type_size;
  };
  const Want supported[] = {
      {GgmlType::F32, "F32", 1, sizeof(float)},
      {GgmlType::F16, "F16", 1, sizeof(uint16_t)},
      {GgmlType::BF16, "BF16", 1, sizeof(uint16_t)},
      {GgmlType::Q4_0, "Q4_0", 32, sizeof(minfer::BlockQ4_0)},
      {GgmlType::Q4_1, "Q4_1", 32, sizeof(minfer::BlockQ4_1)},
      {GgmlType::Q5_0, "Q5_0", 32, sizeof(minfer::BlockQ5_0)},
      {GgmlType::Q5_1, "Q5_1", 32, sizeof(minfer::BlockQ5_1)},
      {GgmlType::Q8_0, "Q8_0", 32, sizeof(minfer::BlockQ8_0)},
      {GgmlType::Q2_K, "Q2_K", 256, sizeof(minfer::BlockQ2_K)},
      {GgmlType::Q3_K, "Q3_K", 256, sizeof(minfer::BlockQ3_K)},
      {GgmlType::Q4_K, "Q4_K", 256, sizeof(minfer::BlockQ4_K)},
      {GgmlType::Q5_K, "Q5_K", 256, sizeof(minfer::BlockQ5_K)},
      {GgmlType::Q6_K, "Q6_K", 256, sizeof(minfer::BlockQ6_K)},
  };
  std::set<uint32_t> supported_ids;
  for (const Want& w : supported) {
    const auto tr = minfer::ggmlTypeTraits(w.t);
    INFO(std::string(w.name));
    supported_ids.insert(static_cast<uint32_t>(w.t));
    CHECK(std::string(tr.name) == w.name);
    CHECK(tr.known);
    CHECK(tr.supported);
    CHECK(tr.block_size == w.block_size);
    CHECK(tr.type_size == w.type_size);
    CHECK(tr.block_size % minfer::groupSize(w.t) == 0);
    // Bytes per block from the format's fields: bits per weight * block + header.
    const auto id = minfer::ggmlTypeTraits(static_cast<uint32_t>(w.t));
    CHECK(id.type_size == tr.type_size);
  }
  // Field arithmetic (independent of the structs): halves, nibbles, high bits, scales.
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q4_0).type_size == 2 + 32 / 2);
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q5_1).type_size == 2 + 2 + 32 / 8 + 32 / 2);
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q2_K).type_size == 16 + 256 / 4 + 2 + 2);
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q3_K).type_size == 256 / 8 + 256 / 4 + 12 + 2);
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q4_K).type_size == 2 + 2 + 12 + 256 / 2);
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q5_K).type_size == 2 + 2 + 12 + 256 / 8 + 256 / 2);
  CHECK(minfer::ggmlTypeTraits(GgmlType::Q6_K).type_size == 256 / 2 + 256 / 4 + 16 + 2);
  // Only the types above are supported.
  for (uint32_t id = 0; id < 64; ++id) {
    INFO("id " << id);
    CHECK(minfer::ggmlTypeTraits(id).supported == (supported_ids.count(id) == 1));
  }
  // Known but not compiled.
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::IQ2_XXS, GgmlType::I32, GgmlType::MXFP4}) {
    INFO(static_cast<uint32_t>(t));
    CHECK(minfer::ggmlTypeTraits(t).known);
    CHECK_FALSE(minfer::ggmlTypeTraits(t).supported);
    CHECK(minfer::ggmlTypeTraits(t).type_size > 0);
  }
  // Ids that are not ggml types (removed Q4_2/Q4_3, the removed repacked types, out of range).
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u, 0xFFFFFFFFu}) {
    INFO("id " << id);
    const auto tr = minfer::ggmlTypeTraits(id);
    CHECK_FALSE(tr.known);
    CHECK_FALSE(tr.supported);
    CHECK(tr.block_size == 0);
    CHECK(tr.type_size == 0);
  }
  // Group sizes and min planes (DESIGN.md section 3).
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q6_K}) CHECK(minfer::groupSize(t) == 16);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K})
    CHECK(minfer::groupSize(t) == 32);
  for (GgmlType t : kQuantTypes) {
    const bool want = t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q2_K || t == GgmlType::Q4_K ||
                      t == GgmlType::Q5_K;
    CHECK(minfer::hasMin(t) == want);
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Fixtures: real GGUF tensors against gguf-py's exact dequantization.

namespace {

std::unique_ptr<minfer::gguf::GgufFile> openModel(const std::string& path) {
  auto f = minfer::gguf::GgufFile::open(path);
  if (!f) {
    FAIL_CHECK("cannot open " << path << ": " << llvm::toString(f.takeError()));
    return nullptr;
  }
  return std::move(*f);
}

// Bytes of one row of `cols` elements of type t; 0 when cols is not a whole number of blocks.
uint64_t rowBytes(GgmlType t, uint64_t cols) {
  const auto tr = minfer::ggmlTypeTraits(t);
  if (tr.block_size == 0 || cols % tr.block_size != 0) return 0;
  return cols / tr.block_size * tr.type_size;
}

// Dequantizes row r of tensor `ti` into `out` (cols floats) with dequantizeBlock.
bool dequantRow(const minfer::gguf::TensorInfo& ti, llvm::ArrayRef<uint8_t> data, uint64_t r, float* out) {
  const auto tr = minfer::ggmlTypeTraits(ti.type);
  const uint64_t rb = rowBytes(ti.type, ti.cols());
  const uint8_t* row = data.data() + r * rb;
  for (uint64_t b = 0; b < ti.cols() / tr.block_size; ++b)
    if (!minfer::dequantizeBlock(ti.type, row + b * tr.type_size, out + b * tr.block_size)) return false;
  return true;
}

}  // namespace

TEST_CASE("fixtures: dequantized rows match gguf-py bit for bit") {
  if (!minfer::test::haveFixtures()) return;
  const std::string dir = minfer::test::fixturesDir();
  std::ifstream in(dir + "/dequant/index.json");
  REQUIRE_MESSAGE(in.good(), "cannot open " << dir << "/dequant/index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  REQUIRE(index.is_object());
  std::set<std::string> types_seen;
  int tensors_checked = 0;
  for (const auto& [model, entries] : index.items()) {
    auto f = openModel(dir + "/models/" + model);
    if (!f) continue;
    for (const auto& entry : entries) {
      const std::string name = entry.at("tensor").get<std::string>();
      const std::string type = entry.at("type").get<std::string>();
      const uint64_t rows_total = entry.at("rows_total").get<uint64_t>();
      const uint64_t cols = entry.at("cols").get<uint64_t>();
      const uint64_t rows = entry.at("rows_in_file").get<uint64_t>();
      const std::string file = dir + "/dequant/" + entry.at("file").get<std::string>();
      INFO(model << " " << name << " (" << type << ", " << rows_total << " x " << cols << ")");
      const minfer::gguf::TensorInfo* ti = f->findTensor(name);
      REQUIRE(ti != nullptr);
      CHECK(std::string(minfer::ggmlTypeTraits(ti->type).name) == type);
      CHECK(ti->cols() == cols);
      CHECK(ti->rows() == rows_total);
      REQUIRE(ti->cols() == cols);
      REQUIRE(rows <= ti->rows());
      const uint64_t rb = rowBytes(ti->type, cols);
      REQUIRE_MESSAGE(rb > 0, "cols " << cols << " is not a whole number of blocks");
      const llvm::ArrayRef<uint8_t> data = f->tensorData(*ti);
      REQUIRE(data.size() >= rows * rb);
      const std::vector<float> want = minfer::test::readF32File(file);
      REQUIRE(want.size() == rows * cols);

      std::vector<float> got(cols);
      int bad = 0;
      const int gs = minfer::groupSize(ti->type);
      const bool quant = gs > 1;
      std::vector<int8_t> q(quant ? minfer::ggmlTypeTraits(ti->type).block_size : 0);
      std::vector<float> scale(quant ? q.size() / gs : 0), min(scale.size());
      for (uint64_t r = 0; r < rows; ++r) {
        REQUIRE(dequantRow(*ti, data, r, got.data()));
        for (uint64_t c = 0; c < cols; ++c) {
          if (bitsOf(got[c]) != bitsOf(want[r * cols + c]) && ++bad <= 5)
            FAIL_CHECK("row " << r << " col " << c << ": dequantizeBlock " << got[c] << " ("
                              << hex(bitsOf(got[c])) << "), fixture " << want[r * cols + c] << " ("
                              << hex(bitsOf(want[r * cols + c])) << ")");
        }
        if (!quant) continue;
        // The decomposed form reproduces the fixture too.
        const auto tr = minfer::ggmlTypeTraits(ti->type);
        for (uint64_t b = 0; b < cols / tr.block_size; ++b) {
          REQUIRE(minfer::decomposeBlock(ti->type, data.data() + r * rb + b * tr.type_size, q.data(),
                                         scale.data(), min.data()));
          for (size_t e = 0; e < q.size(); ++e) {
            float v = scale[e / gs] * static_cast<float>(q[e]);
            if (minfer::hasMin(ti->type)) v = v + min[e / gs];
            const uint64_t c = b * tr.block_size + e;
            if (bitsOf(v) != bitsOf(want[r * cols + c]) && ++bad <= 5)
              FAIL_CHECK("row " << r << " col " << c << ": decomposed " << v << ", fixture " << want[r * cols + c]);
          }
        }
      }
      CHECK_MESSAGE(bad == 0, bad << " mismatches");
      types_seen.insert(type);
      ++tensors_checked;
    }
  }
  CHECK(tensors_checked >= 19 * 3);
  // Every supported type is exercised on real data.
  for (const char* t : {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                        "Q5_K", "Q6_K"})
    CHECK_MESSAGE(types_seen.count(t) == 1, "no fixture tensor of type " << t);
}

TEST_CASE("fixtures: every tensor of every model dequantizes to finite values") {
  if (!minfer::test::haveFixtures()) return;
  const std::string dir = minfer::test::fixturesDir() + "/models";
  std::vector<std::string> paths;
  for (const auto& ent : std::filesystem::directory_iterator(dir))
    if (ent.path().extension() == ".gguf") paths.push_back(ent.path().string());
  std::sort(paths.begin(), paths.end());
  CHECK(paths.size() >= 14);
  uint64_t total = 0;
  for (const std::string& path : paths) {
    auto f = openModel(path);
    if (!f) continue;
    CHECK(!f->tensors().empty());
    for (const auto& ti : f->tensors()) {
      const auto tr = minfer::ggmlTypeTraits(ti.type);
      INFO(path << " " << std::string(ti.name) << " (" << std::string(tr.name) << ", " << ti.rows() << " x " << ti.cols() << ")");
      REQUIRE(tr.supported);
      const uint64_t rb = rowBytes(ti.type, ti.cols());
      REQUIRE(rb > 0);
      const llvm::ArrayRef<uint8_t> data = f->tensorData(ti);
      REQUIRE(data.size() == ti.rows() * rb);
      std::vector<float> row(ti.cols());
      uint64_t non_finite = 0, nonzero = 0;
      for (uint64_t r = 0; r < ti.rows(); ++r) {
        REQUIRE(dequantRow(ti, data, r, row.data()));
        for (float v : row) {
          non_finite += !std::isfinite(v);
          nonzero += v != 0.0f;
        }
      }
      CHECK_MESSAGE(non_finite == 0, non_finite << " non-finite values");
      CHECK(nonzero > 0);
      total += ti.elements();
    }
  }
  CHECK(total > 0);
}
