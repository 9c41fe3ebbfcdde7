// Weight-plane tests: layout rules, the content and offset gates for every type and plane kind (synthetic
// and real fixture tensors), negative controls, determinism across thread counts, streaming, errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/planes/plane_transforms.h"
#include "kernels/expand_blocks.cuh"
#include "tests/planes/plane_reference.h"
#include "tests/test_support.h"

using namespace minfer;
using namespace minfer::planes;
using minfer::test::GatePlane;
using minfer::test::GateResult;

namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
const TensorRole kAllRoles[] = {TensorRole::kMatMul, TensorRole::kEmbedding, TensorRole::kEmbeddingMatMul,
                                TensorRole::kVector};

const char* typeName(GgmlType t) { return ggmlTypeTraits(t).name; }
bool isFloat(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// ---------------------------------------------------------------------------------------------
// Synthetic tensors: random block bytes with every half-precision field finite (deterministic PRNG;
// std::mt19937_64 is fully specified, and only its raw output is used).

uint16_t randomFiniteHalf(std::mt19937_64& rng) {
  // sign, exponent 0..30 (zeros and subnormals included, never inf/NaN), any mantissa
  return static_cast<uint16_t>(((rng() & 1) << 15) | ((rng() % 31) << 10) | (rng() & 0x3FF));
}

void putU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Byte offsets of the binary16 fields of one block (d, and m / dmin where present).
std::vector<int> halfFields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

std::vector<uint8_t> randomTensor(GgmlType type, uint64_t rows, uint64_t cols, uint64_t seed) {
  const GgmlTypeTraits tr = ggmlTypeTraits(type);
  const uint64_t blocks = rows * cols / tr.block_size;
  std::vector<uint8_t> data(blocks * tr.type_size);
  std::mt19937_64 rng(seed);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  for (uint64_t k = 0; k < blocks; ++k) {
    uint8_t* blk = data.data() + k * tr.type_size;
    if (type == GgmlType::F16) {
      putU16(blk, randomFiniteHalf(rng));
    } else if (type == GgmlType::BF16) {
      if (((blk[1] & 0x7F) == 0x7F) && (blk[0] & 0x80)) blk[1] ^= 0x01;  // exponent all ones → finite
    } else if (type == GgmlType::F32) {
      if (((blk[3] & 0x7F) == 0x7F) && (blk[2] & 0x80)) blk[3] ^= 0x01;
    } else {
      for (int off : halfFields(type)) putU16(blk + off, randomFiniteHalf(rng));
    }
  }
  return data;
}

// Test shapes: rows, cols and blocks per row all different, never square, never one block per row.
struct Shape {
  uint64_t rows, cols;
};
std::vector<Shape> shapesFor(GgmlType t) {
  const uint32_t bs = ggmlTypeTraits(t).block_size;
  if (bs == 256) return {{15, 3 * 256}, {24, 5 * 256}};
  if (bs == 32) return {{15, 3 * 32}, {24, 5 * 32}};
  return {{15, 37}, {24, 40}};  // float types: blocks per row = cols
}

// ---------------------------------------------------------------------------------------------
// Layout rules, restated from layout_planner.h, checked against the planner's tables.

std::vector<PlaneKind> expectedKinds(GgmlType t, TensorRole role) {
  const PlaneKind dense = t == GgmlType::F16 ? PlaneKind::kF16 : t == GgmlType::BF16 ? PlaneKind::kBF16 : PlaneKind::kF32;
  if (role == TensorRole::kVector) return {PlaneKind::kF32};
  if (isFloat(t)) return {dense};
  std::vector<PlaneKind> k{PlaneKind::kBlocks};
  if (role == TensorRole::kEmbedding) return k;
  k.push_back(PlaneKind::kI8);
  k.push_back(PlaneKind::kScale);
  if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q2_K || t == GgmlType::Q4_K || t == GgmlType::Q5_K)
    k.push_back(PlaneKind::kMin);
  if (t == GgmlType::Q4_0 || t == GgmlType::Q4_1) k.push_back(PlaneKind::kPacked);
  return k;
}

uint64_t round16(uint64_t x) { return (x + 15) / 16 * 16; }

void checkTableRules(const TensorLayout& L) {
  const TensorDesc& d = L.desc;
  const GgmlTypeTraits tr = ggmlTypeTraits(d.type);
  const std::vector<PlaneKind> kinds = expectedKinds(d.type, d.role);
  REQUIRE(L.planes.size() == kinds.size());
  CHECK(L.source_row_bytes == d.cols / tr.block_size * tr.type_size);
  CHECK(L.source_bytes == d.rows * L.source_row_bytes);
  const uint32_t group = (d.type == GgmlType::Q2_K || d.type == GgmlType::Q3_K || d.type == GgmlType::Q6_K) ? 16 : 32;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const StrideTable& t = L.planes[i];
    INFO("plane " << i << " (" << planeKindName(kinds[i]) << ")");
    CHECK(t.kind == kinds[i]);
    CHECK(t.rows == d.rows);
    CHECK(t.cols == d.cols);
    CHECK(t.ggml_type == static_cast<uint32_t>(d.type));
    switch (kinds[i]) {
      case PlaneKind::kI8:
        CHECK(t.elem == ElemType::kI8);
        CHECK(t.row_pitch == round16(d.cols));
        break;
      case PlaneKind::kScale:
      case PlaneKind::kMin:
        CHECK(t.elem == ElemType::kF32);
        CHECK(t.group_size == group);
        CHECK(t.group_pitch == 4);
        CHECK(t.row_pitch == round16(d.cols / group * 4));
        break;
      case PlaneKind::kPacked:
        CHECK(t.elem == ElemType::kU8);
        CHECK(t.bits == 4);
        CHECK(t.q_offset == (d.type == GgmlType::Q4_0 ? -8 : 0));
        CHECK(t.row_pitch == round16(d.cols / 2));
        break;
      case PlaneKind::kBlocks: {
        // Matmul weights of Q4_K / Q6_K (read by the blocks GEMV): 16-byte block slots; else the GGUF row.
        const bool padded = d.role != TensorRole::kEmbedding && (d.type == GgmlType::Q4_K || d.type == GgmlType::Q6_K);
        CHECK(t.elem == ElemType::kU8);
        CHECK(t.group_size == tr.block_size);
        CHECK(t.group_pitch == (padded ? round16(tr.type_size) : tr.type_size));
        CHECK(t.row_pitch == d.cols / tr.block_size * t.group_pitch);
        if (!padded) CHECK(t.row_pitch == L.source_row_bytes);
        break;
      }
      case PlaneKind::kF32:
        CHECK(t.elem == ElemType::kF32);
        CHECK(t.row_pitch == round16(d.cols * 4));
        break;
      case PlaneKind::kF16:
      case PlaneKind::kBF16:
        CHECK(t.elem == (kinds[i] == PlaneKind::kF16 ? ElemType::kF16 : ElemType::kBF16));
        CHECK(t.row_pitch == round16(d.cols * 2));
        break;
    }
    CHECK(t.row_pitch % (kinds[i] == PlaneKind::kBlocks ? 1 : 16) == 0);
    // Compact form: everything after a quantized tensor's kBlocks plane is derived at load.
    REQUIRE(L.derived.size() == L.planes.size());
    CHECK(L.derived[i] == (i > 0 && kinds[0] == PlaneKind::kBlocks));
  }
}

