// Backslash escapes in prompt text, as llama.cpp's tools process them (--escape, their default).
#include <cstdlib>

#include "minfer/tokenizer.h"

namespace minfer {

std::string processEscapes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    const char c = text[++i];
    switch (c) {
      case 'n': out += '\n'; continue;
      case 'r': out += '\r'; continue;
      case 't': out += '\t'; continue;
      case '\'': out += '\''; continue;
      case '"': out += '"'; continue;
      case '\\': out += '\\'; continue;
      case 'x':
        // Exactly llama.cpp's test: strtol over the next two characters must consume both (so its
        // leniency carries over: "\x 1" and "\x-1" are accepted as strtol reads them).
        if (i + 2 < text.size()) {
          const char hex[3] = {text[i + 1], text[i + 2], 0};
          char* end = nullptr;
          const long value = std::strtol(hex, &end, 16);
          if (end == hex + 2) {
            out += static_cast<char>(value);
            i += 2;
            continue;
          }
        }
        break;
      default:
        break;
    }
    out += '\\';  // unknown escape: kept as written
    out += c;
  }
  return out;
}

std::string dropOneTrailingNewline(std::string text) {
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace minfer
