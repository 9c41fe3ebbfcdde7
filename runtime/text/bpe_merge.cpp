// The two merge algorithms: SentencePiece BPE by token score and byte-level BPE by merge rank.
//
// Both keep the text as a doubly linked list of symbols and a heap of candidate pairs; a merge
// absorbs the right symbol into the left one and pushes the two new neighbouring pairs, so a text of
// n symbols costs O(n log n) (no rescans). A popped pair is stale when one side has been absorbed or
// grown; that is detected by comparing lengths (a live symbol only ever grows, and the left symbol's
// start never moves). Tie-breaking follows llama.cpp (llm_tokenizer_spm_session /
// llm_tokenizer_bpe_session): best score / lowest rank first, then the leftmost pair.
#include <algorithm>

#include "runtime/text/tokenizer_impl.h"
#include "runtime/text/utf8.h"

namespace minfer::text {

namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t offset;  // into the text being merged
  uint32_t length;  // bytes; 0 = absorbed
};

// Cuts `text` into initial symbols: one per UTF-8 sequence as its lead byte announces it (clamped to
// the text), the way llama.cpp does it; malformed bytes become 1-byte symbols.
void initialSymbols(std::string_view text, std::vector<Symbol>& symbols) {
  symbols.clear();
  uint32_t offset = 0;
  const auto n = static_cast<uint32_t>(text.size());
  while (offset < n) {
    const auto len = static_cast<uint32_t>(
        std::min<size_t>(utf8LenFromLead(static_cast<uint8_t>(text[offset])), n - offset));
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, offset + len == n ? -1 : index + 1, offset, len});
    offset += len;
  }
}

// A candidate merge of symbols[left] with its right neighbour, `length` bytes in total when pushed.
// The right symbol is not stored: at pop time it is symbols[left].next, and the pair is stale unless
// both lengths are unchanged (if left has absorbed anything, left + next is strictly longer).
template <typename Key>
struct Pair {
  Key key;         // SPM: score (higher first); BPE: rank (lower first)
  int32_t left;
  uint32_t length;
};

// 4-ary min-heap on `Better` (Better(a, b): a pops before b). Shallower than a binary heap, so fewer
// cache misses on the ~n-entry heaps of long words; storage is reused across words.
template <typename Key, typename Better>
class PairHeap {
 public:
  void clear() { v_.clear(); }
  bool empty() const { return v_.empty(); }
  void reserve(size_t n) { v_.reserve(n); }
  void push(const Pair<Key>& p) {
    size_t i = v_.size();
    v_.push_back(p);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!Better()(p, v_[parent])) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = p;
  }
  Pair<Key> pop() {
    const Pair<Key> top = v_.front();
    const Pair<Key> last = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n == 0) return top;
    size_t i = 0;
    while (true) {
      const size_t first = 4 * i + 1;
      if (first >= n) break;
      size_t best = first;
      const size_t end = std::min(first + 4, n);
      for (size_t c = first + 1; c < end; ++c)
        if (Better()(v_[c], v_[best])) best = c;
      if (!Better()(v_[best], last)) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = last;
    return top;
  }

 private:
  std::vector<Pair<Key>> v_;
};

// Highest score first, then the smallest left index (llama.cpp llm_bigram_spm::comparator).
struct SpmBetter {
  bool operator()(const Pair<float>& a, const Pair<float>& b) const {
    return a.key > b.key || (a.key == b.key && a.left < b.left);
  }
};
// Lowest rank first, then the smallest left index (llama.cpp llm_bigram_bpe::comparator).
struct BpeBetter {
  bool operator()(const Pair<int32_t>& a, const Pair<int32_t>& b) const {
    return a.key < b.key || (a.key == b.key && a.left < b.left);
  }
};

// True when the pair popped is still current (see Pair); then its right symbol is symbols[left].next.
bool isCurrent(const std::vector<Symbol>& symbols, int32_t left, uint32_t length) {
  const Symbol& l = symbols[left];
  return l.length != 0 && l.next >= 0 && l.length + symbols[l.next].length == length;
}

// Absorbs symbols[right] into symbols[left] and unlinks it.
void absorb(std::vector<Symbol>& symbols, int32_t left, int32_t right) {
  Symbol& l = symbols[left];
  Symbol& r = symbols[right];
  l.length += r.length;
  r.length = 0;
  l.next = r.next;
  if (r.next >= 0) symbols[r.next].prev = left;
}

}  // namespace

