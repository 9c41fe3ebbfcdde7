// Byte-level BPE pre-tokenizers: regex lists by GGUF pre name, compiled and matched with PCRE2.
#include "runtime/text/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <vector>

namespace minfer::text {

namespace {

// The regexes, as llama.cpp writes them (src/llama-vocab.cpp, llm_tokenizer_bpe), with non-ASCII
// class members spelled as \x{…} escapes (the source relies on exact code points such as U+212A
// KELVIN SIGN that editors tend to normalize).
constexpr const char* kGpt2 = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
constexpr const char* kLlama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kQwen2 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kCjk = R"re([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";
constexpr const char* kDeepseekLlmLetters =
    R"re(\s?[\x{41}-\x{5A}\x{61}-\x{7A}\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF})re"
    R"re(\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386})re"
    R"re(\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})re"
    R"re(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})re"
    R"re(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})re"
    R"re(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})re"
    R"re(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3})re"
    R"re(\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})re"
    R"re(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})re"
    R"re(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})re"
    R"re(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})re"
    R"re(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF})re"
    R"re(\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})re"
    R"re(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})re"
    R"re(\x{1E900}-\x{1E943}]+)re";
constexpr const char* kDeepseekLlmPunct =
    R"re(\s?[\x{21}-\x{2F}\x{3A}-\x{7E}\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re";
constexpr const char* kPoro = R"re( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)re";

struct Family {
  std::vector<const char*> names;
  std::vector<const char*> regexes;
  bool ignore_merges;
};

// Pre-tokenizer names (GGUF tokenizer.ggml.pre) → regex list, as in llama.cpp's vocabulary loader.
const std::vector<Family>& families() {
  static const std::vector<Family> kFamilies = {
      {{"", "default"},
       {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2, R"re(\p{N}+)re", "[0-9][0-9][0-9]"},
       false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}, {kLlama3}, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}, false},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, R"re(\s+$)re", kCjk, R"re(\p{N}+)re"},
       false},
      {{"deepseek-v3"},
       {R"re(\p{N}{1,3})re", R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re",
        R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^)re"
        "\r\n"
        R"re(\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[)re"
        "\r\n"
        R"re(]*|\s*[)re"
        "\r\n"
        R"re(]+|\s+(?!\S)|\s+)re"},
       false},
      {{"deepseek-coder"}, {"[\r\n]", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kCjk, R"re(\p{N})re"}, false},
      {{"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", kGpt2, "[0-9][0-9][0-9]"}, false},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"re(\p{N})re", kGpt2},
       false},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de",
        "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais"},
       {kGpt2},
       false},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"}, {kQwen2}, false},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kPoro}, false},
      {{"chatglm-bpe", "glm4"}, {kLlama3}, false},
      {{"viking"}, {kPoro, R"re(\p{N})re"}, false},
      {{"tekken"},
       {R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
       true},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", R"re(([\t\n]|    |  ))re", R"re(\p{N})re",
        R"re([\p{P}!-/:-@\[-`{-~])re", kGpt2},
       false},
  };
  return kFamilies;
}

// llama.cpp's whitespace (unicode-data.cpp unicode_set_whitespace: the Unicode White_Space property),
// as class members. PCRE2's own \s would add U+180E.
constexpr const char* kWhitespaceMembers =
    R"re(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})re";

// Rewrites \s and \S (outside or inside a character class) to llama.cpp's whitespace set.
Result<std::string> rewriteWhitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[++i];
      if (d == 's') {
        out += in_class ? std::string(kWhitespaceMembers) : "[" + std::string(kWhitespaceMembers) + "]";
      } else if (d == 'S') {
        if (in_class) return Status::error("pre-tokenizer regex '" + std::string(pattern) + "': \\S inside a class");
        out += "[^" + std::string(kWhitespaceMembers) + "]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // literal ] first
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* p) const { pcre2_match_context_free(p); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* p) const { pcre2_jit_stack_free(p); }
};

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  std::string source;
  ~Regex() { pcre2_code_free(code); }
};

