// CPU reference ops: plain float32 loops over activation rows, weights read through stride tables.
#include "runtime/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/thread_pool.h"

namespace minfer::cpu {
namespace {

// binary16 → float32 for every bit pattern, built once from halfToFloat (exact by construction);
// a 256 KiB table lookup instead of halfToFloat's branches in the f16 matmul inner loop.
const float* halfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = halfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

float readF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

// One float of a scale or min plane (stored as f32 or f16).
float readGroupValue(const PlaneView& p, uint64_t r, uint64_t c) {
  const uint8_t* at = p.data + elementOffset(p.table, r, c);
  return p.table.elem == ElemType::kF16 ? halfToFloat(readU16(at)) : readF32(at);
}

std::string planeError(const WeightPlanes& w, const PlaneView& p, const std::string& what) {
  return "tensor '" + std::string(w.name) + "', " + planeKindName(p.table.kind) + " plane: " + what;
}

Status checkPlane(const WeightPlanes& w, const PlaneView& p) {
  if (!p.present()) return Status::ok();
  const StrideTable& t = p.table;
  if (t.rows != w.rows || t.cols != w.cols)
    return Status::error(planeError(w, p, "shape " + std::to_string(t.rows) + " x " + std::to_string(t.cols) +
                                              " differs from the tensor's " + std::to_string(w.rows) + " x " +
                                              std::to_string(w.cols)));
  if (t.rows == 0 || t.cols == 0) return Status::error(planeError(w, p, "empty shape"));
  const auto need = [&](ElemType e, const char* name) -> Status {
    if (t.elem != e)
      return Status::error(planeError(w, p, "element type " + std::to_string(static_cast<int>(t.elem)) +
                                                ", expected " + name));
    return Status::ok();
  };
  uint64_t row_bytes = 0;  // bytes one row needs from its start
  switch (t.kind) {
    case PlaneKind::kF32: MINFER_RETURN_IF_ERROR(need(ElemType::kF32, "f32")); row_bytes = t.cols * 4; break;
    case PlaneKind::kF16: MINFER_RETURN_IF_ERROR(need(ElemType::kF16, "f16")); row_bytes = t.cols * 2; break;
    case PlaneKind::kBF16: MINFER_RETURN_IF_ERROR(need(ElemType::kBF16, "bf16")); row_bytes = t.cols * 2; break;
    case PlaneKind::kI8: MINFER_RETURN_IF_ERROR(need(ElemType::kI8, "i8")); row_bytes = t.cols; break;
    case PlaneKind::kScale:
    case PlaneKind::kMin: {
      if (t.elem != ElemType::kF32 && t.elem != ElemType::kF16)
        return Status::error(planeError(w, p, "element type " + std::to_string(static_cast<int>(t.elem)) +
                                                  ", expected f32 or f16"));
      if (t.group_size == 0 || t.group_pitch < elemBytes(t.elem))
        return Status::error(planeError(w, p, "group_size " + std::to_string(t.group_size) + ", group_pitch " +
                                                  std::to_string(t.group_pitch) + " (need ≥ 1 and ≥ " +
                                                  std::to_string(elemBytes(t.elem)) + ")"));
      const uint64_t groups = (t.cols + t.group_size - 1) / t.group_size;
      row_bytes = (groups - 1) * t.group_pitch + elemBytes(t.elem);
      break;
    }
    case PlaneKind::kBlocks: {
      const GgmlTypeTraits tr = ggmlTypeTraits(t.ggml_type);
      float probe[kQK_K];
      static const uint8_t zeros[512] = {};
      if (!tr.known || !tr.supported || tr.type_size > sizeof zeros ||
          !dequantizeBlock(static_cast<GgmlType>(t.ggml_type), zeros, probe))
        return Status::error(planeError(w, p, "ggml_type " + std::to_string(t.ggml_type) + " (" + tr.name +
                                                  ") has no CPU dequantization"));
      // Block slots of the block's bytes or padded to 16 (layout_planner.h).
      if (t.group_size != tr.block_size ||
          (t.group_pitch != tr.type_size && t.group_pitch != alignUp(tr.type_size, kPlaneRowAlign)))
        return Status::error(planeError(w, p, "group_size " + std::to_string(t.group_size) + ", group_pitch " +
                                                  std::to_string(t.group_pitch) + " differ from " + tr.name +
                                                  "'s block of " + std::to_string(tr.block_size) + " weights in " +
                                                  std::to_string(tr.type_size) + " bytes"));
      if (t.cols % tr.block_size != 0)
        return Status::error(planeError(w, p, "cols " + std::to_string(t.cols) + " is not a multiple of " +
                                                  tr.name + "'s block size " + std::to_string(tr.block_size)));
      row_bytes = t.cols / tr.block_size * t.group_pitch;
      break;
    }
    case PlaneKind::kPacked: return Status::ok();  // GPU only
    default:
      return Status::error(planeError(w, p, "unknown plane kind " + std::to_string(static_cast<int>(t.kind))));
  }
  if (t.row_pitch < row_bytes)
    return Status::error(planeError(w, p, "row_pitch " + std::to_string(t.row_pitch) + " < " +
                                              std::to_string(row_bytes) + " bytes one row needs"));
  // rows·row_pitch ≤ size, without overflow.
  if (t.row_pitch > p.size / t.rows)
    return Status::error(planeError(w, p, "rows " + std::to_string(t.rows) + " x row_pitch " +
                                              std::to_string(t.row_pitch) + " exceeds the " +
                                              std::to_string(p.size) + " bytes of its segment"));
  return Status::ok();
}

// Dot product of n floats with 8 independent partial sums (vectorizable without reassociation flags).
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

}  // namespace

Status checkWeightPlanes(const WeightPlanes& w) {
  for (const PlaneView* p : {&w.dense, &w.q, &w.scale, &w.min, &w.blocks}) MINFER_RETURN_IF_ERROR(checkPlane(w, *p));
  if (w.q.present() != w.scale.present())
    return Status::error("tensor '" + std::string(w.name) + "': an i8 plane needs a scale plane and vice versa");
  if (w.min.present() && !w.q.present())
    return Status::error("tensor '" + std::string(w.name) + "': min plane without i8 and scale planes");
  if (w.min.present()) {
    const uint32_t a = w.scale.table.group_size, b = w.min.table.group_size;
    if (std::max(a, b) % std::min(a, b) != 0)
      return Status::error("tensor '" + std::string(w.name) + "': scale group_size " + std::to_string(a) +
                           " and min group_size " + std::to_string(b) + " do not nest (one must divide the other)");
  }
  return Status::ok();
}

Result<RowSource> pickRowSource(const WeightPlanes& w, bool for_gather) {
  const bool dense = w.dense.present(), quantized = w.q.present() && w.scale.present(), blocks = w.blocks.present();
  if (for_gather) {
    if (blocks) return RowSource::kBlocks;
    if (dense) return RowSource::kDense;
    if (quantized) return RowSource::kQuantized;
  } else {
    if (dense) return RowSource::kDense;
    if (quantized) return RowSource::kQuantized;
    if (blocks) return RowSource::kBlocks;
  }
  return Status::error("tensor '" + std::string(w.name) +
                       "' has no plane the CPU can read (needs f32/f16/bf16, i8 + scale (+ min), or blocks)");
}

void dequantizeRow(const WeightPlanes& w, RowSource src, uint64_t r, float* out) {
  const uint64_t cols = w.cols;
  // Dense and i8 planes are contiguous along a row by the StrideTable definition
  // (elementOffset(r, c + 1) − elementOffset(r, c) = elemBytes), so each run is addressed from the
  // offset of its first element.
  switch (src) {
    case RowSource::kDense: {
      const uint8_t* p = w.dense.data + elementOffset(w.dense.table, r, 0);
      switch (w.dense.table.kind) {
        case PlaneKind::kF16: {
          const float* table = halfTable();
          for (uint64_t c = 0; c < cols; ++c) out[c] = table[readU16(p + 2 * c)];
          return;
        }
        case PlaneKind::kBF16:
          for (uint64_t c = 0; c < cols; ++c) out[c] = bf16ToFloat(readU16(p + 2 * c));
          return;
        default:
          std::memcpy(out, p, cols * sizeof(float));
          return;
      }
    }
    case RowSource::kQuantized: {
      // One run per group: the scale (and min) are constant within it. checkWeightPlanes guarantees
      // that the larger group size is a multiple of the smaller one.
      const uint32_t run = w.min.present() ? std::min(w.scale.table.group_size, w.min.table.group_size)
                                           : w.scale.table.group_size;
      for (uint64_t c0 = 0; c0 < cols; c0 += run) {
        const uint64_t n = std::min<uint64_t>(run, cols - c0);
        const int8_t* q = reinterpret_cast<const int8_t*>(w.q.data + elementOffset(w.q.table, r, c0));
        const float s = readGroupValue(w.scale, r, c0);
        // stride_table.h: value = s·q + m with a min plane, s·q without one (not "+ 0.0f", which
        // would turn a −0.0 product into +0.0); float32 without FMA contraction (CMake flags).
        if (w.min.present()) {
          const float m = readGroupValue(w.min, r, c0);
          for (uint64_t i = 0; i < n; ++i) out[c0 + i] = s * static_cast<float>(q[i]) + m;
        } else {
          for (uint64_t i = 0; i < n; ++i) out[c0 + i] = s * static_cast<float>(q[i]);
        }
      }
      return;
    }
    case RowSource::kBlocks: {
      const StrideTable& t = w.blocks.table;
      const GgmlType type = static_cast<GgmlType>(t.ggml_type);
      const uint64_t bs = t.group_size;  // = the type's block size (checkWeightPlanes)
      for (uint64_t c = 0; c < cols; c += bs) dequantizeBlock(type, w.blocks.data + elementOffset(t, r, c), out + c);
      return;
    }
  }
}

void embed(const WeightPlanes& table, RowSource src, const int32_t* ids, int n_rows, float* out) {
  for (int t = 0; t < n_rows; ++t)
    dequantizeRow(table, src, static_cast<uint64_t>(ids[t]), out + static_cast<int64_t>(t) * table.cols);
}

void rmsNorm(const float* x, const float* w, int n_rows, int width, float eps, float* out) {
  for (int t = 0; t < n_rows; ++t) {
    const float* xr = x + static_cast<int64_t>(t) * width;
    float* yr = out + static_cast<int64_t>(t) * width;
    const float mean_sq = dot(xr, xr, width) / static_cast<float>(width);
    const float inv = 1.0f / std::sqrt(mean_sq + eps);
    for (int i = 0; i < width; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

void headRmsNorm(float* x, const float* w, int n_rows, int n_head, int head_dim, float eps) {
  // Each head of each row is one "row" of width head_dim.
  rmsNorm(x, w, n_rows * n_head, head_dim, eps, x);
}

void matmul(const WeightPlanes& W, RowSource src, const float* bias, const float* in, int n_rows, float* out,
            ThreadPool* pool, float* scratch) {
  const int64_t rows = static_cast<int64_t>(W.rows), cols = static_cast<int64_t>(W.cols);
  // A dense f32 plane whose rows are contiguous, 4-byte aligned floats is read in place.
  const bool direct = src == RowSource::kDense && W.dense.table.kind == PlaneKind::kF32 &&
                      reinterpret_cast<uintptr_t>(W.dense.data) % alignof(float) == 0 &&
                      W.dense.table.row_pitch % sizeof(float) == 0;
  auto body = [&](int64_t begin, int64_t end, int thread) {
    float* row = scratch + thread * cols;
    for (int64_t r = begin; r < end; ++r) {
      const float* wr = row;
      if (direct)
        wr = reinterpret_cast<const float*>(W.dense.data + elementOffset(W.dense.table, r, 0));
      else
        dequantizeRow(W, src, static_cast<uint64_t>(r), row);
      const float b = bias ? bias[r] : 0.0f;
      for (int t = 0; t < n_rows; ++t) out[t * rows + r] = dot(wr, in + t * cols, cols) + b;
    }
  };
  if (pool)
    pool->parallelFor(rows, body, (cols + 1) * n_rows);  // a row: its dequantization and n_rows dots
  else
    body(0, rows, 0);
}

void rope(float* x, int n_rows, int n_head, int head_dim, int n_rot, RopeStyle style, float freq_base,
          float freq_scale, const int32_t* pos, const float* freq_factors, const kern::RopeYarn& yarn,
          int64_t row_pitch) {
  const int half = n_rot / 2;
  const int64_t pitch = row_pitch > 0 ? row_pitch : static_cast<int64_t>(n_head) * head_dim;
  const bool mix = yarn.ext_factor != 0.0f;
  float cos_t[kMaxRot / 2], sin_t[kMaxRot / 2];
  for (int t = 0; t < n_rows; ++t) {
    // YaRN scales per pair (below), plain RoPE the position: the same order as kernels/rope.cuh.
    const double p = static_cast<double>(pos[t]) * (mix ? 1.0 : static_cast<double>(freq_scale));
    for (int i = 0; i < half; ++i) {
      double theta = p * std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot);
      if (freq_factors) theta /= static_cast<double>(freq_factors[i]);  // same order as kernels/rope.cuh
      if (mix) {
        const double g = static_cast<double>(kern::ropeYarnRamp(yarn.corr_lo, yarn.corr_hi, i) * yarn.ext_factor);
        theta = theta * static_cast<double>(freq_scale) * (1.0 - g) + theta * g;
      }
      cos_t[i] = static_cast<float>(std::cos(theta)) * yarn.mscale;
      sin_t[i] = static_cast<float>(std::sin(theta)) * yarn.mscale;
    }
    for (int h = 0; h < n_head; ++h) {
      float* e = x + t * pitch + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int ia = style == RopeStyle::kNorm ? 2 * i : i;
        const int ib = style == RopeStyle::kNorm ? 2 * i + 1 : i + half;
        const float a = e[ia], b = e[ib];
        e[ia] = a * cos_t[i] - b * sin_t[i];
        e[ib] = a * sin_t[i] + b * cos_t[i];
      }
    }
  }
}

KvRows KvRowStorage::contiguous(int pos0, int n_rows, int n_ctx) {
  for (int t = 0; t < n_rows; ++t) {
    pos[static_cast<size_t>(t)] = pos0 + t;
    tables[static_cast<size_t>(t)] = kFirstBlock;
  }
  return paged(n_ctx, n_ctx);
}

void kvStore(const KvLayer& cache, const float* k, const float* v, int n_rows, const KvRows& rows, int64_t k_pitch,
             int64_t v_pitch) {
  const int64_t width = static_cast<int64_t>(cache.n_head_kv) * cache.head_dim;
  const int64_t kp = k_pitch > 0 ? k_pitch : width, vp = v_pitch > 0 ? v_pitch : width;
  for (int t = 0; t < n_rows; ++t) {
    const int64_t slot = kvSlot(cache, rows, t, rows.pos[t]);
    std::memcpy(cache.k + slot * width, k + t * kp, sizeof(float) * width);
    std::memcpy(cache.v + slot * width, v + t * vp, sizeof(float) * width);
  }
}

namespace {

// fn(i, slot) for the positions i = lo .. hi−1 of row t's sequence, in order; slot = where i lives in the
// cache (kvSlot). One table lookup per block.
template <typename Fn>
void forEachSlot(const KvLayer& cache, const KvRows& rows, int t, int lo, int hi, Fn fn) {
  if (cache.ring > 0) {
    for (int i = lo; i < hi; ++i) fn(i, i % cache.ring);
    return;
  }
  const int bs = rows.block_size;
  const int32_t* table = rows.tables[t];
  for (int i = lo; i < hi;) {
    const int b = i / bs, end = std::min(hi, (b + 1) * bs);
    for (int64_t slot = int64_t{table[b]} * bs + (i - b * bs); i < end; ++i, ++slot) fn(i, slot);
  }
}

}  // namespace

void attention(const float* q, const KvLayer& cache, int n_rows, const KvRows& rows, int n_head, float* out,
               ThreadPool* pool, float* scratch, const AttentionOptions& options, int64_t q_pitch) {
  const int hd = cache.head_dim;
  const int64_t qp = q_pitch > 0 ? q_pitch : static_cast<int64_t>(n_head) * hd;
  const int64_t kv_width = static_cast<int64_t>(cache.n_head_kv) * hd;
  const int group = n_head / cache.n_head_kv;  // query heads per kv head
  const float scale = options.scale != 0 ? options.scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const float cap = options.softcap, inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
  int max_keys = 0;  // for the pool's cost estimate
  for (int t = 0; t < n_rows; ++t) max_keys = std::max(max_keys, rows.pos[t] + 1);
  auto body = [&](int64_t begin, int64_t end, int thread) {
    float* scores = scratch + static_cast<int64_t>(thread) * rows.n_ctx;
    for (int64_t task = begin; task < end; ++task) {
      const int t = static_cast<int>(task / n_head), j = static_cast<int>(task % n_head);
      const int64_t g_off = static_cast<int64_t>(j / group) * hd;
      const int n_keys = rows.pos[t] + 1;  // causal: positions 0 .. pos
      const int lo = options.window > 0 ? std::max(0, n_keys - options.window) : 0;  // sliding window
      const float* qh = q + t * qp + static_cast<int64_t>(j) * hd;
      float max_s = -INFINITY;
      forEachSlot(cache, rows, t, lo, n_keys, [&](int i, int64_t slot) {
        float s = dot(qh, cache.k + slot * kv_width + g_off, hd) * scale;
        if (cap > 0) s = cap * std::tanh(s * inv_cap);
        scores[i] = s;
        max_s = std::max(max_s, s);
      });
      float sum = 0;
      for (int i = lo; i < n_keys; ++i) {
        scores[i] = std::exp(scores[i] - max_s);
        sum += scores[i];
      }
      const float inv_sum = 1.0f / sum;
      float* oh = out + (static_cast<int64_t>(t) * n_head + j) * hd;
      std::fill(oh, oh + hd, 0.0f);
      forEachSlot(cache, rows, t, lo, n_keys, [&](int i, int64_t slot) {
        const float a = scores[i] * inv_sum;
        const float* vh = cache.v + slot * kv_width + g_off;
        for (int d = 0; d < hd; ++d) oh[d] += a * vh[d];
      });
    }
  };
  const int64_t tasks = static_cast<int64_t>(n_rows) * n_head;
  if (pool)
    pool->parallelFor(tasks, body, 2 * static_cast<int64_t>(max_keys) * hd);  // scores and values
  else
    body(0, tasks, 0);
}

void swiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void geGlu(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f, kCoefA = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoefA * g * g))) * up[i];
  }
}

