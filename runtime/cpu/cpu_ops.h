// CPU reference ops: each op kind of the execution plan as a plain float32 loop (DESIGN.md §4).
//
// These functions are the oracle for the GPU parity tests, so each one is separately callable, works
// on plain float arrays and reads weights only through their StrideTables (kernels/stride_table.h).
// The math is fixtures/README.md §3. Layout convention: an activation buffer is `n_rows` rows of
// `width` contiguous floats, row t = token t of the batch. None of these functions allocates.
//
// Accuracy: each function below declares a tolerance (max |error| / max |float64 reference|, on
// random inputs) that tests/runtime/test_cpu_ops.cpp asserts; "measured" is what that test saw.
//
// Thread-safety: the functions are pure over their arguments; those taking a ThreadPool split their
// output rows over it (results are independent of the thread count).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/rope.cuh"
#include "kernels/stride_table.h"
#include "minfer/status.h"

namespace minfer::cpu {

class ThreadPool;

// One plane of a weight tensor: its layout and its bytes (inside the mapped artifact).
struct PlaneView {
  StrideTable table;
  const uint8_t* data = nullptr;  // null when the tensor has no plane of this kind
  uint64_t size = 0;              // bytes readable at data
  bool present() const { return data != nullptr; }
};

// A weight tensor as the CPU reads it: a logical rows × cols matrix (rows = out features, cols = in
// features = GGUF ne[0]); a 1-D tensor of n elements is 1 × n. Any subset of planes may be present;
// every present plane describes the same rows × cols (checkWeightPlanes).
struct WeightPlanes {
  const char* name = "";  // tensor name, for error messages (owned by the artifact)
  uint64_t rows = 0;
  uint64_t cols = 0;
  PlaneView dense;   // kF32 / kF16 / kBF16: the exact source values
  PlaneView q;       // kI8: q(r, c)
  PlaneView scale;   // kScale: scale(r, c / group)          w(r, c) = scale·q + min
  PlaneView min;     // kMin: min(r, c / group), optional    (absent: min = 0)
  PlaneView blocks;  // kBlocks: the source GGUF blocks
  // kPacked planes exist for the GPU decode GEMV; the CPU ignores them.
};

// Which planes a row is read from.
enum class RowSource : uint8_t { kDense, kQuantized, kBlocks };

// Checks every present plane of `w` against rows × cols: plane kind ↔ element type, row pitch large
// enough for a row, group size/pitch of scale, min and block planes, the block type's size, and
// rows·row_pitch ≤ the bytes available. Errors name the tensor, the plane and the numbers.
Status checkWeightPlanes(const WeightPlanes& w);

// The planes to read rows from: for a gather (embedding lookup) kBlocks, then dense, then quantized;
// for matmul dense, then quantized, then kBlocks. All give the same values (the planes are exact
// re-layouts of the source). Error when no complete set is present (e.g. i8 without scale).
Result<RowSource> pickRowSource(const WeightPlanes& w, bool for_gather);

// Writes the cols float values of row r: dense → converted exactly; quantized → scale·q + min
// (kernels/block_formats.h decomposed form, bit-identical to dequantizeBlock); blocks →
// dequantizeBlock of each block of the row. Requires a source accepted by pickRowSource and
// r < rows. Cost: one pass over the row.
void dequantizeRow(const WeightPlanes& w, RowSource src, uint64_t r, float* out);

// ---------------------------------------------------------------------------------------------
// Ops. Shapes in elements; n_rows = tokens in the batch.

// Embed: out[t] = row ids[t] of `table` (n_rows × table.cols). Requires 0 ≤ ids[t] < table.rows
// (the caller validates token ids). Exact (tolerance 0).
void embed(const WeightPlanes& table, RowSource src, const int32_t* ids, int n_rows, float* out);

// RMSNorm (Zhang & Sennrich 2019): out[t] = x[t] / sqrt(mean(x[t]²) + eps) ⊙ w.
// x, out: n_rows × width (out may equal x); w: width. Tolerance 1e-6 (measured 1.1e-7).
void rmsNorm(const float* x, const float* w, int n_rows, int width, float eps, float* out);

// Per-head RMSNorm in place (qwen3 q/k norm): each of the n_head slices of head_dim elements of each
// row is normalized as rmsNorm with the weight w (head_dim). x: n_rows × (n_head·head_dim).
// Tolerance 1e-6 (measured 1.1e-7).
void headRmsNorm(float* x, const float* w, int n_rows, int n_head, int head_dim, float eps);

// MatMul: out[t][r] = Σ_c W(r, c)·in[t][c] (+ bias[r]), W read through its stride tables (source
// `src`). in: n_rows × W.cols; out: n_rows × W.rows (out must not overlap in); bias: W.rows or null.
// scratch: (pool ? pool->threads() : 1) × W.cols floats (one dequantized weight row per thread).
// Each weight row is dequantized once and dotted with all n_rows inputs (float32, 8 partial sums).
// Parallel over output features. Tolerance 1e-6·sqrt(cols / 64) (measured ≤ 1.8e-7 at cols 512,
// every type). Results do not depend on the thread count or on which plane set is read.
void matmul(const WeightPlanes& W, RowSource src, const float* bias, const float* in, int n_rows,
            float* out, ThreadPool* pool, float* scratch);

// RoPE (Su et al. 2021, "RoFormer"), in place. x: n_rows × (n_head·head_dim); row t is at position
// pos[t] (n_rows positions ≥ 0). For i < n_rot/2: θ_i = (pos·freq_scale)·freq_base^(−2i/n_rot) / ff_i (computed in
// double; ff_i = freq_factors[i], or 1 when freq_factors is null: llama.cpp's ggml_rope_ext with
// freq_factors, the rope_freqs.weight of Llama 3.1+ GGUFs, fixtures README §8);
// kNorm rotates the pairs (2i, 2i+1) of each head, kNeox the pairs (i, i + n_rot/2);
// (a, b) → (a·cosθ − b·sinθ, a·sinθ + b·cosθ). Elements ≥ n_rot of a head are untouched.
// Requires n_rot even, n_rot ≤ head_dim, n_rot ≤ kMaxRot; freq_factors: null or n_rot/2 finite
// values > 0. Tolerance 5e-7 (measured 7e-8).
// With yarn (kern::ropeYarn(), kernels/rope.cuh: llama.cpp's YaRN): for ext_factor ≠ 0 the angle is
// θ_i = θ_e·freq_scale·(1 − γ_i) + θ_e·γ_i with θ_e = pos·freq_base^(−2i/n_rot) / ff_i and γ_i =
// ext_factor·ramp(i); cos and sin are multiplied by yarn.mscale (1 by default: no change). γ_i is
// rounded to f32 as in ggml, which adds up to θ_e·(1 − freq_scale)·2^−24 to the angle's error.
// row_pitch: floats from row t to row t + 1 of x (0: n_head·head_dim); a larger pitch makes x a column
// view of a wider buffer (format 1.4, phi3's fused q|k|v rows).
enum class RopeStyle : uint8_t { kNorm = 0, kNeox = 1 };
constexpr int kMaxRot = 1024;
void rope(float* x, int n_rows, int n_head, int head_dim, int n_rot, RopeStyle style, float freq_base,
          float freq_scale, const int32_t* pos, const float* freq_factors = nullptr, const kern::RopeYarn& yarn = {},
          int64_t row_pitch = 0);

// One layer's KV cache in float32: k and v are each (n_ctx, n_head_kv, head_dim), slot-major; a slot holds
// one position of one sequence: KvRows says which, or with ring > 0 (a sliding-window layer of a
// single-sequence session, schema Step.kv_ring) position p is in slot p % ring, whatever the rows' tables.
struct KvLayer {
  float* k = nullptr;
  float* v = nullptr;
  int64_t n_ctx = 0;  // slots (a ring's: min(n_ctx of the session, ring))
  int n_head_kv = 0;
  int head_dim = 0;
  int64_t ring = 0;   // > 0: position p in slot p % ring; 0: the slot KvRows gives
};

// Where the rows of a batch sit in a KV cache of fixed-size blocks (Kwon et al. 2023, vLLM's paged
// attention): row t is position pos[t] of a sequence whose block table is tables[t]; position p of that
// sequence lives in slot tables[t][p / block_size]·block_size + p % block_size. Rows of one sequence share
// its table. One sequence in a contiguous cache of n_ctx slots is the case block_size = n_ctx, every table
// {0} (KvRowStorage::contiguous). Requires 0 ≤ pos[t] < n_ctx, and tables[t] to cover blocks
// 0 .. pos[t] / block_size with slots inside the cache.
struct KvRows {
  const int32_t* pos = nullptr;            // (n_rows) positions
  const int32_t* const* tables = nullptr;  // (n_rows) block tables
  int block_size = 1;                      // positions per block
  int n_ctx = 0;                           // positions of one sequence at most (sizes attention's scratch)
  int64_t slot(int t, int p) const {
    return int64_t{tables[t][p / block_size]} * block_size + p % block_size;
  }
};

// The slot of position p of row t's sequence in `cache`: p % cache.ring for a ring, else rows.slot(t, p).
inline int64_t kvSlot(const KvLayer& cache, const KvRows& rows, int t, int p) {
  return cache.ring > 0 ? p % cache.ring : rows.slot(t, p);
}

// The arrays behind a KvRows for up to max_rows rows, allocated at construction and reused.
struct KvRowStorage {
  explicit KvRowStorage(int max_rows = 0)
      : pos(static_cast<size_t>(max_rows)), tables(static_cast<size_t>(max_rows)) {}
  // Rows 0 .. n_rows−1 at positions pos0 .. of one sequence in a contiguous cache of n_ctx slots.
  // Requires n_rows ≤ max_rows, pos0 ≥ 0 and pos0 + n_rows ≤ n_ctx.
  KvRows contiguous(int pos0, int n_rows, int n_ctx);
  // Rows whose positions and tables the caller wrote into pos / tables.
  KvRows paged(int block_size, int n_ctx) const { return {pos.data(), tables.data(), block_size, n_ctx}; }

