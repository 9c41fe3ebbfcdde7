// Terminal-safe text: makes control characters and ill-formed UTF-8 visible in strings taken from files.
//
// A model file is untrusted input; a name or value printed raw can carry escape sequences that a
// terminal executes (OSC 52 writes the clipboard, CSI moves the cursor or recolours the screen).
// Every human-readable output of a tool that shows a string from a file passes it through
// escapeForTerminal (JSON output is escaped by its writer instead). Header-only: the runtime, which
// links no LLVM, and the compiler share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace minfer::util {

// Length of the well-formed UTF-8 sequence starting at s[i] and its code point in *cp; 0 when the
// bytes there are not one (RFC 3629 §3: no overlong forms, no surrogates, nothing above U+10FFFF,
// no sequence cut by the end of `s`). Requires i < s.size().
inline size_t utf8SequenceAt(std::string_view s, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = byte(0);
  size_t n;
  uint32_t v, min;
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  } else if ((lead & 0xE0) == 0xC0) {
    n = 2, v = lead & 0x1Fu, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, v = lead & 0x0Fu, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    n = 4, v = lead & 0x07u, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
    v = v << 6 | (byte(k) & 0x3Fu);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// True for code points a terminal may act on rather than show: C0 (U+0000..U+001F), DEL, C1
// (U+0080..U+009F; U+009B is CSI on terminals that honour 8-bit controls), and the bidirectional
// embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069), which reorder the rest of the
// line ("Trojan Source", CVE-2021-42574).
inline bool isTerminalControl(uint32_t cp) {
  return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

// `s` with everything that could drive a terminal made visible:
//   \n, \t, \r as those two-character escapes, other C0 controls and DEL as \xNN (lowercase hex);
//   C1 controls and bidi controls (isTerminalControl) as \uNNNN;
//   each byte of ill-formed UTF-8 as \xNN.
// Printable ASCII and well-formed UTF-8 pass unchanged. A backslash is not escaped: the result is for
// reading, not for parsing back, and escaping it a second time changes nothing.
// max_bytes: at most this many bytes of `s` are shown, never cutting a character; "..." marks the rest.
// keep_newlines: \n and \t pass as they are (a whole multi-line message; everything else is escaped).
inline std::string escapeForTerminal(std::string_view s, size_t max_bytes = std::string_view::npos,
                                     bool keep_newlines = false) {
  std::string out;
  out.reserve(s.size() < max_bytes ? s.size() : max_bytes);
  char buf[12];
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    const size_t n = utf8SequenceAt(s, i, &cp);
    if ((n == 0 ? 1 : n) > max_bytes - i) break;
    if (n == 0) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(s[i]));
      out += buf;
      i += 1;
      continue;
    }
    if (!isTerminalControl(cp) || (keep_newlines && (cp == '\n' || cp == '\t'))) {
      out.append(s.substr(i, n));
    } else if (cp == '\n' || cp == '\t' || cp == '\r') {
      out += cp == '\n' ? "\\n" : cp == '\t' ? "\\t" : "\\r";
    } else {
      std::snprintf(buf, sizeof(buf), cp < 0x80 ? "\\x%02x" : "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    }
    i += n;
  }
  if (i < s.size()) out += "...";
  return out;
}

// JSON text made terminal-safe: a JSON writer escapes C0, '"' and '\\' but writes DEL, C1 and bidi
// controls raw. Those (isTerminalControl, from U+007F up) become \uNNNN, and any ill-formed byte
// becomes \ufffd; outside strings JSON has only ASCII, so both land inside strings, where \uNNNN is
// the same character.
inline std::string escapeJsonForTerminal(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  char buf[8];
  for (size_t i = 0; i < json.size();) {
    uint32_t cp = 0;
    const size_t n = utf8SequenceAt(json, i, &cp);
    if (n == 0) {
      out += "\\ufffd";
      i += 1;
      continue;
    }
    if (cp >= 0x7F && isTerminalControl(cp)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(json.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace minfer::util
