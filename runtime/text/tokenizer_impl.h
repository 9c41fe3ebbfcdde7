// The tokenizer's immutable state (shared by Tokenizer copies) and its two merge algorithms.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "minfer/tokenizer.h"
#include "runtime/text/pretokenizer.h"

namespace minfer {

// Hash/equality that let unordered_map<std::string, …> be searched with a string_view (no copy).
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
struct StringViewEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringViewHash, StringViewEqual>;

struct Tokenizer::Impl {
  Vocabulary vocab;               // validated copy; empty texts renamed "[EMPTY_<id>]"
  bool spm = false;               // model "llama" (else "gpt2")
  std::vector<TokenType> types;   // (n_vocab) after llama.cpp's control-token fix-ups
  std::vector<std::string> pieces;  // (n_vocab) tokenToPiece(id, render_special = true)
  std::vector<uint8_t> eog;       // (n_vocab) 1 = end of generation
  StringMap<int32_t> token_to_id;
  // BPE merges keyed by the merged text: (length of the left half, rank) per split; lowest rank kept
  // per (left, right) pair, as llama.cpp's bpe_ranks.emplace does.
  StringMap<std::vector<std::pair<uint32_t, int32_t>>> merges;
  std::vector<int32_t> special_ids;      // control / user-defined / unknown, longest text first
  std::array<int32_t, 256> byte_token{};  // "llama": token of byte b ("<0xXX>", else the 1-char text, else unk, else -1)
                                          // "gpt2": token whose text is the single byte b, else -1
  std::optional<text::PreTokenizer> pre;  // "gpt2" only

  int32_t lookup(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
  float score(int32_t id) const { return vocab.scores.empty() ? 0.0f : vocab.scores[id]; }
  // Rank of merging `left` and `right` (adjacent in memory: right starts where left ends), or -1.
  int32_t mergeRank(std::string_view merged, uint32_t left_len) const {
    auto it = merges.find(merged);
    if (it == merges.end()) return -1;
    for (const auto& [split, rank] : it->second)
      if (split == left_len) return rank;
    return -1;
  }
};

namespace text {

// SentencePiece BPE over `text` (spaces already escaped to "▁"); appends ids to `out`.
void encodeSpm(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out);

// Byte-level BPE over one raw text fragment (pre-tokenization included); appends ids to `out`.
void encodeBpe(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out);

}  // namespace text
}  // namespace minfer