  std::vector<int32_t> pos;             // (max_rows)
  std::vector<const int32_t*> tables;   // (max_rows)
  static constexpr int32_t kFirstBlock[1] = {0};
};

// Stores the batch's keys and values: row t into the slot of its position rows.pos[t] (kvSlot). k, v: n_rows rows of
// n_head_kv·head_dim floats, row t at t·k_pitch (t·v_pitch); a pitch of 0 is the row width (dense rows).
void kvStore(const KvLayer& cache, const float* k, const float* v, int n_rows, const KvRows& rows,
             int64_t k_pitch = 0, int64_t v_pitch = 0);

// Options of attention (schema Step.scale / softcap / window; gemma2 as llama.cpp computes it).
struct AttentionOptions {
  float scale = 0;    // query scale; 0: 1/sqrt(head_dim)
  float softcap = 0;  // s → softcap·tanh(s·(1/softcap)) before the softmax; 0: none
  int window = 0;     // sliding window: keys at positions > p − window only; 0: none
};

// Causal grouped-query attention over the cache (keys/values already stored by kvStore):
// for row t (position p = rows.pos[t] of its sequence) and query head j, kv head g = j / (n_head / n_head_kv):
//   s_i = q[t, j]·K[i, g]·scale for i = lo..p (lo = 0, or max(0, p − window + 1) with a window),
//   then with a softcap s_i = softcap·tanh(s_i / softcap);  a = softmax(s);  out[t, j] = Σ_i a_i·V[i, g],
// K[i] and V[i] read from the slot of position i of row t's sequence (kvSlot: rows.tables[t], or the ring),
// in position order, so a row's result does not depend on the other rows of the batch nor on where the
// positions live (a ring gives bit-identical results to a full cache when it holds every key read).
// q, out: n_rows × (n_head·head_dim), must not overlap; q's row t at t·q_pitch (0: n_head·head_dim).
// Requires n_head % n_head_kv == 0.
// scratch: (pool ? pool->threads() : 1) × rows.n_ctx floats. Parallel over (row, head).
// Tolerance 1e-6 (measured 1.7e-7; with softcap and window the same).
void attention(const float* q, const KvLayer& cache, int n_rows, const KvRows& rows, int n_head, float* out,
               ThreadPool* pool, float* scratch, const AttentionOptions& options = {}, int64_t q_pitch = 0);

// SwiGLU (Shazeer 2020): out = silu(gate) ⊙ up, silu(g) = g / (1 + e^(−g)). n elements; out may
// equal gate or up. Tolerance 5e-7 (measured 8.7e-8).
void swiGlu(const float* gate, const float* up, int64_t n, float* out);

// GeGLU (Shazeer 2020) with the tanh form of GELU (Hendrycks & Gimpel 2016), as ggml_gelu writes it:
// out = 0.5·g·(1 + tanh(√(2/π)·g·(1 + 0.044715·g²))) ⊙ up, in f32 with tanhf. llama.cpp's CPU backend
// instead looks GELU up in an fp16 table (fixtures README §8): this is the exact form, ~4e-4 of it on
// the gemma goldens. n elements; out may equal gate or up. Tolerance 5e-7 (measured 1.2e-7).
void geGlu(const float* gate, const float* up, int64_t n, float* out);

// Scale (gemma): out = x·scale, then with softcap > 0 out = softcap·tanh(out·(1/softcap)) (llama.cpp's
// scale, tanh, scale). n elements; out may equal x. Tolerance 5e-7 (measured 6e-8).
void scale(const float* x, int64_t n, float scale, float softcap, float* out);

// MoE router with softmax gating (llama.cpp's build_moe_ffn, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX): for
// each row t, p = softmax(logits[t]) (ggml_soft_max: max subtracted, e^x in f32, the sum in double,
// times its f32 reciprocal); ids[t] = the n_used experts of largest p, by falling p (equal p: lower id
// first); w[t][j] = p[ids[t][j]], divided by the sum of the chosen p when `norm` (build_moe_ffn's norm_w).
// logits: n_rows × n_expert; ids, w: n_rows × n_used. Requires 1 ≤ n_used ≤ n_expert ≤ kMaxExperts.
// Tolerance 5e-7 on w, ids exact away from ties (measured 3.3e-8).
constexpr int kMaxExperts = 4096;
void moeRoute(const float* logits, int n_rows, int n_expert, int n_used, bool norm, int32_t* ids, float* w);

// Floats of moeFfn scratch per thread for a model of width n_embd and expert width n_ff.
inline int64_t moeScratchFloats(int64_t n_embd, int64_t n_ff) { return 2 * n_embd + 3 * n_ff; }

// MoE FFN (llama.cpp's build_moe_ffn with LLM_FFN_SILU): out[t] = Σ_j w[t][j]·down_e(silu(gate_e·x[t]) ⊙
// up_e·x[t]), e = ids[t][j], the sum in slot order from 0 (as ggml adds the weighted experts). gate, up:
// n_expert·n_ff rows × n_embd cols, down: n_expert·n_embd rows × n_ff cols, each with an expert axis of
// n_expert slices (stride_table.h); only the chosen experts' rows are read (expert e's row r at
// expertOffset + r·row_pitch). x, out: n_rows × n_embd (must not overlap); ids, w: n_rows × n_used with
// ids outside 0..n_expert−1 skipped (moeRoute never writes one). scratch: (pool ? pool->threads() : 1) × moeScratchFloats.
// Parallel over tokens. Tolerance 1e-6·sqrt(max(n_embd, n_ff) / 64) (measured 1.7e-7 at 96 x 64).
void moeFfn(const WeightPlanes& gate, RowSource gate_src, const WeightPlanes& up, RowSource up_src,
            const WeightPlanes& down, RowSource down_src, const float* x, const int32_t* ids, const float* w,
            int n_rows, int n_used, float* out, ThreadPool* pool, float* scratch);

// Elementwise out = a + b over n elements; out may equal a or b. Exact.
void add(const float* a, const float* b, int64_t n, float* out);

}  // namespace minfer::cpu
