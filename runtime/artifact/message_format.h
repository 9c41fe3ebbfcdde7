// Message helpers shared by the artifact loader and its verifier (internal to runtime/artifact/).
#pragma once

#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <string>

namespace minfer::artifact_detail {

// Concatenates its arguments with operator<< (numbers in decimal).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// 0x-prefixed lowercase hex; `width` pads with zeros (checksums are shown with all 16 digits).
inline std::string hex(uint64_t v, int width = 0) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%0*" PRIx64, width, v);
  return buf;
}

}  // namespace minfer::artifact_detail
