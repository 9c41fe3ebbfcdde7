// Chat template builtins: jinja2's filters and tests, Python's str and dict methods, attribute and
// item lookup, iteration and ordering, with jinja2's and Python's error texts.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>

#include "runtime/chat/template_ast.h"

namespace minfer::chat::detail {

namespace {

using K = Value::Kind;

// Argument `pos` (positional) or `name` (keyword); nullptr when absent.
const Value* arg(const CallArgs& a, size_t pos, const char* name) {
  if (pos < a.positional.size()) return &a.positional[pos];
  for (const auto& [k, v] : a.keyword)
    if (k == name) return &v;
  return nullptr;
}

Value argOr(const CallArgs& a, size_t pos, const char* name, Value dflt) {
  const Value* v = arg(a, pos, name);
  return v ? *v : dflt;
}

std::string stringArg(const CallArgs& a, size_t pos, const char* name, const char* fn) {
  const Value* v = arg(a, pos, name);
  if (!v) fail(a.offset, std::string(fn) + "(): missing argument '" + name + "'");
  if (!v->isString())
    fail(a.offset, std::string(fn) + "(): argument '" + name + "' must be str, not " + pythonTypeName(*v));
  return v->asString();
}

// An integer argument of a str method (None: -1, "all"); Python refuses floats and strings.
int64_t intArg(const Value& v, size_t offset) {
  if (v.isNone()) return -1;
  if (v.kind() != K::kInt && v.kind() != K::kBool)
    fail(offset, "'" + pythonTypeName(v) + "' object cannot be interpreted as an integer");
  return v.asInt();
}

uint32_t decodeCp(std::string_view cp) {
  const auto c = static_cast<unsigned char>(cp[0]);
  if (cp.size() == 1) return c;
  uint32_t v = cp.size() == 2 ? (c & 0x1Fu) : cp.size() == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t i = 1; i < cp.size(); ++i) v = (v << 6) | (static_cast<unsigned char>(cp[i]) & 0x3Fu);
  return v;
}

// Python's case mapping for the scripts chat text mostly uses: ASCII, Latin-1, Latin Extended-A, Greek
// (with the final-sigma rule of str.lower) and basic Cyrillic; other code points are left as they are.
uint32_t upperCp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x100 && c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  return c;
}

uint32_t lowerCp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137 && c != 0x130 && c != 0x131) || (c >= 0x14A && c <= 0x177)) return c | 1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  return c;
}

bool isCased(uint32_t c) { return c == 0xDF || upperCp(c) != c || lowerCp(c) != c; }

void appendCp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Appends code point i of cps in the given case (Python's special cases: ß → SS, İ → i̇, final sigma).
void appendCased(std::string& out, const std::vector<std::string_view>& cps, size_t i, bool upper) {
  const uint32_t c = decodeCp(cps[i]);
  if (upper && c == 0xDF) return void(out += "SS");
  if (!upper && c == 0x130) return void(out += "i\xCC\x87");
  if (!upper && c == 0x3A3) {  // Σ → ς at the end of a word: after a cased letter, not before one
    const bool after = i > 0 && isCased(decodeCp(cps[i - 1]));
    const bool before = i + 1 < cps.size() && isCased(decodeCp(cps[i + 1]));
    if (after && !before) return appendCp(out, 0x3C2);
  }
  const uint32_t m = upper ? upperCp(c) : lowerCp(c);
  if (m == c)
    out += cps[i];  // unchanged: keep the original bytes (also invalid UTF-8)
  else
    appendCp(out, m);
}

std::string toUpper(std::string_view s) {
  const auto cps = splitCodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) appendCased(out, cps, i, true);
  return out;
}
std::string toLower(std::string_view s) {
  const auto cps = splitCodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) appendCased(out, cps, i, false);
  return out;
}

// Python's str.capitalize: the first character upper (title) case, the rest lower case.
std::string capitalize(const std::string& s) {
  const auto cps = splitCodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) appendCased(out, cps, i, i == 0);
  return out;
}

// Python's str.title: a cased character after a cased one is lowered, any other is raised.
std::string title(const std::string& s) {
  const auto cps = splitCodePoints(s);
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    const bool cased = isCased(decodeCp(cps[i]));
    appendCased(out, cps, i, !prev_cased);
    prev_cased = cased;
  }
  return out;
}

// jinja2's `title` filter (not str.title): words split at whitespace and "-({[<", each with its first
// character upper-cased and the rest lower-cased.
std::string jinjaTitle(const std::string& s) {
  const auto cps = splitCodePoints(s);
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = decodeCp(cps[i]);
    const bool separator = isPythonSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator)
      out += cps[i];
    else
      appendCased(out, cps, i, word_start);
    word_start = separator;
  }
  return out;
}

int64_t pyLen(const Value& v, size_t offset) {
  switch (v.kind()) {
    case K::kUndefined:
      return 0;
    case K::kString:
      return static_cast<int64_t>(splitCodePoints(v.asString()).size());
    case K::kList:
      return static_cast<int64_t>(v.asList().size());
    case K::kDict:
      return static_cast<int64_t>(v.asDict().size());
    default:
      fail(offset, "object of type '" + pythonTypeName(v) + "' has no len()");
  }
}