void scale(const float* x, int64_t n, float scale, float softcap, float* out) {
  if (softcap > 0) {
    const float inv = 1.0f / softcap;
    for (int64_t i = 0; i < n; ++i) out[i] = softcap * std::tanh(x[i] * scale * inv);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void moeRoute(const float* logits, int n_rows, int n_expert, int n_used, bool norm, int32_t* ids, float* w) {
  float p[kMaxExperts];
  int order[kMaxExperts];
  for (int t = 0; t < n_rows; ++t) {
    const float* r = logits + int64_t(t) * n_expert;
    float mx = r[0];
    for (int e = 1; e < n_expert; ++e) mx = std::max(mx, r[e]);
    double sum = 0;
    for (int e = 0; e < n_expert; ++e) {
      p[e] = std::exp(r[e] - mx);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int e = 0; e < n_expert; ++e) p[e] *= inv, order[e] = e;
    std::partial_sort(order, order + n_used, order + n_expert,
                      [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float chosen = 0;
    for (int j = 0; j < n_used; ++j) chosen += p[order[j]];
    for (int j = 0; j < n_used; ++j) {
      ids[int64_t(t) * n_used + j] = order[j];
      w[int64_t(t) * n_used + j] = norm ? p[order[j]] / chosen : p[order[j]];
    }
  }
}

namespace {

// Row r of expert e of W (expert axis: its rows e·expertRows … ), as a pointer to its floats: read in
// place from a 4-byte aligned f32 plane, else dequantized into `buf`.
const float* expertRow(const WeightPlanes& W, RowSource src, uint64_t e, uint64_t r, float* buf) {
  const StrideTable& t = src == RowSource::kDense ? W.dense.table : src == RowSource::kBlocks ? W.blocks.table : W.q.table;
  if (src == RowSource::kDense && t.kind == PlaneKind::kF32 && t.row_pitch % sizeof(float) == 0 &&
      reinterpret_cast<uintptr_t>(W.dense.data) % alignof(float) == 0)
    return reinterpret_cast<const float*>(W.dense.data + expertOffset(t, e) + elementOffset(t, r, 0));
  dequantizeRow(W, src, e * expertRows(t) + r, buf);
  return buf;
}

}  // namespace

void moeFfn(const WeightPlanes& gate, RowSource gate_src, const WeightPlanes& up, RowSource up_src,
            const WeightPlanes& down, RowSource down_src, const float* x, const int32_t* ids, const float* w,
            int n_rows, int n_used, float* out, ThreadPool* pool, float* scratch) {
  const int64_t n_embd = static_cast<int64_t>(gate.cols), n_ff = static_cast<int64_t>(down.cols);
  const int64_t per_thread = moeScratchFloats(n_embd, n_ff);
  const uint64_t n_expert = down.rows / static_cast<uint64_t>(n_embd);
  auto body = [&](int64_t begin, int64_t end, int thread) {
    float* row = scratch + thread * per_thread;  // max(n_embd, n_ff) floats: one dequantized weight row
    float* g = row + std::max(n_embd, n_ff);     // n_ff: gate, then silu(gate) ⊙ up
    float* u = g + n_ff;                         // n_ff
    float* acc = u + n_ff;                       // n_embd
    for (int64_t t = begin; t < end; ++t) {
      const float* xt = x + t * n_embd;
      std::fill(acc, acc + n_embd, 0.0f);
      for (int j = 0; j < n_used; ++j) {
        const uint64_t e = static_cast<uint32_t>(ids[t * n_used + j]);
        if (e >= n_expert) continue;  // never from moeRoute; a damaged plan reads no other expert's bytes
        const float wj = w[t * n_used + j];
        for (int64_t r = 0; r < n_ff; ++r) g[r] = dot(expertRow(gate, gate_src, e, r, row), xt, n_embd);
        for (int64_t r = 0; r < n_ff; ++r) u[r] = dot(expertRow(up, up_src, e, r, row), xt, n_embd);
        swiGlu(g, u, n_ff, g);
        for (int64_t r = 0; r < n_embd; ++r) acc[r] += dot(expertRow(down, down_src, e, r, row), g, n_ff) * wj;
      }
      std::copy(acc, acc + n_embd, out + t * n_embd);
    }
  };
  if (pool)
    pool->parallelFor(n_rows, body, 3 * n_used * n_embd * n_ff);
  else
    body(0, n_rows, 0);
}

}  // namespace minfer::cpu
