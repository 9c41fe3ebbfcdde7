// Strings from files cannot drive the terminal: minfer-inspect (GGUF and artifact, text and JSON) and
// the error messages of minfer-inspect and minfer-compile show ESC sequences, C1 controls and
// ill-formed UTF-8 escaped; escapeForTerminal's rules one by one.
#include <doctest/doctest.h>

#include <filesystem>

#include "llvm/Support/JSON.h"
#include "runtime/util/terminal_text.h"
#include "tests/faults/fault_support.h"
#include "tests/test_support.h"

using minfer::test::ChildResult;
using minfer::test::TinyGgufSpec;
using minfer::util::escapeForTerminal;

namespace fs = std::filesystem;

namespace {

// OSC 52 (writes the clipboard), an SGR colour, a CSI clear-screen, a C1 CSI as UTF-8 (U+009B), a raw
// C1 byte and an ill-formed byte.
const std::string kOsc52 = "\x1b]52;c;aGVsbG8=\x07";
const std::string kEvilKey = "evil." + kOsc52 + "key";
const std::string kEvilValue = "red\x1b[31mtext\xc2\x9b" "2J\x9b" "end\xff";
const std::string kEvilTensor = "evil\x1b[2J.weight";

// "" when `out` is safe for a terminal (well-formed UTF-8, no control character but \n and \t),
// else where the first offending byte is.
std::string firstControl(const std::string& out) {
  for (size_t i = 0; i < out.size();) {
    uint32_t cp = 0;
    const size_t n = minfer::util::utf8SequenceAt(out, i, &cp);
    if (n == 0) return "ill-formed UTF-8 at byte " + std::to_string(i);
    if (minfer::util::isTerminalControl(cp) && cp != '\n' && cp != '\t')
      return "control U+" + std::to_string(cp) + " at byte " + std::to_string(i) + ": ..." +
             escapeForTerminal(out.substr(i > 40 ? i - 40 : 0, 80)) + "...";
    i += n;
  }
  return "";
}

std::string scratch(const std::string& name) {
  const std::string dir = minfer::test::scratchDir() + "/terminal-safety";
  fs::create_directories(dir);
  return dir + "/" + name;
}

ChildResult inspect(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {minfer::test::toolPath("minfer-inspect")};
  argv.insert(argv.end(), args.begin(), args.end());
  return minfer::test::runChild(argv);
}

}  // namespace

TEST_CASE("escapeForTerminal: C0, DEL, C1, bidi controls and ill-formed UTF-8 escaped; the rest unchanged") {
  CHECK(escapeForTerminal("plain ASCII, UTF-8 h\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x99\x82") ==
        "plain ASCII, UTF-8 h\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x99\x82");
  CHECK(escapeForTerminal(kOsc52) == "\\x1b]52;c;aGVsbG8=\\x07");
  CHECK(escapeForTerminal("a\nb\tc\rd\x7f" + std::string(1, '\0')) == "a\\nb\\tc\\rd\\x7f\\x00");
  CHECK(escapeForTerminal("a\nb\tc\x1b", std::string::npos, /*keep_newlines=*/true) == "a\nb\tc\\x1b");
  CHECK(escapeForTerminal("\xc2\x9b" "2J \xc2\x85") == "\\u009b2J \\u0085");      // C1 as UTF-8
  CHECK(escapeForTerminal("x\x9by\x80") == "x\\x9by\\x80");                         // C1 as raw bytes
  CHECK(escapeForTerminal("\xe2\x80\xae" "evil") == "\\u202eevil");                 // RIGHT-TO-LEFT OVERRIDE
  CHECK(escapeForTerminal("\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x96") ==     // overlong, surrogate,
        "\\xc0\\xaf \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80 \\xe2\\x96");              // > U+10FFFF, cut short
  CHECK(escapeForTerminal("ab\xe2\x96\x81" "cd", 4) == "ab...");  // never cuts a character
  CHECK(escapeForTerminal("abcd", 4) == "abcd");
  for (const std::string& s : {kEvilKey, kEvilValue, kEvilTensor})
    CHECK(escapeForTerminal(escapeForTerminal(s)) == escapeForTerminal(s));  // escaping twice changes nothing
  CHECK(minfer::util::escapeJsonForTerminal("{\"a\": \"x\x7f\xc2\x9b\xe2\x80\xae\xff\"}") ==
        "{\"a\": \"x\\u007f\\u009b\\u202e\\ufffd\"}");
}

TEST_CASE("minfer-inspect on a GGUF with escape sequences in a key, a value and a tensor name") {
  minfer::gguf::GgufWriter w = minfer::test::makeTinyGguf(TinyGgufSpec{});
  w.setString(kEvilKey, kEvilValue);
  w.setStringArray("evil.array", {"ok", kEvilValue});
  w.addTensor(kEvilTensor, minfer::GgmlType::F32, {4}, std::vector<uint8_t>(16, 0));
  const std::string path = scratch("evil.gguf");
  {
    llvm::Error err = w.write(path);
    REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
  }
  const ChildResult text = inspect({path});
  CHECK(text.describe() == "exit 0");
  CHECK_MESSAGE(firstControl(text.output) == "", escapeForTerminal(text.output));
  CHECK(text.output.find("evil.\\x1b]52;c;aGVsbG8=\\x07key") != std::string::npos);
  CHECK(text.output.find("\"red\\x1b[31mtext\\u009b2J\\x9bend\\xff\"") != std::string::npos);
  CHECK(text.output.find("evil\\x1b[2J.weight") != std::string::npos);

  const ChildResult json = inspect({path, "--json"});
  CHECK(json.describe() == "exit 0");
  CHECK_MESSAGE(firstControl(json.output) == "", escapeForTerminal(json.output));
  CHECK(json.output.find("\\u001b]52;c;aGVsbG8=\\u0007") != std::string::npos);
  CHECK(json.output.find("\\u009b") != std::string::npos);
}

