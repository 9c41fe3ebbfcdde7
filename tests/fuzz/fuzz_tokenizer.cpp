// Fuzz harness: tokenizer encode/decode and the streaming detokenizer on arbitrary bytes (see fuzz_harness.h).
//
// Vocabularies, loaded once: llama.cpp's llama-spm and gpt-2 test vocabularies from the fixtures
// (MINFER_FIXTURES, else ../shared/fixtures); without fixtures, two small built-in ones of the same
// kinds (byte tokens and a few merges), so the target still runs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "minfer/tokenizer.h"
#include "tests/fuzz/fuzz_harness.h"
#include "tests/text/gguf_vocabulary.h"

#ifndef MINFER_DEFAULT_FIXTURES
#define MINFER_DEFAULT_FIXTURES ""
#endif

namespace minfer::fuzz {
namespace {

std::string fixtureVocab(const char* name) {
  const char* env = std::getenv("MINFER_FIXTURES");
  const std::string dir = (env && *env) ? env : MINFER_DEFAULT_FIXTURES;
  const std::string path = dir + "/tokenizer/ggml-vocab-" + name + ".gguf";
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "";
  std::fclose(f);
  return path;
}

// GPT-2's bytes_to_unicode for one byte, as UTF-8.
std::string byteLevel(uint8_t b) {
  uint32_t cpt = b;
  auto printable = [](uint32_t x) { return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE; };
  if (!printable(b)) {
    uint32_t k = 0;
    for (uint32_t x = 0; x < b; ++x)
      if (!printable(x)) ++k;
    cpt = 256 + k;
  }
  std::string s;
  if (cpt < 0x80) {
    s += static_cast<char>(cpt);
  } else {
    s += static_cast<char>(0xC0 | (cpt >> 6));
    s += static_cast<char>(0x80 | (cpt & 0x3F));
  }
  return s;
}

Vocabulary builtinSpm() {
  Vocabulary v = Vocabulary::withDefaults("llama", "default");
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.token_types.push_back(6);
  }
  const char* words[] = {"\xE2\x96\x81", "\xE2\x96\x81t", "\xE2\x96\x81th", "\xE2\x96\x81the", "a", "b", "ab", "e",
                         "h", "t", "he", "\xC3\xA9", "\xE2\x96\x81\xE2\x96\x81"};
  float score = -1;
  for (const char* w : words) {
    v.tokens.push_back(w);
    v.token_types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t k = 259; k < v.tokens.size(); ++k) v.scores[k] = score--;
  return v;
}

Vocabulary builtinBpe() {
  Vocabulary v = Vocabulary::withDefaults("gpt2", "gpt-2");
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byteLevel(static_cast<uint8_t>(b)));
  const std::pair<const char*, const char*> merges[] = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"a", "b"}};
  for (const auto& [l, r] : merges) {
    std::string left, right;
    for (const char* c = l; *c; ++c) left += byteLevel(static_cast<uint8_t>(*c));
    for (const char* c = r; *c; ++c) right += byteLevel(static_cast<uint8_t>(*c));
    v.merges.push_back(left + " " + right);
    v.tokens.push_back(left + right);
  }
  v.tokens.push_back("<|endoftext|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types.back() = 3;
  v.bos_id = v.eos_id = static_cast<int32_t>(v.tokens.size()) - 1;
  return v;
}

std::unique_ptr<Tokenizer> load(const char* fixture, Vocabulary (*builtin)()) {
  Vocabulary v;
  const std::string path = fixtureVocab(fixture);
  if (!path.empty()) {
    auto loaded = test::vocabularyFromGguf(path);
    if (!loaded) fuzzFail(path + ": " + loaded.status().message());
    v = std::move(*loaded);
  } else {
    v = builtin();
  }
  auto tok = Tokenizer::create(std::move(v));
  if (!tok) fuzzFail(std::string("vocabulary ") + fixture + ": " + tok.status().message());
  std::fprintf(stderr, "fuzz_tokenizer: %s vocabulary: %s (%d tokens)\n", fixture,
               path.empty() ? "built-in" : path.c_str(), tok->nTokens());
  return std::make_unique<Tokenizer>(std::move(*tok));
}

