// Chat template evaluator: statements, expressions with Python's operator semantics, jinja2's scoping
// (a for loop's body is a new scope per iteration; macros see the template's top level), and the
// public ChatTemplate API.
#include <cmath>
#include <cstring>
#include <exception>
#include <new>

#include "runtime/chat/template_ast.h"

namespace minfer::chat {
namespace detail {
namespace {

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& [k, v] : vars)
      if (k == name) {
        v = std::move(value);
        return;
      }
    vars.emplace_back(name, std::move(value));
  }
};

[[noreturn]] void failUndefined(size_t offset, const Value& v) { fail(offset, v.undefinedReason()); }

class Renderer {
 public:
  Renderer(const Program& program, const ChatInputs& in) : program_(program), inputs_(in) {
    auto global = [&](const char* name, std::function<Value(CallArgs&)> fn) {
      root_.set(name, Value::callable(std::make_shared<Callable>(Callable{name, std::move(fn)})));
    };
    global("raise_exception", [](CallArgs& a) -> Value {
      fail(a.offset, a.positional.empty() ? std::string("raise_exception") : a.positional[0].str());
    });
    global("strftime_now", [this](CallArgs& a) -> Value { return strftimeNow(a); });
    global("range", rangeFn);
    global("namespace", [this](CallArgs& a) -> Value {
      Value ns = Value::nameSpace();
      namespaces_.push_back(ns);
      for (const Value& p : a.positional) {
        if (!p.isDict()) fail(a.offset, "namespace() takes a mapping as positional argument");
        for (const auto& [k, v] : p.asDict()) ns.set(k, v);
      }
      for (auto& [k, v] : a.keyword) ns.set(k, v);
      return ns;
    });
    global("dict", [](CallArgs& a) -> Value {
      Value d = Value::dict();
      for (auto& [k, v] : a.keyword) d.set(k, v);
      return d;
    });
    root_.set("messages", in.messages);
    root_.set("add_generation_prompt", Value(in.add_generation_prompt));
    root_.set("bos_token", Value(in.bos_token));
    root_.set("eos_token", Value(in.eos_token));
    for (const auto& [k, v] : in.extra) root_.set(k, v);
  }

  // A namespace may hold itself or a chain of other namespaces (set ns.next = namespace(prev=ns)):
  // emptying every namespace this render made breaks such cycles and chains without recursion.
  ~Renderer() {
    for (Value& ns : namespaces_) ns.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run() {
    std::string out;
    exec(program_.body, root_, out);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  static Value rangeFn(CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a.positional)
      if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool)
        fail(a.offset, "range() argument must be an integer, not " + pythonTypeName(v));
    if (a.positional.size() == 1)
      stop = a.positional[0].asInt();
    else if (a.positional.size() >= 2) {
      start = a.positional[0].asInt();
      stop = a.positional[1].asInt();
      if (a.positional.size() >= 3) step = a.positional[2].asInt();
    } else
      fail(a.offset, "range expected at least 1 argument, got 0");
    if (step == 0) fail(a.offset, "range() arg 3 must not be zero");
    // Length first (as Python computes it), so that a huge range fails before allocating.
    const __int128 span = step > 0 ? __int128{stop} - start : __int128{start} - stop;
    const __int128 length =
        span <= 0 ? 0 : (span + (step > 0 ? step : -__int128{step}) - 1) / (step > 0 ? step : -__int128{step});
    if (length > static_cast<__int128>(kMaxRangeLength)) fail(a.offset, "range() longer than 1048576 elements");
    Value::List out;
    out.reserve(static_cast<size_t>(length));
    for (int64_t k = 0; k < static_cast<int64_t>(length); ++k)
      out.push_back(Value(static_cast<int64_t>(__int128{start} + __int128{k} * step)));
    return Value::list(std::move(out));
  }

  Value strftimeNow(CallArgs& a) {
    if (a.positional.size() != 1 || !a.positional[0].isString())
      fail(a.offset, "strftime_now(format) takes one string");
    std::tm tm{};
    if (inputs_.now) {
      tm = inputs_.now();
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    const std::string& fmt = a.positional[0].asString();
    std::string buf(fmt.size() * 4 + 64, '\0');
    const size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) fail(a.offset, "strftime_now: format '" + fmt + "' gives an empty or too long result");
    buf.resize(n);
    return Value(std::move(buf));
  }

  // ----- statements -----

