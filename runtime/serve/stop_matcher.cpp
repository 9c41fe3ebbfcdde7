// StopMatcher: stop strings matched across streamed pieces (stop_matcher.h).
#include "runtime/serve/stop_matcher.h"

#include <algorithm>

namespace minfer::serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view piece) {
  if (matched_) return "";
  held_.append(piece);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // The longest tail of held_ that is a proper prefix of a stop string stays held.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t most = std::min(s.size() - 1, held_.size());
    for (size_t len = most; len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace minfer::serve
