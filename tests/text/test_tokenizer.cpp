// Tokenizer tests: llama.cpp's vocab test pairs, stories260K prompts/goldens, hand-made vocabularies and edge cases.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "minfer/tokenizer.h"
#include "runtime/text/pretokenizer.h"
#include "tests/test_support.h"
#include "tests/text/gguf_vocabulary.h"
#include "tests/text/spm_vocabulary.h"

using minfer::Detokenizer;
using minfer::Tokenizer;
using minfer::TokenType;
using minfer::Vocabulary;
using minfer::test::spmVocab;

namespace {

const char* const kFixtureVocabs[] = {"llama-spm", "phi-3", "gpt-2", "deepseek-coder", "starcoder"};

std::string readText(const std::string& path) {
  const std::vector<uint8_t> bytes = minfer::test::readFile(path);
  return std::string(bytes.begin(), bytes.end());
}

// .inp: every test string is followed by "\n__ggml_vocab_test__\n" (fixtures README §6).
std::vector<std::string> splitInp(const std::string& content) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < content.size()) {
    const size_t next = content.find(sep, pos);
    if (next == std::string::npos) {
      out.push_back(content.substr(pos));  // malformed tail: keep it so the count check fails
      break;
    }
    out.push_back(content.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return out;
}

// .out: one line per string, ids in decimal each preceded by a space.
std::vector<std::vector<int32_t>> parseOut(const std::string& content) {
  std::vector<std::vector<int32_t>> out;
  size_t pos = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == std::string::npos) end = content.size();
    std::vector<int32_t> ids;
    const std::string line = content.substr(pos, end - pos);
    size_t k = 0;
    while (k < line.size()) {
      while (k < line.size() && line[k] == ' ') ++k;
      if (k < line.size()) {
        size_t used = 0;
        ids.push_back(std::stoi(line.substr(k), &used));
        k += used;
      }
    }
    out.push_back(std::move(ids));
    pos = end + 1;
  }
  return out;
}

