// Chat templates (runtime/chat): every case of fixtures/chat_templates byte for byte, the expression
// language against values computed by hand, and malformed templates refused with their position.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "minfer/chat_template.h"
#include "tests/test_support.h"

namespace {

using minfer::chat::ChatInputs;
using minfer::chat::ChatTemplate;
using minfer::chat::Value;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open " << path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 2026-01-15 09:30:00, the time the fixtures were rendered at.
std::tm fixtureClock() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 0;
  tm.tm_mday = 15;
  tm.tm_hour = 9;
  tm.tm_min = 30;
  tm.tm_wday = 4;  // Thursday
  tm.tm_yday = 14;
  return tm;
}

}  // namespace

TEST_CASE("every fixture case renders byte for byte or fails with the expected message") {
  if (!minfer::test::haveFixtures()) return;
  const std::string dir = minfer::test::fixturesDir() + "/chat_templates";
  const auto index = nlohmann::ordered_json::parse(readText(dir + "/index.json"));
  int passed = 0, total = 0;
  for (const auto& c : index["cases"]) {
    const std::string name = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>();
    CAPTURE(name);
    ++total;
    auto tmpl = ChatTemplate::parse(readText(dir + "/templates/" + c["template"].get<std::string>() + ".jinja"));
    REQUIRE_MESSAGE(tmpl.isOk(), tmpl.status().message());
    const auto& conv = index["conversations"][c["conversation"].get<std::string>()];
    ChatInputs in;
    auto messages = Value::fromJson(conv["messages"].dump());
    REQUIRE(messages.isOk());
    in.messages = *messages;
    in.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
    in.bos_token = c["bos_token"].get<std::string>();
    in.eos_token = c["eos_token"].get<std::string>();
    in.now = fixtureClock;
    const auto out = tmpl->render(in);
    if (c.contains("expected")) {
      CHECK_MESSAGE(out.isOk(), (out.isOk() ? "" : out.status().message()));
      if (!out.isOk()) continue;
      const std::string expected = readText(dir + "/" + c["expected"].get<std::string>());
      CHECK(*out == expected);
      if (*out == expected) ++passed;
    } else {
      const std::string error = c["error"].get<std::string>();
      REQUIRE_FALSE(out.isOk());
      CHECK_MESSAGE(out.status().message().find(error) != std::string::npos, out.status().message());
      if (out.status().message().find(error) != std::string::npos) ++passed;
    }
  }
  MESSAGE(passed << " of " << total << " fixture cases pass");
  CHECK(total == 96);
  CHECK(passed == total);
}

// ----- the expression language, with values worked out by hand (and checked against jinja2 3.1.6) -----

namespace {

// Renders `source` with the variables of the JSON object `vars`; fails the test on an error.
std::string render(std::string_view source, std::string_view vars = "{}") {
  auto tmpl = ChatTemplate::parse(source);
  REQUIRE_MESSAGE(tmpl.isOk(), tmpl.status().message());
  auto values = Value::fromJson(vars);
  REQUIRE_MESSAGE(values.isOk(), values.status().message());
  ChatInputs in;
  in.messages = Value::list();
  for (const auto& [k, v] : values->asDict()) in.extra.emplace_back(k, v);
  in.now = fixtureClock;
  auto out = tmpl->render(in);
  REQUIRE_MESSAGE(out.isOk(), out.status().message());
  return *out;
}

// The error message of parsing or rendering `source` ("" when both succeed).
std::string errorOf(std::string_view source, std::string_view vars = "{}") {
  auto tmpl = ChatTemplate::parse(source);
  if (!tmpl.isOk()) return tmpl.status().message();
  ChatInputs in;
  const Value values = *Value::fromJson(vars);
  for (const auto& [k, v] : values.asDict()) in.extra.emplace_back(k, v);
  auto out = tmpl->render(in);
  return out.isOk() ? std::string() : out.status().message();
}

}  // namespace