TEST_CASE("error messages quoting a GGUF's key escape it (minfer-inspect, minfer-compile)") {
  // A duplicate key is an error that names the key.
  minfer::gguf::GgufWriter w = minfer::test::makeTinyGguf(TinyGgufSpec{});
  w.setValidate(false);
  w.append(kEvilKey, minfer::gguf::MetaValue::u32(1));
  w.append(kEvilKey, minfer::gguf::MetaValue::u32(2));
  const std::string path = scratch("duplicate.gguf");
  {
    llvm::Error err = w.write(path);
    REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
  }
  const ChildResult r = inspect({path});
  INFO(escapeForTerminal(r.output));
  CHECK(r.describe() == "exit 1");
  CHECK(firstControl(r.output) == "");
  CHECK(r.output.find("duplicate key") != std::string::npos);
  CHECK(r.output.find("evil.\\x1b]52;c;aGVsbG8=\\x07key") != std::string::npos);

  // An unsupported architecture is quoted by the model code; the tool escapes what it prints.
  minfer::gguf::GgufWriter arch = minfer::test::makeTinyGguf(TinyGgufSpec{});
  arch.setString("general.architecture", "ll\x1b[31m\xc2\x9b" "ama");
  const std::string arch_path = scratch("arch.gguf");
  {
    llvm::Error err = arch.write(arch_path);
    REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
  }
  const ChildResult c = minfer::test::runChild(
      {minfer::test::toolPath("minfer-compile"), arch_path, "-o", scratch("arch.mfb"), "--target="});
  INFO(escapeForTerminal(c.output));
  CHECK(c.describe() == "exit 1");
  CHECK(firstControl(c.output) == "");
  CHECK(c.output.find("ll\\x1b[31m\\u009bama") != std::string::npos);
}

TEST_CASE("minfer-inspect on an artifact whose model name and token texts carry escape sequences") {
  minfer::gguf::GgufWriter w = minfer::test::makeTinyGguf(TinyGgufSpec{});
  w.setString("general.name", kEvilValue);
  const std::string gguf = scratch("evil-name.gguf"), mfb = scratch("evil-name.mfb");
  {
    llvm::Error err = w.write(gguf);
    REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
  }
  minfer::test::compileWithTool(gguf, mfb);
  const ChildResult text = inspect({mfb});
  CHECK(text.describe() == "exit 0");
  CHECK_MESSAGE(firstControl(text.output) == "", escapeForTerminal(text.output));
  CHECK(text.output.find("red\\x1b[31mtext\\u009b2J\\x9bend\\xff") != std::string::npos);
  const ChildResult json = inspect({mfb, "--json"});
  CHECK(json.describe() == "exit 0");
  CHECK_MESSAGE(firstControl(json.output) == "", escapeForTerminal(json.output));
}

TEST_CASE("minfer-bench shows a model file name with escape sequences escaped, and its --json still parses") {
  // The bench's model column is the source GGUF's file name, recorded in the artifact.
  const std::string gguf = scratch("bench\x1b[31m\"q\".gguf"), mfb = scratch("bench-evil.mfb");
  minfer::test::writeTinyGguf(TinyGgufSpec{}, gguf);
  minfer::test::compileWithTool(gguf, mfb);
  const std::string bench = minfer::test::toolPath("minfer-bench");
  for (const std::vector<std::string>& format : {std::vector<std::string>{}, {"--csv"}, {"--json"}}) {
    std::vector<std::string> argv = {bench, mfb, "-p", "4", "-n", "2", "-r", "1", "--device", "cpu"};
    argv.insert(argv.end(), format.begin(), format.end());
    const ChildResult r = minfer::test::runChild(argv);
    INFO(escapeForTerminal(r.output));
    CHECK(r.describe() == "exit 0");
    CHECK(firstControl(r.output) == "");
    if (format.empty()) CHECK(r.output.find("| bench\\x1b[31m\"q\".gguf |") != std::string::npos);
    if (!format.empty() && format[0] == "--json") {
      const size_t begin = r.output.find('['), end = r.output.rfind(']');
      REQUIRE(begin != std::string::npos);
      auto parsed = llvm::json::parse(r.output.substr(begin, end - begin + 1));
      REQUIRE_MESSAGE(static_cast<bool>(parsed), llvm::toString(parsed.takeError()));
      CHECK((*parsed->getAsArray())[0].getAsObject()->getString("model") ==
            llvm::StringRef("bench\x1b[31m\"q\".gguf"));
    }
  }
}
