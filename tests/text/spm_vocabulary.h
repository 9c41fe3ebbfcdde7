// Test helper: a small hand-made SentencePiece ("llama") vocabulary with byte fallback, for tokenizer,
// detokenizer and scheduler tests.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "minfer/tokenizer.h"

namespace minfer::test {

// A SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens (ids 3..258), then (text, score)
// normal tokens ("_" in a text stands for "▁"), then user-defined "<tool>".
inline Vocabulary spmVocab(const std::vector<std::pair<std::string, float>>& normal, bool add_space_prefix) {
  Vocabulary v = Vocabulary::withDefaults("llama", "default");
  v.add_space_prefix = add_space_prefix;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.token_types.push_back(6);
  }
  for (const auto& [text, score] : normal) {
    std::string t;
    for (const char c : text) t += (c == '_') ? std::string("\xE2\x96\x81") : std::string(1, c);
    v.tokens.push_back(t);
    v.token_types.push_back(1);
  }
  v.tokens.push_back("<tool>");
  v.token_types.push_back(4);
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t k = 0; k < normal.size(); ++k) v.scores[259 + k] = normal[k].second;
  return v;
}

}  // namespace minfer::test