const std::vector<std::string>& PreTokenizer::knownNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const Family& f : families())
      for (const char* n : f.names) names.emplace_back(n);
    return names;
  }();
  return kNames;
}

Result<PreTokenizer> PreTokenizer::create(std::string_view name) {
  const Family* family = nullptr;
  for (const Family& f : families())
    for (const char* n : f.names)
      if (name == n) family = &f;
  if (!family) {
    std::string known;
    for (const std::string& n : knownNames())
      if (!n.empty()) known += (known.empty() ? "" : ", ") + n;
    return Status::error("unknown pre-tokenizer '" + std::string(name) + "' (vocabulary field pre); known: " +
                         known);
  }
  PreTokenizer pre;
  pre.ignore_merges_ = family->ignore_merges;
  for (const char* source : family->regexes) {
    Result<std::string> pattern = rewriteWhitespace(source);
    if (!pattern) return pattern.takeStatus();
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern->data()), pattern->size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error_code, &error_offset,
                                     nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return Status::error("pre-tokenizer '" + std::string(name) + "': regex '" + source +
                           "' does not compile at offset " + std::to_string(error_offset) + ": " +
                           reinterpret_cast<const char*>(message));
    }
    // JIT is an optimization only: without it (unsupported CPU or build) pcre2_match interprets.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    auto regex = std::make_shared<Regex>();
    regex->code = code;
    regex->source = source;
    pre.regexes_.push_back(std::move(regex));
  }
  return pre;
}

void PreTokenizer::split(std::string_view subject, std::vector<size_t>& cuts) const {
  cuts.clear();
  cuts.push_back(0);
  if (subject.empty()) return;
  cuts.push_back(subject.size());

  // JIT matching uses a 32 KiB machine-stack area by default; a very long match (e.g. tekken's
  // per-letter groups over a 100k-letter word) needs more, so a large JIT stack (64 MiB reserved,
  // committed as touched) is attached on the first PCRE2_ERROR_JIT_STACKLIMIT of this call only.
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> big_context;
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack;
  auto bigContext = [&]() -> pcre2_match_context* {
    if (!big_context) {
      big_context.reset(pcre2_match_context_create(nullptr));
      jit_stack.reset(pcre2_jit_stack_create(32 * 1024, 64 << 20, nullptr));
      if (big_context && jit_stack) pcre2_jit_stack_assign(big_context.get(), nullptr, jit_stack.get());
    }
    return big_context.get();
  };

  const auto* base = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::vector<size_t> next;
  for (const auto& regex : regexes_) {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
        pcre2_match_data_create_from_pattern(regex->code, nullptr));
    next.clear();
    next.push_back(0);
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
      const size_t begin = cuts[s], end = cuts[s + 1];
      const size_t length = end - begin;
      size_t pos = 0;  // relative to begin
      while (pos < length) {
        // The segment is the whole subject of the match: lookaheads and `$` stop at its end.
        int rc = pcre2_match(regex->code, base + begin, length, pos, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
          rc = pcre2_match(regex->code, base + begin, length, pos, PCRE2_NO_UTF_CHECK, match.get(), bigContext());
        if (rc < 0) break;  // no match (or a resource limit on pathological input: the rest stays one gap)
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
        size_t mbegin = ov[0], mend = ov[1];
        if (mend <= mbegin) {  // empty match: none of these patterns produce one; step over a character
          pos = mbegin + 1;
          while (pos < length && (base[begin + pos] & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (mbegin > 0 && next.back() != begin + mbegin) next.push_back(begin + mbegin);  // gap before
        next.push_back(begin + mend);
        pos = mend;
      }
      if (next.back() != end) next.push_back(end);  // trailing gap
    }
    cuts.swap(next);
  }
}

}  // namespace minfer::text