TEST_CASE("arithmetic, comparison and logic follow Python") {
  CHECK(render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}|{{ "
               "6 / 2 }}") == "7|9|3|-4|2|1024|3.5|3.0");
  // '~' binds tighter than '+' and looser than '*' (jinja2's parse_math1 > parse_concat > parse_math2).
  CHECK(render("{{ 2 ** 3 ** 2 }}|{{ 10 - 2 - 3 }}|{{ 2 * 3 ~ 4 }}|{{ (1 + 2) ~ 3 }}|{{ 'a' ~ (2 + 3) }}") ==
        "64|5|64|33|a5");
  CHECK(errorOf("{{ 1 + 2 ~ 3 }}").find("unsupported operand type(s) for +: 'int' and 'str'") != std::string::npos);
  CHECK(render("{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 2.5e-7 }}|{{ 1.5 + 1 }}") ==
        "0.30000000000000004|1e+16|1000000000000000.0|1e-05|0.0001|2.5e-07|2.5");
  CHECK(render("{{ 'a' ~ 1 ~ none ~ true ~ [1, 'x'] ~ {'k': none} }}") == "a1NoneTrue[1, 'x']{'k': None}");
  CHECK(render("{{ 'ab' * 3 }}{{ [0] * 2 }}{{ [1] + [2] }}{{ (1, 2) }}{{ (1,) }}") == "ababab[0, 0][1, 2](1, 2)(1,)");
  CHECK(render("{{ 1 == 1.0 }}{{ true == 1 }}{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}{{ x == y }}{{ x == none }}") ==
        "TrueTrueTrueTrueFalse");
  CHECK(render("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}") == "TrueFalseTrueTrue");
  CHECK(render("{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 1 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'x' in nothing }}") ==
        "TrueTrueTrueTrueFalse");
  CHECK(render("{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ '' and 'y' }}|{{ not '' }}|{{ not 1 in [2] }}") == "x|y||True|True");
  CHECK(
      render("{{ 'y' if 1 else 'n' }}|{{ 'y' if 0 else 'n' }}|{{ 'y' if 0 }}|{{ 'a' if 0 else 'b' if 1 else 'c' }}") ==
      "y|n||b");
}

TEST_CASE("literals: strings with escapes, adjacent strings, numbers, none/true/false in both cases") {
  CHECK(render(R"({{ "\u00e9\x41\101\d" }}|{{ 'a' 'b' }}|{{ 1_000 }}|{{ true }}{{ True }}{{ none }}{{ None }})") ==
        "éAA\\d|ab|1000|TrueTrueNoneNone");
  CHECK(render(R"({{ ['it\'s', "q\""] }}|{{ "it's" }})") == R"(["it's", 'q"']|it's)");
}

TEST_CASE("undefined values print empty, are falsy, and fail when used further") {
  CHECK(render("[{{ foo }}]{{ foo is defined }}{{ foo is undefined }}{{ foo | default('d') }}{{ foo | length }}") ==
        "[]FalseTrued0");
  CHECK(render("[{{ d.missing }}]{{ d.missing is defined }}{{ d.a }}{{ d['a'] }}[{{ l[5] }}]{{ l[-1] }}[{{ none.x }}]",
               R"({"d": {"a": 1}, "l": [1, 2, 3]})") == "[]False11[]3[]");
  CHECK(errorOf("{{ foo.bar }}").find("'foo' is undefined") != std::string::npos);
  CHECK(errorOf("{{ d.missing.x }}", R"({"d": {}})").find("'dict object' has no attribute 'missing'") !=
        std::string::npos);
  CHECK(errorOf("{{ l[3].y }}", R"({"l": [1]})").find("list object has no element 3") != std::string::npos);
  CHECK(errorOf("{{ foo + 1 }}").find("'foo' is undefined") != std::string::npos);
  CHECK(errorOf("{{ foo|tojson }}").find("Object of type Undefined is not JSON serializable") != std::string::npos);
}

