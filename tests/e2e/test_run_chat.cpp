// minfer-run -cnv end to end: stories260K compiled at test time, user turns piped on stdin, chat
// templates from a file (a small one written here, real ones from the fixtures) or from the artifact.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "minfer/runtime.h"
#include "tests/test_support.h"

namespace {

std::string tool(const char* name) { return std::string(MINFER_TOOLS_DIR) + "/" + name; }

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

struct Run {
  int status = -1;
  std::string out, err;
};

// Runs `command` (a shell command line) with `input` on stdin; stdout and stderr captured apart.
Run run(const std::string& command, const std::string& input = "") {
  const std::string dir = minfer::test::scratchDir();
  writeText(dir + "/chat.in", input);
  const int raw = std::system((command + " <" + dir + "/chat.in >" + dir + "/chat.out 2>" + dir + "/chat.err").c_str());
  Run r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = readText(dir + "/chat.out");
  r.err = readText(dir + "/chat.err");
  return r;
}

// The artifact of stories260K.gguf (no chat template), or of a copy carrying `chat_template` and, when
// eot_id ≥ 0, tokenizer.ggml.eot_token_id = eot_id.
std::string compileStories(const std::string& chat_template = "", int eot_id = -1) {
  const std::string gguf = minfer::test::fixturesDir() + "/models/stories260K.gguf";
  const std::string base = minfer::test::scratchDir() + (chat_template.empty() ? "/stories-chat" : "/stories-tmpl") +
                           (eot_id >= 0 ? "-eot" : "");
  if (std::filesystem::exists(base + ".mfb")) return base + ".mfb";
  std::string source = gguf;
  if (!chat_template.empty()) {
    auto file = minfer::gguf::GgufFile::open(gguf);
    REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
    minfer::gguf::GgufWriter w(3);
    for (const auto& kv : (*file)->metadata()) w.set(kv.key, minfer::gguf::MetaValue::fromParsed(kv.value));
    for (const auto& t : (*file)->tensors()) {
      const llvm::ArrayRef<uint8_t> data = (*file)->tensorData(t);
      w.addTensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                  std::vector<uint8_t>(data.begin(), data.end()));
    }
    w.setString("tokenizer.chat_template", chat_template);
    if (eot_id >= 0) w.setU32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(eot_id));
    source = base + ".gguf";
    llvm::Error written = w.write(source);
    REQUIRE_MESSAGE(!written, llvm::toString(std::move(written)));
  }
  const Run r = run(tool("minfer-compile") + " " + source + " -o " + base + ".mfb");
  INFO(r.err);
  REQUIRE(r.status == 0);
  return base + ".mfb";
}

// One --verbose turn: the tokens the KV cache kept, the tokens fed and their text (as printed: control
// characters escaped), the reply's length.
struct Turn {
  int kept = -1, fed = -1, reply = -1;
  std::string text;
};

std::vector<Turn> turns(const std::string& err) {
  std::vector<Turn> out;
  const std::regex fed_re("minfer-run: turn ([0-9]+): ([0-9]+) tokens kept in the KV cache, ([0-9]+) fed: \"(.*)\"\n");
  const std::regex reply_re("minfer-run: turn ([0-9]+): reply of ([0-9]+) tokens");
  for (std::sregex_iterator it(err.begin(), err.end(), fed_re), end; it != end; ++it) {
    REQUIRE(std::stoi((*it)[1]) == static_cast<int>(out.size()) + 1);
    out.push_back({std::stoi((*it)[2]), std::stoi((*it)[3]), -1, (*it)[4]});
  }
  for (std::sregex_iterator it(err.begin(), err.end(), reply_re), end; it != end; ++it) {
    const size_t i = std::stoul((*it)[1]) - 1;
    REQUIRE(i < out.size());
    out[i].reply = std::stoi((*it)[2]);
  }
  return out;
}

// The tokens `text` is fed as (control-token texts parsed, as minfer-run -cnv does).
size_t tokenCount(const std::string& artifact, const std::string& text, bool add_special) {
  auto model = minfer::Model::open(artifact, minfer::BackendKind::kCpu);
  REQUIRE(bool(model));
  auto ids = (*model)->tokenize(text, add_special, /*parse_special=*/true);
  REQUIRE(bool(ids));
  return ids->size();
}

// "role:content" lines, then "assistant:" for the reply.
const char kPlainTemplate[] =
    "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

const std::string kRun = " --temp 0 --device cpu -n 8 --verbose";

}  // namespace