const Tokenizer& vocabulary(bool bpe) {
  static const std::unique_ptr<Tokenizer> spm = load("llama-spm", builtinSpm);
  static const std::unique_ptr<Tokenizer> gpt2 = load("gpt-2", builtinBpe);
  return bpe ? *gpt2 : *spm;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7F || u == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string idList(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

// `s` with every U+2581 (E2 96 81) replaced by a space.
std::string markerAsSpace(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool hasUserDefined(const Tokenizer& t) {
  for (int32_t id = 0; id < t.nTokens(); ++id)
    if (t.tokenType(id) == TokenType::kUserDefined) return true;
  return false;
}

}  // namespace

int runTokenizer(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const bool bpe = flags & 1, parse_special = flags & 2, add_special = flags & 4, render_special = flags & 8;
  const Tokenizer& tok = vocabulary(bpe);
  static const bool user_defined[2] = {hasUserDefined(vocabulary(false)), hasUserDefined(vocabulary(true))};
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const int32_t n = tok.nTokens();

  // Encode.
  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids)
    if (id < 0 || id >= n) fuzzFail("encode produced id " + std::to_string(id) + " outside [0, " + std::to_string(n) + ")");
  // Round trip (tokenizer.h): "llama" keeps every byte up to the space marker (a literal U+2581 "▁"
  // decodes as a space, and a space swallowed by an invalid lead byte's sequence comes back as the
  // bytes of "▁", both as in llama.cpp), so both sides are compared with "▁" read as " ";
  // byte-level BPE keeps well-formed UTF-8 exactly. Only without special tokens in play: control
  // tokens decode to "", and a user-defined token is followed by a space prefix.
  if (!parse_special && !add_special && !user_defined[bpe] && (!bpe || isWellFormedUtf8(text))) {
    const std::string back = tok.decode(ids);
    if ((bpe ? back : markerAsSpace(back)) != (bpe ? text : markerAsSpace(text)))
      fuzzFail(std::string(bpe ? "gpt-2" : "llama-spm") + ": decode(encode(text)) != text: '" + escaped(text) +
               "' -> ids" + idList(ids) + " -> '" + escaped(back) + "'");
  }

  // Decode arbitrary ids: the text bytes read as little-endian int32 (any value, out of range included).
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  std::string joined;
  for (int32_t id : raw) {
    const std::string piece = tok.tokenToPiece(id, render_special);
    if ((id < 0 || id >= n) && !piece.empty()) fuzzFail("out-of-range id " + std::to_string(id) + " has a piece");
    joined += tok.tokenToPiece(id);
    (void)tok.isEndOfGeneration(id);
    (void)tok.tokenType(id);
  }
  const std::string decoded = tok.decode(raw);
  if (decoded.size() > joined.size()) fuzzFail("decode is longer than its pieces");

  // Streaming: every push and the flush are well-formed UTF-8.
  Detokenizer detok(tok, render_special);
  for (int32_t id : raw) {
    const std::string out = detok.push(id);
    if (!isWellFormedUtf8(out)) fuzzFail("Detokenizer::push returned ill-formed UTF-8");
  }
  if (!isWellFormedUtf8(detok.flush())) fuzzFail("Detokenizer::flush returned ill-formed UTF-8");
  // The same ids streamed with the encoded ones after them (pieces of real text across a bad prefix).
  Detokenizer mixed(tok, render_special);
  std::string streamed;
  for (int32_t id : raw) streamed += mixed.push(id);
  for (int32_t id : ids) streamed += mixed.push(id);
  streamed += mixed.flush();
  if (!isWellFormedUtf8(streamed)) fuzzFail("Detokenizer stream is ill-formed UTF-8");
  return 0;
}

}  // namespace minfer::fuzz

#ifdef MINFER_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return minfer::fuzz::runTokenizer(data, size);
}
#endif