TEST_CASE("Python type errors are reported, not guessed around") {
  CHECK(errorOf("{{ 'a' + 1 }}").find("can only concatenate str (not \"int\") to str") != std::string::npos);
  CHECK(errorOf("{{ 1 < 'a' }}").find("'<' not supported between instances of 'int' and 'str'") != std::string::npos);
  CHECK(errorOf("{{ 1 / 0 }}").find("division by zero") != std::string::npos);
  CHECK(errorOf("{{ 'x' * 'y' }}").find("can't multiply sequence by non-int of type 'str'") != std::string::npos);
  CHECK(errorOf("{{ [1].append(2) }}").find("access to attribute 'append' of 'list' object is unsafe.") !=
        std::string::npos);
  CHECK(errorOf("{{ 9223372036854775807 + 1 }}").find("integer overflow") != std::string::npos);
  CHECK(errorOf("{% for x in none %}{% endfor %}").find("'NoneType' object is not iterable") != std::string::npos);
}

TEST_CASE("subscripts and slices count code points") {
  CHECK(
      render("{{ 'abc'[::-1] }}|{{ 'abcdef'[1:] }}|{{ 'abcdef'[:-2] }}|{{ 'abcdef'[1:5:2] }}|{{ [1,2,3,4][::-2] }}") ==
      "cba|bcdef|abcd|bd|[4, 2]");
  CHECK(render("{{ 'héllo'[1] }}|{{ 'héllo'[-4:-1] }}|{{ 'héllo'|length }}|{{ [1,2,3,4][3:0:-1] }}|{{ l.1.a }}",
               R"({"l": [7, {"a": 8}]})") == "é|éll|5|[4, 3, 2]|8");
}

