// Chat templates (runtime/chat): every case of fixtures/chat_templates byte for byte, the expression
// language against values computed by hand, and malformed templates refused with their position.
#include <doctest/doctest.h>

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
