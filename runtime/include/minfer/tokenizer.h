// Text ↔ token ids: the runtime tokenizer (SentencePiece-BPE and byte-level BPE, llama.cpp semantics).
//
// Semantics follow llama.cpp's tokenizer (src/llama-vocab.cpp, src/unicode.cpp) so that prompts give
// the same ids as `llama-tokenize` on the same GGUF; the test suite checks this on llama.cpp's own
// test vocabularies (fixtures/tokenizer). Two model kinds:
//   "llama": SentencePiece BPE. Spaces become U+2581 "▁"; with add_space_prefix a "▁" is prepended to
//            each text fragment that starts the input or follows a special token; adjacent symbols are
//            merged greedily by the score of the merged token (highest first, leftmost on ties); a
//            symbol that is not a token is emitted as byte tokens "<0xXX>" (byte fallback).
//   "gpt2":  byte-level BPE. The text is split into words by the pre-tokenizer's regexes (selected by
//            Vocabulary::pre, GGUF `tokenizer.ggml.pre`), each word's UTF-8 bytes are mapped to
//            printable code points (GPT-2's bytes_to_unicode table), then pairs are merged by the rank
//            of `merges` (lowest rank first, leftmost on ties).
// Special tokens (types control, user-defined, unknown) are cut out of the text before either
// algorithm runs, longest text first; control and unknown tokens only when parse_special is true,
// user-defined tokens always (as llama.cpp and HF tokenizers do).
//
// Invalid UTF-8 input never crashes. "llama": bytes are grouped by their lead byte as llama.cpp does
// and whatever is not a token becomes byte tokens, so every input byte survives (decode gives the
// input back, up to the space marker: a literal U+2581 "▁" in the input decodes as a space, and a
// space that falls inside the sequence length an invalid lead byte claims is grouped with it and
// decodes as the bytes of "▁", as in llama.cpp; see tests/fuzz/regressions/fuzz_tokenizer).
// "gpt2": each byte that does not start a structurally valid sequence is replaced by U+FFFD before
// pre-tokenization, exactly as llama.cpp's unicode_cpts_from_utf8 does (decode then gives U+FFFD in
// its place).
//
// Not modelled (documented differences from llama.cpp): the LSTRIP/RSTRIP token attributes that
// llama.cpp sets only for jina-v2 "<mask>" and for models whose general.name contains "phi-3"; the
// clean_up_tokenization_spaces pass of llama_detokenize (decode here is byte-exact); BPE token texts
// containing code points outside the byte table decode to their own UTF-8 instead of "[UNK_BYTE_…]".
//
// Thread-safety: a Tokenizer is immutable after create(); all const methods may be called from any
// number of threads at once (each encode() call uses its own PCRE2 match data). Copies share the
// immutable state. A Detokenizer holds per-stream state and must not be shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "minfer/status.h"

namespace minfer {

// GGUF `tokenizer.ggml.token_type` values (llama.cpp enum llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything the tokenizer needs, as plain data (what the artifact carries). GGUF key in brackets.
struct Vocabulary {
  std::string model;                // "llama" (SentencePiece) or "gpt2" (byte-level BPE) [tokenizer.ggml.model]
  std::string pre;                  // pre-tokenizer name, "gpt2" only ("" = "default") [tokenizer.ggml.pre]
  std::vector<std::string> tokens;  // (n_vocab) token texts, id = index [tokenizer.ggml.tokens]
  std::vector<float> scores;        // (n_vocab) or empty (all 0) [tokenizer.ggml.scores]
  std::vector<int32_t> token_types; // (n_vocab) TokenType values or empty (all normal) [tokenizer.ggml.token_type]
  std::vector<std::string> merges;  // (n_merges) "left right", rank = index; "gpt2" only [tokenizer.ggml.merges]
  int32_t bos_id = -1;              // -1 = none [tokenizer.ggml.bos_token_id]
  int32_t eos_id = -1;              // [tokenizer.ggml.eos_token_id]
  int32_t unk_id = -1;              // [tokenizer.ggml.unknown_token_id]
  int32_t pad_id = -1;              // [tokenizer.ggml.padding_token_id]
  int32_t eot_id = -1;              // end of turn, -1 = none [tokenizer.ggml.eot_token_id]
  int32_t eom_id = -1;              // end of message, -1 = none [tokenizer.ggml.eom_token_id]
  bool add_bos = false;             // prepend bos_id when encode(add_special = true) [tokenizer.ggml.add_bos_token]
  bool add_eos = false;             // append eos_id when encode(add_special = true) [tokenizer.ggml.add_eos_token]
  bool add_space_prefix = false;    // "llama": prepend "▁" to text fragments [tokenizer.ggml.add_space_prefix]

