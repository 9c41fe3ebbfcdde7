// minfer-server driven by the npm `openai` client (Node): completions and chat, streamed and not, errors.
// The package is installed by scripts/setup.sh into .node/; without node or the package the suite prints
// why and exits 77 (ctest: Skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/e2e/golden_support.h"
#include "tests/serve/server_process.h"
#include "tests/test_support.h"

namespace {

using nlohmann::json;

// Runs `command`; its stdout.
std::string capture(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int raw = pclose(pipe);
  status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

// Why the suite cannot run here ("" when it can).
std::string skipReason() {
  int status = -1;
  const std::string version = capture("node --version 2>/dev/null", status);
  if (status != 0) return "node is not installed";
  if (!std::filesystem::exists(std::string(MINFER_OPENAI_MODULE) + "/package.json"))
    return std::string("the npm openai package is not installed at ") + MINFER_OPENAI_MODULE + " (scripts/setup.sh installs it)";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (const std::string why = skipReason(); !why.empty()) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return MINFER_SKIP_RETURN_CODE;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

TEST_CASE("the npm openai client drives /v1/completions and /v1/chat/completions, streamed and not") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = minfer::test::compiledFixture("stories260K.gguf");
  const std::string tmpl = minfer::test::scratchDir() + "/chat.jinja";
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}";
  minfer::test::ServerProcess server({artifact, "--device", "cpu", "-np", "2", "-c", "256", "-t", "1", "--alias",
                                      "stories", "--api-key", "k3y", "--chat-template", tmpl});
  int status = -1;
  const std::string out = capture("MINFER_OPENAI_MODULE=" + std::string(MINFER_OPENAI_MODULE) + " node " +
                                      MINFER_OPENAI_SCRIPT + " " + std::to_string(server.port()) + " stories k3y",
                                  status);
  INFO(out);
  REQUIRE(status == 0);
  const json j = json::parse(out);
  const minfer::test::Reference plain = minfer::test::single(artifact, "Once upon a time", 24);
  const minfer::test::Reference chat = minfer::test::single(artifact, "user: Once upon a time\nassistant:", 24);

  CHECK(j["models"] == json::array({"stories"}));
  CHECK(j["completion"]["object"] == "text_completion");
  CHECK(j["completion"]["text"] == plain.text);
  CHECK(j["completion"]["finish_reason"] == plain.finish_reason);
  CHECK(j["completion"]["usage"]["prompt_tokens"] == plain.prompt_tokens);
  CHECK(j["completion"]["usage"]["completion_tokens"] == plain.completion_tokens);
  CHECK(j["completion_stream"]["text"] == plain.text);
  CHECK(j["completion_stream"]["finish_reason"] == plain.finish_reason);
  CHECK(j["completion_stream"]["chunks"].get<int>() >= 2);

  CHECK(j["chat"]["object"] == "chat.completion");
  CHECK(j["chat"]["role"] == "assistant");
  CHECK(j["chat"]["text"] == chat.text);
  CHECK(j["chat"]["usage"]["prompt_tokens"] == chat.prompt_tokens);
  CHECK(j["chat_stream"]["text"] == chat.text);
  CHECK(j["chat_stream"]["finish_reason"] == chat.finish_reason);
  CHECK(j["chat_stream"]["usage"]["completion_tokens"] == chat.completion_tokens);

  CHECK(j["unknown_model"]["status"] == 404);
  CHECK(j["unknown_model"]["param"] == "model");
  CHECK(j["wrong_key"]["status"] == 401);
}
