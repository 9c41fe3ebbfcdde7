// Test-side reference for weight planes: independent block expansion, expected plane images, gates.
#include "tests/planes/plane_reference.h"

#include <cstring>
#include <sstream>

namespace minfer::test {

namespace {

float half(const uint8_t* p) { return halfToFloat(readU16(p)); }

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Reads `n` bytes at `off` of a plane, refusing reads that leave it.
bool readAt(const uint8_t* data, uint64_t size, uint64_t off, uint64_t n, void* out) {
  if (off > size || n > size - off) return false;
  std::memcpy(out, data + off, n);
  return true;
}


// Q4_K / Q5_K scales and mins with the 32-bit mask arithmetic of ggml's vec_dot_q4_K (a different
// expression of the same 12-byte packing than kScaleMin): bytes 0..7 of the result are the 8 scales,
// bytes 8..15 the 8 mins.
void k4ScalesMins(const uint8_t* packed, uint8_t* sc8, uint8_t* m8) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t utmp[4];
  utmp[0] = readU32(packed);
  utmp[1] = readU32(packed + 4);
  utmp[2] = readU32(packed + 8);
  utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
  const uint32_t uaux = utmp[1] & kmask1;
  utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
  utmp[2] = uaux;
  utmp[0] &= kmask1;
  for (int i = 0; i < 8; ++i) {
    sc8[i] = static_cast<uint8_t>(utmp[i / 4] >> (8 * (i % 4)));
    m8[i] = static_cast<uint8_t>(utmp[2 + i / 4] >> (8 * (i % 4)));
  }
}

}  // namespace

bool refExpandBlock(GgmlType type, const uint8_t* b, RefBlock* o) {
  *o = RefBlock{};
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: {
      const bool one = type == GgmlType::Q4_1;
      o->n = o->group = 32;
      o->has_add = one;
      o->scale[0] = half(b);
      if (one) o->add[0] = half(b + 2);
      const uint8_t* qs = b + (one ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        o->q[j] = (qs[j] & 0xF) - (one ? 0 : 8);
        o->q[j + 16] = (qs[j] >> 4) - (one ? 0 : 8);
      }
      return true;
    }
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool one = type == GgmlType::Q5_1;
      o->n = o->group = 32;
      o->has_add = one;
      o->scale[0] = half(b);
      if (one) o->add[0] = half(b + 2);
      const uint32_t qh = readU32(b + (one ? 4 : 2));
      const uint8_t* qs = b + (one ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const uint32_t xh0 = ((qh >> j) << 4) & 0x10;
        const uint32_t xh1 = (qh >> (j + 12)) & 0x10;
        o->q[j] = static_cast<int>((qs[j] & 0xF) | xh0) - (one ? 0 : 16);
        o->q[j + 16] = static_cast<int>((qs[j] >> 4) | xh1) - (one ? 0 : 16);
      }
      return true;
    }
    case GgmlType::Q8_0:
      o->n = o->group = 32;
      o->scale[0] = half(b);
      for (int j = 0; j < 32; ++j) o->q[j] = static_cast<int8_t>(b[2 + j]);
      return true;
    case GgmlType::Q2_K: {
      o->n = 256;
      o->group = 16;
      o->has_add = true;
      const float d = half(b + 80), dmin = half(b + 82);
      const uint8_t* q = b + 16;
      int is = 0, y = 0;
      for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
          for (int part = 0; part < 2; ++part) {
            const uint8_t sc = b[is];
            o->scale[is] = d * static_cast<float>(sc & 0xF);
            o->add[is] = -(dmin * static_cast<float>(sc >> 4));
            ++is;
            for (int l = 0; l < 16; ++l) o->q[y++] = (q[l + 16 * part] >> shift) & 3;
          }
        }
        q += 32;
      }
      return true;
    }
    case GgmlType::Q3_K: {
      o->n = 256;
      o->group = 16;
      uint32_t aux[4];
      aux[0] = readU32(b + 96);
      aux[1] = readU32(b + 100);
      aux[2] = readU32(b + 104);
      const uint32_t tmp = aux[2];
      aux[2] = ((aux[0] >> 4) & 0x0f0f0f0fu) | (((tmp >> 4) & 0x03030303u) << 4);
      aux[3] = ((aux[1] >> 4) & 0x0f0f0f0fu) | (((tmp >> 6) & 0x03030303u) << 4);
      aux[0] = (aux[0] & 0x0f0f0f0fu) | (((tmp >> 0) & 0x03030303u) << 4);
      aux[1] = (aux[1] & 0x0f0f0f0fu) | (((tmp >> 2) & 0x03030303u) << 4);
      const float d_all = half(b + 108);
      const uint8_t* q = b + 32;
      const uint8_t* hm = b;
      uint8_t m = 1;
      int is = 0, y = 0;
      for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
          for (int part = 0; part < 2; ++part) {
            const int sc = static_cast<int8_t>((aux[is / 4] >> (8 * (is % 4))) & 0xFF);
            o->scale[is] = d_all * static_cast<float>(sc - 32);
            ++is;
            for (int l = 0; l < 16; ++l) {
              const int k = l + 16 * part;
              o->q[y++] = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
            }
          }
          m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
      }
      return true;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = type == GgmlType::Q5_K;
      o->n = 256;
      o->group = 32;
      o->has_add = true;
      const float d = half(b), dmin = half(b + 2);
      uint8_t sc[8], mn[8];
      k4ScalesMins(b + 4, sc, mn);
      const uint8_t* ql = b + (five ? 48 : 16);
      const uint8_t* qh = b + 16;
      int is = 0, y = 0;
      uint8_t u1 = 1, u2 = 2;
      for (int j = 0; j < 256; j += 64) {
        o->scale[is] = d * static_cast<float>(sc[is]);
        o->add[is] = -(dmin * static_cast<float>(mn[is]));
        o->scale[is + 1] = d * static_cast<float>(sc[is + 1]);
        o->add[is + 1] = -(dmin * static_cast<float>(mn[is + 1]));
        for (int l = 0; l < 32; ++l) o->q[y++] = (ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0);
        for (int l = 0; l < 32; ++l) o->q[y++] = (ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0);
        ql += 32;
        is += 2;
        u1 = static_cast<uint8_t>(u1 << 2);
        u2 = static_cast<uint8_t>(u2 << 2);
      }
      return true;
    }
    case GgmlType::Q6_K: {
      o->n = 256;
      o->group = 16;
      const float d = half(b + 208);
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int n = 0; n < 2; ++n) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          int* y = o->q + 128 * n;
          y[l + 0] = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          y[l + 32] = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          y[l + 64] = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          y[l + 96] = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          for (int k = 0; k < 4; ++k) o->scale[8 * n + is + 2 * k] = d * static_cast<float>(sc[is + 2 * k]);
        }
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