std::string idsToString(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<Tokenizer> makeTokenizer(Vocabulary v) {
  auto t = Tokenizer::create(std::move(v));
  if (!t) {
    FAIL_CHECK(t.status().message());
    return std::nullopt;
  }
  return std::move(*t);
}

std::optional<Tokenizer> loadTokenizer(const std::string& path) {
  auto v = minfer::test::vocabularyFromGguf(path);
  if (!v) {
    FAIL_CHECK(v.status().message());
    return std::nullopt;
  }
  return makeTokenizer(std::move(*v));
}

std::string vocabPath(const std::string& name) {
  return minfer::test::fixturesDir() + "/tokenizer/ggml-vocab-" + name + ".gguf";
}

// Index of `text` in the vocabulary's token list by linear search (independent of the tokenizer's maps).
int32_t indexOf(const Vocabulary& v, const std::string& text) {
  const auto it = std::find(v.tokens.begin(), v.tokens.end(), text);
  return it == v.tokens.end() ? -1 : static_cast<int32_t>(it - v.tokens.begin());
}

std::string pieces(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s += t.tokenToPiece(id);
  return s;
}

// GPT-2's bytes_to_unicode, written out here independently of the implementation under test.
std::string byteLevel(uint8_t b) {
  uint32_t cpt = b;
  if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    uint32_t k = 0;
    for (uint32_t x = 0; x < b; ++x)
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++k;
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

std::string byteLevel(const std::string& bytes) {
  std::string s;
  for (const char c : bytes) s += byteLevel(static_cast<uint8_t>(c));
  return s;
}

// A byte-level BPE vocabulary: the 256 single-byte tokens (id = byte value), then `extra` tokens
// (written in plain bytes, converted here), then "<|endoftext|>" as a control token.
Vocabulary bpeVocab(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                    const std::string& pre = "gpt-2") {
  Vocabulary v = Vocabulary::withDefaults("gpt2", pre);
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byteLevel(static_cast<uint8_t>(b)));
  for (const std::string& e : extra) v.tokens.push_back(byteLevel(e));
  v.tokens.push_back("<|endoftext|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types.back() = 3;
  v.bos_id = v.eos_id = static_cast<int32_t>(v.tokens.size()) - 1;
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    v.merges.push_back(byteLevel(m.substr(0, space)) + " " + byteLevel(m.substr(space + 1)));
  }
  return v;
}

int32_t spmId(const Vocabulary& v, const std::string& text) {
  std::string t;
  for (const char c : text) t += (c == '_') ? std::string("\xE2\x96\x81") : std::string(1, c);
  const int32_t id = indexOf(v, t);
  REQUIRE_MESSAGE(id >= 0, "test vocabulary lacks " << text);
  return id;
}

double secondsFor(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A guard against quadratic blow-up, not a speed check (speed is for benchmarks): release builds encode
// 1 MiB (measured 0.06-0.45 s per input on an idle 2-core machine; a quadratic encoder would take hours),
// debug + sanitizer builds (~50x slower) 128 KiB. The budgets leave room for a loaded machine: a 1.0 s
// budget failed once while two other builds ran.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
constexpr size_t kLongInputBytes = 1u << 20;
constexpr double kLongInputBudgetSeconds = 30.0;
#else
constexpr size_t kLongInputBytes = 128u << 10;
constexpr double kLongInputBudgetSeconds = 120.0;
#endif

}  // namespace

TEST_CASE("fixture vocabularies: every test string gives llama.cpp's ids, and decodes back") {
  if (!minfer::test::haveFixtures()) return;
  for (const char* name : kFixtureVocabs) {
    INFO("vocab " << std::string(name));
    const std::string path = vocabPath(name);
    auto tok = loadTokenizer(path);
    REQUIRE(tok);
    const std::vector<std::string> inputs = splitInp(readText(path + ".inp"));
    const std::vector<std::vector<int32_t>> expected = parseOut(readText(path + ".out"));
    REQUIRE(inputs.size() == 46);
    REQUIRE(expected.size() == 46);
    int mismatches = 0;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const std::vector<int32_t> ids = tok->encode(inputs[k], /*add_special=*/false, /*parse_special=*/false);
      if (ids != expected[k]) {
        ++mismatches;
        FAIL_CHECK("string #" << k + 1 << " '" << escaped(inputs[k]) << "'\n  expected" << idsToString(expected[k])
                              << "\n  got     " << idsToString(ids));
      }
      // Every byte of these (valid UTF-8) strings has a token in all five vocabularies, so decoding
      // must give the input back exactly; no exceptions are needed for this set.
      const std::string decoded = tok->decode(expected[k]);
      CHECK_MESSAGE(decoded == inputs[k], "string #" << k + 1 << " decodes to '" << escaped(decoded) << "'");
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("fixture vocabularies: loaded fields match the README table") {
  if (!minfer::test::haveFixtures()) return;
  struct Row {
    const char* name;
    const char* model;
    size_t tokens;
    size_t merges;
    int32_t bos, eos;
    bool add_bos;
  };
  const Row rows[] = {{"llama-spm", "llama", 32000, 0, 1, 2, true},
                      {"phi-3", "llama", 32064, 0, 1, 32000, true},
                      {"gpt-2", "gpt2", 50257, 50000, 50256, 50256, false},
                      {"deepseek-coder", "gpt2", 32256, 31757, 32013, 32014, true},
                      {"starcoder", "gpt2", 49152, 48872, 0, 0, false}};
  for (const Row& r : rows) {
    INFO("vocab " << r.name);
    auto tok = loadTokenizer(vocabPath(r.name));
    REQUIRE(tok);
    const Vocabulary& v = tok->vocabulary();
    CHECK(v.model == r.model);
    CHECK(v.tokens.size() == r.tokens);
    CHECK(v.merges.size() == r.merges);
    CHECK(v.bos_id == r.bos);
    CHECK(v.eos_id == r.eos);
    CHECK(v.add_bos == r.add_bos);
    CHECK(tok->isEndOfGeneration(r.eos));
    // parse_special: the BOS text (a control token in all five) becomes BOS; the text after a special
    // token is encoded as on its own (SPM: with its own "▁" prefix).
    const std::string bos_text = v.tokens[r.bos];
    const std::vector<int32_t> hello = tok->encode("Hello", false, false);
    std::vector<int32_t> expected = {r.bos};
    expected.insert(expected.end(), hello.begin(), hello.end());
    CHECK(tok->tokenType(r.bos) == TokenType::kControl);
    CHECK(tok->encode(bos_text + "Hello", false, true) == expected);
    const std::vector<int32_t> literal = tok->encode(bos_text + "Hello", false, false);
    CHECK(std::find(literal.begin(), literal.end(), r.bos) == literal.end());
    CHECK(tok->decode(literal) == bos_text + "Hello");
  }
}

TEST_CASE("stories260K: prompts give the goldens' ids; generated ids detokenize to the goldens' text") {
  if (!minfer::test::haveFixtures()) return;
  auto tok = loadTokenizer(minfer::test::fixturesDir() + "/models/stories260K.gguf");
  REQUIRE(tok);
  CHECK(tok->encode("Once upon a time", /*add_special=*/true, /*parse_special=*/false) ==
        std::vector<int32_t>{1, 403, 407, 261, 378});
  CHECK(tok->encode("Once upon a time", false, false) == std::vector<int32_t>{403, 407, 261, 378});

  for (const char* name : {"stories260K-F32_once", "stories260K-F32_long"}) {
    INFO("golden " << name);
    const auto j = nlohmann::json::parse(readText(minfer::test::fixturesDir() + "/goldens/" + name + ".json"));
    const std::string prompt = j.at("prompt_text").get<std::string>();
    const auto prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
    CHECK(tok->encode(prompt, true, false) == prompt_ids);
    CHECK(tok->decode(std::vector<int32_t>(prompt_ids.begin() + 1, prompt_ids.end())) == prompt);

    const auto generated = j.at("generated_ids").get<std::vector<int32_t>>();
    std::string hex;
    for (const char c : pieces(*tok, generated)) {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(c));
      hex += buf;
    }
    CHECK(hex == j.at("generated_bytes_hex").get<std::string>());
    Detokenizer detok(*tok);
    std::string streamed;
    for (const int32_t id : generated) streamed += detok.push(id);
    streamed += detok.flush();
    CHECK(streamed == j.at("generated_text").get<std::string>());
  }
}

TEST_CASE("SentencePiece merging: best score first, leftmost on ties, byte fallback, space prefix") {
  {
    // "abc": bc (-3) beats ab (-5); then a+bc = abc (-4) is a token.
    const Vocabulary v = spmVocab({{"a", -2}, {"b", -2}, {"c", -2}, {"ab", -5}, {"bc", -3}, {"abc", -4}}, false);
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    CHECK(tok->encode("abc", false, false) == std::vector<int32_t>{spmId(v, "abc")});
  }
  {
    // Without "abc" the result stays a + bc (ab lost to bc, and is stale afterwards).
    const Vocabulary v = spmVocab({{"a", -2}, {"b", -2}, {"c", -2}, {"ab", -5}, {"bc", -3}}, false);
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    CHECK(tok->encode("abc", false, false) == std::vector<int32_t>{spmId(v, "a"), spmId(v, "bc")});
  }
  {
    // "aaa" with "aa": two equal-score candidates; the leftmost merges first → aa, a.
    const Vocabulary v = spmVocab({{"a", -2}, {"aa", -1}}, false);
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    CHECK(tok->encode("aaa", false, false) == std::vector<int32_t>{spmId(v, "aa"), spmId(v, "a")});
  }
  {
    // "é" (C3 A9) is not a token: byte fallback <0xC3> <0xA9> = ids 3 + byte.
    const Vocabulary v = spmVocab({{"a", -2}, {"_", -1}, {"_a", -1}}, true);
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    CHECK(tok->encode("a\xC3\xA9", false, false) == std::vector<int32_t>{spmId(v, "_a"), 3 + 0xC3, 3 + 0xA9});
    // add_space_prefix: "a" is encoded as "▁a"; with add_special, BOS (id 1) comes first.
    CHECK(tok->encode("a", false, false) == std::vector<int32_t>{spmId(v, "_a")});
    CHECK(tok->encode("a", true, false) == std::vector<int32_t>{1, spmId(v, "_a")});
    CHECK(tok->encode("", true, false) == std::vector<int32_t>{1});
    CHECK(tok->encode("", false, false).empty());
    // Pieces: "▁a" → " a", byte token → that byte, control hidden unless rendered, unknown hidden.
    CHECK(tok->tokenToPiece(spmId(v, "_a")) == " a");
    CHECK(tok->tokenToPiece(3 + 0x41) == "A");
    CHECK(tok->tokenToPiece(1).empty());
    CHECK(tok->tokenToPiece(1, /*render_special=*/true) == "<s>");
    CHECK(tok->tokenToPiece(0).empty());
    CHECK(tok->tokenToPiece(-1).empty());
    CHECK(tok->tokenToPiece(tok->nTokens()).empty());
  }
}

TEST_CASE("special tokens: control only with parse_special, user-defined always; space prefix after them") {
  const Vocabulary v = spmVocab({{"_", -1}, {"x", -2}, {"y", -2}, {"_x", -1}}, true);
  auto tok = makeTokenizer(v);
  REQUIRE(tok);
  const int32_t tool = indexOf(v, "<tool>");
  // The fragment after a special token gets its own "▁" prefix: "▁x" <tool> "▁y".
  CHECK(tok->encode("x<tool>y", false, false) ==
        std::vector<int32_t>{spmId(v, "_x"), tool, spmId(v, "_"), spmId(v, "y")});
  // "</s>" (control): a token only with parse_special; otherwise text (here: byte fallback).
  const std::vector<int32_t> parsed = tok->encode("x</s>", false, true);
  CHECK(parsed == std::vector<int32_t>{spmId(v, "_x"), 2});
  const std::vector<int32_t> literal = tok->encode("x</s>", false, false);
  CHECK(std::find(literal.begin(), literal.end(), 2) == literal.end());
  CHECK(tok->decode(literal) == "x</s>");
  // Longest special text first: "<s>" inside "</s>" is not cut out.
  CHECK(tok->encode("</s><s>", false, true) == std::vector<int32_t>{2, 1});
}

TEST_CASE("byte-level BPE merging: lowest rank first; unmerged symbols stay separate") {
  {
    const Vocabulary v = bpeVocab({"ab", "bc", "abc"}, {"b c", "a b", "ab c"});
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    // b c (rank 0) wins; "a bc" is not a merge → a, bc.
    CHECK(tok->encode("abc", false, false) == std::vector<int32_t>{'a', indexOf(v, byteLevel("bc"))});
  }
  {
    const Vocabulary v = bpeVocab({"ab", "bc", "abc"}, {"a b", "b c", "ab c"});
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    CHECK(tok->encode("abc", false, false) == std::vector<int32_t>{indexOf(v, byteLevel("abc"))});
    // " abc" is one word (gpt-2 regex) whose first symbol "Ġ" takes part in no merge → Ġ, abc.
    CHECK(tok->encode("abc abc", false, false) ==
          std::vector<int32_t>{indexOf(v, byteLevel("abc")), ' ', indexOf(v, byteLevel("abc"))});
    CHECK(tok->tokenToPiece(' ') == " ");
    CHECK(tok->tokenToPiece(0x0A) == "\n");
    CHECK(tok->tokenToPiece(0xFF) == "\xFF");
  }
  {
    // parse_special on/off with a byte-level vocabulary.
    const Vocabulary v = bpeVocab({}, {});
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    const int32_t eot = tok->nTokens() - 1;
    CHECK(tok->encode("a<|endoftext|>", false, true) == std::vector<int32_t>{'a', eot});
    const std::vector<int32_t> literal = tok->encode("a<|endoftext|>", false, false);
    CHECK(literal.size() == 14);
    CHECK(tok->decode(literal) == "a<|endoftext|>");
    CHECK(tok->tokenToPiece(eot).empty());
    CHECK(tok->isEndOfGeneration(eot));
    CHECK_FALSE(tok->isEndOfGeneration('a'));
  }
}

TEST_CASE("pre-tokenizers: segmentations written out by hand") {
  auto segments = [](const char* pre, const std::string& text) {
    auto p = minfer::text::PreTokenizer::create(pre);
    REQUIRE_MESSAGE(p, p.status().message());
    std::vector<size_t> cuts;
    p->split(text, cuts);
    std::vector<std::string> out;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) out.push_back(text.substr(cuts[k], cuts[k + 1] - cuts[k]));
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(segments("gpt-2", "Hello world's  123 !!\n\n x") ==
        V{"Hello", " world", "'s", " ", " 123", " !!", "\n\n", " x"});
  CHECK(segments("llama3", "12345 abc's") == V{"123", "45", " abc", "'s"});
  CHECK(segments("qwen2", "x12345") == V{"x", "1", "2", "3", "4", "5"});
  CHECK(segments("starcoder", "ab12 c") == V{"ab", "1", "2", " c"});
  CHECK(segments("deepseek-coder", "foo, bar\n123") == V{"foo", ",", " bar", "\n", "1", "2", "3"});
  // U+180E is not whitespace for llama.cpp (Unicode White_Space), so it is "other" like punctuation;
  // PCRE2's own \s would match it and split this into a, U+180E, U+180E, b. U+0085 is whitespace.
  CHECK(segments("gpt-2", "a\xE1\xA0\x8E\xE1\xA0\x8E" "b") == V{"a", "\xE1\xA0\x8E\xE1\xA0\x8E", "b"});
  CHECK(segments("gpt-2", "a\xC2\x85\xC2\x85" "b") == V{"a", "\xC2\x85", "\xC2\x85", "b"});
  CHECK(segments("gpt-2", "").empty());
  // A 200k-letter match needs more than PCRE2's default JIT stack (tekken repeats a group per letter).
  CHECK(segments("tekken", std::string(200000, 'b') + "Ab") == V{std::string(200000, 'b'), "Ab"});
  auto unknown = minfer::text::PreTokenizer::create("no-such-pre");
  REQUIRE_FALSE(unknown);
  CHECK(unknown.status().message().find("no-such-pre") != std::string::npos);
}

TEST_CASE("every known pre-tokenizer compiles and loses no byte (all-bytes vocabulary, no merges)") {
  std::string text;
  for (int b = 1; b < 128; ++b) text += static_cast<char>(b);
  text += " Hello, y'all! 123 4567 \xF0\x9F\xA6\x99 \xE4\xBD\xA0\xE5\xA5\xBD \xD0\x9F\xD1\x80\xD0\xB8 \t\n\n  x  ";
  for (const std::string& pre : minfer::text::PreTokenizer::knownNames()) {
    INFO("pre '" << pre << "'");
    auto tok = makeTokenizer(bpeVocab({}, {}, pre));
    REQUIRE(tok);
    const std::vector<int32_t> ids = tok->encode(text, false, false);
    CHECK(ids.size() == text.size());  // one single-byte token per byte
    CHECK(tok->decode(ids) == text);
  }
}

TEST_CASE("invalid UTF-8 input: no crash; SPM keeps the bytes, BPE replaces them with U+FFFD") {
  const std::string bad[] = {"\xFF", "a\xC3", "\xE2\x82", "\x80\x80x", "\xED\xA0\x80", "\xF8\x88\x80\x80\x80",
                             "\xF4\x90\x80\x80", "ok\xF0\x9F\xA6"};
  if (minfer::test::haveFixtures()) {
    auto spm = loadTokenizer(vocabPath("llama-spm"));
    auto bpe = loadTokenizer(vocabPath("gpt-2"));
    REQUIRE(spm);
    REQUIRE(bpe);
    for (const std::string& s : bad) {
      INFO("input " << escaped(s));
      CHECK(spm->decode(spm->encode(s, false, false)) == s);
      const std::vector<int32_t> ids = bpe->encode(s, false, false);
      CHECK_FALSE(ids.empty());
      Detokenizer d(*bpe);
      std::string out;
      for (const int32_t id : ids) out += d.push(id);
      out += d.flush();
      CHECK(out.find("\xEF\xBF\xBD") != std::string::npos);
    }
    // Overlong forms are decoded, not replaced, as llama.cpp's unicode_cpt_from_utf8 does: C0 80 is U+0000.
    CHECK(bpe->decode(bpe->encode("\xC0\x80", false, false)) == std::string(1, '\0'));
    CHECK(spm->decode(spm->encode("\xC0\x80", false, false)) == "\xC0\x80");
    // A lone 0xFF byte is tokenized exactly as U+FFFD would be (llama.cpp's substitution).
    CHECK(bpe->encode("a\xFF" "b", false, false) == bpe->encode("a\xEF\xBF\xBD" "b", false, false));
  }
  // Byte-level vocabulary without merges: surrogates (ED A0 80) survive as their 3 bytes.
  auto tok = makeTokenizer(bpeVocab({}, {}));
  REQUIRE(tok);
  CHECK(tok->decode(tok->encode("x\xED\xA0\x80y", false, false)) == "x\xED\xA0\x80y");
  CHECK(tok->decode(tok->encode("x\xFFy", false, false)) == "x\xEF\xBF\xBDy");
}

TEST_CASE("detokenizer: multi-byte characters split across byte tokens print whole; bad bytes → U+FFFD") {
  const Vocabulary v = spmVocab({{"a", -1}}, false);
  auto tok = makeTokenizer(v);
  REQUIRE(tok);
  auto byte = [](int b) { return 3 + b; };
  {
    Detokenizer d(*tok);
    CHECK(d.push(byte(0xF0)).empty());  // 🦙 = F0 9F A6 99
    CHECK(d.push(byte(0x9F)).empty());
    CHECK(d.push(byte(0xA6)).empty());
    CHECK(d.push(byte(0x99)) == "\xF0\x9F\xA6\x99");
    CHECK(d.push(spmId(v, "a")) == "a");
    CHECK(d.flush().empty());
  }
  {
    Detokenizer d(*tok);
    CHECK(d.push(byte(0xE2)).empty());
    CHECK(d.push(spmId(v, "a")) == "\xEF\xBF\xBD" "a");  // E2 then 'a': ill-formed, then 'a'
    CHECK(d.push(byte(0xC3)).empty());
    CHECK(d.flush() == "\xEF\xBF\xBD");  // incomplete at the end of the stream
    CHECK(d.flush().empty());
  }
  {
    Detokenizer d(*tok);
    CHECK(d.push(byte(0xFF)) == "\xEF\xBF\xBD");          // never valid
    CHECK(d.push(byte(0xED)).empty());
    CHECK(d.push(byte(0xA0)) == "\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: ED and A0 are separate subparts
    CHECK(d.push(byte(0xC0)) == "\xEF\xBF\xBD");          // overlong lead
    CHECK(d.push(1).empty());                              // control token: no text
  }
  {
    Detokenizer d(*tok, /*render_special=*/true);
    CHECK(d.push(1) == "<s>");
  }
}

TEST_CASE("long inputs (1 MiB in release builds): linear time, exact round trip") {
  if (!minfer::test::haveFixtures()) return;
  const std::vector<std::string> inputs = splitInp(readText(vocabPath("gpt-2") + ".inp"));
  std::string block;
  for (const std::string& s : inputs) block += s + "\n";
  std::string text;
  while (text.size() < kLongInputBytes) text += block;
  const std::string letters(kLongInputBytes, 'a');  // one 1 MiB word (BPE) / one long merge chain
  const std::string spaces(kLongInputBytes, ' ');
  for (const char* name : {"llama-spm", "gpt-2"}) {
    INFO("vocab " << std::string(name));
    auto tok = loadTokenizer(vocabPath(name));
    REQUIRE(tok);
    for (const std::string* input : std::initializer_list<const std::string*>{&text, &letters, &spaces}) {
      std::vector<int32_t> ids;
      const double seconds = secondsFor([&] { ids = tok->encode(*input, false, false); });
      INFO("input starts with '" << escaped(input->substr(0, 8)) << "', " << ids.size() << " tokens");
      CHECK(seconds < kLongInputBudgetSeconds);
      CHECK(ids.size() <= input->size());  // gpt-2 has no merge for two spaces: 1 token per space
      CHECK(tok->decode(ids) == *input);
    }
  }
}

TEST_CASE("create() rejects inconsistent vocabularies with the field and index named") {
  auto error = [](Vocabulary v) {
    auto t = Tokenizer::create(std::move(v));
    return t ? std::string("(accepted)") : t.status().message();
  };
  auto contains = [](const std::string& message, const std::string& part) {
    INFO("message: " << message);
    CHECK(message.find(part) != std::string::npos);
  };
  const Vocabulary good = bpeVocab({"ab"}, {"a b"});
  REQUIRE(Tokenizer::create(good));

  Vocabulary v = good;
  v.model = "bert";
  contains(error(v), "model 'bert'");
  v = good;
  v.tokens.clear();
  v.token_types.clear();
  contains(error(v), "tokens is empty");
  v = good;
  v.scores.assign(5, 0.0f);
  contains(error(v), "scores has 5 entries, tokens has 258");
  v = good;
  v.token_types.pop_back();
  contains(error(v), "token_types has 257 entries");
  v = good;
  v.token_types[7] = 9;
  contains(error(v), "token_types[7] = 9");
  v = good;
  v.eos_id = 258;
  contains(error(v), "eos_id = 258 is out of range [0, 258)");
  v = good;
  v.bos_id = -1;
  v.add_bos = true;
  contains(error(v), "add_bos is set but bos_id is -1");
  v = good;
  v.tokens[1] = v.tokens[0];
  contains(error(v), "tokens[1]");
  v = good;
  v.merges.push_back("xyz");
  contains(error(v), "merges[1] = 'xyz'");
  v = good;
  v.merges.push_back("a zz");
  contains(error(v), "merges[1] = 'a zz': 'zz' is not a token");
  v = good;
  v.pre = "no-such-pre";
  contains(error(v), "unknown pre-tokenizer 'no-such-pre'");
  Vocabulary s = spmVocab({{"a", -1}}, true);
  s.token_types[4] = 6;
  s.tokens[4] = "<0xZZ>";
  contains(error(s), "tokens[4] = '<0xZZ>' has type byte");
  s = spmVocab({{"a", -1}}, true);
  s.tokens[260] = "";  // renamed like llama.cpp, not an error
  auto renamed = Tokenizer::create(s);
  REQUIRE(renamed);
  CHECK(renamed->vocabulary().tokens[260] == "[EMPTY_260]");
}

TEST_CASE("Tokenizer is safe to share between threads (const encode from several threads)") {
  const Vocabulary v = bpeVocab({"ab", "abc"}, {"a b", "ab c"});
  auto tok = makeTokenizer(v);
  REQUIRE(tok);
  const std::string text = "abc abc, 123 abc\n";
  const std::vector<int32_t> reference = tok->encode(text, false, false);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < results.size(); ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) results[k] = tok->encode(text, false, false);
    });
  for (auto& t : threads) t.join();
  for (const auto& r : results) CHECK(r == reference);
}