  struct DepthGuard {
    DepthGuard(int& d, size_t offset) : depth(d) {
      if (++depth > kMaxRenderDepth) fail(offset, "blocks and macro calls nested deeper than 256");
    }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  Flow exec(const Body& body, Scope& scope, std::string& out) {
    if (body.empty()) return Flow::kNormal;
    DepthGuard guard(render_depth_, body.front().offset);
    for (const Node& n : body) {
      switch (n.kind) {
        case Node::Kind::kData:
          out += n.text;
          break;
        case Node::Kind::kOutput:
          out += eval(*n.expr, scope).str();
          break;
        case Node::Kind::kIf: {
          size_t i = 0;
          while (i < n.conds.size() && !eval(*n.conds[i], scope).truthy()) ++i;
          if (i < n.bodies.size()) {
            const Flow f = exec(n.bodies[i], scope, out);
            if (f != Flow::kNormal) return f;
          }
          break;
        }
        case Node::Kind::kFor:
          execFor(n, scope, out);
          break;
        case Node::Kind::kSet:
          execSet(n, scope);
          break;
        case Node::Kind::kSetBlock: {
          std::string captured;
          exec(n.bodies[0], scope, captured);
          scope.set(n.targets[0], Value(std::move(captured)));
          break;
        }
        case Node::Kind::kMacro:
          defineMacro(n, scope);
          break;
        case Node::Kind::kBreak:
          return Flow::kBreak;
        case Node::Kind::kContinue:
          return Flow::kContinue;
      }
    }
    return Flow::kNormal;
  }

  void bind(Scope& scope, const std::vector<std::string>& targets, const Value& v, size_t offset) {
    if (targets.size() == 1) {
      scope.set(targets[0], v);
      return;
    }
    if (v.isUndefined()) failUndefined(offset, v);
    const std::vector<Value> items = iterate(v, offset);
    if (items.size() > targets.size())
      fail(offset, "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
    if (items.size() < targets.size())
      fail(offset, "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                       std::to_string(items.size()) + ")");
    for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], items[i]);
  }