TEST_CASE("string methods and filters") {
  CHECK(
      render(
          "{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hi'|upper }}{{ 'Hi'|lower }}|{{ 'hello wORLD'|capitalize }}|"
          "{{ 'hello wORLD foo'|title }}") == "x|hi|HIhi|Hello world|Hello World Foo");
  CHECK(
      render(
          "{{ 'a-b-c'.split('-') }}|{{ ' a  b '.split() }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}") ==
      "['a', 'b', 'c']|['a', 'b']|['a', 'b-c']|['a-b', 'c']");
  CHECK(
      render("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}|{{ '  hi\\n'.strip() }}|"
             "{{ 'xxhi'.lstrip('x') }}|{{ 'hi\\n\\n'.rstrip('\\n') }}|{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}|"
             "{{ ', '.join(['a', 'b']) }}|{{ 'aaa'.replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}") ==
      "TrueTrue|hi|hi|hi|22|a, b|bbb|bba");
  // Qwen3's and GLM's reasoning split.
  CHECK(render("{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ "
               "c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
               R"({"c": "<think>\nreason\n</think>\n\nanswer"})") == "answer|reason");
  CHECK(render("{{ [1,2,3]|length }}|{{ {'a':1}|length }}|{{ [3,1,2]|first }}{{ [3,1,2]|last }}|{{ 'abc'|list }}|"
               "{{ [1,2,3]|join(', ') }}|{{ u|join(', ', attribute='n') }}",
               R"({"u": [{"n": "a"}, {"n": "b"}]})") == "3|1|32|['a', 'b', 'c']|1, 2, 3|a, b");
  CHECK(
      render(
          "{{ '42'|int + 1 }}{{ '3.7'|int }}{{ 'x'|int }}{{ 'x'|int(5) }}{{ 3.9|int }}|{{ '2.5'|float }}|{{ -3|abs }}|"
          "{{ 2.567|round(2) }}|{{ 1|string ~ [1]|string }}|{{ x|e }}",
          R"({"x": "<a&'\">"})") == "433053|2.5|3|2.57|1[1]|&lt;a&amp;&#39;&#34;&gt;");
  CHECK(render("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}") == "a\n    b\n\n    c|  a\n  b");
  CHECK(
      render("{{ [3,1,2]|sort }}{{ ['b','A','c']|sort }}{{ [1,2,3]|reverse|list }}{{ 'abc'|reverse }}{{ [1,5,2]|max }}"
             "{{ [1,2,3]|sum }}{{ range(5, 0, -2)|list }}{{ [1,2,3]|batch(2)|list }}") ==
      "[1, 2, 3]['A', 'b', 'c'][3, 2, 1]cba56[5, 3, 1][[1, 2], [3]]");
  CHECK(render("{{ '%s and %d' % ('a', 3) }}|{{ '%05.2f' % 3.14159 }}|{{ '%s-%s'|format(1, 2) }}") ==
        "a and 3|03.14|1-2");
}

TEST_CASE("case mapping follows Python beyond ASCII; jinja2's title filter is not str.title") {
  CHECK(render(
            "{{ 'é'|upper }}|{{ 'ÉA'|lower }}|{{ 'straße'|upper }}|{{ 'ΣΊΣΥΦΟΣ ΟΔΟΣ'|lower }}|{{ 'привет мир'|upper }}|"
            "{{ 'łódź ÿ ı'|upper }}") == "É|éa|STRASSE|σίσυφος οδος|ПРИВЕТ МИР|ŁÓDŹ Ÿ I");
  CHECK(render("{{ 'hello-world (foo) [bar]'|title }}|{{ \"they're\"|title }}|{{ \"they're\".title() }}|"
               "{{ 'ÉCOLE normale'|capitalize }}") == "Hello-World (Foo) [Bar]|They're|They'Re|École normale");
}

// Findings of a local libFuzzer run (TESTING.md §5), kept as regressions.
TEST_CASE("fuzz regressions: numbers that do not fit, non-integer operands of integer tests") {
  // std::stoll threw out of the renderer (std::terminate) on an attribute index past int64.
  CHECK(errorOf("{{ x.99999999999999999999 }}") ==
        "chat template 1:6: integer 99999999999999999999 does not fit in 64 bits");
  CHECK(render("{{ [{'a': 1}]|selectattr('99999999999999999999')|list }}") == "[]");
  // Floats where ints are usual: Python's semantics, not an exception.
  CHECK(render("{{ 9.0 is divisibleby 3 }}{{ 3.5 is even }}{{ 4.0 is even }}{{ (-9223372036854775807 - 1) is "
               "divisibleby(-1) }}"
               "{{ 2.5|round(1) }}") == "TrueFalseTrueTrue2.5");
  CHECK(errorOf("{{ 'a b c'.split(' ', 1.0) }}").find("'float' object cannot be interpreted as an integer") !=
        std::string::npos);
  CHECK(errorOf("{{ (-9223372036854775807 - 1)|abs }}").find("integer overflow") != std::string::npos);
  CHECK(errorOf("{{ [9223372036854775807, 1]|sum }}").find("integer overflow") != std::string::npos);
  CHECK(errorOf("{{ 1.5|round('x') }}").find("precision must be an integer") != std::string::npos);
}

TEST_CASE("selectattr, rejectattr, map, items and dict methods") {
  const char* vars =
      R"({"l": [{"role": "user", "c": 1}, {"role": "assistant", "c": 2, "x": true}, {"role": "user", "c": 3}],
                         "d": {"b": 1, "a": 2}})";
  CHECK(
      render(
          "{{ l|selectattr('role', 'equalto', 'user')|list|length }}|{{ l|rejectattr('role', 'equalto', 'user')|"
          "map(attribute='c')|join(',') }}|{{ l|selectattr('x')|map(attribute='c')|list }}|"
          "{{ l|map(attribute='role')|unique|list }}|{{ [1,2,3,4]|select('odd')|list }}|{{ ['a']|map('upper')|list }}",
          vars) == "2|2|[2]|['user', 'assistant']|[1, 3]|['A']");
  CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{{ "
               "d|items|list }}|"
               "{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}|{{ d.keys()|list }}{{ d.values()|list }}",
               vars) == "b=1;a=2;|ba|[('b', 1), ('a', 2)]|2None5|['b', 'a'][1, 2]");
}