std::vector<std::string> split(const std::string& s, const Value& sep, int64_t maxsplit, size_t offset) {
  std::vector<std::string> out;
  if (sep.isNone() || sep.isUndefined()) {
    const auto cps = splitCodePoints(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && isPythonSpace(decodeCp(cps[i]))) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest;
        for (size_t k = i; k < cps.size(); ++k) rest += cps[k];
        out.push_back(std::string(pythonStrip(rest, Value::none(), false, true)));
        return out;
      }
      std::string word;
      while (i < cps.size() && !isPythonSpace(decodeCp(cps[i]))) word += cps[i++];
      out.push_back(std::move(word));
    }
    return out;
  }
  if (!sep.isString()) fail(offset, "must be str or None, not " + pythonTypeName(sep));
  const std::string& d = sep.asString();
  if (d.empty()) fail(offset, "empty separator");
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t p = s.find(d, start);
    if (p == std::string::npos) break;
    out.push_back(s.substr(start, p - start));
    start = p + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

Value toList(std::vector<std::string> parts) {
  Value::List l;
  for (auto& p : parts) l.push_back(Value(std::move(p)));
  return Value::list(std::move(l));
}

std::string replaceAll(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const auto cps = splitCodePoints(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < cps.size()) out += cps[i];
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += to;
    start = p + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// ----- str and dict methods (bound by getAttribute) -----

using StrMethod = Value (*)(const std::string& self, CallArgs& a);

bool affix(const std::string& self, CallArgs& a, bool prefix) {
  const Value* v = arg(a, 0, "prefix");
  if (!v) fail(a.offset, prefix ? "startswith() takes at least 1 argument" : "endswith() takes at least 1 argument");
  std::vector<Value> options = v->isList() ? v->asList() : std::vector<Value>{*v};
  for (const Value& o : options) {
    if (!o.isString())
      fail(a.offset, "startswith/endswith first arg must be str or a tuple of str, not " + pythonTypeName(o));
    const std::string& p = o.asString();
    if (p.size() <= self.size() &&
        (prefix ? self.compare(0, p.size(), p) : self.compare(self.size() - p.size(), p.size(), p)) == 0)
      return true;
  }
  return false;
}

const std::pair<const char*, StrMethod> kStrMethods[] = {
    {"startswith", [](const std::string& s, CallArgs& a) { return Value(affix(s, a, true)); }},
    {"endswith", [](const std::string& s, CallArgs& a) { return Value(affix(s, a, false)); }},
    {"strip", [](const std::string& s,
                 CallArgs& a) { return Value(pythonStrip(s, argOr(a, 0, "chars", Value::none()), true, true)); }},
    {"lstrip", [](const std::string& s,
                  CallArgs& a) { return Value(pythonStrip(s, argOr(a, 0, "chars", Value::none()), true, false)); }},
    {"rstrip", [](const std::string& s,
                  CallArgs& a) { return Value(pythonStrip(s, argOr(a, 0, "chars", Value::none()), false, true)); }},
    {"split",
     [](const std::string& s, CallArgs& a) {
       const Value maxsplit = argOr(a, 1, "maxsplit", Value(-1));
       return toList(split(s, argOr(a, 0, "sep", Value::none()), intArg(maxsplit, a.offset), a.offset));
     }},
    {"rsplit",
     [](const std::string& s, CallArgs& a) {
       const Value sep = argOr(a, 0, "sep", Value::none());
       const Value maxsplit = argOr(a, 1, "maxsplit", Value(-1));
       const int64_t n = intArg(maxsplit, a.offset);
       std::vector<std::string> all = split(s, sep, -1, a.offset);
       if (n < 0 || static_cast<int64_t>(all.size()) <= n + 1 || !sep.isString()) return toList(std::move(all));
       // Keep the last n pieces separate, join the rest back with the separator.
       std::vector<std::string> out;
       const size_t head = all.size() - static_cast<size_t>(n);
       std::string first;
       for (size_t i = 0; i < head; ++i) first += (i ? sep.asString() : "") + all[i];
       out.push_back(first);
       out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(head), all.end());
       return toList(std::move(out));
     }},
    {"replace",
     [](const std::string& s, CallArgs& a) {
       const Value count = argOr(a, 2, "count", Value(-1));
       return Value(replaceAll(s, stringArg(a, 0, "old", "replace"), stringArg(a, 1, "new", "replace"),
                               intArg(count, a.offset)));
     }},
    {"upper", [](const std::string& s, CallArgs&) { return Value(toUpper(s)); }},
    {"lower", [](const std::string& s, CallArgs&) { return Value(toLower(s)); }},
    {"title", [](const std::string& s, CallArgs&) { return Value(title(s)); }},
    {"capitalize", [](const std::string& s, CallArgs&) { return Value(capitalize(s)); }},
    {"find",
     [](const std::string& s, CallArgs& a) {
       const size_t p = s.find(stringArg(a, 0, "sub", "find"));
       return Value(p == std::string::npos ? int64_t{-1}
                                           : static_cast<int64_t>(splitCodePoints(s.substr(0, p)).size()));
     }},
    {"count",
     [](const std::string& s, CallArgs& a) {
       const std::string sub = stringArg(a, 0, "sub", "count");
       if (sub.empty()) return Value(static_cast<int64_t>(splitCodePoints(s).size() + 1));
       int64_t n = 0;
       for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
       return Value(n);
     }},
    {"join",
     [](const std::string& s, CallArgs& a) {
       const Value* items = arg(a, 0, "iterable");
       if (!items) fail(a.offset, "join() takes exactly one argument");
       std::string out;
       bool first = true;
       for (const Value& v : iterate(*items, a.offset)) {
         if (!v.isString()) fail(a.offset, "sequence item: expected str instance, " + pythonTypeName(v) + " found");
         out += (first ? "" : s) + v.asString();
         first = false;
       }
       return Value(std::move(out));
     }},
    {"removeprefix",
     [](const std::string& s, CallArgs& a) {
       const std::string p = stringArg(a, 0, "prefix", "removeprefix");
       return Value(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
     }},
    {"removesuffix",
     [](const std::string& s, CallArgs& a) {
       const std::string p = stringArg(a, 0, "suffix", "removesuffix");
       return Value(p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0
                        ? s.substr(0, s.size() - p.size())
                        : s);
     }},
    {"splitlines",
     [](const std::string& s, CallArgs&) {
       std::vector<std::string> out;
       size_t start = 0;
       for (size_t i = 0; i < s.size(); ++i) {
         if (s[i] != '\n' && s[i] != '\r') continue;
         out.push_back(s.substr(start, i - start));
         if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
         start = i + 1;
       }
       if (start < s.size()) out.push_back(s.substr(start));
       return toList(std::move(out));
     }},
    {"isdigit",
     [](const std::string& s, CallArgs&) {
       return Value(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
     }},
    {"isspace",
     [](const std::string& s, CallArgs&) {
       const auto cps = splitCodePoints(s);
       return Value(!cps.empty() &&
                    std::all_of(cps.begin(), cps.end(), [](auto cp) { return isPythonSpace(decodeCp(cp)); }));
     }},
};

Value dictMethod(const Value& self, const std::string& name, CallArgs& a) {
  Value::List out;
  if (name == "get") {
    const Value* key = arg(a, 0, "key");
    if (!key) fail(a.offset, "get expected at least 1 argument, got 0");
    const Value* found = key->isString() ? self.find(key->asString()) : nullptr;
    return found ? *found : argOr(a, 1, "default", Value::none());
  }
  for (const auto& [k, v] : self.asDict()) {
    if (name == "items")
      out.push_back(Value::tuple({Value(k), v}));
    else if (name == "keys")
      out.push_back(Value(k));
    else
      out.push_back(v);
  }
  return Value::list(std::move(out));
}

// A method bound to its object (the closure holds the object).
Value boundMethod(const std::string& name, std::function<Value(CallArgs&)> fn) {
  return Value::callable(std::make_shared<Callable>(Callable{name, std::move(fn)}));
}

}  // namespace

bool isPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string pythonStrip(std::string_view s, const Value& chars, bool left, bool right) {
  const auto cps = splitCodePoints(s);
  std::vector<std::string_view> set;
  const bool ws = !chars.isString();
  if (!ws) set = splitCodePoints(chars.asString());
  auto strip = [&](std::string_view cp) {
    return ws ? isPythonSpace(decodeCp(cp)) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  if (b == e) return "";
  const size_t from = static_cast<size_t>(cps[b].data() - s.data());
  const size_t to = static_cast<size_t>(cps[e - 1].data() + cps[e - 1].size() - s.data());
  return std::string(s.substr(from, to - from));
}

std::string pythonTypeName(const Value& v) {
  switch (v.kind()) {
    case K::kUndefined:
      return "Undefined";
    case K::kNone:
      return "NoneType";
    case K::kBool:
      return "bool";
    case K::kInt:
      return "int";
    case K::kFloat:
      return "float";
    case K::kString:
      return "str";
    case K::kList:
      return "list";
    case K::kDict:
      return "dict";
    case K::kNamespace:
      return "Namespace";
    case K::kCallable:
      return "function";
  }
  return "object";
}

std::string objectTypeRepr(const Value& v) {
  if (v.isNone()) return "None";
  return pythonTypeName(v) + " object";
}

std::vector<Value> iterate(const Value& v, size_t offset) {
  switch (v.kind()) {
    case K::kUndefined:
      return {};
    case K::kList:
      return v.asList();
    case K::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.asDict()) keys.push_back(Value(k));
      return keys;
    }
    case K::kString: {
      std::vector<Value> chars;
      for (auto cp : splitCodePoints(v.asString())) chars.push_back(Value(cp));
      return chars;
    }
    default:
      fail(offset, "'" + pythonTypeName(v) + "' object is not iterable");
  }
}

