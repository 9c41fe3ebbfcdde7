// StopMatcher: finds OpenAI `stop` strings in streamed text, across piece boundaries.
//
// push() appends a piece of generated text and returns what may be emitted now: everything except a
// tail that is still the beginning of some stop string (held back until the next piece decides).
// When a stop string occurs, push() returns the text before its first occurrence (the earliest
// position over all stop strings) and matched() becomes true; the stop string and anything after it
// are dropped. flush() returns the held-back tail at the end of generation (no match happened).
// Pieces that are valid UTF-8 give valid UTF-8 out when the stop strings are valid UTF-8: a held-back
// tail starts where a stop string's first byte (a lead byte) matched, so a cut is on a character
// boundary.
// Cost: per push, O(stops × held²) byte comparisons, held ≤ the longest stop string's length.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace minfer::serve {

class StopMatcher {
 public:
  // `stops`: the stop strings; empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops);

  std::string push(std::string_view piece);
  std::string flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet emitted: a proper prefix of some stop string
  bool matched_ = false;
};

}  // namespace minfer::serve
