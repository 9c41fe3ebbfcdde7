// chat::Value: Python's truthiness, str(), repr(), ==, and json.dumps for template values.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/chat/template_ast.h"

namespace minfer::chat {

using detail::formatFloat;

namespace {

uint16_t nestingOf(const Value& container_item) {
  return static_cast<uint16_t>(std::min(container_item.nesting() + 1, 65535));
}

}  // namespace

Value Value::list(List items) {
  Value v;
  v.depth_ = 1;
  for (const Value& item : items) v.depth_ = std::max(v.depth_, nestingOf(item));
  v.v_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::dict(Dict items) {
  Value v;
  v.depth_ = 1;
  for (const auto& kv : items) v.depth_ = std::max(v.depth_, nestingOf(kv.second));
  v.v_ = std::make_shared<Dict>(std::move(items));
  return v;
}

Value Value::nameSpace(Dict attributes) {
  Value v;
  v.v_ = Namespace{std::make_shared<Dict>(std::move(attributes))};
  return v;
}

Value Value::callable(std::shared_ptr<const detail::Callable> fn) {
  Value v;
  v.v_ = std::move(fn);
  return v;
}

Value Value::undefined(std::string why) {
  Value v;
  v.v_ = Undefined{std::make_shared<const std::string>(std::move(why))};
  return v;
}

namespace {

struct TooDeep {};
constexpr int kMaxJsonDepth = 512;

Value fromNlohmann(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth) throw TooDeep{};
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));  // beyond int64: kept as a float (Python would keep it exact)
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value::List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(fromNlohmann(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value out = Value::dict();
      for (const auto& [k, e] : j.items())
        out.set(k, fromNlohmann(e, depth + 1));  // set: a repeated key keeps its first place
      return out;
    }
    default:
      return Value::none();
  }
}

}  // namespace

Result<Value> Value::fromJson(std::string_view json) {
  // ordered_json keeps object keys in file order (nlohmann::json would sort them).
  try {
    return fromNlohmann(nlohmann::ordered_json::parse(json), 1);
  } catch (const nlohmann::json::exception& e) {
    return Status::error(std::string("JSON: ") + e.what());
  } catch (const TooDeep&) {
    return Status::error("JSON: arrays and objects nested deeper than " + std::to_string(kMaxJsonDepth));
  }
}

int64_t Value::asInt() const {
  switch (kind()) {
    case Kind::kBool:
      return asBool() ? 1 : 0;
    case Kind::kFloat: {
      const double d = std::get<double>(v_);
      if (std::isnan(d)) return 0;
      if (d >= 9223372036854775807.0) return INT64_MAX;
      if (d <= -9223372036854775808.0) return INT64_MIN;
      return static_cast<int64_t>(d);
    }
    default:
      return std::get<int64_t>(v_);  // throws bad_variant_access: caller broke the contract
  }
}

double Value::asFloat() const {
  switch (kind()) {
    case Kind::kFloat:
      return std::get<double>(v_);
    case Kind::kInt:
      return static_cast<double>(std::get<int64_t>(v_));
    case Kind::kBool:
      return asBool() ? 1.0 : 0.0;
    default:
      return std::get<double>(v_);  // throws bad_variant_access: caller broke the contract
  }
}

const Value::Dict& Value::asDict() const {
  if (kind() == Kind::kNamespace) return *std::get<Namespace>(v_).attributes;
  return *std::get<std::shared_ptr<Dict>>(v_);
}

const std::string& Value::undefinedReason() const {
  static const std::string kEmpty = "value is undefined";
  const auto& u = std::get<Undefined>(v_);
  return u.why ? *u.why : kEmpty;
}

const Value* Value::find(std::string_view key) const {
  if (kind() != Kind::kDict && kind() != Kind::kNamespace) return nullptr;
  for (const auto& [k, v] : asDict())
    if (k == key) return &v;
  return nullptr;
}

void Value::set(std::string_view key, Value value) {
  Dict& d = kind() == Kind::kNamespace ? *std::get<Namespace>(v_).attributes : *std::get<std::shared_ptr<Dict>>(v_);
  for (auto& [k, v] : d)
    if (k == key) {
      v = std::move(value);
      return;
    }
  if (kind() == Kind::kDict) depth_ = std::max(depth_, nestingOf(value));
  d.emplace_back(std::string(key), std::move(value));
}

void Value::push(Value item) {
  depth_ = std::max(depth_, nestingOf(item));
  std::get<std::shared_ptr<List>>(v_)->push_back(std::move(item));
}

void Value::clear() {
  if (kind() == Kind::kList) std::get<std::shared_ptr<List>>(v_)->clear();
  if (kind() == Kind::kDict) std::get<std::shared_ptr<Dict>>(v_)->clear();
  if (kind() == Kind::kNamespace) std::get<Namespace>(v_).attributes->clear();
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return asBool();
    case Kind::kInt:
      return asInt() != 0;
    case Kind::kFloat:
      return asFloat() != 0.0;
    case Kind::kString:
      return !asString().empty();
    case Kind::kList:
      return !asList().empty();
    case Kind::kDict:
      return !asDict().empty();
    default:
      return true;
  }
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return asString();
    default:
      return repr();
  }
}