// ---------------------------------------------------------------------------------------------
// The two gates over all planes of one transformed tensor.

GatePlane gatePlane(const TensorLayout& L, const std::vector<std::vector<uint8_t>>& planes, PlaneKind k) {
  const int i = L.find(k);
  REQUIRE(i >= 0);
  return {L.planes[i], planes[i].data(), planes[i].size()};
}

// Runs the offset gate for the read path that covers plane kind `k`, with `alter` applied to that
// plane's table (identity for the gate proper; a stride swap for the negative control).
GateResult offsetGateFor(const TensorLayout& L, const std::vector<std::vector<uint8_t>>& planes, PlaneKind k,
                         const std::vector<float>& ref, StrideTable (*alter)(const StrideTable&)) {
  GatePlane target = gatePlane(L, planes, k);
  target.table = alter(target.table);
  switch (k) {
    case PlaneKind::kF32:
    case PlaneKind::kF16:
    case PlaneKind::kBF16:
    case PlaneKind::kBlocks:
      return test::gateDirect(target, ref);
    default: break;
  }
  GatePlane q = gatePlane(L, planes, PlaneKind::kI8);
  GatePlane s = gatePlane(L, planes, PlaneKind::kScale);
  const bool with_min = L.find(PlaneKind::kMin) >= 0;
  GatePlane m = with_min ? gatePlane(L, planes, PlaneKind::kMin) : GatePlane{};
  if (k == PlaneKind::kScale) s = target;
  if (k == PlaneKind::kMin) m = target;
  if (k == PlaneKind::kI8 || k == PlaneKind::kPacked) q = target;
  return test::gateDecomposed(q, s, with_min ? &m : nullptr, ref);
}

StrideTable identity(const StrideTable& t) { return t; }

// (type, plane kind) pairs that passed both gates with at least one element checked.
std::set<std::pair<GgmlType, PlaneKind>>& gatedPairs() {
  static std::set<std::pair<GgmlType, PlaneKind>> pairs;
  return pairs;
}

// Content gate and offset gate for every plane of `L` built from `source`; returns true when all pass.
bool runGates(const TensorLayout& L, llvm::ArrayRef<uint8_t> source, const std::vector<std::vector<uint8_t>>& planes,
              const std::vector<float>& ref) {
  bool all = true;
  REQUIRE(planes.size() == L.planes.size());
  for (size_t i = 0; i < L.planes.size(); ++i) {
    const StrideTable& t = L.planes[i];
    INFO(L.desc.name << " " << typeName(L.desc.type) << " " << L.desc.rows << "x" << L.desc.cols << " "
                     << roleName(L.desc.role) << " plane " << planeKindName(t.kind));
    CHECK(planes[i].size() == t.bytes());
    // Content gate: bytes vs the independent expansion, first differing byte reported.
    const std::vector<uint8_t> want = test::expectedPlane(L.desc.type, t, source.data(), L.source_row_bytes);
    const auto diff = std::mismatch(want.begin(), want.end(), planes[i].begin(), planes[i].end());
    const bool content_ok = want.size() == planes[i].size() && diff.first == want.end();
    if (!content_ok) {
      const uint64_t at = static_cast<uint64_t>(diff.first - want.begin());
      FAIL_CHECK("content gate: first difference at byte " << at << " (row " << at / t.row_pitch << ", byte "
                                                           << at % t.row_pitch << " of the row)");
    }
    // Offset gate.
    const GateResult g = offsetGateFor(L, planes, t.kind, ref, identity);
    CHECK(g.checked == L.desc.rows * L.desc.cols);
    if (g.mismatches) FAIL_CHECK("offset gate: " << g.mismatches << " of " << g.checked << " differ; first " << g.first);
    if (content_ok && g.mismatches == 0 && g.checked > 0) gatedPairs().insert({L.desc.type, t.kind});
    all = all && content_ok && g.mismatches == 0;
  }
  return all;
}

std::vector<std::vector<uint8_t>> transformAll(const TensorLayout& L, llvm::ArrayRef<uint8_t> src, unsigned threads,
                                               uint8_t fill = 0xCD) {
  PlaneWorkers workers(threads);
  std::vector<std::vector<uint8_t>> planes;
  std::vector<llvm::MutableArrayRef<uint8_t>> views;
  for (const StrideTable& t : L.planes) planes.emplace_back(t.bytes(), fill);  // garbage: padding must be written
  for (auto& p : planes) views.emplace_back(p);
  llvm::Error e = transformTensor(L, src, views, workers);
  REQUIRE_MESSAGE(!e, llvm::toString(std::move(e)));
  return planes;
}

