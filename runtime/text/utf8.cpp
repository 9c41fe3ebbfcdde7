// UTF-8 helpers of the tokenizer: lenient decoding, encoding, strict scanning, GPT-2's byte table.
#include "runtime/text/utf8.h"

namespace minfer::text {

void appendUtf8(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

void decodeUtf8Lenient(std::string_view text, std::vector<uint32_t>& cpts) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  cpts.clear();
  cpts.reserve(n);
  auto cont = [&](size_t i) { return i < n && (s[i] & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      cpts.push_back(b);
      i += 1;
    } else if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
      cpts.push_back((uint32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      cpts.push_back((uint32_t(b & 0x0F) << 12) | (uint32_t(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const uint32_t cpt = (uint32_t(b & 0x07) << 18) | (uint32_t(s[i + 1] & 0x3F) << 12) |
                           (uint32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
      if (cpt > 0x10FFFF) {
        cpts.push_back(kReplacementChar);
        i += 1;
      } else {
        cpts.push_back(cpt);
        i += 4;
      }
    } else {
      cpts.push_back(kReplacementChar);
      i += 1;
    }
  }
}

int utf8ScanStrict(const uint8_t* s, size_t n) {
  if (n == 0) return 0;
  const uint8_t b = s[0];
  if (b < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;  // no overlongs
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;  // no overlongs
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // continuation byte, C0/C1 or F5..FF: never valid
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return 0;  // valid so far, incomplete
    const uint8_t c = s[k];
    const bool ok = (k == 1) ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return -k;
  }
  return len;
}

namespace {

struct ByteTable {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 324> from_unicode{};  // code points 0..323 cover the whole table

  ByteTable() {
    from_unicode.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[b] = printable ? b : next++;
      from_unicode[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& byteTable() {
  static const ByteTable table;
  return table;
}

}  // namespace

const std::array<uint32_t, 256>& byteToUnicode() { return byteTable().to_unicode; }

int unicodeToByte(uint32_t cpt) {
  const auto& t = byteTable().from_unicode;
  return cpt < t.size() ? t[cpt] : -1;
}

}  // namespace minfer::text