Value getAttribute(const Value& obj, const std::string& name) {
  if (obj.isString()) {
    for (const auto& [n, m] : kStrMethods)
      if (name == n) {
        const std::string self = obj.asString();
        StrMethod method = m;
        return boundMethod(name, [self, method](CallArgs& a) { return method(self, a); });
      }
  } else if (obj.isDict()) {
    if (name == "items" || name == "keys" || name == "values" || name == "get")
      return boundMethod(name, [obj, name](CallArgs& a) { return dictMethod(obj, name, a); });
    if (const Value* v = obj.find(name)) return *v;
  } else if (obj.kind() == K::kNamespace) {
    if (const Value* v = obj.find(name)) return *v;
  }
  // The immutable sandbox refuses the methods that modify lists and dicts.
  static const char* const kMutating[] = {"append", "extend",  "insert", "pop",        "remove", "clear",
                                          "sort",   "reverse", "update", "setdefault", "popitem"};
  if (obj.isList() || obj.isDict())
    for (const char* m : kMutating)
      if (name == m)
        return Value::undefined("access to attribute '" + name + "' of '" + pythonTypeName(obj) +
                                "' object is unsafe.");
  return Value::undefined("'" + objectTypeRepr(obj) + "' has no attribute '" + name + "'");
}

Value getItem(const Value& obj, const Value& key) {
  if (obj.isList() || obj.isString()) {
    if (key.kind() == K::kInt || key.kind() == K::kBool) {
      int64_t i = key.asInt();
      if (obj.isList()) {
        const auto n = static_cast<int64_t>(obj.asList().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.asList()[static_cast<size_t>(i)];
      } else {
        const auto cps = splitCodePoints(obj.asString());
        const auto n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value(cps[static_cast<size_t>(i)]);
      }
    }
  } else if ((obj.isDict() || obj.kind() == K::kNamespace) && key.isString()) {
    if (obj.isDict())
      if (const Value* v = obj.find(key.asString())) return *v;
  }
  if (key.isString()) {  // jinja2 falls back to the attribute of that name
    Value attr = getAttribute(obj, key.asString());
    if (!attr.isUndefined()) return attr;
    return Value::undefined("'" + objectTypeRepr(obj) + "' has no attribute '" + key.asString() + "'");
  }
  return Value::undefined(objectTypeRepr(obj) + " has no element " + key.repr());
}

int pythonOrder(size_t offset, const std::string& op, const Value& a, const Value& b) {
  if (a.isUndefined()) fail(offset, a.undefinedReason());
  if (b.isUndefined()) fail(offset, b.undefinedReason());
  const auto intLike = [](const Value& v) { return v.kind() == K::kInt || v.kind() == K::kBool; };
  if (a.isNumber() && b.isNumber()) {
    if (intLike(a) && intLike(b)) return a.asInt() < b.asInt() ? -1 : a.asInt() > b.asInt() ? 1 : 0;
    return a.asFloat() < b.asFloat() ? -1 : a.asFloat() > b.asFloat() ? 1 : 0;
  }
  if (a.isString() && b.isString()) {
    const int c = a.asString().compare(b.asString());  // byte order = code point order in UTF-8
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.isList() && b.isList()) {
    const auto& x = a.asList();
    const auto& y = b.asList();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!(x[i] == y[i])) return pythonOrder(offset, op, x[i], y[i]);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail(offset,
       "'" + op + "' not supported between instances of '" + pythonTypeName(a) + "' and '" + pythonTypeName(b) + "'");
}

bool pythonContains(size_t offset, const Value& needle, const Value& hay) {
  switch (hay.kind()) {
    case K::kUndefined:
      return false;  // Undefined iterates as empty
    case K::kString:
      if (!needle.isString())
        fail(offset, "'in <string>' requires string as left operand, not " + pythonTypeName(needle));
      return hay.asString().find(needle.asString()) != std::string::npos;
    case K::kList:
      for (const Value& v : hay.asList())
        if (v == needle) return true;
      return false;
    case K::kDict:
      return needle.isString() && hay.find(needle.asString()) != nullptr;
    default:
      fail(offset, "argument of type '" + pythonTypeName(hay) + "' is not iterable");
  }
}

std::string percentFormat(size_t offset, const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  if (args.isList())
    list = args.asList();
  else
    list.push_back(args);
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    std::string spec = "%";
    ++i;
    while (i < fmt.size() && std::strchr("0123456789.-+ #", fmt[i]) && fmt[i] != 0 && spec.size() < 16)
      spec += fmt[i++];
    if (i >= fmt.size()) fail(offset, "incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= list.size()) fail(offset, "not enough arguments for format string");
    const Value& v = list[next++];
    char buf[512];
    switch (conv) {
      case 's':
        out += v.str();
        break;
      case 'r':
        out += v.repr();
        break;
      case 'd':
      case 'i':
      case 'x':
        if (!v.isNumber())
          fail(offset, std::string("%") + conv + " format: a real number is required, not " + pythonTypeName(v));
        std::snprintf(buf, sizeof buf, (spec + (conv == 'x' ? "llx" : "lld")).c_str(),
                      static_cast<long long>(v.asInt()));
        out += buf;
        break;
      case 'f':
      case 'e':
      case 'g':
        if (!v.isNumber()) fail(offset, "must be real number, not " + pythonTypeName(v));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.asFloat());
        out += buf;
        break;
      default:
        fail(offset, std::string("unsupported format character '") + conv + "'");
    }
  }
  if (next < list.size() && args.isList()) fail(offset, "not all arguments converted during string formatting");
  return out;
}