TEST_CASE("minfer-run -cnv: two turns on stdin; the second feeds only the suffix of the rendering") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string tmpl = minfer::test::scratchDir() + "/plain.jinja";
  writeText(tmpl, kPlainTemplate);
  const Run r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + tmpl + kRun, "Once upon\nThe end\n");
  INFO(r.err);
  CHECK(r.status == 0);
  const std::vector<Turn> t = turns(r.err);
  REQUIRE(t.size() == 2);
  // Turn 1: the whole rendering, with the BOS the vocabulary adds.
  CHECK(t[0].kept == 0);
  CHECK(t[0].text == "user:Once upon\\nassistant:");
  CHECK(t[0].fed == static_cast<int>(tokenCount(artifact, "user:Once upon\nassistant:", true)));
  CHECK(t[0].reply == 8);  // greedy stories260K does not end its reply within 8 tokens
  // Turn 2: the cache keeps turn 1's prompt and reply; only the new text after the reply is fed.
  CHECK(t[1].kept == t[0].fed + t[0].reply);
  CHECK(t[1].text == "\\nuser:The end\\nassistant:");
  CHECK(t[1].fed == static_cast<int>(tokenCount(artifact, "\nuser:The end\nassistant:", false)));
  CHECK(t[1].reply == 8);
  // Each reply printed on stdout, ended by a newline.
  CHECK(r.out.size() > 2);
  CHECK(r.out.back() == '\n');
  // The same conversation again: greedy, so byte for byte the same replies.
  CHECK(run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + tmpl + kRun, "Once upon\nThe end\n").out ==
        r.out);
}

TEST_CASE("minfer-run -cnv: -sys, -p as the first user message, blank lines skipped, EOF ends with exit 0") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string tmpl = minfer::test::scratchDir() + "/plain.jinja";
  writeText(tmpl, kPlainTemplate);
  Run r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + tmpl + " -sys 'Be kind.' -p 'Hi\\tthere'" +
              kRun);
  INFO(r.err);
  CHECK(r.status == 0);
  std::vector<Turn> t = turns(r.err);
  REQUIRE(t.size() == 1);
  CHECK(t[0].text == "system:Be kind.\\nuser:Hi\\tthere\\nassistant:");  // -p's escapes processed
  // Long spellings; escapes in stdin lines processed too; a blank line is no turn; no newline at EOF.
  r = run(tool("minfer-run") + " " + artifact + " --conversation --chat-template " + tmpl +
              " --system-prompt 'A\\tB'" + kRun,
          "\none\\ttwo\n\nthree");
  t = turns(r.err);
  CHECK(r.status == 0);
  REQUIRE(t.size() == 2);
  CHECK(t[0].text == "system:A\\\\tB\\nuser:one\\ttwo\\nassistant:");  // -sys is literal, as in llama.cpp
  CHECK(t[1].text == "\\nuser:three\\nassistant:");
  // Nothing on stdin: no turn at all.
  r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + tmpl + kRun);
  CHECK(r.status == 0);
  CHECK(r.out.empty());
  CHECK(turns(r.err).empty());
}

TEST_CASE("minfer-run -cnv: real templates render through (ChatML's end-of-turn fed with the next turn; BOS once)") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string dir = minfer::test::fixturesDir() + "/chat_templates/templates/";
  Run r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + dir + "Qwen-Qwen2.5-7B-Instruct.jinja" +
                  " -sys 'Be brief.'" + kRun,
              "hi\nthere\n");
  INFO(r.err);
  CHECK(r.status == 0);
  std::vector<Turn> t = turns(r.err);
  REQUIRE(t.size() == 2);
  CHECK(t[0].text ==
        "<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n");
  CHECK(t[1].kept == t[0].fed + t[0].reply);
  CHECK(t[1].text == "<|im_end|>\\n<|im_start|>user\\nthere<|im_end|>\\n<|im_start|>assistant\\n");
  // Gemma's template starts with {{ bos_token }} ("<s>" here): the tokenizer adds BOS, so the rendered
  // one is dropped rather than fed twice.
  r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + dir + "google-gemma-2-2b-it.jinja" + kRun,
          "hi\n");
  t = turns(r.err);
  CHECK(r.status == 0);
  REQUIRE(t.size() == 1);
  CHECK(t[0].text == "<start_of_turn>user\\nhi<end_of_turn>\\n<start_of_turn>model\\n");
  CHECK(t[0].fed == static_cast<int>(tokenCount(artifact, "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", true)));
}

TEST_CASE("minfer-run -cnv: a template that rewrites an earlier reply rewinds the KV cache to what still matches") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  // Replies are rendered trimmed: stories260K's reply starts with a space, so turn 2's rendering no
  // longer starts with the reply as generated; the cache keeps turn 1's feed and the rest is fed again.
  const std::string tmpl = minfer::test::scratchDir() + "/trim.jinja";
  writeText(tmpl, "{% for m in messages %}{{ m.role }}:{{ m.content | trim }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}");
  const Run r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + tmpl + kRun, "Once upon\nThe end\n");
  INFO(r.err);
  CHECK(r.status == 0);
  const std::vector<Turn> t = turns(r.err);
  REQUIRE(t.size() == 2);
  CHECK(t[1].kept == t[0].fed);
  REQUIRE(t[1].text.size() > std::string("\\nuser:The end\\nassistant:").size());
  CHECK(t[1].text.ends_with("\\nuser:The end\\nassistant:"));
  CHECK(t[1].text.front() != ' ');  // the trimmed reply
}