std::vector<float> refDequantize(GgmlType type, uint64_t rows, uint64_t cols, const uint8_t* data) {
  const GgmlTypeTraits tr = ggmlTypeTraits(type);
  std::vector<float> out(rows * cols);
  const uint64_t blocks = rows * cols / tr.block_size;
  for (uint64_t k = 0; k < blocks; ++k) dequantizeBlock(type, data + k * tr.type_size, &out[k * tr.block_size]);
  return out;
}

std::vector<uint8_t> expectedPlane(GgmlType type, const StrideTable& t, const uint8_t* src,
                                   uint64_t src_row_bytes) {
  const GgmlTypeTraits tr = ggmlTypeTraits(type);
  std::vector<uint8_t> img(t.rows * t.row_pitch, 0);
  const uint64_t blocks_per_row = t.cols / tr.block_size;
  for (uint64_t r = 0; r < t.rows; ++r) {
    const uint8_t* srow = src + r * src_row_bytes;
    uint8_t* drow = img.data() + r * t.row_pitch;
    switch (t.kind) {
      case PlaneKind::kBlocks: {  // each GGUF block at the start of its slot of group_pitch bytes
        const uint32_t block_bytes = ggmlTypeTraits(type).type_size;
        for (uint64_t b = 0; b < src_row_bytes / block_bytes; ++b)
          std::memcpy(drow + b * t.group_pitch, srow + b * block_bytes, block_bytes);
        break;
      }
      case PlaneKind::kF16:
      case PlaneKind::kBF16:
        std::memcpy(drow, srow, t.cols * 2);
        break;
      case PlaneKind::kF32:
        if (type == GgmlType::F32) {
          std::memcpy(drow, srow, t.cols * 4);
        } else {
          const std::vector<float> v = refDequantize(type, 1, t.cols, srow);
          std::memcpy(drow, v.data(), t.cols * 4);
        }
        break;
      case PlaneKind::kI8:
      case PlaneKind::kScale:
      case PlaneKind::kMin:
      case PlaneKind::kPacked:
        for (uint64_t b = 0; b < blocks_per_row; ++b) {
          RefBlock rb;
          refExpandBlock(type, srow + b * tr.type_size, &rb);
          for (int e = 0; e < rb.n; ++e) {
            const uint64_t c = b * rb.n + e;
            const uint64_t g = c / rb.group;
            if (t.kind == PlaneKind::kI8) {
              drow[c] = static_cast<uint8_t>(static_cast<int8_t>(rb.q[e]));
            } else if (t.kind == PlaneKind::kScale) {
              const uint32_t u = bitsOf(rb.scale[e / rb.group]);
              std::memcpy(drow + 4 * g, &u, 4);
            } else if (t.kind == PlaneKind::kMin) {
              const uint32_t u = bitsOf(rb.add[e / rb.group]);
              std::memcpy(drow + 4 * g, &u, 4);
            } else {
              const int u = rb.q[e] + (type == GgmlType::Q4_0 ? 8 : 0);
              drow[(c / 32) * 16 + c % 16] |= static_cast<uint8_t>((u & 0xF) << ((c % 32) < 16 ? 0 : 4));
            }
          }
        }
        break;
    }
  }
  return img;
}

