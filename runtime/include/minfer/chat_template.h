// Chat templates: renders the Jinja template that GGUF files carry as `tokenizer.chat_template`.
//
// Semantics are those of Python jinja2 3.1 as Hugging Face transformers renders chat templates:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
// globals raise_exception(msg) and strftime_now(fmt), and a `tojson` filter that is Python's
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False). The renderer
// covers the subset real chat templates use (fixtures/chat_templates: 16 families, every case byte
// for byte); runtime/chat/README.md lists it and what is left out. Anything outside it is refused
// with an error naming the line and column, never guessed.
//
// Errors: parse() and render() return a failed Status whose message starts with
// "chat template <line>:<column>: " (1-based, counted in code points of the template after newline
// normalisation) and says what failed: a syntax error, an unknown filter/test/tag, an undefined value
// used where jinja2 raises ("'foo' is undefined", "'dict object' has no attribute 'x'"), a Python
// type error ("can only concatenate str (not \"int\") to str"), or the message a template passed to
// raise_exception. Nesting (brackets, blocks, unary operators) is bounded at parse time, macro
// recursion and the depth of the values a template builds at render time (runtime/chat/README.md,
// "Bounds"), so no template can exhaust the stack; running out of memory is reported the same way.
// Nothing is thrown at the caller.
//
// Thread-safety: a ChatTemplate is immutable after parse(); render() may be called from any number of
// threads at once. A Value's lists and dicts are shared between copies (copy is O(1)): do not mutate
// one (set/push) while another thread renders with it.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "minfer/status.h"

namespace minfer::chat {

namespace detail {
struct Callable;  // a macro, a global function or a bound method (internal to the renderer)
struct Program;   // a parsed template
}  // namespace detail

// A template value: Python's None, bool, int, float, str, list (and tuple, a list that prints with
// parentheses) and dict (insertion-ordered, string keys, as JSON objects), plus jinja2's Undefined,
// namespace() objects and callables. Integers are int64 (Python's are unbounded: overflow is an error).
class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };
  using List = std::vector<Value>;
  using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

  Value() = default;                                 // undefined (a missing variable)
  Value(bool b) : v_(b) {}                           // NOLINT: implicit, like a literal
  Value(int i) : v_(int64_t{i}) {}                   // NOLINT
  Value(int64_t i) : v_(i) {}                        // NOLINT
  Value(double d) : v_(d) {}                         // NOLINT
  Value(std::string s) : v_(std::move(s)) {}         // NOLINT
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT
  static Value none() {
    Value v;
    v.v_ = None{};
    return v;
  }
  static Value list(List items = {});
  static Value tuple(List items);  // a list that prints as Python's tuple: (1, 2), (1,)
  static Value dict(Dict items = {});
  static Value nameSpace(Dict attributes = {});
  static Value callable(std::shared_ptr<const detail::Callable> fn);
  // An undefined value; `why` is the message of the error raised when it is used (jinja2's
  // "'x' is undefined", "'dict object' has no attribute 'x'").
  static Value undefined(std::string why);

  // JSON text → Value (objects keep their key order; integers that fit int64 stay integers). Parsed
  // with nlohmann-json; errors name the byte offset. Arrays and objects nested deeper than 512 are
  // refused.
  static Result<Value> fromJson(std::string_view json);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool isUndefined() const { return kind() == Kind::kUndefined; }
  bool isNone() const { return kind() == Kind::kNone; }
  bool isString() const { return kind() == Kind::kString; }
  bool isList() const { return kind() == Kind::kList; }
  bool isTuple() const { return isList() && tuple_; }
  bool isDict() const { return kind() == Kind::kDict; }
  bool isNumber() const { return kind() == Kind::kInt || kind() == Kind::kFloat || kind() == Kind::kBool; }

  // Accessors; each requires the matching kind (asInt and asFloat accept any number: bool, int, and
  // float, which asInt truncates toward zero, saturating; NaN gives 0).
  bool asBool() const { return std::get<bool>(v_); }
  int64_t asInt() const;
  double asFloat() const;
  const std::string& asString() const { return std::get<std::string>(v_); }
  const List& asList() const { return *std::get<std::shared_ptr<List>>(v_); }
  const Dict& asDict() const;  // dict or namespace attributes
  const detail::Callable& asCallable() const { return *std::get<std::shared_ptr<const detail::Callable>>(v_); }
  const std::string& undefinedReason() const;

  // Dict/namespace: the value under `key`, nullptr when absent (or not a dict).
  const Value* find(std::string_view key) const;
  // Dict/namespace: sets `key` (appended when new). List: appends. Mutates the shared storage.
  void set(std::string_view key, Value value);
  void push(Value item);
  // List/dict/namespace: removes every item (the renderer uses it to break namespace cycles).
  void clear();
  // Lists and dicts: 1 + the nesting of their deepest item, as built through list()/dict()/tuple()
  // and set()/push() on this copy (saturates at 65535); everything else 0. The renderer bounds it so
  // that no value it builds is too deep to print, compare or destroy without exhausting the stack.
  int nesting() const { return depth_; }

  bool truthy() const;       // Python's bool(): empty/zero/None/Undefined are false
  std::string str() const;   // Python's str(); Undefined prints as ""
  std::string repr() const;  // Python's repr(), used inside printed lists and dicts
  // Python's json.dumps(self, ensure_ascii, indent, sort_keys) with the default separators
  // (", " and ": "; "," and ": " when indented); indent < 0 means None. Throws nothing; a value JSON
  // cannot hold (Undefined, namespace, callable) makes it return false with `error` set.
  bool toJson(std::string& out, std::string& error, int indent = -1, bool ensure_ascii = false,
              bool sort_keys = false) const;

  // Python's ==: 1 == 1.0 == True, deep for lists and dicts (dict order ignored); Undefined equals
  // only Undefined; namespaces and callables by identity.
  friend bool operator==(const Value& a, const Value& b);
  // Same object (jinja2's `sameas`): equal scalars, or the same list/dict/namespace/callable.
  bool sameAs(const Value& other) const;

 private:
  std::string reprInside(std::vector<const void*>& open) const;

  struct Undefined {
    std::shared_ptr<const std::string> why;
  };
  struct None {};
  struct Namespace {
    std::shared_ptr<Dict> attributes;
  };
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<List>, std::shared_ptr<Dict>,
               Namespace, std::shared_ptr<const detail::Callable>>
      v_;
  bool tuple_ = false;  // a list made as a tuple (only its repr differs)
  uint16_t depth_ = 0;  // nesting()
};

// What a chat template is rendered with (the variables transformers' apply_chat_template passes).
struct ChatInputs {
  Value messages = Value::list();  // list of {"role": ..., "content": ..., ...} dicts
  bool add_generation_prompt = false;
  std::string bos_token;  // the tokenizer's BOS text ("" when it has none)
  std::string eos_token;
  // Further variables (tools, documents, enable_thinking, …); they shadow the four above.
  std::vector<std::pair<std::string, Value>> extra;
  // The clock strftime_now() formats with C's strftime (month and day names of the LC_TIME locale: C, as
  // in Python, unless the program called setlocale); empty = the local time now.
  std::function<std::tm()> now;
};

class ChatTemplate {
 public:
  // Parses the template once. Errors: "chat template L:C: <what>".
  static Result<ChatTemplate> parse(std::string_view source);

  // Renders. Errors: "chat template L:C: <what>", including raise_exception's message.
  Result<std::string> render(const ChatInputs& inputs) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const detail::Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const detail::Program> program_;
};

}  // namespace minfer::chat
