// Streaming detokenizer: token pieces → always-valid UTF-8, holding back incomplete sequences.
#include "minfer/tokenizer.h"
#include "runtime/text/utf8.h"

namespace minfer {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

std::string Detokenizer::push(int32_t id) {
  pending_ += tokenizer_.tokenToPiece(id, render_special_);
  std::string out;
  const auto* s = reinterpret_cast<const uint8_t*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const int len = text::utf8ScanStrict(s + i, n - i);
    if (len > 0) {
      out.append(pending_, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else if (len < 0) {
      out += kReplacement;  // one U+FFFD per maximal ill-formed subpart
      i += static_cast<size_t>(-len);
    } else {
      break;  // an incomplete sequence at the end: wait for the next piece
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Detokenizer::flush() {
  std::string out;
  if (!pending_.empty()) out = kReplacement;  // only an incomplete (≤ 3-byte) prefix can remain
  pending_.clear();
  return out;
}

}  // namespace minfer