GateResult gateDirect(const GatePlane& p, const std::vector<float>& ref) {
  GateResult g;
  const StrideTable& t = p.table;
  float block[kQK_K];
  uint64_t cached = ~uint64_t{0};
  for (uint64_t r = 0; r < t.rows; ++r) {
    for (uint64_t c = 0; c < t.cols; ++c) {
      const uint64_t off = elementOffset(t, r, c);
      float v = 0;
      bool ok = true;
      switch (t.kind) {
        case PlaneKind::kF32: ok = readAt(p.data, p.size, off, 4, &v); break;
        case PlaneKind::kF16:
        case PlaneKind::kBF16: {
          uint16_t h = 0;
          ok = readAt(p.data, p.size, off, 2, &h);
          v = t.kind == PlaneKind::kF16 ? halfToFloat(h) : bf16ToFloat(h);
          break;
        }
        case PlaneKind::kBlocks: {
          const GgmlTypeTraits tr = ggmlTypeTraits(t.ggml_type);
          ok = off <= p.size && tr.type_size <= p.size - off;
          if (ok && off != cached) {
            dequantizeBlock(static_cast<GgmlType>(t.ggml_type), p.data + off, block);
            cached = off;
          }
          if (ok) v = block[c % t.group_size];
          break;
        }
        default:
          ok = false;
      }
      ++g.checked;
      const float want = ref[r * t.cols + c];
      if (!ok || bitsOf(v) != bitsOf(want)) {
        if (g.mismatches++ > 0) continue;
        std::ostringstream os;
        os << "(" << r << ", " << c << "): " << (ok ? "read " : "offset out of plane ") << v << " at byte "
           << off << ", reference " << want;
        g.first = os.str();
      }
    }
  }
  return g;
}

GateResult gateDecomposed(const GatePlane& qp, const GatePlane& sp, const GatePlane* mp,
                          const std::vector<float>& ref) {
  GateResult g;
  const StrideTable& t = qp.table;
  for (uint64_t r = 0; r < t.rows; ++r) {
    for (uint64_t c = 0; c < t.cols; ++c) {
      int q = 0;
      bool ok = true;
      uint64_t qoff;
      if (t.kind == PlaneKind::kPacked) {
        uint32_t shift = 0;
        qoff = packedOffset(t, r, c, &shift);
        uint8_t byte = 0;
        ok = readAt(qp.data, qp.size, qoff, 1, &byte);
        // packedQ() is the contract's reader; use it on the in-range byte.
        if (ok) q = packedQ(t, qp.data, r, c);
      } else {
        qoff = elementOffset(t, r, c);
        int8_t v = 0;
        ok = readAt(qp.data, qp.size, qoff, 1, &v);
        q = v;
      }
      float s = 0, m = 0;
      ok = readAt(sp.data, sp.size, elementOffset(sp.table, r, c), 4, &s) && ok;
      if (mp) ok = readAt(mp->data, mp->size, elementOffset(mp->table, r, c), 4, &m) && ok;
      const float v = mp ? s * static_cast<float>(q) + m : s * static_cast<float>(q);
      const float want = ref[r * t.cols + c];
      ++g.checked;
      if (!ok || bitsOf(v) != bitsOf(want)) {
        if (g.mismatches++ > 0) continue;
        std::ostringstream os;
        os << "(" << r << ", " << c << "): " << (ok ? "" : "offset out of plane; ") << "q " << q << " at byte "
           << qoff << ", scale " << s;
        if (mp) os << ", min " << m;
        os << " -> " << v << ", reference " << want;
        g.first = os.str();
      }
    }
  }
  return g;
}

StrideTable swappedPitch(const StrideTable& t) {
  StrideTable s = t;
  const auto ceilDiv = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
  switch (t.kind) {
    case PlaneKind::kI8: s.row_pitch = alignUp(t.rows, 16); break;
    case PlaneKind::kScale:
    case PlaneKind::kMin: s.row_pitch = alignUp(ceilDiv(t.rows, t.group_size) * 4, 16); break;
    case PlaneKind::kPacked: s.row_pitch = alignUp(ceilDiv(t.rows, 2), 16); break;
    case PlaneKind::kBlocks: s.row_pitch = ceilDiv(t.rows, t.group_size) * t.group_pitch; break;
    default: s.row_pitch = alignUp(t.rows * elemBytes(t.elem), 16); break;
  }
  return s;
}

}  // namespace minfer::test
