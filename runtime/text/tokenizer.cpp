// Tokenizer: vocabulary validation, special-token partitioning, encode dispatch, pieces and decode.
#include "minfer/tokenizer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "runtime/text/tokenizer_impl.h"
#include "runtime/text/utf8.h"

namespace minfer {

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's space

// Token texts llama.cpp's vocabulary loader forces to control type (end-of-turn, end-of-message and
// fill-in-the-middle markers) and those it treats as end of generation (src/llama-vocab.cpp, load).
// "\xEF\xBD\x9C" is U+FF5C "｜" as DeepSeek spells it.
const std::vector<std::string_view>& controlTexts() {
  static const std::vector<std::string_view> kTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
      "_<EOT>", "[EOT]", "<end_of_utterance>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "<|eom_id|>",
      "<|fim_prefix|>", "<fim-prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
      "<|fim_suffix|>", "<fim-suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>",
      "<|fim_middle|>", "<fim-middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
      "<|fim_pad|>", "<fim-pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
      "<|file_sep|>"};
  return kTexts;
}
const std::vector<std::string_view>& endOfGenerationTexts() {
  static const std::vector<std::string_view> kTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<|eom_id|>",
      "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>", "<|fim_pad|>", "<fim-pad>", "<PAD>", "<|fim_repo|>",
      "<|repo_name|>", "<fim-repo>", "<REPO>", "<|file_sep|>"};
  return kTexts;
}
// DeepSeek's end of sentence: llama.cpp's EOT auto-detection takes it when the GGUF names no EOT token.
constexpr std::string_view kDeepSeekEndOfSentence =
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>";

std::string quoted(std::string_view s) {
  std::string out = "'";
  for (const char c : s.substr(0, 64)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  if (s.size() > 64) out += "...";
  return out + "'";
}

Status fieldError(const std::string& what) { return Status::error("vocabulary: " + what); }

// Parses "<0xXX>" (two upper- or lower-case hex digits); -1 if `text` is not of that form.
int parseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = text[k];
    int digit;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    else return -1;
    value = value * 16 + digit;
  }
  return value;
}

bool isSpecialType(TokenType t) { return t == TokenType::kControl || t == TokenType::kUnknown; }

// A piece of the input: raw text [begin, end) or an already identified special token.
struct Fragment {
  int32_t token;  // -1 for text
  size_t begin;
  size_t end;
};

// Cuts special tokens out of the text fragments, longest token text first, every occurrence
// (leftmost, non-overlapping), as llama.cpp's tokenizer_st_partition does. Control and unknown
// tokens only with parse_special; user-defined tokens always. Cost: one substring search per
// special token whose first byte occurs in the text.
void partitionSpecial(const Tokenizer::Impl& impl, std::string_view text, bool parse_special,
                      std::vector<Fragment>& fragments) {
  fragments.assign(1, Fragment{-1, 0, text.size()});
  bool present[256] = {};
  for (const char c : text) present[static_cast<uint8_t>(c)] = true;
  std::vector<Fragment> next;
  for (const int32_t id : impl.special_ids) {
    if (!parse_special && isSpecialType(impl.types[id])) continue;
    const std::string_view special = impl.vocab.tokens[id];
    if (!present[static_cast<uint8_t>(special[0])]) continue;
    next.clear();
    bool found = false;
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (pos < f.end) {
        const size_t match = text.substr(0, f.end).find(special, pos);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({-1, pos, match});
        next.push_back({id, match, match + special.size()});
        pos = match + special.size();
        found = true;
      }
      if (pos < f.end) next.push_back({-1, pos, f.end});
    }
    if (found) fragments.swap(next);
  }
}

// llama.cpp's fix-ups at load: end-of-turn / FIM marker texts become control tokens; the
// end-of-generation set (Tokenizer::isEndOfGeneration). Needs impl.types and impl.token_to_id.
void markControlAndEndOfGeneration(const Vocabulary& vocab, Tokenizer::Impl& impl) {
  impl.eog.assign(impl.types.size(), 0);
  for (const std::string_view t : controlTexts()) {
    const int32_t id = impl.lookup(t);
    if (id >= 0) impl.types[id] = TokenType::kControl;
  }
  for (const std::string_view t : endOfGenerationTexts()) {
    const int32_t id = impl.lookup(t);
    if (id >= 0) impl.eog[id] = 1;
  }
  if (vocab.eot_id < 0) {
    const int32_t id = impl.lookup(kDeepSeekEndOfSentence);
    if (id >= 0) impl.eog[id] = 1;
  }
  for (const int32_t id : {vocab.eos_id, vocab.eot_id, vocab.eom_id})
    if (id >= 0) impl.eog[id] = 1;
}

}  // namespace