TEST_CASE("prompt special tokens on fixture vocabularies: llama.cpp's partition, ids from the .out files") {
  if (!minfer::test::haveFixtures()) return;
  // llama-spm: .out gives "Hello" → 15043 and "Hello world" → 15043 3186 ("▁world" = 3186); "</s>" is
  // control id 2. llama.cpp (parse_special) cuts "</s>" out, and the fragment after it gets its own "▁".
  auto spm = loadTokenizer(vocabPath("llama-spm"));
  REQUIRE(spm);
  CHECK(spm->encode("Hello</s>world", false, true) == std::vector<int32_t>{15043, 2, 3186});
  CHECK(spm->encode("Hello</s>world", true, true) == std::vector<int32_t>{1, 15043, 2, 3186});
  const std::vector<int32_t> spm_literal = spm->encode("Hello</s>world", false, false);
  CHECK(std::find(spm_literal.begin(), spm_literal.end(), 2) == spm_literal.end());
  // gpt-2: "Hello" → 15496, " world" → 995 (.out #12, #13); "<|endoftext|>" is 50256. No space prefix.
  auto gpt2 = loadTokenizer(vocabPath("gpt-2"));
  REQUIRE(gpt2);
  CHECK(gpt2->encode("Hello<|endoftext|> world", false, true) == std::vector<int32_t>{15496, 50256, 995});
  const std::vector<int32_t> bpe_literal = gpt2->encode("Hello<|endoftext|> world", false, false);
  CHECK(std::find(bpe_literal.begin(), bpe_literal.end(), 50256) == bpe_literal.end());
  // phi-3: "<|user|>hi" with BOS is 3 tokens: <s>, <|user|>, "▁hi".
  auto phi3 = loadTokenizer(vocabPath("phi-3"));
  REQUIRE(phi3);
  const int32_t user = phi3->findToken("<|user|>");
  const int32_t hi = phi3->findToken("\xE2\x96\x81hi");
  REQUIRE(user >= 0);
  REQUIRE(hi >= 0);
  CHECK(phi3->encode("<|user|>hi", true, true) == std::vector<int32_t>{1, user, hi});
  CHECK(phi3->encode("<|user|>hi", true, false).size() > 3);
}