  void execFor(const Node& n, Scope& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.expr, scope), n.expr->offset);
    if (n.cond) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope s{&scope, {}};
        bind(s, n.targets, item, n.offset);
        if (eval(*n.cond, s).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      Scope s{&scope, {}};
      bind(s, n.targets, items[i], n.offset);
      if (n.uses_loop) s.set("loop", loopObject(items, i));
      if (exec(n.bodies[0], s, out) == Flow::kBreak) break;
    }
    if (len == 0 && n.bodies.size() > 1) {
      Scope s{&scope, {}};
      exec(n.bodies[1], s, out);
    }
  }

  // jinja2's LoopContext as a dict (previtem/nextitem only where they exist, as Undefined otherwise).
  static Value loopObject(const std::vector<Value>& items, size_t i) {
    const size_t len = items.size();
    const auto count = static_cast<int64_t>(len), idx = static_cast<int64_t>(i);
    Value loop = Value::dict({{"index", Value(idx + 1)},
                              {"index0", Value(idx)},
                              {"revindex", Value(count - idx)},
                              {"revindex0", Value(count - idx - 1)},
                              {"first", Value(i == 0)},
                              {"last", Value(i + 1 == len)},
                              {"length", Value(count)},
                              {"depth", Value(1)},
                              {"depth0", Value(0)}});
    if (i > 0) loop.set("previtem", items[i - 1]);
    if (i + 1 < len) loop.set("nextitem", items[i + 1]);
    loop.set("cycle",
             Value::callable(std::make_shared<Callable>(Callable{"cycle", [i](CallArgs& a) -> Value {
                                                                   if (a.positional.empty())
                                                                     fail(a.offset, "no items for cycling given");
                                                                   return a.positional[i % a.positional.size()];
                                                                 }})));
    return loop;
  }

  void execSet(const Node& n, Scope& scope) {
    Value v = eval(*n.expr, scope);
    if (n.text.empty()) {
      bind(scope, n.targets, v, n.offset);
      return;
    }
    const Value* ns = scope.find(n.targets[0]);
    if (!ns || ns->kind() != Value::Kind::kNamespace) fail(n.offset, "cannot assign attribute on non-namespace object");
    Value target = *ns;  // shares the namespace's attributes
    target.set(n.text, std::move(v));
  }

  void defineMacro(const Node& n, Scope& scope) {
    const Node* macro = &n;
    auto fn = [this, macro](CallArgs& a) -> Value { return callMacro(*macro, a); };
    scope.set(n.text, Value::callable(std::make_shared<Callable>(Callable{n.text, std::move(fn)})));
  }

  Value callMacro(const Node& m, CallArgs& a) {
    if (call_depth_ >= kMaxCallDepth) fail(a.offset, "macro '" + m.text + "': calls nested deeper than 64");
    if (a.positional.size() > m.targets.size())
      fail(a.offset, "macro '" + m.text + "' takes not more than " + std::to_string(m.targets.size()) + " argument(s)");
    Scope s{&root_, {}};
    std::vector<bool> given(m.targets.size(), false);
    for (size_t i = 0; i < a.positional.size(); ++i) {
      s.set(m.targets[i], a.positional[i]);
      given[i] = true;
    }
    for (auto& [k, v] : a.keyword) {
      size_t i = 0;
      while (i < m.targets.size() && m.targets[i] != k) ++i;
      if (i == m.targets.size()) fail(a.offset, "macro '" + m.text + "' takes no keyword argument '" + k + "'");
      if (given[i]) fail(a.offset, "macro '" + m.text + "' got multiple values for argument '" + k + "'");
      s.set(k, v);
      given[i] = true;
    }
    for (size_t i = 0; i < m.targets.size(); ++i) {
      if (given[i]) continue;
      s.set(m.targets[i], m.defaults[i] ? eval(*m.defaults[i], s)
                                        : Value::undefined("parameter '" + m.targets[i] + "' was not provided"));
    }
    ++call_depth_;
    std::string out;
    exec(m.bodies[0], s, out);
    --call_depth_;
    return Value(std::move(out));
  }

  // ----- expressions -----

  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList: {
        Value::List items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return bounded(e.offset, e.negate ? Value::tuple(std::move(items)) : Value::list(std::move(items)));
      }
      case Expr::Kind::kDict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          if (!k.isString())
            fail(e.args[i]->offset, "dict keys must be strings in chat templates, got " + pythonTypeName(k));
          d.set(k.asString(), eval(*e.args[i + 1], scope));
        }
        return bounded(e.offset, std::move(d));
      }
      case Expr::Kind::kGetAttr: {
        Value obj = eval(*e.args[0], scope);
        if (obj.isUndefined()) failUndefined(e.offset, obj);
        return getAttribute(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        Value obj = eval(*e.args[0], scope);
        if (obj.isUndefined()) failUndefined(e.offset, obj);
        return getItem(obj, eval(*e.args[1], scope));
      }
      case Expr::Kind::kSlice:
        return evalSlice(e, scope);
      case Expr::Kind::kCall:
        return evalCall(e, scope);
      case Expr::Kind::kFilter: {
        Value input = eval(*e.args[0], scope);
        CallArgs args = evalArgs(e, scope, 1);
        return bounded(e.offset, findFilter(e.name)(input, args));
      }
      case Expr::Kind::kTest: {
        Value input = eval(*e.args[0], scope);
        CallArgs args = evalArgs(e, scope, 1);
        return Value(findTest(e.name)(input, args) != e.negate);
      }
      case Expr::Kind::kNot:
        return Value(!eval(*e.args[0], scope).truthy());
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        Value v = eval(*e.args[0], scope);
        if (v.isUndefined()) failUndefined(e.offset, v);
        if (!v.isNumber())
          fail(e.offset, std::string("bad operand type for unary ") + (e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" +
                             pythonTypeName(v) + "'");
        if (e.kind == Expr::Kind::kPos) return v.kind() == Value::Kind::kBool ? Value(v.asInt()) : v;
        if (v.kind() == Value::Kind::kFloat) return Value(-v.asFloat());
        if (v.asInt() == INT64_MIN) fail(e.offset, "integer overflow");
        return Value(-v.asInt());
      }
      case Expr::Kind::kBinary: {
        Value a = eval(*e.args[0], scope);
        Value b = eval(*e.args[1], scope);
        return binaryOp(e.offset, e.name, a, b);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!compare(e.offset, e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? eval(*e.args[1], scope) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? a : eval(*e.args[1], scope);
      }
      case Expr::Kind::kCondExpr:
        if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and has no else section");
    }
    fail(e.offset, "internal error: unknown expression");
  }

  CallArgs evalArgs(const Expr& e, Scope& scope, size_t first) {
    CallArgs args;
    args.offset = e.offset;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, scope));
    return args;
  }

  Value evalCall(const Expr& e, Scope& scope) {
    Value fn = eval(*e.args[0], scope);
    if (fn.isUndefined()) failUndefined(e.offset, fn);
    if (fn.kind() != Value::Kind::kCallable) fail(e.offset, "'" + pythonTypeName(fn) + "' object is not callable");
    CallArgs args = evalArgs(e, scope, 1);
    return bounded(e.offset, fn.asCallable().fn(args));
  }

  Value evalSlice(const Expr& e, Scope& scope) {
    Value obj = eval(*e.args[0], scope);
    if (obj.isUndefined()) failUndefined(e.offset, obj);
    int64_t bound[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int i = 0; i < 3; ++i) {
      if (!e.args[i + 1]) continue;
      Value v = eval(*e.args[i + 1], scope);
      if (v.isNone()) continue;
      if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool)
        fail(e.offset, "slice indices must be integers or None");
      bound[i] = v.asInt();
      given[i] = true;
    }
    const int64_t step = bound[2];
    if (step == 0) fail(e.offset, "slice step cannot be zero");
    std::vector<std::string_view> cps;
    int64_t len = 0;
    if (obj.isString()) {
      cps = splitCodePoints(obj.asString());
      len = static_cast<int64_t>(cps.size());
    } else if (obj.isList()) {
      len = static_cast<int64_t>(obj.asList().size());
    } else {
      fail(e.offset, "'" + pythonTypeName(obj) + "' object is not subscriptable");
    }
    // PySlice_AdjustIndices.
    auto adjust = [&](int64_t v, bool has, int64_t dflt) {
      if (!has) return dflt;
      if (v < 0) {
        v += len;
        if (v < 0) v = step < 0 ? -1 : 0;
      } else if (v >= len) {
        v = step < 0 ? len - 1 : len;
      }
      return v;
    };
    const int64_t start = adjust(bound[0], given[0], step < 0 ? len - 1 : 0);
    const int64_t stop = adjust(bound[1], given[1], step < 0 ? -1 : len);
    std::string s;
    Value::List l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.isString())
        s += cps[static_cast<size_t>(i)];
      else
        l.push_back(obj.asList()[static_cast<size_t>(i)]);
    }
    return obj.isString() ? Value(std::move(s)) : Value::list(std::move(l));
  }

  static bool isIntLike(const Value& v) { return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool; }

  [[noreturn]] static void unsupported(size_t offset, const std::string& op, const Value& a, const Value& b) {
    fail(offset,
         "unsupported operand type(s) for " + op + ": '" + pythonTypeName(a) + "' and '" + pythonTypeName(b) + "'");
  }

  static Value repeat(size_t offset, const Value& seq, int64_t n) {
    if (n < 0) n = 0;
    const size_t unit = seq.isString() ? seq.asString().size() : seq.asList().size();
    if (unit != 0 && static_cast<uint64_t>(n) > kMaxRepeatBytes / unit)
      fail(offset, "repetition result larger than 64 MiB");
    if (seq.isString()) {
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += seq.asString();
      return Value(std::move(out));
    }
    Value::List out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.asList().begin(), seq.asList().end());
    return Value::list(std::move(out));
  }

  static Value binaryOp(size_t offset, const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value(a.str() + b.str());
    if (a.isUndefined()) failUndefined(offset, a);
    if (b.isUndefined()) failUndefined(offset, b);
    const bool nums = a.isNumber() && b.isNumber();
    const bool ints = nums && isIntLike(a) && isIntLike(b);
    int64_t r = 0;
    if (op == "+") {
      if (ints) {
        if (__builtin_add_overflow(a.asInt(), b.asInt(), &r)) fail(offset, "integer overflow");
        return Value(r);
      }
      if (nums) return Value(a.asFloat() + b.asFloat());
      if (a.isString() && b.isString()) return Value(a.asString() + b.asString());
      if (a.isList() && b.isList()) {
        Value::List l = a.asList();
        l.insert(l.end(), b.asList().begin(), b.asList().end());
        return Value::list(std::move(l));
      }
      if (a.isString() || a.isList()) {
        const std::string t = a.isString() ? "str" : "list";
        fail(offset, "can only concatenate " + t + " (not \"" + pythonTypeName(b) + "\") to " + t);
      }
      unsupported(offset, op, a, b);
    }
    if (op == "-") {
      if (ints) {
        if (__builtin_sub_overflow(a.asInt(), b.asInt(), &r)) fail(offset, "integer overflow");
        return Value(r);
      }
      if (nums) return Value(a.asFloat() - b.asFloat());
      unsupported(offset, op, a, b);
    }
    if (op == "*") {
      if (ints) {
        if (__builtin_mul_overflow(a.asInt(), b.asInt(), &r)) fail(offset, "integer overflow");
        return Value(r);
      }
      if (nums) return Value(a.asFloat() * b.asFloat());
      if ((a.isString() || a.isList()) && isIntLike(b)) return repeat(offset, a, b.asInt());
      if ((b.isString() || b.isList()) && isIntLike(a)) return repeat(offset, b, a.asInt());
      if (a.isString() || a.isList() || b.isString() || b.isList())
        fail(offset,
             "can't multiply sequence by non-int of type '" + pythonTypeName(a.isString() || a.isList() ? b : a) + "'");
      unsupported(offset, op, a, b);
    }
    if (op == "/") {
      if (!nums) unsupported(offset, op, a, b);
      if (b.asFloat() == 0) fail(offset, "division by zero");
      return Value(a.asFloat() / b.asFloat());
    }
    if (op == "//" || op == "%") {
      if (op == "%" && a.isString()) return Value(percentFormat(offset, a.asString(), b));
      if (!nums) unsupported(offset, op, a, b);
      if (ints) {
        const int64_t x = a.asInt(), y = b.asInt();
        if (y == 0) fail(offset, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail(offset, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value(op == "//" ? q : m);
      }
      const double x = a.asFloat(), y = b.asFloat();
      if (y == 0) fail(offset, op == "//" ? "float floor division by zero" : "float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(op == "//" ? std::floor(x / y) : m);
    }
    if (op == "**") {
      if (!nums) unsupported(offset, op, a, b);
      if (ints && b.asInt() >= 0) {
        int64_t base = a.asInt(), result = 1;
        for (int64_t k = b.asInt(); k > 0; --k)
          if (__builtin_mul_overflow(result, base, &result)) fail(offset, "integer overflow");
        return Value(result);
      }
      return Value(std::pow(a.asFloat(), b.asFloat()));
    }
    fail(offset, "unknown operator '" + op + "'");
  }

  static bool compare(size_t offset, const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "in") return pythonContains(offset, a, b);
    if (op == "not in") return !pythonContains(offset, a, b);
    const int c = pythonOrder(offset, op, a, b);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  // Lists and dicts a template builds stay shallow enough to print, compare and destroy recursively.
  static Value bounded(size_t offset, Value v) {
    if (v.nesting() > kMaxValueNesting) fail(offset, "lists and dicts nested deeper than 256");
    return v;
  }

  const Program& program_;
  const ChatInputs& inputs_;
  Scope root_;
  std::vector<Value> namespaces_;  // every namespace() this render made
  int call_depth_ = 0;
  int render_depth_ = 0;
};

// Byte offset → "line:column" (1-based; columns in code points).
std::string location(const std::string& source, size_t offset) {
  offset = std::min(offset, source.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i)
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  const size_t column = splitCodePoints(std::string_view(source).substr(line_start, offset - line_start)).size() + 1;
  return std::to_string(line) + ":" + std::to_string(column);
}

// jinja2's source normalisation: "\r\n" and "\r" become "\n"; one trailing newline is dropped
// (keep_trailing_newline=False).
std::string normalizeNewlines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      out += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      out += text[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace
}  // namespace detail

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  std::string normalized = detail::normalizeNewlines(source);
  try {
    return ChatTemplate(detail::parseProgram(normalized));
  } catch (const detail::TemplateError& e) {
    return Status::error("chat template " + detail::location(normalized, e.offset) + ": " + e.message);
  } catch (const std::bad_alloc&) {
    return Status::error("chat template: out of memory while parsing");
  } catch (const std::exception& e) {  // a bug in the parser, reported rather than thrown at the caller
    return Status::error(std::string("chat template: internal error while parsing: ") + e.what());
  }
}

Result<std::string> ChatTemplate::render(const ChatInputs& inputs) const {
  try {
    detail::Renderer renderer(*program_, inputs);
    return renderer.run();
  } catch (const detail::TemplateError& e) {
    return Status::error("chat template " + detail::location(program_->source, e.offset) + ": " + e.message);
  } catch (const std::bad_alloc&) {
    return Status::error("chat template: out of memory while rendering");
  } catch (const std::exception& e) {  // a bug in the renderer, reported rather than thrown at the caller
    return Status::error(std::string("chat template: internal error while rendering: ") + e.what());
  }
}

}  // namespace minfer::chat