// ----- filters -----

namespace {

Value attributeOf(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (v.isUndefined()) return v;
    int64_t index = 0;
    const bool numeric = digits && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    v = getItem(v, numeric ? Value(index) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// select/reject/selectattr/rejectattr: args = [attribute,] test name, test args…
Value selectFilter(const Value& input, CallArgs& a, bool by_attribute, bool keep) {
  size_t first = 0;
  std::string attribute;
  if (by_attribute) {
    attribute = stringArg(a, 0, "attribute", "selectattr");
    first = 1;
  }
  TestFn test = nullptr;
  CallArgs test_args;
  test_args.offset = a.offset;
  if (first < a.positional.size()) {
    if (!a.positional[first].isString()) fail(a.offset, "test name must be a string");
    test = findTest(a.positional[first].asString());
    if (!test) fail(a.offset, "no test named '" + a.positional[first].asString() + "'");
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(first + 1), a.positional.end());
  }
  Value::List out;
  for (const Value& item : iterate(input, a.offset)) {
    const Value v = by_attribute ? attributeOf(item, attribute) : item;
    CallArgs t = test_args;
    const bool pass = test ? test(v, t) : v.truthy();
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value mapFilter(const Value& input, CallArgs& a) {
  Value::List out;
  if (const Value* attr = arg(a, 99, "attribute")) {
    if (!attr->isString()) fail(a.offset, "map(attribute=...) must be a string");
    const Value dflt = argOr(a, 99, "default", Value());
    for (const Value& item : iterate(input, a.offset)) {
      Value v = attributeOf(item, attr->asString());
      out.push_back(v.isUndefined() && !dflt.isUndefined() ? dflt : v);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].isString()) fail(a.offset, "map() needs a filter name or attribute=");
  FilterFn f = findFilter(a.positional[0].asString());
  if (!f) fail(a.offset, "no filter named '" + a.positional[0].asString() + "'");
  CallArgs rest;
  rest.offset = a.offset;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(input, a.offset)) {
    CallArgs r = rest;
    out.push_back(f(item, r));
  }
  return Value::list(std::move(out));
}

Value tojsonFilter(const Value& input, CallArgs& a) {
  // transformers' filter: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  const Value ensure = argOr(a, 0, "ensure_ascii", Value(false));
  const Value indent = argOr(a, 1, "indent", Value::none());
  if (const Value* sep = arg(a, 2, "separators"); sep && !sep->isNone())
    fail(a.offset, "tojson: separators= is not supported");
  if (!indent.isNone() && indent.kind() != K::kInt) fail(a.offset, "tojson: indent must be an integer or none");
  const int width = indent.isNone() ? -1 : static_cast<int>(std::clamp<int64_t>(indent.asInt(), 0, 64));
  std::string out, error;
  if (!input.toJson(out, error, width, ensure.truthy(), argOr(a, 3, "sort_keys", Value(false)).truthy()))
    fail(a.offset, error);
  return Value(std::move(out));
}

Value indentFilter(const Value& input, CallArgs& a) {
  const Value width = argOr(a, 0, "width", Value(4));
  const std::string pad =
      width.isString()
          ? width.asString()
          : std::string(static_cast<size_t>(std::clamp<int64_t>(width.isNumber() ? width.asInt() : 4, 0, 256)), ' ');
  const bool first = argOr(a, 1, "first", Value(false)).truthy();
  const bool blank = argOr(a, 2, "blank", Value(false)).truthy();
  std::vector<std::string> lines;
  const std::string s = input.str() + "\n";
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    lines.push_back(s.substr(start, i - start));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    start = i + 1;
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + ((blank || !lines[i].empty()) ? pad + lines[i] : lines[i]);
  return Value(first ? pad + out : out);
}

Value sortFilter(const Value& input, CallArgs& a) {
  std::vector<Value> items = iterate(input, a.offset);
  const bool reverse = argOr(a, 0, "reverse", Value(false)).truthy();
  const bool case_sensitive = argOr(a, 1, "case_sensitive", Value(false)).truthy();
  const Value attribute = argOr(a, 2, "attribute", Value::none());
  auto key = [&](const Value& v) {
    Value k = attribute.isString() ? attributeOf(v, attribute.asString()) : v;
    return (!case_sensitive && k.isString()) ? Value(toLower(k.asString())) : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = pythonOrder(a.offset, "<", key(x), key(y));
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value intFilter(const Value& input, CallArgs& a) {
  const Value dflt = argOr(a, 0, "default", Value(0));
  switch (input.kind()) {
    case K::kInt:
    case K::kBool:
      return Value(input.asInt());
    case K::kFloat:
      return std::isfinite(input.asFloat()) && std::fabs(input.asFloat()) < 9.2e18
                 ? Value(static_cast<int64_t>(input.asFloat()))
                 : dflt;
    case K::kString: {
      const std::string s = pythonStrip(input.asString(), Value::none(), true, true);
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == 0 && errno == 0) return Value(static_cast<int64_t>(v));
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == 0 && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
      return dflt;
    }
    default:
      return dflt;
  }
}

Value floatFilter(const Value& input, CallArgs& a) {
  const Value dflt = argOr(a, 0, "default", Value(0.0));
  if (input.isNumber()) return Value(input.asFloat());
  if (input.isString()) {
    const std::string s = pythonStrip(input.asString(), Value::none(), true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == 0) return Value(d);
  }
  return dflt;
}

Value firstLast(const Value& input, CallArgs& a, bool last) {
  std::vector<Value> items = iterate(input, a.offset);
  if (items.empty())
    return Value::undefined(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
  return last ? items.back() : items.front();
}

Value minMax(const Value& input, CallArgs& a, bool max) {
  std::vector<Value> items = iterate(input, a.offset);
  if (items.empty())
    return Value::undefined(max ? "No aggregated item, sequence was empty."
                                : "No aggregated item, sequence was empty.");
  Value best = items[0];
  for (const Value& v : items) {
    const int c = pythonOrder(a.offset, "<", v, best);
    if (max ? c > 0 : c < 0) best = v;
  }
  return best;
}

Value escapeFilter(const Value& input, CallArgs&) {
  std::string out;
  for (char c : input.str()) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value(std::move(out));
}

const std::pair<const char*, FilterFn> kFilters[] = {
    {"abs",
     [](const Value& v, CallArgs& a) {
       if (!v.isNumber()) fail(a.offset, "bad operand type for abs(): '" + pythonTypeName(v) + "'");
       if (v.kind() == K::kFloat) return Value(std::fabs(v.asFloat()));
       if (v.asInt() == INT64_MIN) fail(a.offset, "integer overflow");
       return Value(v.asInt() < 0 ? -v.asInt() : v.asInt());
     }},
    {"attr", [](const Value& v, CallArgs& a) { return getAttribute(v, stringArg(a, 0, "name", "attr")); }},
    {"batch",
     [](const Value& v, CallArgs& a) {
       const Value size = argOr(a, 0, "linecount", Value());
       if (size.kind() != K::kInt || size.asInt() <= 0) fail(a.offset, "batch: linecount must be a positive integer");
       const Value* fill = arg(a, 1, "fill_with");
       Value::List out, cur;
       for (const Value& item : iterate(v, a.offset)) {
         cur.push_back(item);
         if (static_cast<int64_t>(cur.size()) == size.asInt()) out.push_back(Value::list(std::move(cur))), cur.clear();
       }
       if (!cur.empty()) {
         while (fill && !fill->isNone() && static_cast<int64_t>(cur.size()) < size.asInt()) cur.push_back(*fill);
         out.push_back(Value::list(std::move(cur)));
       }
       return Value::list(std::move(out));
     }},
    {"capitalize", [](const Value& v, CallArgs&) { return Value(capitalize(v.str())); }},
    {"count", [](const Value& v, CallArgs& a) { return Value(pyLen(v, a.offset)); }},
    {"d",
     [](const Value& v, CallArgs& a) {
       const bool boolean = argOr(a, 1, "boolean", Value(false)).truthy();
       return (v.isUndefined() || (boolean && !v.truthy())) ? argOr(a, 0, "default_value", Value("")) : v;
     }},
    {"default",
     [](const Value& v, CallArgs& a) {
       const bool boolean = argOr(a, 1, "boolean", Value(false)).truthy();
       return (v.isUndefined() || (boolean && !v.truthy())) ? argOr(a, 0, "default_value", Value("")) : v;
     }},
    {"dictsort",
     [](const Value& v, CallArgs& a) {
       if (!v.isDict()) fail(a.offset, "dictsort: a mapping is required, not " + pythonTypeName(v));
       Value::List items;
       for (const auto& [k, x] : v.asDict()) items.push_back(Value::tuple({Value(k), x}));
       std::stable_sort(items.begin(), items.end(), [](const Value& x, const Value& y) {
         return toLower(x.asList()[0].asString()) < toLower(y.asList()[0].asString());
       });
       return Value::list(std::move(items));
     }},
    {"e", escapeFilter},
    {"escape", escapeFilter},
    {"first", [](const Value& v, CallArgs& a) { return firstLast(v, a, false); }},
    {"float", floatFilter},
    {"format",
     [](const Value& v, CallArgs& a) { return Value(percentFormat(a.offset, v.str(), Value::list(a.positional))); }},
    {"indent", indentFilter},
    {"int", intFilter},
    {"items",
     [](const Value& v, CallArgs& a) {
       if (v.isUndefined()) return Value::list();
       if (!v.isDict()) fail(a.offset, "Can only get item pairs from a mapping.");
       Value::List items;
       for (const auto& [k, x] : v.asDict()) items.push_back(Value::tuple({Value(k), x}));
       return Value::list(std::move(items));
     }},
    {"join",
     [](const Value& v, CallArgs& a) {
       const std::string sep = argOr(a, 0, "d", Value("")).str();
       const Value attribute = argOr(a, 1, "attribute", Value::none());
       std::string out;
       bool first = true;
       for (const Value& item : iterate(v, a.offset)) {
         out += (first ? "" : sep) + (attribute.isString() ? attributeOf(item, attribute.asString()) : item).str();
         first = false;
       }
       return Value(std::move(out));
     }},
    {"last", [](const Value& v, CallArgs& a) { return firstLast(v, a, true); }},
    {"length", [](const Value& v, CallArgs& a) { return Value(pyLen(v, a.offset)); }},
    {"list", [](const Value& v, CallArgs& a) { return Value::list(iterate(v, a.offset)); }},
    {"lower", [](const Value& v, CallArgs&) { return Value(toLower(v.str())); }},
    {"map", mapFilter},
    {"max", [](const Value& v, CallArgs& a) { return minMax(v, a, true); }},
    {"min", [](const Value& v, CallArgs& a) { return minMax(v, a, false); }},
    {"reject", [](const Value& v, CallArgs& a) { return selectFilter(v, a, false, false); }},
    {"rejectattr", [](const Value& v, CallArgs& a) { return selectFilter(v, a, true, false); }},
    {"replace",
     [](const Value& v, CallArgs& a) {
       const Value count = argOr(a, 2, "count", Value::none());
       return Value(replaceAll(v.str(), argOr(a, 0, "old", Value("")).str(), argOr(a, 1, "new", Value("")).str(),
                               intArg(count, a.offset)));
     }},
    {"reverse",
     [](const Value& v, CallArgs& a) {
       if (v.isString()) {
         auto cps = splitCodePoints(v.asString());
         std::string out;
         for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
         return Value(std::move(out));
       }
       std::vector<Value> items = iterate(v, a.offset);
       std::reverse(items.begin(), items.end());
       return Value::list(std::move(items));
     }},
    {"round",
     [](const Value& v, CallArgs& a) {
       if (!v.isNumber()) fail(a.offset, "round: a number is required, not " + pythonTypeName(v));
       const Value p = argOr(a, 0, "precision", Value(0));
       if (p.kind() != K::kInt) fail(a.offset, "round: precision must be an integer");
       const int64_t precision = std::clamp<int64_t>(p.asInt(), -400, 400);
       const std::string method = argOr(a, 1, "method", Value("common")).str();
       const double scale = std::pow(10.0, static_cast<double>(precision));
       const double x = v.asFloat() * scale;
       const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
       return Value(r / scale);
     }},
    {"safe", [](const Value& v, CallArgs&) { return v; }},
    {"select", [](const Value& v, CallArgs& a) { return selectFilter(v, a, false, true); }},
    {"selectattr", [](const Value& v, CallArgs& a) { return selectFilter(v, a, true, true); }},
    {"sort", sortFilter},
    {"string", [](const Value& v, CallArgs&) { return Value(v.str()); }},
    {"sum",
     [](const Value& v, CallArgs& a) {
       Value total = argOr(a, 1, "start", Value(0));
       const Value attribute = argOr(a, 0, "attribute", Value::none());
       for (const Value& item : iterate(v, a.offset)) {
         const Value x = attribute.isString() ? attributeOf(item, attribute.asString()) : item;
         if (!x.isNumber() || !total.isNumber())
           fail(a.offset, "sum: unsupported operand type '" + pythonTypeName(x) + "'");
         if (x.kind() == K::kFloat || total.kind() == K::kFloat) {
           total = Value(total.asFloat() + x.asFloat());
         } else {
           int64_t r = 0;
           if (__builtin_add_overflow(total.asInt(), x.asInt(), &r)) fail(a.offset, "integer overflow");
           total = Value(r);
         }
       }
       return total;
     }},
    {"title", [](const Value& v, CallArgs&) { return Value(jinjaTitle(v.str())); }},
    {"tojson", tojsonFilter},
    {"trim", [](const Value& v,
                CallArgs& a) { return Value(pythonStrip(v.str(), argOr(a, 0, "chars", Value::none()), true, true)); }},
    {"unique",
     [](const Value& v, CallArgs& a) {
       Value::List out;
       for (const Value& item : iterate(v, a.offset)) {
         const bool seen = std::any_of(out.begin(), out.end(), [&](const Value& o) {
           return (o.isString() && item.isString()) ? toLower(o.asString()) == toLower(item.asString()) : o == item;
         });
         if (!seen) out.push_back(item);
       }
       return Value::list(std::move(out));
     }},
    {"upper", [](const Value& v, CallArgs&) { return Value(toUpper(v.str())); }},
};

// ----- tests -----

// Python's `value % divisor == 0` for ints and floats (INT64_MIN % -1 is 0, not a trap).
bool divisible(size_t offset, const Value& v, const Value& divisor, const char* test) {
  if (!v.isNumber() || !divisor.isNumber()) fail(offset, std::string(test) + ": numbers are required");
  if (v.kind() == K::kFloat || divisor.kind() == K::kFloat) {
    if (divisor.asFloat() == 0) fail(offset, "float modulo");
    return std::fmod(v.asFloat(), divisor.asFloat()) == 0;
  }
  const int64_t n = divisor.asInt();
  if (n == 0) fail(offset, "integer division or modulo by zero");
  return n == -1 || v.asInt() % n == 0;
}

bool compareTest(const Value& v, CallArgs& a, const char* op) {
  const Value* other = arg(a, 0, "other");
  if (!other) fail(a.offset, std::string("test '") + op + "' needs an argument");
  const std::string o = op;
  if (o == "==") return v == *other;
  if (o == "!=") return !(v == *other);
  const int c = pythonOrder(a.offset, o, v, *other);
  return o == "<" ? c < 0 : o == "<=" ? c <= 0 : o == ">" ? c > 0 : c >= 0;
}

const std::pair<const char*, TestFn> kTests[] = {
    {"boolean", [](const Value& v, CallArgs&) { return v.kind() == K::kBool; }},
    {"callable", [](const Value& v, CallArgs&) { return v.kind() == K::kCallable; }},
    {"defined", [](const Value& v, CallArgs&) { return !v.isUndefined(); }},
    {"divisibleby", [](const Value& v, CallArgs& a) {
       const Value* n = arg(a, 0, "num");
       if (!n) fail(a.offset, "test 'divisibleby' needs an argument");
       return divisible(a.offset, v, *n, "divisibleby");
     }},
    {"eq", [](const Value& v, CallArgs& a) { return compareTest(v, a, "=="); }},
    {"equalto", [](const Value& v, CallArgs& a) { return compareTest(v, a, "=="); }},
    {"==", [](const Value& v, CallArgs& a) { return compareTest(v, a, "=="); }},
    {"even", [](const Value& v, CallArgs& a) {
       return divisible(a.offset, v, Value(2), "even");
     }},
    {"false", [](const Value& v, CallArgs&) { return v.kind() == K::kBool && !v.asBool(); }},
    {"float", [](const Value& v, CallArgs&) { return v.kind() == K::kFloat; }},
    {"ge", [](const Value& v, CallArgs& a) { return compareTest(v, a, ">="); }},
    {">=", [](const Value& v, CallArgs& a) { return compareTest(v, a, ">="); }},
    {"gt", [](const Value& v, CallArgs& a) { return compareTest(v, a, ">"); }},
    {">", [](const Value& v, CallArgs& a) { return compareTest(v, a, ">"); }},
    {"greaterthan", [](const Value& v, CallArgs& a) { return compareTest(v, a, ">"); }},
    {"in", [](const Value& v, CallArgs& a) {
       const Value* seq = arg(a, 0, "seq");
       if (!seq) fail(a.offset, "test 'in' needs an argument");
       return pythonContains(a.offset, v, *seq);
     }},
    {"integer", [](const Value& v, CallArgs&) { return v.kind() == K::kInt; }},
    {"iterable", [](const Value& v, CallArgs&) {
       return v.isUndefined() || v.isString() || v.isList() || v.isDict();
     }},
    {"le", [](const Value& v, CallArgs& a) { return compareTest(v, a, "<="); }},
    {"<=", [](const Value& v, CallArgs& a) { return compareTest(v, a, "<="); }},
    {"lower",
     [](const Value& v, CallArgs&) {
       return v.isString() && toLower(v.asString()) == v.asString() && toUpper(v.asString()) != v.asString();
     }},
    {"lt", [](const Value& v, CallArgs& a) { return compareTest(v, a, "<"); }},
    {"<", [](const Value& v, CallArgs& a) { return compareTest(v, a, "<"); }},
    {"lessthan", [](const Value& v, CallArgs& a) { return compareTest(v, a, "<"); }},
    {"mapping", [](const Value& v, CallArgs&) { return v.isDict(); }},
    {"ne", [](const Value& v, CallArgs& a) { return compareTest(v, a, "!="); }},
    {"!=", [](const Value& v, CallArgs& a) { return compareTest(v, a, "!="); }},
    {"none", [](const Value& v, CallArgs&) { return v.isNone(); }},
    {"number", [](const Value& v, CallArgs&) { return v.isNumber(); }},
    {"odd", [](const Value& v, CallArgs& a) {
       return !divisible(a.offset, v, Value(2), "odd");
     }},
    {"sameas", [](const Value& v, CallArgs& a) {
       const Value* other = arg(a, 0, "other");
       if (!other) fail(a.offset, "test 'sameas' needs an argument");
       return v.sameAs(*other);
     }},
    {"sequence", [](const Value& v, CallArgs&) { return v.isUndefined() || v.isString() || v.isList() || v.isDict(); }},
    {"string", [](const Value& v, CallArgs&) { return v.isString(); }},
    {"true", [](const Value& v, CallArgs&) { return v.kind() == K::kBool && v.asBool(); }},
    {"undefined", [](const Value& v, CallArgs&) { return v.isUndefined(); }},
    {"upper",
     [](const Value& v, CallArgs&) {
       return v.isString() && toUpper(v.asString()) == v.asString() && toLower(v.asString()) != v.asString();
     }},
};

}  // namespace

FilterFn findFilter(std::string_view name) {
  for (const auto& [n, f] : kFilters)
    if (name == n) return f;
  return nullptr;
}

TestFn findTest(std::string_view name) {
  for (const auto& [n, t] : kTests)
    if (name == n) return t;
  return nullptr;
}

}  // namespace minfer::chat::detail