TEST_CASE("tests (is ...)") {
  CHECK(
      render(
          "{{ x is string }}{{ x is number }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}"
          "{{ none is none }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 1 is iterable }}",
          R"({"x": "s"})") == "TrueFalseTrueTrueTrueTrueTrueTrueFalseTrueFalse");
  CHECK(render(
            "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}"
            "{{ 9 is divisibleby(4) }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 'a' is in 'abc' }}{{ x is not none }}",
            R"({"x": "s"})") == "TrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrue");
}

TEST_CASE("statements: for with loop variables, filter, else, break/continue; set and namespace scoping; macros") {
  CHECK(
      render("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
             "{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
             R"({"l": ["a", "b"]})") == "1021TrueFalse2[|b]2110FalseTrue2[a|]");
  CHECK(render("{% for x in l if x != 'b' %}{{ loop.index }}{{ x }}{{ loop.length }}{% endfor %}",
               R"({"l": ["a", "b", "c"]})") == "1a22c2");
  CHECK(
      render(
          "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}"
          "{{ x }}{% endfor %}|{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}") ==
      "empty|13|1");
  CHECK(render("{% for x in [1,2] %}{{ loop.cycle('odd', 'even') }}{% endfor %}") == "oddeven");
  // A for body is a new scope per iteration: `set` inside does not leak; namespaces carry state out.
  CHECK(render("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}") == "12121");
  CHECK(render("{% set ns = namespace(a=1, b='x') %}{% for i in [1,2,3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a "
               "}}{{ ns.b }}") == "7x");
  CHECK(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c + d }}{% set s %}in {{ 1 + 1 }}{% "
               "endset %}[{{ s }}]") == "127[in 2]");
  CHECK(render("{% macro m(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, "
               "c=3) }}|"
               "{{ 'x' + m('y') }}") == "1-B-None|1-2-None|1-B-3|xy-B-None");
  CHECK(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}") == "54321");
  CHECK(render("{% macro f() %}{{ g }}{% endmacro %}{% set g = 'top' %}{{ f() }}") == "top");
  CHECK(errorOf("{% set x = 5 %}{% set x.y = 1 %}").find("cannot assign attribute on non-namespace object") !=
        std::string::npos);
  CHECK(errorOf("{% set a, b = [1, 2, 3] %}").find("too many values to unpack (expected 2)") != std::string::npos);
  CHECK(errorOf("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("takes not more than 1 argument(s)") !=
        std::string::npos);
}

TEST_CASE("whitespace control: trim_blocks, lstrip_blocks, '-' and '+' markers, comments, raw") {
  CHECK(render("a\n  {% if true %}\n  b\n  {% endif %}\nc") == "a\n  b\nc");
  CHECK(render("a  {% if true %}b{% endif %}  c\n") == "a  b  c");  // not at line start: kept; last "\n" dropped
  CHECK(render("  {{ 'x' }}  \n  {% if 1 %}y{% endif %}") == "  x  \ny");
  CHECK(render("{% if 1 -%}   \n\n  x  {%- endif %}  \n") == "x  ");
  CHECK(render("a\n{#- comment -#}\n  b\n  {# c #}\nd\n\n") == "ab\nd\n");
  CHECK(render("x {%+ if 1 %}y{% endif +%}\nz") == "x y\nz");
  CHECK(render("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n") == "  1\n  2\n");
  CHECK(render("a\r\nb\r\n{% if 1 %}\r\nc\r\n{% endif %}\r\n") == "a\nb\nc\n");
  CHECK(render("{{- ' a ' -}}   \n  {{- 'b' }}|{{ {'a': {'b': 1}} }}") == " a b|{'a': {'b': 1}}");
  CHECK(render("{% raw %}{{ x }}{% endraw %}") == "{{ x }}");
}