void encodeSpm(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out) {
  std::vector<Symbol> symbols;
  initialSymbols(text, symbols);
  if (symbols.empty()) return;

  PairHeap<float, SpmBetter> heap;
  heap.reserve(symbols.size());
  auto tryPair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t length = symbols[left].length + symbols[right].length;
    const int32_t id = impl.lookup(text.substr(symbols[left].offset, length));
    if (id >= 0) heap.push({impl.score(id), left, length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) tryPair(i - 1, i);

  while (!heap.empty()) {
    const Pair<float> pair = heap.pop();
    if (!isCurrent(symbols, pair.left, pair.length)) continue;
    absorb(symbols, pair.left, symbols[pair.left].next);
    tryPair(symbols[pair.left].prev, pair.left);
    tryPair(pair.left, symbols[pair.left].next);
  }

  // Symbol 0 is never absorbed (merges absorb to the left), so the chain starts there. A symbol that
  // is not a token (only possible for an initial one) falls back to one byte token per byte.
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].offset, symbols[i].length);
    const int32_t id = impl.lookup(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (const char c : piece) {
      const int32_t byte_id = impl.byte_token[static_cast<uint8_t>(c)];
      if (byte_id >= 0) out.push_back(byte_id);
    }
  }
}

void encodeBpe(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out) {
  // Code points as llama.cpp reads them (malformed bytes → U+FFFD), re-encoded canonically: `canon`
  // holds the bytes each word is made of, `subject` the same with surrogates (which PCRE2 rejects)
  // replaced by U+FFFD; both encodings take 3 bytes, so offsets agree.
  std::vector<uint32_t> cpts;
  decodeUtf8Lenient(text, cpts);
  std::string canon;
  canon.reserve(text.size() + 16);
  bool has_surrogate = false;
  for (const uint32_t c : cpts) {
    appendUtf8(canon, c);
    has_surrogate |= (c >= 0xD800 && c <= 0xDFFF);
  }
  std::string sanitized;
  if (has_surrogate) {
    for (const uint32_t c : cpts) appendUtf8(sanitized, (c >= 0xD800 && c <= 0xDFFF) ? kReplacementChar : c);
  }
  std::vector<size_t> cuts;
  impl.pre->split(has_surrogate ? std::string_view(sanitized) : std::string_view(canon), cuts);

  const auto& byte_map = byteToUnicode();
  std::string word;
  std::vector<Symbol> symbols;
  PairHeap<int32_t, BpeBetter> heap;
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    word.clear();
    for (size_t k = cuts[s]; k < cuts[s + 1]; ++k) appendUtf8(word, byte_map[static_cast<uint8_t>(canon[k])]);

    if (impl.pre->ignoreMerges()) {  // llama3 family: a word that is a token is taken whole
      const int32_t id = impl.lookup(word);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
    }

    initialSymbols(word, symbols);
    heap.clear();
    auto tryPair = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const uint32_t length = symbols[left].length + symbols[right].length;
      const int32_t rank =
          impl.mergeRank(std::string_view(word).substr(symbols[left].offset, length), symbols[left].length);
      if (rank >= 0) heap.push({rank, left, length});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) tryPair(i - 1, i);

    while (!heap.empty()) {
      const Pair<int32_t> pair = heap.pop();
      if (!isCurrent(symbols, pair.left, pair.length)) continue;
      absorb(symbols, pair.left, symbols[pair.left].next);
      tryPair(symbols[pair.left].prev, pair.left);
      tryPair(pair.left, symbols[pair.left].next);
    }

    // A final symbol that is not a token: llama.cpp looks up each of its bytes as a 1-byte token
    // text and drops the bytes that have none.
    for (const Symbol& sym : symbols) {
      if (sym.length == 0) continue;
      const std::string_view piece = std::string_view(word).substr(sym.offset, sym.length);
      const int32_t id = impl.lookup(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (const char c : piece) {
        const int32_t byte_id = impl.byte_token[static_cast<uint8_t>(c)];
        if (byte_id >= 0) out.push_back(byte_id);
      }
    }
  }
}

}  // namespace minfer::text