TEST_CASE("stories260K: Hello</s>world is 8 tokens with parse_special (</s> = 2), 11 without") {
  if (!minfer::test::haveFixtures()) return;
  auto tok = loadTokenizer(minfer::test::fixturesDir() + "/models/stories260K.gguf");
  REQUIRE(tok);
  // Expected from llama.cpp's rule: BOS, "Hello" as its own input, </s>, "world" as its own input.
  const std::vector<int32_t> hello = tok->encode("Hello", false, false);
  const std::vector<int32_t> world = tok->encode("world", false, false);
  std::vector<int32_t> expected = {1};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(2);
  expected.insert(expected.end(), world.begin(), world.end());
  const std::vector<int32_t> parsed = tok->encode("Hello</s>world", true, true);
  CHECK(parsed == expected);
  CHECK(parsed.size() == 8);
  CHECK(tok->encode("Hello</s>world", true, false).size() == 11);
}

TEST_CASE("end of generation: EOS, eot_id, eom_id and llama.cpp's texts") {
  Vocabulary v = spmVocab({{"a", -1}, {"b", -1}, {"c", -1}}, true);
  for (const char* text : {"<|im_end|>", "<end_of_turn>", "_<EOT>", "<|end_of_text|>",
                           "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "<unrelated>"}) {
    v.tokens.push_back(text);
    v.token_types.push_back(1);  // normal in the file: llama.cpp makes the known ones control
    v.scores.push_back(0.0f);
  }
  const int32_t a = spmId(v, "a"), b = spmId(v, "b"), c = spmId(v, "c");
  const int32_t deepseek = indexOf(v, "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>");
  {
    auto tok = makeTokenizer(v);
    REQUIRE(tok);
    CHECK(tok->isEndOfGeneration(2));  // EOS
    for (const char* text : {"<|im_end|>", "<end_of_turn>", "_<EOT>", "<|end_of_text|>"}) {
      CAPTURE(text);
      CHECK(tok->isEndOfGeneration(indexOf(v, text)));
      CHECK(tok->tokenType(indexOf(v, text)) == TokenType::kControl);
    }
    CHECK(tok->isEndOfGeneration(deepseek));  // llama.cpp's EOT guess when the GGUF names none
    CHECK(!tok->isEndOfGeneration(indexOf(v, "<unrelated>")));
    CHECK(!tok->isEndOfGeneration(a));
    CHECK(!tok->isEndOfGeneration(1));  // BOS
  }
  v.eot_id = a;  // tokenizer.ggml.eot_token_id / eom_token_id: end of generation whatever their text
  v.eom_id = b;
  auto tok = makeTokenizer(v);
  REQUIRE(tok);
  CHECK(tok->isEndOfGeneration(a));
  CHECK(tok->isEndOfGeneration(b));
  CHECK(!tok->isEndOfGeneration(c));
  CHECK(!tok->isEndOfGeneration(deepseek));  // an explicit eot_id: no guess by text
  const std::vector<int32_t> eog = tok->endOfGenerationIds();
  CHECK(std::is_sorted(eog.begin(), eog.end()));
  CHECK(std::count_if(eog.begin(), eog.end(), [&](int32_t id) { return id == a || id == b || id == 2; }) == 3);
  v.eot_id = static_cast<int32_t>(v.tokens.size());
  auto bad = Tokenizer::create(v);
  REQUIRE(!bad);
  CHECK(bad.status().message().find("eot_id = " + std::to_string(v.tokens.size()) + " is out of range") !=
        std::string::npos);
}

TEST_CASE("fixture vocabularies: end-of-generation ids as llama.cpp lists them") {
  if (!minfer::test::haveFixtures()) return;
  // phi-3: EOS 32000 "<|endoftext|>" and 32007 "<|end|>" (llama.cpp prints both under "EOG tokens").
  auto phi3 = loadTokenizer(vocabPath("phi-3"));
  REQUIRE(phi3);
  CHECK(phi3->findToken("<|end|>") == 32007);
  CHECK(phi3->isEndOfGeneration(32000));
  CHECK(phi3->isEndOfGeneration(32007));
  CHECK(!phi3->isEndOfGeneration(phi3->findToken("<|user|>")));
  CHECK(!phi3->isEndOfGeneration(1));
  // gpt-2: only "<|endoftext|>" 50256.
  auto gpt2 = loadTokenizer(vocabPath("gpt-2"));
  REQUIRE(gpt2);
  CHECK(gpt2->endOfGenerationIds() == std::vector<int32_t>{50256});
}

TEST_CASE("processEscapes: llama.cpp's string_process_escapes") {
  using minfer::processEscapes;
  CHECK(processEscapes("a\\nb") == "a\nb");
  CHECK(processEscapes("\\t\\r\\\\\\\"\\'") == "\t\r\\\"'");
  CHECK(processEscapes("\\x41\\x7a") == "Az");
  CHECK(processEscapes("\\x0a") == "\n");
  CHECK(processEscapes("\\xZZ") == "\\xZZ");  // strtol reads no hex digit: kept
  CHECK(processEscapes("\\x4") == "\\x4");    // fewer than two characters after x: kept
  CHECK(processEscapes("\\x4g") == "\\x4g");  // strtol stops after one digit: kept
  CHECK(processEscapes("\\q\\a\\v") == "\\q\\a\\v");  // not in llama.cpp's list: kept as written
  CHECK(processEscapes("end\\") == "end\\");  // a lone trailing backslash stays
  CHECK(processEscapes("\\\\n") == "\\n");    // an escaped backslash, then a plain n
  CHECK(processEscapes(std::string("a\\x00b", 6)) == std::string("a\0b", 3));
  CHECK(minfer::dropOneTrailingNewline("a\n\n") == "a\n");
  CHECK(minfer::dropOneTrailingNewline("a") == "a");
  CHECK(minfer::dropOneTrailingNewline("") == "");
}