Vocabulary Vocabulary::withDefaults(std::string model, std::string pre) {
  Vocabulary v;
  if (model == "llama") {
    v.bos_id = 1;
    v.eos_id = 2;
    v.unk_id = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
  } else if (model == "gpt2") {
    v.bos_id = 11;
    v.eos_id = 11;
    for (const char* name : {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                             "lfm2", "tekken", "chameleon"})
      if (pre == name) v.add_bos = true;
    if (pre == "chatglm-bpe" || pre == "glm4") v.bos_id = -1;
  }
  v.model = std::move(model);
  v.pre = std::move(pre);
  return v;
}

Result<Tokenizer> Tokenizer::create(Vocabulary vocab) {
  auto impl = std::make_shared<Impl>();
  if (vocab.model != "llama" && vocab.model != "gpt2")
    return fieldError("model " + quoted(vocab.model) + " is not supported (expected 'llama' or 'gpt2')");
  impl->spm = vocab.model == "llama";

  const size_t n = vocab.tokens.size();
  if (n == 0) return fieldError("tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return fieldError("tokens has " + std::to_string(n) + " entries (max 2^31-1)");
  if (!vocab.scores.empty() && vocab.scores.size() != n)
    return fieldError("scores has " + std::to_string(vocab.scores.size()) + " entries, tokens has " +
                      std::to_string(n));
  if (!vocab.token_types.empty() && vocab.token_types.size() != n)
    return fieldError("token_types has " + std::to_string(vocab.token_types.size()) + " entries, tokens has " +
                      std::to_string(n));
  for (size_t i = 0; i < vocab.scores.size(); ++i)
    if (std::isnan(vocab.scores[i])) return fieldError("scores[" + std::to_string(i) + "] is NaN");

  const int32_t n_vocab = static_cast<int32_t>(n);
  const std::pair<const char*, int32_t> ids[] = {
      {"bos_id", vocab.bos_id}, {"eos_id", vocab.eos_id}, {"unk_id", vocab.unk_id}, {"pad_id", vocab.pad_id},
      {"eot_id", vocab.eot_id}, {"eom_id", vocab.eom_id}};
  for (const auto& [name, id] : ids)
    if (id < -1 || id >= n_vocab)
      return fieldError(std::string(name) + " = " + std::to_string(id) + " is out of range [0, " +
                        std::to_string(n_vocab) + ") (-1 = none)");
  if (vocab.add_bos && vocab.bos_id < 0) return fieldError("add_bos is set but bos_id is -1");
  if (vocab.add_eos && vocab.eos_id < 0) return fieldError("add_eos is set but eos_id is -1");

  impl->types.resize(n, TokenType::kNormal);
  impl->token_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!vocab.token_types.empty()) {
      const int32_t t = vocab.token_types[i];
      if (t < 0 || t > 6)
        return fieldError("token_types[" + std::to_string(i) + "] = " + std::to_string(t) +
                          " is not a token type (expected 0..6)");
      impl->types[i] = static_cast<TokenType>(t);
    }
    std::string& text = vocab.tokens[i];
    if (text.empty()) text = "[EMPTY_" + std::to_string(i) + "]";  // llama.cpp renames them the same way
    auto [it, inserted] = impl->token_to_id.emplace(text, static_cast<int32_t>(i));
    if (!inserted)
      return fieldError("tokens[" + std::to_string(i) + "] = " + quoted(text) + " duplicates tokens[" +
                        std::to_string(it->second) + "]");
    if (impl->spm && impl->types[i] == TokenType::kByte && parseByteToken(text) < 0)
      return fieldError("tokens[" + std::to_string(i) + "] = " + quoted(text) +
                        " has type byte (6) but is not of the form <0xXX>");
  }

  markControlAndEndOfGeneration(vocab, *impl);

  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& merge = vocab.merges[i];
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= merge.size())
      return fieldError("merges[" + std::to_string(i) + "] = " + quoted(merge) +
                        " is not of the form \"left right\"");
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    if (impl->lookup(left) < 0 || impl->lookup(right) < 0)
      return fieldError("merges[" + std::to_string(i) + "] = " + quoted(merge) + ": " +
                        quoted(impl->lookup(left) < 0 ? left : right) + " is not a token");
    if (impl->spm) continue;  // SentencePiece merges by score; llama.cpp ignores merges here too
    auto& splits = impl->merges[std::string(left) + std::string(right)];
    const auto left_len = static_cast<uint32_t>(left.size());
    const bool seen = std::any_of(splits.begin(), splits.end(), [&](const auto& s) { return s.first == left_len; });
    if (!seen) splits.emplace_back(left_len, static_cast<int32_t>(i));  // first (lowest) rank wins
  }

  if (!impl->spm) {
    Result<text::PreTokenizer> pre = text::PreTokenizer::create(vocab.pre);
    if (!pre) return Status(pre.status()).withContext("vocabulary: ");
    impl->pre.emplace(std::move(*pre));
  }

  // Byte fallback tables.
  for (int b = 0; b < 256; ++b) {
    const std::string single(1, static_cast<char>(b));
    if (impl->spm) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      int32_t id = impl->lookup(hex);
      if (id < 0) id = impl->lookup(single);
      if (id < 0) id = vocab.unk_id;  // llama.cpp throws here; a vocabulary without byte tokens maps to <unk>
      impl->byte_token[b] = id;
    } else {
      impl->byte_token[b] = impl->lookup(single);
    }
  }

  // Pieces (render_special = true; tokenToPiece hides control/unknown ones on request).
  impl->pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = vocab.tokens[i];
    std::string& piece = impl->pieces[i];
    switch (impl->types[i]) {
      case TokenType::kControl:
      case TokenType::kUnknown:
      case TokenType::kUserDefined:
        piece = text;
        break;
      case TokenType::kNormal:
        if (impl->spm) {
          for (size_t pos = 0; pos < text.size();) {
            if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
              piece += ' ';
              pos += kSpaceMarker.size();
            } else {
              piece += text[pos++];
            }
          }
        } else {
          std::vector<uint32_t> cpts;
          text::decodeUtf8Lenient(text, cpts);
          for (const uint32_t c : cpts) {
            const int b = text::unicodeToByte(c);
            if (b >= 0) piece += static_cast<char>(b);
            else text::appendUtf8(piece, c);  // not a byte-table code point: kept as its own UTF-8
          }
        }
        break;
      case TokenType::kByte:
        if (impl->spm) piece = std::string(1, static_cast<char>(parseByteToken(text)));
        break;
      case TokenType::kUnused:
      case TokenType::kUndefined:
        break;
    }
  }

  // Special tokens, longest text first (ties by id, for a deterministic order).
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = impl->types[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown)
      impl->special_ids.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(impl->special_ids.begin(), impl->special_ids.end(), [&](int32_t a, int32_t b) {
    return vocab.tokens[a].size() > vocab.tokens[b].size();
  });

  impl->vocab = std::move(vocab);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& impl = *impl_;
  const Vocabulary& v = impl.vocab;
  std::vector<int32_t> out;
  std::vector<Fragment> fragments;
  if (!text.empty()) partitionSpecial(impl, text, parse_special, fragments);

  if (add_special && v.add_bos) out.push_back(v.bos_id);
  if (impl.spm) {
    // A fragment that starts the input or follows a special token gets the "▁" prefix.
    bool prev_special = true;
    std::string escaped;
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      escaped.clear();
      if (v.add_space_prefix && prev_special) escaped += kSpaceMarker;
      for (const char c : text.substr(f.begin, f.end - f.begin)) {
        if (c == ' ') escaped += kSpaceMarker;
        else escaped += c;
      }
      text::encodeSpm(impl, escaped, out);
      prev_special = false;
    }
  } else {
    for (const Fragment& f : fragments) {
      if (f.token >= 0) out.push_back(f.token);
      else text::encodeBpe(impl, text.substr(f.begin, f.end - f.begin), out);
    }
  }
  if (add_special && v.add_eos) out.push_back(v.eos_id);
  return out;
}

std::string Tokenizer::tokenToPiece(int32_t id, bool render_special) const {
  const Impl& impl = *impl_;
  if (id < 0 || id >= nTokens()) return {};
  if (!render_special && isSpecialType(impl.types[id])) return {};
  return impl.pieces[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    std::string piece = tokenToPiece(ids[k]);
    if (k == 0 && impl_->vocab.add_space_prefix && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    out += piece;
  }
  return out;
}

int32_t Tokenizer::nTokens() const { return static_cast<int32_t>(impl_->vocab.tokens.size()); }
const Vocabulary& Tokenizer::vocabulary() const { return impl_->vocab; }

TokenType Tokenizer::tokenType(int32_t id) const {
  return (id >= 0 && id < nTokens()) ? impl_->types[id] : TokenType::kUndefined;
}

int32_t Tokenizer::findToken(std::string_view text) const { return impl_->lookup(text); }

bool Tokenizer::isEndOfGeneration(int32_t id) const { return id >= 0 && id < nTokens() && impl_->eog[id]; }

std::vector<int32_t> Tokenizer::endOfGenerationIds() const {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < nTokens(); ++id)
    if (impl_->eog[id]) ids.push_back(id);
  return ids;
}

}  // namespace minfer