TensorLayout plan(const TensorDesc& d) {
  llvm::Expected<TensorLayout> L = planLayout(d);
  REQUIRE_MESSAGE(static_cast<bool>(L), (L ? std::string() : llvm::toString(L.takeError())));
  return std::move(*L);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("independent block expansion reproduces dequantizeBlock bit for bit") {
  // The reference expansion must itself be right before it can judge planes: value = s·q (+ add)
  // equals dequantizeBlock for every element of random blocks of every quantized type.
  for (GgmlType type : kAllTypes) {
    if (isFloat(type)) continue;
    INFO(typeName(type));
    const std::vector<uint8_t> data = randomTensor(type, 8, ggmlTypeTraits(type).block_size, 7);
    const std::vector<float> ref = test::refDequantize(type, 8, ggmlTypeTraits(type).block_size, data.data());
    uint64_t bad = 0;
    for (int k = 0; k < 8; ++k) {
      test::RefBlock rb;
      REQUIRE(test::refExpandBlock(type, data.data() + k * ggmlTypeTraits(type).type_size, &rb));
      for (int e = 0; e < rb.n; ++e) {
        const float s = rb.scale[e / rb.group];
        const float v = rb.has_add ? s * static_cast<float>(rb.q[e]) + rb.add[e / rb.group] : s * static_cast<float>(rb.q[e]);
        bad += std::memcmp(&v, &ref[k * rb.n + e], 4) != 0;
      }
    }
    CHECK(bad == 0);
  }
}

namespace {

// The transforms size and address blocks with BlockTraits<T>; the GGUF reader, the layout planner
// and the runtime use ggmlTypeTraits / groupSize / hasMin / decomposeBlock. Both must agree.
template <GgmlType T>
void checkBlockTraits() {
  using Tr = BlockTraits<T>;
  INFO(typeName(T));
  CHECK(ggmlTypeTraits(T).block_size == static_cast<uint32_t>(Tr::kWeights));
  CHECK(ggmlTypeTraits(T).type_size == static_cast<uint32_t>(Tr::kBytes));
  CHECK(groupSize(T) == Tr::kGroupSize);
  CHECK(Tr::kGroups * Tr::kGroupSize == Tr::kWeights);
  CHECK(hasMin(T) == Tr::kHasMin);
  // A block of zero bytes has every stored q = 0, so every decomposed q is −kQBias.
  std::vector<uint8_t> zero(Tr::kBytes, 0);
  int8_t q[kQK_K];
  float scale[kQK_K], min[kQK_K];
  REQUIRE(decomposeBlock(T, zero.data(), q, scale, min));
  for (int e = 0; e < Tr::kWeights; ++e) CHECK(q[e] == -Tr::kQBias);
}

}  // namespace

TEST_CASE("BlockTraits agree with the run-time tables and decomposeBlock") {
  checkBlockTraits<GgmlType::Q4_0>();
  checkBlockTraits<GgmlType::Q4_1>();
  checkBlockTraits<GgmlType::Q5_0>();
  checkBlockTraits<GgmlType::Q5_1>();
  checkBlockTraits<GgmlType::Q8_0>();
  checkBlockTraits<GgmlType::Q2_K>();
  checkBlockTraits<GgmlType::Q3_K>();
  checkBlockTraits<GgmlType::Q4_K>();
  checkBlockTraits<GgmlType::Q5_K>();
  checkBlockTraits<GgmlType::Q6_K>();
  // Scale layouts: Q2_K scale in the low kScaleBits of scales[g], min above; Q3_K scales biased.
  const uint16_t one = floatToHalf(1.0f);
  uint8_t q2[sizeof(BlockQ2_K)] = {};
  q2[offsetof(BlockQ2_K, scales)] = static_cast<uint8_t>(3 | (5 << BlockTraits<GgmlType::Q2_K>::kScaleBits));
  std::memcpy(q2 + offsetof(BlockQ2_K, d), &one, 2);
  std::memcpy(q2 + offsetof(BlockQ2_K, dmin), &one, 2);
  int8_t q[kQK_K];
  float scale[kQK_K], min[kQK_K];
  REQUIRE(decomposeBlock(GgmlType::Q2_K, q2, q, scale, min));
  CHECK(scale[0] == 3.0f);
  CHECK(min[0] == -5.0f);
  uint8_t q3[sizeof(BlockQ3_K)] = {};
  std::memcpy(q3 + offsetof(BlockQ3_K, d), &one, 2);
  REQUIRE(decomposeBlock(GgmlType::Q3_K, q3, q, scale, min));
  CHECK(scale[0] == static_cast<float>(-BlockTraits<GgmlType::Q3_K>::kScaleBias));
}

TEST_CASE("layout rules: plane kinds, element types, pitches and group sizes for every type and role") {
  for (GgmlType type : kAllTypes)
    for (TensorRole role : kAllRoles)
      for (const Shape& s : shapesFor(type)) {
        INFO(typeName(type) << " " << roleName(role) << " " << s.rows << "x" << s.cols);
        checkTableRules(plan({"w", type, s.rows, s.cols, role}));
      }
}

TEST_CASE("content and offset gates on synthetic tensors: every type, role and plane kind") {
  uint64_t seed = 1;
  for (GgmlType type : kAllTypes)
    for (const Shape& s : shapesFor(type)) {
      const std::vector<uint8_t> src = randomTensor(type, s.rows, s.cols, seed++);
      const std::vector<float> ref = test::refDequantize(type, s.rows, s.cols, src.data());
      for (TensorRole role : kAllRoles) {
        const TensorLayout L = plan({"synthetic", type, s.rows, s.cols, role});
        const auto planes = transformAll(L, src, 2);
        CHECK(runGates(L, src, planes, ref));
      }
    }
  // Every (type, plane kind) the layout rules call for passed both gates.
  for (GgmlType type : kAllTypes) {
    for (PlaneKind k : expectedKinds(type, TensorRole::kEmbeddingMatMul)) {
      INFO(typeName(type) << " " << planeKindName(k));
      CHECK(gatedPairs().count({type, k}) == 1);
    }
    INFO(typeName(type) << " vector f32");
    CHECK(gatedPairs().count({type, PlaneKind::kF32}) == 1);
  }
}

namespace {

// Expert e of a plane with an expert axis as a plane of its own: its rows start at expertOffset(e) and
// the reference is the e-th slice of rows (GGUF ne[2] = e). `pitch_error` shifts every expert by that
// many bytes (the negative control).
GatePlane expertSlice(const GatePlane& p, uint64_t e, int64_t pitch_error = 0) {
  GatePlane s = p;
  s.table.rows = expertRows(p.table);
  s.table.experts = 1;
  s.table.expert_pitch = 0;
  const uint64_t off = expertOffset(p.table, e) + static_cast<uint64_t>(pitch_error * static_cast<int64_t>(e));
  s.data = p.data + std::min(off, p.size);
  s.size = p.size - std::min(off, p.size);
  return s;
}

// Offset gate of every plane of `L` (experts > 1) read expert by expert through expertOffset;
// returns the mismatches.
uint64_t expertGate(const TensorLayout& L, const std::vector<std::vector<uint8_t>>& planes,
                    const std::vector<float>& ref, int64_t pitch_error = 0) {
  const uint64_t n_expert = L.desc.experts, rpe = L.desc.rows / n_expert, cols = L.desc.cols;
  uint64_t bad = 0;
  for (uint64_t e = 0; e < n_expert; ++e) {
    const std::vector<float> slice(ref.begin() + static_cast<int64_t>(e * rpe * cols),
                                   ref.begin() + static_cast<int64_t>((e + 1) * rpe * cols));
    for (size_t i = 0; i < L.planes.size(); ++i) {
      const PlaneKind k = L.planes[i].kind;
      GateResult g;
      if (k == PlaneKind::kF32 || k == PlaneKind::kF16 || k == PlaneKind::kBF16 || k == PlaneKind::kBlocks) {
        g = test::gateDirect(expertSlice(gatePlane(L, planes, k), e, pitch_error), slice);
      } else {
        GatePlane q = expertSlice(gatePlane(L, planes, k == PlaneKind::kPacked ? k : PlaneKind::kI8), e, pitch_error);
        GatePlane sc = expertSlice(gatePlane(L, planes, PlaneKind::kScale), e, pitch_error);
        const bool with_min = L.find(PlaneKind::kMin) >= 0;
        GatePlane m = with_min ? expertSlice(gatePlane(L, planes, PlaneKind::kMin), e, pitch_error) : GatePlane{};
        g = test::gateDecomposed(q, sc, with_min ? &m : nullptr, slice);
      }
      CHECK(g.checked == rpe * cols);
      bad += g.mismatches;
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("expert axis: 3-D expert tensors get experts / expert_pitch on every plane and pass both gates per expert") {
  // The types the qwen3moe fixtures' expert and attention tensors use (README §8.2), and Q6_K / Q4_0.
  const GgmlType types[] = {GgmlType::F32, GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_0};
  uint64_t seed = 900;
  for (GgmlType type : types) {
    const uint32_t bs = ggmlTypeTraits(type).block_size;
    // 3 experts of 7 rows, 2 or 5 blocks per row (float: 37 cols): rows ≠ cols ≠ experts ≠ blocks.
    for (uint64_t cols : {uint64_t{bs == 1 ? 37u : 2 * bs}, uint64_t{bs == 1 ? 21u : 5 * bs}}) {
      const uint64_t experts = 3, rows = experts * 7;
      INFO(typeName(type) << " " << experts << " experts x 7 rows x " << cols << " cols");
      const std::vector<uint8_t> src = randomTensor(type, rows, cols, seed++);
      const std::vector<float> ref = test::refDequantize(type, rows, cols, src.data());
      const TensorLayout L = plan({"blk.0.ffn_up_exps.weight", type, rows, cols, TensorRole::kMatMul, 3});
      for (const StrideTable& t : L.planes) {
        CHECK(t.experts == 3);
        CHECK(t.expert_pitch == 7 * t.row_pitch);
        CHECK(t.rows == rows);
        CHECK(expertRows(t) == 7);
      }
      // Q4_K and Q6_K experts are read from their GGUF blocks (kernels/moe.cuh): no derived planes;
      // the other quantized types keep kI8 + kScale for the MoE kernels.
      if (type == GgmlType::Q4_K || type == GgmlType::Q6_K)
        CHECK((L.planes.size() == 1 && L.planes[0].kind == PlaneKind::kBlocks && L.planes[0].group_pitch % 16 == 0));
      else if (type != GgmlType::F32)
        CHECK((L.find(PlaneKind::kI8) >= 0 && L.find(PlaneKind::kScale) >= 0));
      const auto planes = transformAll(L, src, 2);
      CHECK(runGates(L, src, planes, ref));  // the whole plane as rows × cols
      CHECK(expertGate(L, planes, ref) == 0);
      // Negative control: an expert pitch one row short of the table's fails.
      CHECK(expertGate(L, planes, ref, -static_cast<int64_t>(L.planes[0].row_pitch)) > 0);
    }
  }
  // Planner errors: experts that do not divide the rows, an expert axis on a vector.
  for (const TensorDesc& d : {TensorDesc{"w", GgmlType::Q8_0, 20, 64, TensorRole::kMatMul, 3},
                              TensorDesc{"w", GgmlType::Q8_0, 21, 64, TensorRole::kMatMul, 0},
                              TensorDesc{"w", GgmlType::F32, 4, 64, TensorRole::kVector, 2}}) {
    llvm::Expected<TensorLayout> L = planLayout(d);
    REQUIRE(!L);
    const std::string msg = llvm::toString(L.takeError());
    CHECK(msg.find(std::to_string(d.experts) + " experts: need ≥ 1 experts that divide the rows") != std::string::npos);
  }
}

TEST_CASE("qwen3moe fixtures: every tensor passes both gates, the expert tensors per expert too") {
  if (!test::haveFixtures()) return;
  PlaneWorkers workers(2);
  std::set<GgmlType> seen, seen_experts;
  for (const char* file : {"tiny-qwen3moe-F32.gguf", "tiny-qwen3moe-Q8_0.gguf", "tiny-qwen3moe-Q4_K_M.gguf"}) {
    INFO(file);
    auto gguf = gguf::GgufFile::open(test::fixturesDir() + "/arch/models/" + file);
    REQUIRE_MESSAGE(static_cast<bool>(gguf), (gguf ? std::string() : llvm::toString(gguf.takeError())));
    for (const gguf::TensorInfo& ti : (*gguf)->tensors()) {
      INFO(ti.name);
      const bool experts = ti.n_dims == 3;
      TensorDesc d{std::string(ti.name), ti.type, ti.rows(), ti.cols(), TensorRole::kMatMul,
                   experts ? static_cast<uint32_t>(ti.ne[2]) : 1u};
      if (ti.n_dims == 1) d.role = TensorRole::kVector;
      if (ti.name == "token_embd.weight") d.role = TensorRole::kEmbeddingMatMul;
      const TensorLayout L = plan(d);
      const llvm::ArrayRef<uint8_t> src = (*gguf)->tensorData(ti);
      const std::vector<float> ref = test::refDequantize(ti.type, ti.rows(), ti.cols(), src.data());
      const auto planes = transformAll(L, src, workers.threads());
      CHECK(runGates(L, src, planes, ref));
      if (!experts) {
        seen.insert(ti.type);
        continue;
      }
      CHECK(expertGate(L, planes, ref) == 0);
      seen_experts.insert(ti.type);
    }
  }
  // README §8.2: F32, Q8_0, Q4_K and Q5_0 expert tensors; Q5_K (attn_output) and Q6_K among the others.
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_0}) {
    INFO(typeName(t));
    CHECK(seen_experts.count(t) == 1);
  }
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    INFO(typeName(t));
    CHECK(seen.count(t) == 1);
  }
}

TEST_CASE("negative controls: a rows<->cols stride swap and a flipped byte fail the gates") {
  uint64_t seed = 100;
  for (GgmlType type : kAllTypes)
    for (const Shape& s : shapesFor(type)) {
      const std::vector<uint8_t> src = randomTensor(type, s.rows, s.cols, seed++);
      const std::vector<float> ref = test::refDequantize(type, s.rows, s.cols, src.data());
      const TensorLayout L = plan({"control", type, s.rows, s.cols, TensorRole::kEmbeddingMatMul});
      const auto planes = transformAll(L, src, 1);
      for (size_t i = 0; i < L.planes.size(); ++i) {
        const StrideTable& t = L.planes[i];
        INFO(typeName(type) << " " << s.rows << "x" << s.cols << " plane " << planeKindName(t.kind));
        // Stride swap: whenever the swapped pitch differs, the offset gate must fail. For the larger
        // shape it always differs (asserted), so every plane kind has a failing control.
        const StrideTable swapped = test::swappedPitch(t);
        if (s.rows == 24) CHECK(swapped.row_pitch != t.row_pitch);
        if (swapped.row_pitch != t.row_pitch) {
          const GateResult g = offsetGateFor(L, planes, t.kind, ref, test::swappedPitch);
          CHECK(g.mismatches > 0);
        }
        // Flipped byte inside the last row's data: content gate and offset gate both fail. The byte
        // is the most significant byte of a float element (exponent bit flip) or bit 0 of a q byte,
        // at an element whose scale is non-zero (so a q change shows in the value).
        std::vector<std::vector<uint8_t>> bad = planes;
        uint64_t r = t.rows - 1, c = t.cols - 1;
        if (t.kind == PlaneKind::kI8 || t.kind == PlaneKind::kPacked) {
          const GatePlane sp = gatePlane(L, planes, PlaneKind::kScale);
          for (;; --c) {
            float sv;
            std::memcpy(&sv, sp.data + elementOffset(sp.table, r, c), 4);
            if (sv != 0 || c == 0) break;
          }
        }
        uint64_t off;
        uint8_t mask = 0x01;
        if (t.kind == PlaneKind::kPacked) {
          uint32_t shift;
          off = packedOffset(t, r, c, &shift);
          mask = static_cast<uint8_t>(1u << shift);
        } else if (t.kind == PlaneKind::kBlocks) {
          off = elementOffset(t, r, c) + halfFields(type)[0] + 1;  // the high byte of d
          mask = 0x04;
        } else {
          off = elementOffset(t, r, c) + elemBytes(t.elem) - 1;
          if (t.elem != ElemType::kI8) mask = 0x40;
        }
        bad[i][off] ^= mask;
        CHECK(test::expectedPlane(type, t, src.data(), L.source_row_bytes) != bad[i]);
        CHECK(offsetGateFor(L, bad, t.kind, ref, identity).mismatches > 0);
      }
    }
}

TEST_CASE("r43 control: a dense plane read with the source's block strides fails the offset gate") {
  // The failure DESIGN.md §3 guards against: the kI8 plane addressed with the GGUF row pitch.
  const GgmlType type = GgmlType::Q6_K;
  const std::vector<uint8_t> src = randomTensor(type, 24, 5 * 256, 4343);
  const std::vector<float> ref = test::refDequantize(type, 24, 5 * 256, src.data());
  const TensorLayout L = plan({"r43", type, 24, 5 * 256, TensorRole::kMatMul});
  const auto planes = transformAll(L, src, 2);
  static uint64_t source_pitch;
  source_pitch = L.source_row_bytes;
  const GateResult g = offsetGateFor(L, planes, PlaneKind::kI8, ref, [](const StrideTable& t) {
    StrideTable s = t;
    s.row_pitch = source_pitch;
    return s;
  });
  CHECK(g.mismatches > 0);
  CHECK(offsetGateFor(L, planes, PlaneKind::kI8, ref, identity).mismatches == 0);
}

TEST_CASE("transforms are deterministic: -j 1, 2 and 3 give identical bytes whatever the buffers held") {
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    TensorRole role;
  };
  // Enough rows for several chunks of ~64 KiB of source per chunk.
  const Case cases[] = {{GgmlType::Q4_K, 301, 2048, TensorRole::kEmbeddingMatMul},
                        {GgmlType::Q6_K, 203, 2048, TensorRole::kMatMul},
                        {GgmlType::Q4_0, 517, 1024, TensorRole::kEmbeddingMatMul},
                        {GgmlType::Q5_1, 300, 512, TensorRole::kVector},
                        {GgmlType::F16, 263, 520, TensorRole::kMatMul}};
  for (const Case& k : cases) {
    INFO(typeName(k.type) << " " << roleName(k.role));
    const std::vector<uint8_t> src = randomTensor(k.type, k.rows, k.cols, 99);
    const TensorLayout L = plan({"det", k.type, k.rows, k.cols, k.role});
    const auto one = transformAll(L, src, 1, 0x00);
    CHECK(transformAll(L, src, 2, 0xFF) == one);
    CHECK(transformAll(L, src, 3, 0x5A) == one);
  }
}

TEST_CASE("streaming: planes transformed one at a time equal all at once") {
  const GgmlType type = GgmlType::Q4_K;
  const std::vector<uint8_t> src = randomTensor(type, 24, 5 * 256, 5);
  const TensorLayout L = plan({"stream", type, 24, 5 * 256, TensorRole::kEmbeddingMatMul});
  const auto all = transformAll(L, src, 2);
  PlaneWorkers workers(2);
  for (size_t i = 0; i < L.planes.size(); ++i) {
    std::vector<uint8_t> one(L.planes[i].bytes(), 0xEE);
    std::vector<llvm::MutableArrayRef<uint8_t>> views(L.planes.size());
    views[i] = one;
    REQUIRE(!llvm::errorToBool(transformTensor(L, src, views, workers)));
    CHECK(one == all[i]);
  }
}

TEST_CASE("PlaneWorkers: every item exactly once for any n, grain and thread count") {
  for (unsigned threads : {1u, 2u, 5u})
    for (uint64_t n : {0ull, 1ull, 7ull, 1000ull})
      for (uint64_t grain : {1ull, 3ull, 64ull, 5000ull}) {
        PlaneWorkers w(threads);
        CHECK(w.threads() == threads);
        std::vector<std::atomic<int>> hits(n);
        std::atomic<uint64_t> widest{0};
        for (int rep = 0; rep < 3; ++rep)
          w.parallelFor(n, grain, [&](uint64_t b, uint64_t e) {
            uint64_t prev = widest.load();
            while (e - b > prev && !widest.compare_exchange_weak(prev, e - b)) {
            }
            for (uint64_t i = b; i < e; ++i) hits[i].fetch_add(1);
          });
        CHECK(widest.load() <= grain);
        for (uint64_t i = 0; i < n; ++i) CHECK(hits[i].load() == 3);
      }
}

TEST_CASE("errors name the tensor, the field and the numbers") {
  const auto planError = [](TensorDesc d) {
    llvm::Expected<TensorLayout> L = planLayout(d);
    REQUIRE(!L);
    return llvm::toString(L.takeError());
  };
  std::string m = planError({"blk.3.ffn_up.weight", GgmlType::Q4_K, 64, 300, TensorRole::kMatMul});
  CHECK(m.find("blk.3.ffn_up.weight") != std::string::npos);
  CHECK(m.find("cols = 300") != std::string::npos);
  CHECK(m.find("256") != std::string::npos);
  m = planError({"x", GgmlType::IQ2_XXS, 4, 256, TensorRole::kMatMul});
  CHECK(m.find("not supported") != std::string::npos);
  CHECK(m.find("Q6_K") != std::string::npos);
  m = planError({"x", static_cast<GgmlType>(4), 4, 256, TensorRole::kMatMul});
  CHECK(m.find("type id 4") != std::string::npos);
  m = planError({"x", GgmlType::Q8_1, 4, 256, TensorRole::kMatMul});
  CHECK(m.find("not supported") != std::string::npos);
  m = planError({"x", GgmlType::F32, 0, 256, TensorRole::kMatMul});
  CHECK(m.find("non-zero") != std::string::npos);
  m = planError({"huge", GgmlType::F32, uint64_t{1} << 40, uint64_t{1} << 30, TensorRole::kMatMul});
  CHECK(m.find("2^62") != std::string::npos);

  const TensorLayout L = plan({"blk.0.attn_q.weight", GgmlType::Q8_0, 15, 96, TensorRole::kMatMul});
  PlaneWorkers w(1);
  std::vector<uint8_t> src(L.source_bytes - 1);
  std::vector<std::vector<uint8_t>> planes;
  std::vector<llvm::MutableArrayRef<uint8_t>> views;
  for (const StrideTable& t : L.planes) planes.emplace_back(t.bytes());
  for (auto& p : planes) views.emplace_back(p);
  m = llvm::toString(transformTensor(L, src, views, w));
  CHECK(m.find("blk.0.attn_q.weight") != std::string::npos);
  CHECK(m.find(std::to_string(L.source_bytes - 1) + " bytes") != std::string::npos);
  src.resize(L.source_bytes);
  m = llvm::toString(transformTensor(L, src, llvm::makeArrayRef(views).drop_back(), w));
  CHECK(m.find("output buffers") != std::string::npos);
  planes[1].pop_back();
  views[1] = planes[1];
  m = llvm::toString(transformTensor(L, src, views, w));
  CHECK(m.find("plane 1 (i8)") != std::string::npos);
  CHECK(m.find(std::to_string(L.planes[1].bytes())) != std::string::npos);
}

TEST_CASE("gates on every tensor of every fixture model (real GGUF data), and against gguf-py dequantization") {
  if (!test::haveFixtures()) return;
  const std::string dir = test::fixturesDir();
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/models"))
    if (e.path().extension() == ".gguf") files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  REQUIRE(!files.empty());

  // gguf-py's exact dequantization of the first rows of three tensors per model (fixtures README §7).
  std::ifstream index_in(dir + "/dequant/index.json");
  REQUIRE(index_in.good());
  const nlohmann::json index = nlohmann::json::parse(index_in);

  std::set<GgmlType> seen;
  PlaneWorkers workers(2);
  uint64_t dequant_checked = 0;
  for (const std::string& file : files) {
    INFO(file);
    auto gguf = gguf::GgufFile::open(dir + "/models/" + file);
    REQUIRE_MESSAGE(static_cast<bool>(gguf), (gguf ? std::string() : llvm::toString(gguf.takeError())));
    for (const gguf::TensorInfo& ti : (*gguf)->tensors()) {
      TensorDesc d{std::string(ti.name), ti.type, ti.rows(), ti.cols(), TensorRole::kMatMul};
      if (ti.n_dims == 1) d.role = TensorRole::kVector;
      // token_embd gets the gather form and the matmul planes, whether tied or not, so real embedding
      // data goes through every plane kind.
      if (ti.name == "token_embd.weight") d.role = TensorRole::kEmbeddingMatMul;
      const TensorLayout L = plan(d);
      checkTableRules(L);
      const llvm::ArrayRef<uint8_t> src = (*gguf)->tensorData(ti);
      const std::vector<float> ref = test::refDequantize(d.type, d.rows, d.cols, src.data());
      const auto planes = transformAll(L, src, workers.threads());
      CHECK(runGates(L, src, planes, ref));
      seen.insert(d.type);

      if (!index.contains(file)) continue;
      for (const auto& entry : index[file]) {
        if (entry["tensor"] != d.name) continue;
        const std::vector<float> py = test::readF32File(dir + "/dequant/" + entry["file"].get<std::string>());
        REQUIRE(py.size() == entry["rows_in_file"].get<uint64_t>() * d.cols);
        CHECK(std::memcmp(py.data(), ref.data(), py.size() * 4) == 0);
        dequant_checked += py.size();
      }
    }
  }
  CHECK(dequant_checked > 0);
  for (GgmlType t : kAllTypes) {
    INFO("fixture coverage of " << typeName(t));
    CHECK(seen.count(t) == 1);
  }
}

TEST_CASE("plane forms: compact derives every plane after kBlocks at load, expanded stores them all") {
  for (GgmlType type : kAllTypes)
    for (TensorRole role : kAllRoles) {
      INFO(typeName(type) << " " << roleName(role));
      const TensorDesc d{"w", type, 24, 5 * uint64_t{ggmlTypeTraits(type).block_size}, role};
      const TensorLayout compact = plan(d);
      llvm::Expected<TensorLayout> expanded = planLayout(d, PlaneForm::kExpanded);
      REQUIRE(static_cast<bool>(expanded));
      REQUIRE(expanded->planes.size() == compact.planes.size());
      uint64_t derived = 0;
      for (size_t i = 0; i < compact.planes.size(); ++i) {
        CHECK(expanded->planes[i].kind == compact.planes[i].kind);
        CHECK(expanded->planes[i].row_pitch == compact.planes[i].row_pitch);
        CHECK_FALSE(expanded->derived[i]);
        if (compact.derived[i]) derived += compact.planes[i].bytes();
      }
      CHECK(expanded->storedBytes() == expanded->planeBytes());
      CHECK(compact.storedBytes() + derived == compact.planeBytes());
      // A quantized matmul weight stores its GGUF blocks only: at most 16-byte slots per block more.
      if (!isFloat(type) && role != TensorRole::kVector) {
        const GgmlTypeTraits tr = ggmlTypeTraits(type);
        CHECK(compact.storedBytes() <= compact.source_bytes / tr.type_size * round16(tr.type_size));
        CHECK(compact.storedBytes() >= compact.source_bytes);
      }
    }
}

TEST_CASE("load-time expansion (expand_blocks.cuh expandBlock) writes the compiler's derived planes byte for byte") {
  // The runtime's load plan runs expandBlock on the GPU over the stored kBlocks plane; here the same
  // header function runs on the host and must reproduce what the compiler writes into an expanded
  // artifact (which passed the content and offset gates above), padding included (zeroed buffers, as
  // the runtime zeroes derived planes before the launch).
  for (GgmlType type : kAllTypes) {
    if (isFloat(type)) continue;
    for (const Shape& s : shapesFor(type)) {
      INFO(typeName(type) << " " << s.rows << "x" << s.cols);
      const TensorLayout L = plan({"w", type, s.rows, s.cols, TensorRole::kMatMul});
      const std::vector<uint8_t> src = randomTensor(type, s.rows, s.cols, 11 + s.rows);
      const std::vector<std::vector<uint8_t>> want = transformAll(L, src, 2);
      std::vector<std::vector<uint8_t>> got(L.planes.size());
      for (size_t i = 0; i < L.planes.size(); ++i) got[i].assign(L.derived[i] ? L.planes[i].bytes() : 0, 0);
      const auto at = [&](PlaneKind k) -> std::pair<uint8_t*, uint64_t> {
        const int i = L.find(k);
        return i < 0 ? std::pair<uint8_t*, uint64_t>{nullptr, 0} : std::pair{got[i].data(), L.planes[i].row_pitch};
      };
      kern::ExpandTargets x;
      x.q = reinterpret_cast<int8_t*>(at(PlaneKind::kI8).first);
      x.q_pitch = at(PlaneKind::kI8).second;
      x.scale = reinterpret_cast<float*>(at(PlaneKind::kScale).first);
      x.s_pitch = at(PlaneKind::kScale).second;
      x.min = reinterpret_cast<float*>(at(PlaneKind::kMin).first);
      x.m_pitch = at(PlaneKind::kMin).second;
      x.packed = at(PlaneKind::kPacked).first;
      x.p_pitch = at(PlaneKind::kPacked).second;
      if (L.find(PlaneKind::kPacked) >= 0) x.q_offset = L.planes[L.find(PlaneKind::kPacked)].q_offset;
      const StrideTable& blocks = L.planes[L.find(PlaneKind::kBlocks)];
      const uint8_t* stored = want[L.find(PlaneKind::kBlocks)].data();
      for (uint64_t r = 0; r < s.rows; ++r)
        for (uint64_t b = 0; b < s.cols / blocks.group_size; ++b)
          kern::expandBlock(type, stored + elementOffset(blocks, r, b * blocks.group_size), r, b, x);
      for (size_t i = 0; i < L.planes.size(); ++i) {
        if (!L.derived[i]) continue;
        INFO("plane " << planeKindName(L.planes[i].kind));
        CHECK(got[i] == want[i]);
      }
    }
  }
}

TEST_CASE("f16_prefill: quantized matmul weights get a derived kF16 plane of their weights rounded to binary16") {
  uint64_t seed = 77;
  for (GgmlType type : kAllTypes)
    for (TensorRole role : kAllRoles)
      for (uint32_t experts : {1u, 2u}) {
        if (experts > 1 && role == TensorRole::kVector) continue;
        const GgmlTypeTraits tr = ggmlTypeTraits(type);
        const TensorDesc d{"w", type, 24, 5 * uint64_t{tr.block_size}, role, experts};
        INFO(typeName(type) << " " << roleName(role) << " experts " << experts);
        llvm::Expected<TensorLayout> L = planLayout(d, PlaneForm::kCompact, /*f16_prefill=*/true);
        REQUIRE(static_cast<bool>(L));
        const bool want_f16 = !isFloat(type) && experts == 1 &&
                              (role == TensorRole::kMatMul || role == TensorRole::kEmbeddingMatMul);
        // Without f16_prefill the layout is unchanged; with it, one more derived plane at the end, or for Q4_K
        // and Q6_K (decode reads kBlocks) the kF16 plane as the only derived one.
        const TensorLayout plain = plan(d);
        const bool only_f16 = type == GgmlType::Q4_K || type == GgmlType::Q6_K;
        REQUIRE(L->planes.size() == (want_f16 ? (only_f16 ? 2 : plain.planes.size() + 1) : plain.planes.size()));
        if (!want_f16) continue;
        const int f = L->find(PlaneKind::kF16);
        REQUIRE(f == static_cast<int>(L->planes.size()) - 1);
        CHECK(L->derived[static_cast<size_t>(f)]);
        const StrideTable& t = L->planes[static_cast<size_t>(f)];
        CHECK(t.elem == ElemType::kF16);
        CHECK(t.row_pitch == round16(d.cols * 2));

        const std::vector<uint8_t> src = randomTensor(type, d.rows, d.cols, seed++);
        const std::vector<float> ref = test::refDequantize(type, d.rows, d.cols, src.data());
        llvm::Expected<TensorLayout> X = planLayout(d, PlaneForm::kExpanded, true);
        REQUIRE(static_cast<bool>(X));
        const std::vector<std::vector<uint8_t>> planes = transformAll(*X, src, 2);
        // Content gate: the plane's bytes against the reference rounded to binary16 through the table,
        // padding zero.
        std::vector<uint8_t> want(t.bytes(), 0);
        std::vector<float> rounded(ref.size());
        for (uint64_t r = 0; r < d.rows; ++r)
          for (uint64_t c = 0; c < d.cols; ++c) {
            const uint16_t h = floatToHalf(ref[r * d.cols + c]);
            std::memcpy(want.data() + elementOffset(t, r, c), &h, 2);
            rounded[r * d.cols + c] = halfToFloat(h);
          }
        CHECK(planes[static_cast<size_t>(f)] == want);
        // Offset gate: every element read through the stride table equals the rounded reference.
        const GateResult g = test::gateDirect(gatePlane(*X, planes, PlaneKind::kF16), rounded);
        CHECK(g.checked == d.rows * d.cols);
        CHECK(g.mismatches == 0);
        // The load-time expansion writes the same bytes (the runtime zeroes the plane first).
        std::vector<uint8_t> got(t.bytes(), 0);
        const auto bytesOf = [&](PlaneKind k) { return X->find(k) >= 0 ? X->planes[static_cast<size_t>(X->find(k))].bytes() : 0; };
        const auto pitchOf = [&](PlaneKind k) { return X->find(k) >= 0 ? X->planes[static_cast<size_t>(X->find(k))].row_pitch : 0; };
        std::vector<int8_t> q(bytesOf(PlaneKind::kI8));
        std::vector<float> sc(bytesOf(PlaneKind::kScale) / 4), mn(bytesOf(PlaneKind::kMin) / 4);
        CHECK(q.empty() == only_f16);
        kern::ExpandTargets x;  // the kF16 plane, and kI8 / kScale / kMin where the layout has them
        if (!q.empty()) {
          x.q = q.data();
          x.q_pitch = pitchOf(PlaneKind::kI8);
          x.scale = sc.data();
          x.s_pitch = pitchOf(PlaneKind::kScale);
        }
        if (!mn.empty()) {
          x.min = mn.data();
          x.m_pitch = pitchOf(PlaneKind::kMin);
        }
        x.f16 = reinterpret_cast<uint16_t*>(got.data());
        x.f_pitch = t.row_pitch;
        const StrideTable& blocks = X->planes[static_cast<size_t>(X->find(PlaneKind::kBlocks))];
        const uint8_t* stored = planes[static_cast<size_t>(X->find(PlaneKind::kBlocks))].data();
        for (uint64_t r = 0; r < d.rows; ++r)
          for (uint64_t b = 0; b < d.cols / blocks.group_size; ++b)
            kern::expandBlock(type, stored + elementOffset(blocks, r, b * blocks.group_size), r, b, x);
        CHECK(got == want);
      }
}