namespace {

// Python's repr of a str: single quotes unless the text holds ' and no ".
std::string reprString(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string Value::repr() const {
  std::vector<const void*> open;  // containers being printed: a namespace that holds itself prints {...}
  return reprInside(open);
}

std::string Value::reprInside(std::vector<const void*>& open) const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return asBool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(asInt());
    case Kind::kFloat:
      return formatFloat(asFloat());
    case Kind::kString:
      return reprString(asString());
    case Kind::kList: {
      const void* id = &asList();
      if (std::find(open.begin(), open.end(), id) != open.end()) return "[...]";
      open.push_back(id);
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < asList().size(); ++i) out += (i ? ", " : "") + asList()[i].reprInside(open);
      open.pop_back();
      if (tuple_) return out + (asList().size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      const bool ns = kind() == Kind::kNamespace;
      const void* id = &asDict();
      if (std::find(open.begin(), open.end(), id) != open.end()) return ns ? "<Namespace {...}>" : "{...}";
      open.push_back(id);
      std::string out = ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : asDict()) {
        out += (first ? "" : ", ") + reprString(k) + ": " + v.reprInside(open);
        first = false;
      }
      open.pop_back();
      return out + (ns ? "}>" : "}");
    }
    case Kind::kCallable:
      return "<function " + asCallable().name + ">";
  }
  return "";
}

namespace {

// json.dumps' string encoding: \" \\ \n \r \t \b \f, other controls as \u00XX; with ensure_ascii
// every non-ASCII code point as \uXXXX (surrogate pairs above U+FFFF).
void jsonString(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c >= 0x80 && ensure_ascii) {
      const std::string_view rest = s.substr(i);
      const std::string_view cp = detail::splitCodePoints(rest.substr(0, std::min<size_t>(4, rest.size())))[0];
      uint32_t v = c;
      if (cp.size() == 2) v = ((c & 0x1F) << 6) | (cp[1] & 0x3F);
      if (cp.size() == 3) v = ((c & 0x0F) << 12) | ((cp[1] & 0x3F) << 6) | (cp[2] & 0x3F);
      if (cp.size() == 4) v = ((c & 0x07) << 18) | ((cp[1] & 0x3F) << 12) | ((cp[2] & 0x3F) << 6) | (cp[3] & 0x3F);
      i += cp.size() - 1;
      if (v >= 0x10000) {
        v -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", v);
      }
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

bool jsonValue(const Value& v, std::string& out, std::string& error, int indent, bool ensure_ascii, bool sort_keys,
               int level) {
  if (level > 512) {
    error = "tojson: nesting deeper than 512";
    return false;
  }
  const std::string item_sep = indent >= 0 ? "," : ", ";
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return true;
    case Value::Kind::kBool:
      out += v.asBool() ? "true" : "false";
      return true;
    case Value::Kind::kInt:
      out += std::to_string(v.asInt());
      return true;
    case Value::Kind::kFloat: {
      const double d = v.asFloat();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : formatFloat(d);
      return true;
    }
    case Value::Kind::kString:
      jsonString(out, v.asString(), ensure_ascii);
      return true;
    case Value::Kind::kList: {
      const auto& l = v.asList();
      if (l.empty()) {
        out += "[]";
        return true;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        if (!jsonValue(l[i], out, error, indent, ensure_ascii, sort_keys, level + 1)) return false;
      }
      newline(level);
      out += ']';
      return true;
    }
    case Value::Kind::kDict: {
      if (v.asDict().empty()) {
        out += "{}";
        return true;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.asDict()) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        jsonString(out, items[i]->first, ensure_ascii);
        out += ": ";
        if (!jsonValue(items[i]->second, out, error, indent, ensure_ascii, sort_keys, level + 1)) return false;
      }
      newline(level);
      out += '}';
      return true;
    }
    case Value::Kind::kUndefined:
      error = "Object of type Undefined is not JSON serializable";
      return false;
    case Value::Kind::kNamespace:
      error = "Object of type Namespace is not JSON serializable";
      return false;
    case Value::Kind::kCallable:
      error = "Object of type function is not JSON serializable";
      return false;
  }
  return false;
}

}  // namespace

bool Value::toJson(std::string& out, std::string& error, int indent, bool ensure_ascii, bool sort_keys) const {
  return jsonValue(*this, out, error, indent, ensure_ascii, sort_keys, 0);
}

bool operator==(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.isNumber() && b.isNumber()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.asFloat() == b.asFloat();
    return a.asInt() == b.asInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.asString() == b.asString();
    case K::kList:
      return a.asList() == b.asList();
    case K::kDict: {
      const auto& da = a.asDict();
      if (da.size() != b.asDict().size()) return false;
      for (const auto& [k, v] : da) {
        const Value* other = b.find(k);
        if (!other || !(v == *other)) return false;
      }
      return true;
    }
    default:
      return a.sameAs(b);
  }
}

bool Value::sameAs(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kList:
      return std::get<std::shared_ptr<List>>(v_) == std::get<std::shared_ptr<List>>(other.v_);
    case Kind::kDict:
      return std::get<std::shared_ptr<Dict>>(v_) == std::get<std::shared_ptr<Dict>>(other.v_);
    case Kind::kNamespace:
      return std::get<Namespace>(v_).attributes == std::get<Namespace>(other.v_).attributes;
    case Kind::kCallable:
      return std::get<std::shared_ptr<const detail::Callable>>(v_) ==
             std::get<std::shared_ptr<const detail::Callable>>(other.v_);
    case Kind::kUndefined:
      return false;
    default:
      return *this == other;
  }
}

namespace detail {

std::string formatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits (as Python's repr), then Python's layout: scientific when the decimal
  // exponent is < -4 or >= 16, else positional with at least one fractional digit.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp10 = static_cast<int>(std::strtol(sci.c_str() + e + 1, nullptr, 10));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + eb;
  }
  if (exp10 < 0) return out + "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  const size_t int_digits = static_cast<size_t>(exp10) + 1;
  if (digits.size() <= int_digits) return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

std::vector<std::string_view> splitCodePoints(std::string_view s) {
  // A byte that does not start a complete sequence counts as one code point (bytes survive slicing).
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace detail
}  // namespace minfer::chat
