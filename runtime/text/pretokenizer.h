// Byte-level BPE pre-tokenizers: the regex lists that split text into words, by GGUF pre name (PCRE2).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "minfer/status.h"

namespace minfer::text {

// A named list of regexes applied in order (llama.cpp unicode_regex_split semantics): the text
// starts as one segment; each regex splits every current segment into its matches and the gaps
// between them (gaps are kept as segments), matching only inside that segment (lookaheads and `$`
// see the segment's end). The regexes are llama.cpp's, per pre-tokenizer type (src/llama-vocab.cpp,
// llm_tokenizer_bpe), compiled with PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY (ECMAScript `$`),
// JIT-compiled when available. `\s` / `\S` are rewritten to llama.cpp's whitespace set (the Unicode
// White_Space property; PCRE2's \s also matches U+180E MONGOLIAN VOWEL SEPARATOR, llama.cpp's does
// not); \p{L}, \p{N}, \p{P} are PCRE2's Unicode properties (llama.cpp uses its own tables of the same
// categories, generated from a newer Unicode version: code points assigned after Unicode 14 may differ).
//
// Immutable after create(); split() may run concurrently (per-call match data and JIT stack).
class PreTokenizer {
 public:
  // Errors: an unknown name (the message lists the known ones), a regex that fails to compile.
  static Result<PreTokenizer> create(std::string_view name);

  // Names accepted by create() ("" means "default").
  static const std::vector<std::string>& knownNames();

  // Cuts `subject` (well-formed UTF-8, no surrogates) into segments; appends the segment boundaries
  // to `cuts`, which is cleared first: cuts = {0, c1, …, subject.size()} (empty subject → {0}).
  // Cost: one pass over the text per regex (O(n) for these patterns on ordinary text). Should PCRE2
  // still hit a resource limit (a single match of millions of characters), the rest of that segment
  // is kept as one piece: no crash, no lost bytes.
  void split(std::string_view subject, std::vector<size_t>& cuts) const;

  // llama3 / tekken families: a whole word that is a token is emitted without merging.
  bool ignoreMerges() const { return ignore_merges_; }

  struct Regex;

 private:
  std::vector<std::shared_ptr<const Regex>> regexes_;
  bool ignore_merges_ = false;
};

}  // namespace minfer::text