TEST_CASE("tojson is transformers' json.dumps(ensure_ascii=False)") {
  const char* vars = R"({"d": {"name": "f", "p": {"type": ["string", null], "n": 1.0, "e": [], "o": {}}}})";
  CHECK(render("{{ d|tojson }}", vars) ==
        R"({"name": "f", "p": {"type": ["string", null], "n": 1.0, "e": [], "o": {}}})");
  CHECK(render("{{ d|tojson(indent=2) }}", vars) ==
        "{\n  \"name\": \"f\",\n  \"p\": {\n    \"type\": [\n      \"string\",\n      null\n    ],\n    \"n\": 1.0,\n"
        "    \"e\": [],\n    \"o\": {}\n  }\n}");
  CHECK(render(R"({{ 'é\u2028"\\\n\t\x01'|tojson }})") == "\"é\u2028\\\"\\\\\\n\\t\\u0001\"");
  CHECK(render(R"({{ 'é😀'|tojson(ensure_ascii=true) }}|{{ {'b':1,'a':2}|tojson(sort_keys=true) }})") ==
        "\"\\u00e9\\ud83d\\ude00\"|{\"a\": 2, \"b\": 1}");
}

TEST_CASE("globals: raise_exception, strftime_now (injectable clock, local time by default), range, namespace, dict") {
  CHECK(render("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%B %d, %Y') }}|{{ strftime_now('%d %b %Y %H:%M') }}") ==
        "2026-01-15|January 15, 2026|15 Jan 2026 09:30");
  {
    auto tmpl = ChatTemplate::parse("{{ strftime_now('%Y') }}");
    REQUIRE(tmpl.isOk());
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    CHECK(*tmpl->render(ChatInputs{}) == std::to_string(tm.tm_year + 1900));
  }
  CHECK(render("{{ range(5, 0, -2)|list }}{{ range(0, 5, 2)|list }}{{ range(3, 3)|list }}{{ range(9223372036854775807 "
               "- 1, 9223372036854775807)|list }}") == "[5, 3, 1][0, 2, 4][][9223372036854775806]");
  CHECK(render("{{ range(3)|list }}{{ range(1, 4)|list }}{{ dict(a=1) }}{{ namespace(x=1).x }}") ==
        "[0, 1, 2][1, 2, 3]{'a': 1}1");
  CHECK(errorOf("\n  {{ raise_exception('boom ' ~ 1) }}") == "chat template 2:6: boom 1");
}

TEST_CASE("malformed templates are refused with line:column and what is wrong") {
  CHECK(errorOf("{% if x %}a") == "chat template 1:12: unexpected end of template: missing '{% endif %}'");
  CHECK(errorOf("{% for x in y %}") == "chat template 1:17: unexpected end of template: missing '{% endfor %}'");
  CHECK(errorOf("a\n{{ x ") == "chat template 2:1: unclosed tag: expected '}}' before the end of the template");
  CHECK(errorOf("{# unclosed") == "chat template 1:1: missing end of comment tag '#}'");
  CHECK(errorOf("{{ x | nosuch }}") == "chat template 1:6: no filter named 'nosuch'");
  CHECK(errorOf("{{ x is nosuch }}") == "chat template 1:6: no test named 'nosuch'");
  CHECK(errorOf("{{ (1 + }}") == "chat template 1:9: unexpected '}', expected ')'");
  CHECK(errorOf("{% endif %}") == "chat template 1:4: unexpected '{% endif %}'");
  CHECK(errorOf("{% include 'x' %}") == "chat template 1:4: unknown or unsupported tag 'include'");
  CHECK(errorOf("{{ 'abc }}") == "chat template 1:4: unterminated string literal");
  CHECK(errorOf("{% break %}") == "chat template 1:4: 'break' outside of a loop");
  CHECK(errorOf("{{ a b }}") == "chat template 1:6: expected '}}', got 'b'");
  CHECK(errorOf(std::string("{{ \x01 }}")) == "chat template 1:4: unexpected character '\\x01' in tag");
}

TEST_CASE("nesting and recursion are bounded (no stack exhaustion)") {
  const auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  CHECK(errorOf("{{ " + repeat("(", 10000) + "1" + repeat(")", 10000) + " }}").find("brackets nested deeper than 64") !=
        std::string::npos);
  CHECK(errorOf("{{ " + repeat("not ", 10000) + "1 }}").find("nested deeper than 64") != std::string::npos);
  CHECK(errorOf("{{ " + repeat("-", 10000) + "1 }}").find("nested deeper than 64") != std::string::npos);
  CHECK(errorOf(repeat("{% if 1 %}", 10000) + repeat("{% endif %}", 10000)).find("nested deeper than 64") !=
        std::string::npos);
  CHECK(errorOf("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("macro 'f': calls nested deeper than 64") !=
        std::string::npos);
  CHECK(render(repeat("(", 30) + "{{ " + repeat("(", 30) + "1" + repeat(")", 30) + " }}") == repeat("(", 30) + "1");
  // Blocks inside recursive macros: bounded as a whole, not only per macro level.
  CHECK(errorOf("{% macro f() %}" + repeat("{% if 1 %}", 50) + "{{ f() }}" + repeat("{% endif %}", 50) +
                "{% endmacro %}{{ f() }}")
            .find("blocks and macro calls nested deeper than 256") != std::string::npos);
  // Values a template builds: deep lists are refused, namespace cycles and chains print and free safely.
  CHECK(errorOf("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}")
            .find("lists and dicts nested deeper than 256") != std::string::npos);
  CHECK(errorOf("{% set ns = namespace(x=[1]) %}{% for i in range(1000) %}{% set ns.x = ns.x|batch(1) %}{% endfor %}")
            .find("lists and dicts nested deeper than 256") != std::string::npos);
  CHECK(render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}") ==
        "<Namespace {'a': 1, 'me': <Namespace {...}>}>");
  CHECK(
      render(
          "{% set ns = namespace(x=none) %}{% for i in range(50000) %}{% set ns.x = namespace(prev=ns.x) %}{% endfor %}"
          "done") == "done");
  CHECK(Value::fromJson(repeat("[", 100000) + repeat("]", 100000)).status().message().find("nested deeper than 512") !=
        std::string::npos);
  CHECK(errorOf("{{ range(100000000)|length }}").find("range() longer than 1048576 elements") != std::string::npos);
  CHECK(errorOf("{{ 'x' * 100000000000 }}").find("larger than 64 MiB") != std::string::npos);
}

TEST_CASE("Value: JSON keeps key order; Python str/repr/==") {
  auto v = Value::fromJson(R"({"z": 1, "a": [1.5, "x", null, true], "m": {}})");
  REQUIRE(v.isOk());
  REQUIRE(v->asDict().size() == 3);
  CHECK(v->asDict()[0].first == "z");
  CHECK(v->str() == "{'z': 1, 'a': [1.5, 'x', None, True], 'm': {}}");
  CHECK(*v == *Value::fromJson(R"({"m": {}, "a": [1.5, "x", null, true], "z": 1.0})"));
  CHECK_FALSE(Value::fromJson("{\"a\": ").isOk());
  CHECK(Value::fromJson("{\"a\": ").status().message().find("JSON") == 0);
  CHECK(Value().str().empty());
  CHECK_FALSE(Value().truthy());
  CHECK(Value(int64_t{3}) == Value(3.0));
}

TEST_CASE("corrupted real templates fail cleanly (deterministic mutations of every fixture template)") {
  if (!minfer::test::haveFixtures()) return;
  const std::string dir = minfer::test::fixturesDir() + "/chat_templates";
  const auto index = nlohmann::ordered_json::parse(readText(dir + "/index.json"));
  ChatInputs in;
  in.messages = *Value::fromJson(index["conversations"]["multi_turn"]["messages"].dump());
  in.add_generation_prompt = true;
  in.now = fixtureClock;
  static const char* const kSnippets[] = {"{%", "%}", "{{", "}}", "{#",           "#}",          "-",    "(",
                                          ")",  "[",  "]",  "'",  "\"",           "\\",          " if ", " for ",
                                          "|",  ".",  ",",  "\n", "{% endfor %}", "{% endif %}", "\xff"};
  uint64_t state = 0x9E3779B97F4A7C15ull;  // xorshift64: the same mutations on every run
  auto next = [&](uint64_t bound) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return bound ? state % bound : 0;
  };
  int parsed = 0, rendered = 0, total = 0;
  std::string last_template;
  for (const auto& c : index["cases"]) {
    const std::string name = c["template"].get<std::string>();
    if (name == last_template) continue;
    last_template = name;
    const std::string source = readText(dir + "/templates/" + name + ".jinja");
    for (int m = 0; m < 120; ++m) {
      std::string s = source;
      for (int k = 1 + static_cast<int>(next(3)); k > 0; --k) {
        const size_t at = next(s.size() + 1);
        switch (next(4)) {
          case 0:
            s.erase(at, next(16));
            break;  // delete a run
          case 1:
            s.insert(at, kSnippets[next(std::size(kSnippets))]);
            break;  // insert syntax
          case 2:
            s.insert(at, s.substr(next(s.size() + 1), next(64)));
            break;  // duplicate a run
          default:
            s.resize(at);
            break;  // truncate
        }
      }
      ++total;
      auto tmpl = ChatTemplate::parse(s);
      if (!tmpl.isOk()) {
        CHECK(tmpl.status().message().rfind("chat template ", 0) == 0);
        continue;
      }
      ++parsed;
      auto out = tmpl->render(in);
      if (out.isOk())
        ++rendered;
      else
        CHECK(out.status().message().rfind("chat template ", 0) == 0);
    }
  }
  MESSAGE(total << " mutated templates: " << parsed << " parsed, " << rendered
                << " rendered, the rest refused with a message");
  CHECK(total == 16 * 120);
}

TEST_CASE("minfer-chat-template renders a template file for a messages file") {
  const std::string dir = minfer::test::scratchDir();
  std::ofstream(dir + "/t.jinja") << "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                                     "{% if add_generation_prompt %}[assistant:{% endif %}{{ extra }}"
                                     "{% if messages|length > 2 %}{{ raise_exception('too long') }}{% endif %}\n";
  std::ofstream(dir + "/list.json") << R"([{"role": "user", "content": "Hi"}])";
  std::ofstream(dir + "/object.json") << R"({"messages": [{"role": "user", "content": "Hé"}], )"
                                         R"("bos_token": "<s>", "extra": "!", "add_generation_prompt": true})";
  std::ofstream(dir + "/long.json") << R"([{"role": "user", "content": "1"}, {"role": "user", "content": "2"},
                                          {"role": "user", "content": "3"}])";
  // Runs the tool; returns its stdout (stderr appended after "\n--stderr--\n") and sets the exit status.
  auto run = [&](const std::string& args, int& status) {
    const std::string cmd = std::string(MINFER_CHAT_TEMPLATE_TOOL) + " " + args + " 2>" + dir + "/err";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = ::pclose(p);
    status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    return out + (status ? "\n--stderr--\n" + readText(dir + "/err") : "");
  };
  int status = 0;
  CHECK(run(dir + "/t.jinja " + dir + "/list.json", status) == "[user:Hi]");  // trailing newline dropped
  CHECK(status == 0);
  CHECK(run(dir + "/t.jinja " + dir + "/object.json", status) == "<s>[user:Hé][assistant:!");
  CHECK(run(dir + "/t.jinja " + dir + "/list.json --add-generation-prompt --bos '<B>'", status) ==
        "<B>[user:Hi][assistant:");
  CHECK(status == 0);
  const std::string error = run(dir + "/t.jinja " + dir + "/long.json", status);
  CHECK(status == 1);
  CHECK(error.find("t.jinja: chat template 1:175: too long") != std::string::npos);
  run(dir + "/missing.jinja " + dir + "/list.json", status);
  CHECK(status == 1);
}