TEST_CASE("minfer-run -cnv: the artifact's tokenizer.chat_template is used; --chat-template overrides it") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                                              "{% if add_generation_prompt %}[assistant]{% endif %}");
  Run r = run(tool("minfer-run") + " " + artifact + " -cnv" + kRun, "hello\n");
  INFO(r.err);
  CHECK(r.status == 0);
  std::vector<Turn> t = turns(r.err);
  REQUIRE(t.size() == 1);
  CHECK(t[0].text == "[user] hello\\n[assistant]");
  const std::string tmpl = minfer::test::scratchDir() + "/plain.jinja";
  writeText(tmpl, kPlainTemplate);
  r = run(tool("minfer-run") + " " + artifact + " -cnv --chat-template " + tmpl + kRun, "hello\n");
  t = turns(r.err);
  REQUIRE(t.size() == 1);
  CHECK(t[0].text == "user:hello\\nassistant:");
}

TEST_CASE("minfer-run -cnv: a reply ended by an end-of-generation token; that token is not kept, the template's end is fed") {
  if (!minfer::test::haveFixtures()) return;
  // The greedy continuation of "Once upon a time" starts with token 432 "," (fixtures README §5);
  // declared the EOT token, it ends the first reply at once. The template closes each reply with "|".
  const std::string artifact = compileStories(
      "{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}|{% endif %}{% endfor %}", 432);
  const Run r = run(tool("minfer-run") + " " + artifact + " -cnv" + kRun, "Once upon a time\n and then\n");
  INFO(r.err);
  CHECK(r.status == 0);
  const std::vector<Turn> t = turns(r.err);
  REQUIRE(t.size() == 2);
  CHECK(t[0].fed == 5);  // BOS and the 4 tokens of llama.cpp's prompt
  CHECK(r.err.find("turn 1: reply of 0 tokens, stop: end of generation") != std::string::npos);
  CHECK(t[1].kept == 5);
  CHECK(t[1].text == "| and then");
  CHECK(r.out.starts_with("\n"));  // the empty first reply's line
}

TEST_CASE("minfer-run -cnv errors: no template, unreadable file, parse error, raise_exception: message, exit 1") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string dir = minfer::test::scratchDir();
  const std::string cnv = tool("minfer-run") + " " + artifact + " -cnv --temp 0 --device cpu -n 4";
  auto check_error = [&](const std::string& args, const std::string& message) {
    CAPTURE(args);
    const Run r = run(cnv + args, "hi\n");
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.err.find(message) != std::string::npos, r.err);
    CHECK(r.out.empty());
  };
  check_error("", artifact + ": the model has no chat template (tokenizer.chat_template); pass --chat-template FILE");
  check_error(" --chat-template " + dir + "/missing.jinja",
              "--chat-template " + dir + "/missing.jinja: cannot read the template: No such file or directory");
  check_error(" --chat-template " + dir, "--chat-template " + dir + ": is a directory, not a template file");
  writeText(dir + "/bad.jinja", "{% for m in messages %}\n  {{ m.content }\n{% endfor %}");
  check_error(" --chat-template " + dir + "/bad.jinja", dir + "/bad.jinja: chat template 2:");
  writeText(dir + "/raise.jinja", "{% if messages[0].role != 'system' %}{{ raise_exception('a system message comes "
                                  "first') }}{% endif %}"
                                  "{% for m in messages %}{{ m.content }}\n{% endfor %}");
  check_error(" --chat-template " + dir + "/raise.jinja", dir + "/raise.jinja: chat template 1:");
  check_error(" --chat-template " + dir + "/raise.jinja", "a system message comes first");
  // With -sys the same template renders.
  const Run ok = run(cnv + " --chat-template " + dir + "/raise.jinja -sys s", "hi\n");
  CHECK(ok.status == 0);
  // -sys and --chat-template without -cnv; --logits-out with it.
  Run r = run(tool("minfer-run") + " " + artifact + " -p hi -sys s --device cpu");
  CHECK(r.status == 1);
  CHECK(r.err.find("-sys and --chat-template apply to conversation mode: add -cnv") != std::string::npos);
  r = run(cnv + " --chat-template " + dir + "/raise.jinja --logits-out " + dir + "/l.f32");
  CHECK(r.status == 1);
  CHECK(r.err.find("--logits-out is not supported with -cnv") != std::string::npos);
  const std::string help = run(tool("minfer-run") + " --help").out;
  for (const char* flag : {"-cnv", "--conversation", "-sys", "--system-prompt", "--chat-template"}) {
    CAPTURE(flag);
    CHECK(help.find(flag) != std::string::npos);
  }
}
