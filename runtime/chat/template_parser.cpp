// Chat template lexer and parser: jinja2's tokenizer rules (trim_blocks, lstrip_blocks, "-"/"+"
// whitespace control) and its recursive-descent grammar, for the statements chat templates use.
#include <charconv>
#include <cstdio>
#include <cstring>

#include "runtime/chat/template_ast.h"

namespace minfer::chat::detail {

void fail(size_t offset, std::string message) { throw TemplateError{offset, std::move(message)}; }

namespace {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // data, name, decoded string, number text, operator
  size_t offset;
};

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool isNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }

// Python's str.rstrip() of template text (ASCII whitespace; non-ASCII spaces are rare in templates).
std::string_view rstripText(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && isSpace(s[n - 1])) --n;
  return s.substr(0, n);
}

void appendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous token ended with "\n" (jinja2's lstrip_blocks rule)
    const size_t n = src_.size();
    while (pos < n) {
      size_t tag = src_.find('{', pos);
      while (tag != std::string::npos && tag + 1 < n && (src_[tag + 1] == 0 || !std::strchr("{%#", src_[tag + 1])))
        tag = src_.find('{', tag + 1);
      if (tag == std::string::npos || tag + 1 >= n) {
        emit(Tok::kData, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < n && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      std::string_view text(src_.data() + pos, tag - pos);
      if (sign == '-') {
        text = rstripText(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces between the start of the line and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool all_space = true;
          for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && isSpace(text[i]);
          if (all_space) text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) emit(Tok::kData, std::string(text), pos);
      pos = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = skipComment(tag, pos);
      } else if (kind == '%' && rawBlock(tag, pos)) {
      } else {
        pos = lexTag(tag, pos, kind == '%');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({Tok::kEof, "", n});
    return std::move(tokens_);
  }

 private:
  void emit(Tok t, std::string text, size_t offset) { tokens_.push_back({t, std::move(text), offset}); }

  // "{% raw %}…{% endraw %}": the text between is data, not template. Moves pos past the end tag.
  bool rawBlock(size_t tag, size_t& pos) {
    size_t p = pos;
    while (p < src_.size() && isSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && (isNameStart(src_[p + 3]) || isDigit(src_[p + 3]))))
      return false;
    p += 3;
    while (p < src_.size() && isSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && isSpace(src_[p])) ++p;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    for (size_t q = src_.find("{%", p); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      const char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r++] : 0;
      while (r < src_.size() && isSpace(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && isSpace(src_[r])) ++r;
      const bool signed_end = r < src_.size() && (src_[r] == '-' || src_[r] == '+');
      if (src_.compare(r + (signed_end ? 1 : 0), 2, "%}") != 0) continue;
      std::string_view text(src_.data() + p, q - p);
      if (sign == '-') {
        text = rstripText(text);
      } else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        bool all_space = l_pos < text.size();
        for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && isSpace(text[i]);
        if (all_space && l_pos > 0) text = text.substr(0, l_pos);
      }
      if (!text.empty()) emit(Tok::kData, std::string(text), p);
      const size_t end = r + (signed_end ? 1 : 0);
      pos = afterEnd(end, end - (signed_end ? 1 : 0), /*trim=*/true);
      return true;
    }
    fail(tag, "missing '{% endraw %}' for this raw block");
  }

  // After "#}": "-#}" strips all following whitespace, "+#}" nothing, "#}" one newline (trim_blocks).
  size_t skipComment(size_t tag, size_t pos) {
    const size_t end = src_.find("#}", pos);
    if (end == std::string::npos) fail(tag, "missing end of comment tag '#}'");
    return afterEnd(end, pos, /*trim=*/true);
  }

  // Position after an end tag found at `end` ("%}", "}}" or "#}"), applying its whitespace control.
  size_t afterEnd(size_t end, size_t body_start, bool trim) {
    size_t p = end + 2;
    const char before = end > body_start ? src_[end - 1] : 0;
    if (before == '-') {
      while (p < src_.size() && isSpace(src_[p])) ++p;
    } else if (before != '+' && trim && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    return p;
  }

  size_t lexTag(size_t tag, size_t pos, bool block) {
    emit(block ? Tok::kBlockBegin : Tok::kVarBegin, "", tag);
    const char* close = block ? "%}" : "}}";
    std::vector<char> brackets;
    const size_t n = src_.size();
    while (true) {
      while (pos < n && isSpace(src_[pos])) ++pos;
      if (pos >= n) fail(tag, std::string("unclosed tag: expected '") + close + "' before the end of the template");
      if (brackets.empty()) {
        const bool signed_end =
            (src_[pos] == '-' || (block && src_[pos] == '+')) && src_.compare(pos + 1, 2, close) == 0;
        if (signed_end || src_.compare(pos, 2, close) == 0) {
          const size_t end = signed_end ? pos + 1 : pos;
          emit(block ? Tok::kBlockEnd : Tok::kVarEnd, "", end);
          return afterEnd(end, end - (signed_end ? 1 : 0), block);
        }
      }
      const char c = src_[pos];
      if (isNameStart(c)) {
        size_t e = pos;
        while (e < n && (isNameStart(src_[e]) || isDigit(src_[e]))) ++e;
        emit(Tok::kName, src_.substr(pos, e - pos), pos);
        pos = e;
      } else if (isDigit(c)) {
        pos = lexNumber(pos);
      } else if (c == '\'' || c == '"') {
        pos = lexString(pos);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (src_.compare(pos, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) {
          char shown[8];
          const auto u = static_cast<unsigned char>(c);
          std::snprintf(shown, sizeof shown, u < 0x20 || u >= 0x7f ? "\\x%02x" : "%c", u);
          fail(pos, std::string("unexpected character '") + shown + "' in tag");
        }
        const char oc = op[0];
        if (op[1] == 0 && (oc == '(' || oc == '[' || oc == '{')) {
          if (brackets.size() >= static_cast<size_t>(kMaxNesting)) fail(pos, "brackets nested deeper than 64");
          brackets.push_back(oc == '(' ? ')' : oc == '[' ? ']' : '}');
        } else if (op[1] == 0 && (oc == ')' || oc == ']' || oc == '}')) {
          if (brackets.empty()) fail(pos, std::string("unexpected '") + oc + "'");
          if (brackets.back() != oc)
            fail(pos, std::string("unexpected '") + oc + "', expected '" + brackets.back() + "'");
          brackets.pop_back();
        }
        emit(Tok::kOp, op, pos);
        pos += std::strlen(op);
      }
    }
  }

  size_t lexNumber(size_t pos) {
    const size_t n = src_.size();
    auto digits = [&](size_t p) {
      while (p < n && (isDigit(src_[p]) || (src_[p] == '_' && p + 1 < n && isDigit(src_[p + 1])))) ++p;
      return p;
    };
    size_t e = digits(pos);
    bool is_float = false;
    // After a '.', only an integer (foo.0.1 is two subscripts, as jinja2's (?<!\.) rule has it).
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::kOp && tokens_.back().text == ".";
    if (!after_dot) {
      if (e + 1 < n && src_[e] == '.' && isDigit(src_[e + 1])) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t p = e + 1;
        if (p < n && (src_[p] == '+' || src_[p] == '-')) ++p;
        if (p < n && isDigit(src_[p])) {
          e = digits(p);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = pos; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    emit(is_float ? Tok::kFloat : Tok::kInt, text, pos);
    return e;
  }

  // A quoted string with Python's escapes (jinja2 decodes literals with "unicode-escape"); unknown
  // escapes keep their backslash.
  size_t lexString(size_t pos) {
    const char q = src_[pos];
    std::string out;
    size_t p = pos + 1;
    const size_t n = src_.size();
    while (true) {
      if (p >= n) fail(pos, "unterminated string literal");
      const char c = src_[p];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= n) fail(pos, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          const auto r = std::from_chars(src_.data() + p, src_.data() + std::min(n, p + len), cp, 16);
          if (r.ptr != src_.data() + p + len || cp > 0x10FFFF) fail(p - 2, std::string("truncated \\") + e + " escape");
          appendUtf8(out, cp);
          p += len;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k)
              cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            appendUtf8(out, cp);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    emit(Tok::kString, std::move(out), pos);
    return p + 1;
  }

  const std::string& src_;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------------
// Parser: jinja2's grammar (parser.py), expression precedence from loosest to tightest:
//   cond-expr (a if c else b) < or < and < not < compare (== != < > <= >= in, not in)
//   < + - < ~ < * / // % < ** < unary - + < postfix (.attr [sub] (call)) with filters and tests.

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parseTemplate() {
    std::string end_tag;
    Body body = parseBody({}, end_tag);
    return body;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  bool isOp(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool isName(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  const Token& next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }

  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kString:
        return "string literal";
      case Tok::kData:
        return "template text";
      default:
        return "'" + t.text + "'";
    }
  }
  void expectOp(const char* op) {
    if (!isOp(op)) fail(cur().offset, std::string("expected '") + op + "', got " + describe(cur()));
    next();
  }
  std::string expectName(const char* what) {
    if (cur().type != Tok::kName) fail(cur().offset, std::string("expected ") + what + ", got " + describe(cur()));
    return next().text;
  }
  void expectBlockEnd() {
    if (cur().type != Tok::kBlockEnd) fail(cur().offset, "expected '%}', got " + describe(cur()));
    next();
  }

  struct DepthGuard {
    DepthGuard(int& d, size_t offset) : depth(d) {
      if (++depth > kMaxNesting) fail(offset, "template nested deeper than 64 levels");
    }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  // Statements until one of `ends` (a block tag name); its name is returned in end_tag ("" at EOF).
  Body parseBody(std::initializer_list<const char*> ends, std::string& end_tag) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (ends.size() != 0)
          fail(t.offset, std::string("unexpected end of template: missing '{% ") + *(ends.end() - 1) + " %}'");
        end_tag.clear();
        return body;
      }
      if (t.type == Tok::kData) {
        body.push_back(Node{Node::Kind::kData, t.offset, t.text, {}, {}, {}, {}, {}, {}, false});
        next();
      } else if (t.type == Tok::kVarBegin) {
        next();
        Node n{Node::Kind::kOutput, t.offset, {}, parseTuple(), {}, {}, {}, {}, {}, false};
        if (cur().type != Tok::kVarEnd) fail(cur().offset, "expected '}}', got " + describe(cur()));
        next();
        body.push_back(std::move(n));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& name = peek();
        if (name.type != Tok::kName) fail(name.offset, "expected a statement name after '{%', got " + describe(name));
        for (const char* e : ends)
          if (name.text == e) {
            end_tag = name.text;
            pos_ += 2;
            return body;
          }
        next();
        body.push_back(parseStatement());
      } else {
        fail(t.offset, "unexpected " + describe(t));
      }
    }
  }

  Node makeNode(Node::Kind kind, size_t offset) { return Node{kind, offset, {}, {}, {}, {}, {}, {}, {}, false}; }

  Node parseStatement() {
    const Token& t = next();  // the statement name
    DepthGuard guard(depth_, t.offset);
    const std::string& s = t.text;
    if (s == "if") return parseIf(t.offset);
    if (s == "for") return parseFor(t.offset);
    if (s == "set") return parseSet(t.offset);
    if (s == "macro") return parseMacro(t.offset);
    if (s == "break" || s == "continue") {
      if (loop_depth_ == 0) fail(t.offset, "'" + s + "' outside of a loop");
      expectBlockEnd();
      return makeNode(s == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, t.offset);
    }
    if (s == "elif" || s == "else" || s == "endif" || s == "endfor" || s == "endmacro" || s == "endset")
      fail(t.offset, "unexpected '{% " + s + " %}'");
    fail(t.offset, "unknown or unsupported tag '" + s + "'");
  }

  Node parseIf(size_t offset) {
    Node n = makeNode(Node::Kind::kIf, offset);
    n.conds.push_back(parseTuple());
    expectBlockEnd();
    while (true) {
      std::string end;
      n.bodies.push_back(parseBody({"elif", "else", "endif"}, end));
      if (end == "elif") {
        n.conds.push_back(parseTuple());
        expectBlockEnd();
      } else if (end == "else") {
        expectBlockEnd();
        n.bodies.push_back(parseBody({"endif"}, end));
        expectBlockEnd();
        return n;
      } else {
        expectBlockEnd();
        return n;
      }
    }
  }

  std::vector<std::string> parseTargets() {
    std::vector<std::string> targets;
    const bool paren = isOp("(");
    if (paren) next();
    do {
      targets.push_back(expectName("a variable name"));
    } while (isOp(",") && (next(), cur().type == Tok::kName));
    if (paren) expectOp(")");
    for (const auto& name : targets)
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None")
        fail(cur().offset, "cannot assign to '" + name + "'");
    return targets;
  }

  Node parseFor(size_t offset) {
    Node n = makeNode(Node::Kind::kFor, offset);
    n.targets = parseTargets();
    if (!isName("in")) fail(cur().offset, "expected 'in' in for loop, got " + describe(cur()));
    next();
    n.expr = parseTuple(/*with_condexpr=*/false);
    if (isName("if")) {
      next();
      n.cond = parseExpression();
    }
    if (isName("recursive")) fail(cur().offset, "recursive loops are not supported");
    expectBlockEnd();
    std::string end;
    ++loop_depth_;
    const bool outer_uses_loop = uses_loop_;
    uses_loop_ = false;
    n.bodies.push_back(parseBody({"else", "endfor"}, end));
    n.uses_loop = uses_loop_;
    uses_loop_ = outer_uses_loop;
    --loop_depth_;
    if (end == "else") {
      expectBlockEnd();
      const int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in a for's else belong to no loop
      n.bodies.push_back(parseBody({"endfor"}, end));
      loop_depth_ = saved;
    }
    expectBlockEnd();
    return n;
  }

  Node parseSet(size_t offset) {
    Node n = makeNode(Node::Kind::kSet, offset);
    if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
      n.targets.push_back(next().text);
      next();
      n.text = expectName("an attribute name");
    } else {
      n.targets = parseTargets();
    }
    if (isOp("=")) {
      next();
      n.expr = parseTuple();
      expectBlockEnd();
      return n;
    }
    if (n.targets.size() != 1 || !n.text.empty()) fail(cur().offset, "expected '=' in set, got " + describe(cur()));
    expectBlockEnd();
    n.kind = Node::Kind::kSetBlock;
    std::string end;
    const int saved = loop_depth_;
    loop_depth_ = 0;
    n.bodies.push_back(parseBody({"endset"}, end));
    loop_depth_ = saved;
    expectBlockEnd();
    return n;
  }

  Node parseMacro(size_t offset) {
    Node n = makeNode(Node::Kind::kMacro, offset);
    n.text = expectName("a macro name");
    expectOp("(");
    while (!isOp(")")) {
      if (!n.targets.empty()) expectOp(",");
      n.targets.push_back(expectName("a parameter name"));
      if (isOp("=")) {
        next();
        n.defaults.push_back(parseExpression());
      } else {
        n.defaults.push_back(nullptr);
      }
    }
    next();
    expectBlockEnd();
    std::string end;
    const int saved = loop_depth_;
    loop_depth_ = 0;
    n.bodies.push_back(parseBody({"endmacro"}, end));
    loop_depth_ = saved;
    if (cur().type == Tok::kName) next();  // {% endmacro name %}
    expectBlockEnd();
    return n;
  }

  // ----- expressions -----

  ExprPtr make(Expr::Kind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // An expression, or an implicit tuple "a, b" (as a list).
  ExprPtr parseTuple(bool with_condexpr = true) {
    const size_t offset = cur().offset;
    ExprPtr first = with_condexpr ? parseExpression() : parseOr();
    if (!isOp(",")) return first;
    ExprPtr tuple = make(Expr::Kind::kList, offset);
    tuple->negate = true;  // a tuple
    tuple->args.push_back(std::move(first));
    while (isOp(",")) {
      next();
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || isOp(")")) break;
      tuple->args.push_back(with_condexpr ? parseExpression() : parseOr());
    }
    return tuple;
  }

  ExprPtr parseExpression() {
    DepthGuard guard(depth_, cur().offset);
    ExprPtr e = parseOr();
    while (isName("if")) {
      const size_t offset = next().offset;
      ExprPtr c = make(Expr::Kind::kCondExpr, offset);
      c->args.push_back(std::move(e));
      c->args.push_back(parseOr());
      if (isName("else")) {
        next();
        c->args.push_back(parseExpression());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, size_t offset, ExprPtr a, ExprPtr b, std::string op = {}) {
    ExprPtr e = make(kind, offset);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parseOr() {
    ExprPtr e = parseAnd();
    while (isName("or")) {
      const size_t offset = next().offset;
      e = binary(Expr::Kind::kOr, offset, std::move(e), parseAnd());
    }
    return e;
  }

  ExprPtr parseAnd() {
    ExprPtr e = parseNot();
    while (isName("and")) {
      const size_t offset = next().offset;
      e = binary(Expr::Kind::kAnd, offset, std::move(e), parseNot());
    }
    return e;
  }

  ExprPtr parseNot() {
    if (isName("not")) {
      DepthGuard guard(depth_, cur().offset);
      ExprPtr e = make(Expr::Kind::kNot, next().offset);
      e->args.push_back(parseNot());
      return e;
    }
    return parseCompare();
  }

  ExprPtr parseCompare() {
    const size_t offset = cur().offset;
    ExprPtr first = parseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (isName("in")) {
        next();
        op = "in";
      } else if (isName("not") && peek().type == Tok::kName && peek().text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, offset);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parseMath1() {
    ExprPtr e = parseConcat();
    while (isOp("+") || isOp("-")) {
      const Token& t = next();
      e = binary(Expr::Kind::kBinary, t.offset, std::move(e), parseConcat(), t.text);
    }
    return e;
  }

  ExprPtr parseConcat() {
    ExprPtr e = parseMath2();
    while (isOp("~")) {
      const Token& t = next();
      e = binary(Expr::Kind::kBinary, t.offset, std::move(e), parseMath2(), "~");
    }
    return e;
  }

  ExprPtr parseMath2() {
    ExprPtr e = parsePow();
    while (isOp("*") || isOp("/") || isOp("//") || isOp("%")) {
      const Token& t = next();
      e = binary(Expr::Kind::kBinary, t.offset, std::move(e), parsePow(), t.text);
    }
    return e;
  }

  ExprPtr parsePow() {
    ExprPtr e = parseUnary(true);
    while (isOp("**")) {
      const Token& t = next();
      e = binary(Expr::Kind::kBinary, t.offset, std::move(e), parseUnary(true), "**");
    }
    return e;
  }

  ExprPtr parseUnary(bool with_filter) {
    ExprPtr e;
    if (isOp("-") || isOp("+")) {
      DepthGuard guard(depth_, cur().offset);
      const Token& t = next();
      e = make(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.offset);
      e->args.push_back(parseUnary(false));
    } else {
      e = parsePrimary();
    }
    e = parsePostfix(std::move(e));
    if (with_filter) e = parseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr parsePrimary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        next();
        ExprPtr e = make(Expr::Kind::kLiteral, t.offset);
        if (t.text == "true" || t.text == "True")
          e->literal = Value(true);
        else if (t.text == "false" || t.text == "False")
          e->literal = Value(false);
        else if (t.text == "none" || t.text == "None")
          e->literal = Value::none();
        else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
          if (t.text == "loop") uses_loop_ = true;
        }
        return e;
      }
      case Tok::kString: {
        ExprPtr e = make(Expr::Kind::kLiteral, t.offset);
        std::string s;
        while (cur().type == Tok::kString) s += next().text;  // adjacent literals concatenate
        e->literal = Value(std::move(s));
        return e;
      }
      case Tok::kInt: {
        next();
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail(t.offset, "integer literal " + t.text + " does not fit in 64 bits");
        ExprPtr e = make(Expr::Kind::kLiteral, t.offset);
        e->literal = Value(v);
        return e;
      }
      case Tok::kFloat: {
        next();
        ExprPtr e = make(Expr::Kind::kLiteral, t.offset);
        e->literal = Value(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          next();
          if (isOp(")")) {  // empty tuple
            next();
            ExprPtr e = make(Expr::Kind::kList, t.offset);
            e->negate = true;
            return e;
          }
          ExprPtr e = parseTuple();
          expectOp(")");
          return e;
        }
        if (t.text == "[") {
          next();
          ExprPtr e = make(Expr::Kind::kList, t.offset);
          while (!isOp("]")) {
            if (!e->args.empty()) {
              expectOp(",");
              if (isOp("]")) break;
            }
            e->args.push_back(parseExpression());
          }
          next();
          return e;
        }
        if (t.text == "{") {
          next();
          ExprPtr e = make(Expr::Kind::kDict, t.offset);
          while (!isOp("}")) {
            if (!e->args.empty()) {
              expectOp(",");
              if (isOp("}")) break;
            }
            e->args.push_back(parseExpression());
            expectOp(":");
            e->args.push_back(parseExpression());
          }
          next();
          return e;
        }
        break;
      default:
        break;
    }
    fail(t.offset, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr parsePostfix(ExprPtr e) {
    while (true) {
      if (isOp(".")) {
        const size_t offset = next().offset;
        if (cur().type == Tok::kInt) {
          ExprPtr item = make(Expr::Kind::kGetItem, offset);
          ExprPtr key = make(Expr::Kind::kLiteral, cur().offset);
          const Token& digits = next();
          int64_t index = 0;
          const auto r = std::from_chars(digits.text.data(), digits.text.data() + digits.text.size(), index);
          if (r.ec != std::errc()) fail(digits.offset, "integer " + digits.text + " does not fit in 64 bits");
          key->literal = Value(index);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(key));
          e = std::move(item);
          continue;
        }
        ExprPtr a = make(Expr::Kind::kGetAttr, offset);
        a->name = expectName("an attribute name");
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (isOp("[")) {
        e = parseSubscript(std::move(e));
      } else if (isOp("(")) {
        ExprPtr call = make(Expr::Kind::kCall, e->offset);
        call->args.push_back(std::move(e));
        parseCallArgs(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parseSubscript(ExprPtr obj) {
    const size_t offset = next().offset;  // '['
    ExprPtr parts[3];
    int colons = 0;
    while (!isOp("]")) {
      if (isOp(":")) {
        if (++colons > 2) fail(cur().offset, "too many ':' in slice");
        next();
        continue;
      }
      if (parts[colons]) fail(cur().offset, "expected ']', got " + describe(cur()));
      parts[colons] = parseExpression();
    }
    next();
    if (colons == 0) {
      if (!parts[0]) fail(offset, "empty subscript");
      ExprPtr e = make(Expr::Kind::kGetItem, offset);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    ExprPtr e = make(Expr::Kind::kSlice, offset);
    e->args.push_back(std::move(obj));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // "(" args ")" into e.args (after what is there) and e.kwargs.
  void parseCallArgs(Expr& e) {
    expectOp("(");
    bool first = true;
    while (!isOp(")")) {
      if (!first) {
        expectOp(",");
        if (isOp(")")) break;
      }
      first = false;
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parseExpression());
      } else {
        if (!e.kwargs.empty()) fail(cur().offset, "positional argument after keyword argument");
        e.args.push_back(parseExpression());
      }
    }
    next();
  }

  std::string dottedName() {
    std::string name = expectName("a filter or test name");
    while (isOp(".") && peek().type == Tok::kName) {
      next();
      name += "." + next().text;
    }
    return name;
  }

  ExprPtr parseFilterExpr(ExprPtr e) {
    while (true) {
      if (isOp("|")) {
        const size_t offset = next().offset;
        ExprPtr f = make(Expr::Kind::kFilter, offset);
        f->name = dottedName();
        if (!findFilter(f->name)) fail(offset, "no filter named '" + f->name + "'");
        f->args.push_back(std::move(e));
        if (isOp("(")) parseCallArgs(*f);
        e = std::move(f);
      } else if (isName("is")) {
        const size_t offset = next().offset;
        ExprPtr t = make(Expr::Kind::kTest, offset);
        if (isName("not")) {
          next();
          t->negate = true;
        }
        t->name = dottedName();
        if (!findTest(t->name)) fail(offset, "no test named '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (isOp("(")) {
          parseCallArgs(*t);
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                    cur().type == Tok::kFloat || isOp("(") || isOp("[") || isOp("{")) &&
                   !isName("else") && !isName("or") && !isName("and")) {
          if (isName("is")) fail(cur().offset, "you cannot chain multiple tests with is");
          t->args.push_back(parsePostfix(parsePrimary()));  // `x is divisibleby 3`
        }
        e = std::move(t);
      } else if (isOp("(")) {
        ExprPtr call = make(Expr::Kind::kCall, e->offset);
        call->args.push_back(std::move(e));
        parseCallArgs(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  bool uses_loop_ = false;  // the for body being parsed names `loop`
};

}  // namespace

std::unique_ptr<Program> parseProgram(std::string source) {
  auto program = std::make_unique<Program>();
  program->source = std::move(source);
  Parser parser(Lexer(program->source).run());
  program->body = parser.parseTemplate();
  return program;
}

}  // namespace minfer::chat::detail
