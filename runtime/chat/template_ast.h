// The parsed form of a chat template (expressions and statements) and the renderer's internal types.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "minfer/chat_template.h"

namespace minfer::chat::detail {

// Limits that keep hostile templates from exhausting the stack or memory.
inline constexpr int kMaxNesting = 64;                // brackets, blocks and unary operators, at parse time
inline constexpr int kMaxCallDepth = 64;              // macro calls inside macro calls, at render time
inline constexpr int kMaxRenderDepth = 256;           // bodies being executed at once (blocks inside macro calls)
inline constexpr int kMaxValueNesting = 256;          // lists and dicts inside lists and dicts a template builds
inline constexpr size_t kMaxRangeLength = 1u << 20;   // elements range() may produce
inline constexpr size_t kMaxRepeatBytes = 64u << 20;  // result of "s" * n or list * n

// The renderer's internal error: where (byte offset in the normalised source) and what. Thrown inside
// the parser and the evaluator, caught at the public API and turned into a Status.
struct TemplateError {
  size_t offset;
  std::string message;
};
[[noreturn]] void fail(size_t offset, std::string message);

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args = items; negate: a tuple
    kDict,      // args = key, value, key, value, … (keys must evaluate to strings)
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], absent parts null
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..], kwargs); negate
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] op args[1]: + - * / // % ** ~
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] …: == != < > <= >= in "not in"
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCondExpr,  // args[0] if args[1] else args[2] (null: undefined)
  };
  Kind kind;
  size_t offset;  // of the token that names the operation (for errors)
  Value literal;
  std::string name;  // variable, attribute, filter, test or binary operator
  bool negate = false;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind {
    kData,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] → bodies[i]; bodies[conds.size()], when present, is the else branch
    kFor,       // for targets in expr [if cond] : bodies[0] [else bodies[1]]
    kSet,       // set targets = expr; or set targets[0].attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(params = defaults) : bodies[0]
    kBreak,
    kContinue,
  };
  Kind kind;
  size_t offset;
  std::string text;            // data; macro name; attribute of a namespace assignment
  ExprPtr expr;                // output, for iterable, set value
  ExprPtr cond;                // for ... if cond
  std::vector<ExprPtr> conds;  // if / elif conditions
  std::vector<Body> bodies;
  std::vector<std::string> targets;  // for / set names; macro parameter names
  std::vector<ExprPtr> defaults;     // macro parameter defaults (null: none), parallel to targets
  bool uses_loop = false;            // for: the body names `loop` (else no loop object is built)
};

struct Program {
  std::string source;  // normalised: "\n" newlines, one trailing newline dropped (jinja2's default)
  Body body;
};

// Parses normalised template text (lexer + parser in template_parser.cpp).
std::unique_ptr<Program> parseProgram(std::string source);

// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  size_t offset = 0;  // of the call, for errors
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

// Builtins (template_builtins.cpp). Each throws TemplateError (at args.offset) on misuse.
using FilterFn = Value (*)(const Value& input, CallArgs& args);
FilterFn findFilter(std::string_view name);
using TestFn = bool (*)(const Value& input, CallArgs& args);
TestFn findTest(std::string_view name);
// obj.name for strings, lists and dicts: a bound method (Python methods first, as jinja2's getattr
// does), else for dicts the item; Undefined naming the attribute when neither exists.
Value getAttribute(const Value& obj, const std::string& name);
// obj[key] (jinja2's getitem: the item first, then a method of that name).
Value getItem(const Value& obj, const Value& key);
// Python's type name as jinja2's error messages print it ("dict object", "None", "str object").
std::string objectTypeRepr(const Value& v);
std::string pythonTypeName(const Value& v);  // "str", "int", "NoneType", …

// Python iteration: list items, dict keys, string characters; Undefined iterates as empty.
std::vector<Value> iterate(const Value& v, size_t offset);

// Python's ordering of numbers, strings and lists (-1, 0, 1); TypeError-like failure otherwise.
int pythonOrder(size_t offset, const std::string& op, const Value& a, const Value& b);
// Python's `needle in hay` (Undefined holds nothing).
bool pythonContains(size_t offset, const Value& needle, const Value& hay);
// Python's `fmt % args`: %s %r %d %i %x %f %e %g %% with flags, width and precision.
std::string percentFormat(size_t offset, const std::string& fmt, const Value& args);

// UTF-8 helpers (code points, as Python's str counts).
std::vector<std::string_view> splitCodePoints(std::string_view s);
bool isPythonSpace(uint32_t cp);
std::string pythonStrip(std::string_view s, const Value& chars, bool left, bool right);

// Python's float repr ("1.0", "1e+16", "0.30000000000000004", "inf").
std::string formatFloat(double d);

}  // namespace minfer::chat::detail