  // A vocabulary holding llama.cpp's defaults for this model kind and pre-tokenizer, to be filled
  // from a GGUF file: special ids, add_bos / add_eos, add_space_prefix. A loader then overwrites each
  // field whose GGUF key is present (special ids only when in range, as llama.cpp does).
  //   "llama": bos 1, eos 2, unk 0, add_bos, add_space_prefix.
  //   "gpt2":  bos 11, eos 11; add_bos for pre llama3/llama-v3/llama-bpe/falcon3/tekken/chameleon;
  //            bos -1 for chatglm-bpe.
  static Vocabulary withDefaults(std::string model, std::string pre);
};

class Tokenizer {
 public:
  // Validates `vocab` and builds the lookup tables (O(n_vocab + n_merges)). Errors name the field,
  // the index and the numbers: unknown model or pre-tokenizer, empty token list, scores/token_types
  // sizes ≠ n_vocab, token type outside 0..6, duplicate token text, byte token ("llama") whose text is
  // not "<0xXX>", special id (bos/eos/unk/pad/eot/eom) outside [0, n_vocab), add_bos/add_eos without the id, merge without a
  // " " separator or whose halves are not tokens. Empty token texts are renamed "[EMPTY_<id>]" as in
  // llama.cpp.
  static Result<Tokenizer> create(Vocabulary vocab);

  // Token ids of `text` (UTF-8; invalid sequences allowed, see the file comment).
  // add_special: prepend BOS / append EOS as the vocabulary's add_bos / add_eos say.
  // parse_special: control/unknown token texts in `text` become those tokens (else they are text).
  // Cost: O(n log n) in the text length (priority-queue merging; about 0.1-0.45 s per MiB in a release
  // build); allocates. Precondition: text.size() < 4 GiB (symbol offsets are 32-bit).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes token `id` stands for: "▁" → " " and "<0xXX>" → that byte ("llama"); the byte table
  // inverted ("gpt2"); control, unknown, unused and undefined tokens → "" unless render_special,
  // which gives control/unknown tokens their text. User-defined tokens → their text. Out-of-range
  // ids → "". May be an incomplete UTF-8 sequence (byte tokens, byte-level pieces).
  std::string tokenToPiece(int32_t id, bool render_special = false) const;

  // The pieces of `ids` concatenated (llama_detokenize with remove_special = false and
  // unparse_special = false): when add_space_prefix, one leading space of the first token's piece is
  // removed, so decode(encode(s)) == s for "llama". No clean-up of spaces; bytes are not validated.
  std::string decode(std::span<const int32_t> ids) const;

  int32_t nTokens() const;
  const Vocabulary& vocabulary() const;
  // Type after llama.cpp's fix-ups (tokens such as "<|im_end|>" or "<|fim_prefix|>" become control).
  TokenType tokenType(int32_t id) const;
  // Id of the token whose text is exactly `text`, or -1.
  int32_t findToken(std::string_view text) const;
  // End of generation, llama.cpp's special_eog_ids (src/llama-vocab.cpp, load): eos_id, eot_id,
  // eom_id, and the tokens it recognises by their text: "<|eot_id|>", "<|im_end|>", "<|end|>",
  // "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]",
  // "<end_of_utterance>", the FIM pad / repo / file-separator markers, and DeepSeek's
  // "<｜end▁of▁sentence｜>" when the vocabulary has no eot_id (llama.cpp takes it as the EOT token then).
  bool isEndOfGeneration(int32_t id) const;
  // The end-of-generation ids, ascending.
  std::vector<int32_t> endOfGenerationIds() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Prompt text as llama.cpp's tools read it (common/common.cpp, common/arg.cpp).
//
// processEscapes: llama.cpp's string_process_escapes, applied to -p / -f text unless --no-escape:
// "\n" "\r" "\t" "\'" "\"" "\\" become that character; "\xHH" becomes the byte 0xHH when strtol
// reads both characters after the x as hex (so "\x4" at the end, or "\xZZ", stay as written);
// any other backslash sequence (including "\a", "\b", "\f", "\v", which llama.cpp does not
// handle) and a trailing lone backslash stay as written. Never fails.
std::string processEscapes(std::string_view text);
// llama.cpp's -f / --file: one trailing "\n" (as `echo text > file` writes) is not part of the text.
std::string dropOneTrailingNewline(std::string text);

// Streaming detokenizer: turns generated ids into text that is always valid UTF-8.
// push() returns the bytes that are complete so far: a trailing incomplete UTF-8 sequence is held
// back until the next push (multi-byte characters split across byte tokens print whole), and every
// ill-formed sequence becomes U+FFFD (one per maximal ill-formed subpart, Unicode 15 §3.9, Table 3-7
// well-formed byte sequences: no overlongs, no surrogates, nothing above U+10FFFF). flush() ends the
// stream: held bytes become U+FFFD. Pieces come from Tokenizer::tokenToPiece (no leading-space
// removal: streamed continuations keep their spaces). Not thread-safe (one per stream).
class Detokenizer {
 public:
  explicit Detokenizer(Tokenizer tokenizer, bool render_special = false)
      : tokenizer_(std::move(tokenizer)), render_special_(render_special) {}

  std::string push(int32_t id);
  std::string flush();

 private:
  Tokenizer tokenizer_;
  bool render_special_;
  std::string pending_;  // bytes not yet emitted: at most an incomplete sequence (≤ 3 bytes) between calls
};

}  // namespace minfer
