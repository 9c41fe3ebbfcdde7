// UTF-8 helpers of the tokenizer: llama.cpp-compatible lenient decoding, encoding, GPT-2's byte table.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace minfer::text {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the sequence a byte starts, from its high nibble only (llama.cpp unicode_len_utf8):
// 0x00-0xBF → 1 (continuation bytes count as single symbols), 0xC0-0xDF → 2, 0xE0-0xEF → 3,
// 0xF0-0xFF → 4. Used to cut text into initial merge symbols; callers clamp to the bytes left.
inline size_t utf8LenFromLead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Appends the UTF-8 encoding of `cpt` (≤ 0x10FFFF; surrogates are encoded like any other value).
void appendUtf8(std::string& out, uint32_t cpt);

// Decodes `text` the way llama.cpp's unicode_cpts_from_utf8 does: the lead byte gives the length,
// the continuation bytes must be 10xxxxxx and present; overlong forms and surrogates are accepted as
// decoded. A byte that does not start such a sequence gives U+FFFD and decoding resumes at the next
// byte. Deviation: values above U+10FFFF (lead 0xF5-0xF7), which llama.cpp later rejects with an
// exception, also give U+FFFD (one per lead byte). Output: one code point per decoded sequence.
void decodeUtf8Lenient(std::string_view text, std::vector<uint32_t>& cpts);

// Strict streaming validation (Unicode Table 3-7). Returns the length of the well-formed sequence at
// s[0..n) (1-4), 0 when s holds only a valid but incomplete prefix of one (n too short), or -k when
// the first k ≥ 1 bytes are a maximal ill-formed subpart (to be replaced by one U+FFFD).
int utf8ScanStrict(const uint8_t* s, size_t n);

// GPT-2 bytes_to_unicode: printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves, the
// other 68 bytes, in increasing order, to U+0100, U+0101, …  byteToUnicode()[b] is that code point.
const std::array<uint32_t, 256>& byteToUnicode();
// The inverse: byte for a code point of the table, or -1.
int unicodeToByte(uint32_t cpt);

}  // namespace minfer::text
