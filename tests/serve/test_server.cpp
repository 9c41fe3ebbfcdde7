// minfer-server end to end on the CPU backend: stories260K compiled at test time, the server started on a
// free loopback port. Concurrent greedy requests give exactly Session::generate's text (also when a small
// KV pool forces preemption), streaming and non-streaming agree, the chat endpoint renders the template,
// bad requests and bad options get clear errors, a client that goes away cancels its request, and SIGTERM
// drains (running requests finish or, after --drain-timeout, are cancelled; new ones get 503).
#include <doctest/doctest.h>

#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <tuple>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "tests/e2e/golden_support.h"
#include "runtime/tools/server/http_server.h"
#include "tests/serve/server_process.h"
#include "tests/test_support.h"

namespace {

using minfer::test::get;
using minfer::test::post;
using minfer::test::postStream;
using minfer::test::Reference;
using minfer::test::ServerProcess;
using minfer::test::single;
using nlohmann::json;

const std::vector<std::string> kPrompts = {"Once upon a time", "Tom had a big red ball.", "Lily and her mom",
                                           "The cat sat", "One day, a little boy", "There was a dog",
                                           "Sam liked to", "In the park"};
constexpr int kMaxTokens = 40;

std::string artifact() { return minfer::test::compiledFixture("stories260K.gguf"); }

json completion(const std::string& prompt, int max_tokens, bool stream = false) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
}

// Every prompt twice at once (streamed and not), against the single-sequence references.
// After two requests of up to 8000 tokens whose clients left: within 30 s both are counted cancelled and as
// disconnects, stopped early, and their blocks are back in the pool with nothing running.
void checkTwoCancelledByDisconnect(const ServerProcess& server) {
  std::map<std::string, double> m;
  for (int i = 0; i < 300; ++i) {
    m = server.metrics();
    if (m["minfer_requests_finished_total{finish_reason=\"cancelled\"}"] == 2 && m["minfer_kv_blocks_used"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(m["minfer_requests_finished_total{finish_reason=\"cancelled\"}"] == 2);
  CHECK(m["minfer_client_disconnects_total"] == 2);
  CHECK(m["minfer_generated_tokens_total"] < 2 * 8000);
  CHECK(m["minfer_kv_blocks_used"] == 0);
  CHECK(m["minfer_requests_running"] == 0);
}

void checkConcurrentGreedy(const ServerProcess& server) {
  std::vector<Reference> want;
  for (const std::string& p : kPrompts) want.push_back(single(artifact(), p, kMaxTokens));
  std::vector<minfer::test::HttpResult> plain(kPrompts.size());
  std::vector<minfer::test::StreamResult> streamed(kPrompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    clients.emplace_back([&, i] { plain[i] = post(server.port(), "/v1/completions", completion(kPrompts[i], kMaxTokens).dump()); });
    clients.emplace_back([&, i] { streamed[i] = postStream(server.port(), "/v1/completions", completion(kPrompts[i], kMaxTokens, true)); });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    INFO("prompt \"" << kPrompts[i] << "\": " << plain[i].body);
    REQUIRE(plain[i].status == 200);
    const json& j = plain[i].json;
    CHECK(j["object"] == "text_completion");
    CHECK(j["model"] == "stories260K.gguf.mfb");  // the artifact's file name (no --alias)
    CHECK(j["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    CHECK(j["choices"][0]["text"] == want[i].text);
    CHECK(j["choices"][0]["finish_reason"] == want[i].finish_reason);
    CHECK(j["usage"]["prompt_tokens"] == want[i].prompt_tokens);
    CHECK(j["usage"]["completion_tokens"] == want[i].completion_tokens);
    CHECK(j["usage"]["total_tokens"] == want[i].prompt_tokens + want[i].completion_tokens);
    CHECK(streamed[i].status == 200);
    CHECK(streamed[i].done);
    CHECK(streamed[i].text == want[i].text);
    CHECK(streamed[i].finish_reason == want[i].finish_reason);
  }
}

}  // namespace

TEST_CASE("concurrent greedy requests return exactly the single-sequence text; streamed and not agree") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-np", "4", "-c", "256", "-t", "1"});
  REQUIRE(server.running());
  checkConcurrentGreedy(server);
  const auto m = server.metrics();
  CHECK(m.at("minfer_requests_submitted_total") == 2 * kPrompts.size());
  CHECK(m.at("minfer_kv_blocks_used") == 0);
  CHECK(m.at("minfer_requests_running") == 0);
  CHECK(m.at("minfer_requests_waiting") == 0);
  CHECK(m.at("minfer_generated_tokens_total") > 0);

  // stream_options.include_usage: a usage chunk before [DONE]; a stop string ends the text before it.
  const Reference ref = single(artifact(), kPrompts[0], kMaxTokens);
  json body = completion(kPrompts[0], kMaxTokens, true);
  body["stream_options"] = {{"include_usage", true}};
  const size_t cut = ref.text.find("girl");
  REQUIRE(cut != std::string::npos);
  body["stop"] = json::array({"zebra", "girl"});
  const minfer::test::StreamResult s = postStream(server.port(), "/v1/completions", body);
  CHECK(s.text == ref.text.substr(0, cut));
  CHECK(s.finish_reason == "stop");
  CHECK(s.usage["prompt_tokens"] == ref.prompt_tokens);
  CHECK(s.usage["completion_tokens"].get<int>() < ref.completion_tokens);

  // Per-request sampling: seeded draws through the whole chain give Session::generate's tokens for the same
  // parameters (the scheduler feeds each request's Sampler as generate() does), and differ by seed.
  minfer::SamplerParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 20;
  sp.top_p = 0.9f;
  sp.min_p = 0.02f;
  sp.repeat_penalty = 1.1f;
  sp.repeat_last_n = 16;
  std::vector<std::string> sampled;
  for (uint64_t seed : {42u, 43u}) {
    sp.seed = seed;
    const Reference want = single(artifact(), kPrompts[1], kMaxTokens, sp);
    const json req = {{"prompt", kPrompts[1]}, {"max_tokens", kMaxTokens}, {"temperature", sp.temperature},
                      {"top_k", sp.top_k}, {"top_p", sp.top_p}, {"min_p", sp.min_p},
                      {"repeat_penalty", sp.repeat_penalty}, {"repeat_last_n", sp.repeat_last_n}, {"seed", seed}};
    const minfer::test::HttpResult got = post(server.port(), "/v1/completions", req.dump());
    INFO("seed " << seed << ": " << got.body);
    CHECK(got.json["choices"][0]["text"] == want.text);
    sampled.push_back(want.text);
  }
  CHECK(sampled[0] != sampled[1]);

  const minfer::test::HttpResult models = get(server.port(), "/v1/models");
  CHECK(models.json["data"][0]["id"] == "stories260K.gguf.mfb");
  CHECK(get(server.port(), "/health").json["status"] == "ok");
  CHECK(server.stop() == 0);
}

TEST_CASE("a KV pool too small for every sequence: preemption, and still the single-sequence text") {
  if (!minfer::test::haveFixtures()) return;
  // 4 sequences growing to ~48 positions need ~24 blocks of 8; the pool has 10.
  ServerProcess server({artifact(), "--device", "cpu", "-np", "4", "-c", "128", "--kv-blocks", "10",
                        "--kv-block-size", "8", "-t", "1"});
  checkConcurrentGreedy(server);
  const auto m = server.metrics();
  CHECK(m.at("minfer_preemptions_total") > 0);
  CHECK(m.at("minfer_kv_blocks_total") == 10);
  CHECK(m.at("minfer_kv_blocks_used") == 0);
  // The start-up log says what a request can hold: the pool's 80 positions, not -c's 128.
  CHECK(server.log().find("a request holds at most 80 positions, what the pool of 10 KV blocks of 8 gives") !=
        std::string::npos);
}

TEST_CASE("chat: rendered with --chat-template; streamed and not agree; without a template only chat is refused") {
  if (!minfer::test::haveFixtures()) return;
  const std::string tmpl = minfer::test::scratchDir() + "/chat.jinja";
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}";
  ServerProcess server({artifact(), "--device", "cpu", "--chat-template", tmpl, "-c", "256", "-t", "1"});
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Once upon"}},
                                                                                {{"type", "text"}, {"text", " a time"}}})}}});
  const json body = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}};
  const minfer::test::HttpResult r = post(server.port(), "/v1/chat/completions", body.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  CHECK(r.json["object"] == "chat.completion");
  CHECK(r.json["choices"][0]["message"]["role"] == "assistant");
  // The rendered conversation, generated from as one prompt.
  const Reference ref = single(artifact(), "system: Be brief.\nuser: Once upon a time\nassistant:", 24);
  CHECK(r.json["choices"][0]["message"]["content"] == ref.text);
  CHECK(r.json["usage"]["prompt_tokens"] == ref.prompt_tokens);
  json sbody = body;
  sbody["stream"] = true;
  const minfer::test::StreamResult s = postStream(server.port(), "/v1/chat/completions", sbody);
  CHECK(s.done);
  CHECK(s.text == ref.text);
  CHECK(s.finish_reason == r.json["choices"][0]["finish_reason"]);
  REQUIRE(!s.events.empty());
  CHECK(json::parse(s.events[0])["object"] == "chat.completion.chunk");
  CHECK(json::parse(s.events[0])["choices"][0]["delta"]["role"] == "assistant");
  // An assistant message may leave its content out or null (rendered empty), and max_completion_tokens wins over
  // max_tokens.
  const json turns = json::array({{{"role", "user"}, {"content", "Once"}}, {{"role", "assistant"}, {"content", nullptr}},
                                  {{"role", "user"}, {"content", "upon"}}, {{"role", "assistant"}}});
  const json nulls = {{"messages", turns}, {"max_tokens", 24}, {"max_completion_tokens", 5}, {"temperature", 0}};
  const minfer::test::HttpResult n = post(server.port(), "/v1/chat/completions", nulls.dump());
  INFO(n.body);
  REQUIRE(n.status == 200);
  const Reference nref = single(artifact(), "user: Once\nassistant: \nuser: upon\nassistant: \nassistant:", 5);
  CHECK(nref.completion_tokens == 5);  // not ended by end of generation: the bound is what stopped it
  CHECK(n.json["usage"]["completion_tokens"] == 5);
  CHECK(n.json["usage"]["prompt_tokens"] == nref.prompt_tokens);
  CHECK(n.json["choices"][0]["message"]["content"] == nref.text);
  server.stop();

  // stories260K carries no chat template: chat gets a 400 that says so; completions are served.
  ServerProcess bare({artifact(), "--device", "cpu", "-c", "256", "-t", "1"});
  const minfer::test::HttpResult no = post(bare.port(), "/v1/chat/completions", body.dump());
  CHECK(no.status == 400);
  CHECK(no.json["error"]["code"] == "no_chat_template");
  CHECK(no.json["error"]["message"].get<std::string>().find("--chat-template") != std::string::npos);
  CHECK(post(bare.port(), "/v1/completions", completion("Once", 4).dump()).status == 200);
}

TEST_CASE("bad requests get a 4xx OpenAI-style error naming the field; the server stays up") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-c", "64", "--body-limit", "4096", "-t", "1"});
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;  // nullptr: the error's param is null
    const char* says;
  };
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "Once upon a time ";
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": \"Once\", ", 400, nullptr, "not valid JSON"},
      {"/v1/completions", "[1, 2]", 400, nullptr, "must be a JSON object"},
      {"/v1/completions", R"({"max_tokens": 4})", 400, "prompt", "prompt: missing"},
      {"/v1/completions", R"({"prompt": 5})", 400, "prompt", "prompt: must be"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "5"})", 400, "max_tokens", "must be an integer"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens", "≥ 1"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": -3})", 400, "max_tokens", "≥ 1"},
      {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature", "must be a number"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 1.5})", 400, "top_p", "must be in [0"},
      {"/v1/completions", R"({"prompt": "x", "stream": 1})", 400, "stream", "must be a boolean"},
      {"/v1/completions", R"({"prompt": "x", "stop": 5})", 400, "stop", "string or an array"},
      {"/v1/completions", R"({"prompt": "x", "stop": ["a", ""]})", 400, "stop", "empty"},
      {"/v1/completions", R"({"prompt": "x", "seed": 1.5})", 400, "seed", "must be an integer"},
      {"/v1/completions", R"({"prompt": "x", "n": 2})", 400, "n", "n: is 2; only n = 1 (one choice per request) is supported: n > 1 is not"},
      {"/v1/completions", R"({"prompt": "x", "n": 0})", 400, "n", "n: is 0; only n = 1"},
      {"/v1/completions", R"({"prompt": "x", "n": "x"})", 400, "n", "n: must be an integer, not string"},
      {"/v1/completions", R"({"prompt": "x", "n": 1.5})", 400, "n", "n: must be an integer, not number"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "n": [2]})", 400, "n", "n: must be an integer, not array"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "prompt", "token id 99999"},
      {"/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "model", "does not exist"},
      {"/v1/completions", R"({"prompt": "x", "model": 7})", 400, "model", "must be a string"},
      {"/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "prompt", "the context holds 64"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages", "non-empty array"},
      {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role", "must be a string"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})", 400, "messages[0].content", "must be"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400, "messages[0].content", "missing"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": null}]})", 400, "messages[0].content", "missing"},
      {"/v1/completions", "", 400, nullptr, "the request body is empty"},
      {"/v1/completions", R"({"prompt": "x", "max_completion_tokens": "3"})", 400, "max_completion_tokens", "must be an integer"},
      {"/v1/completions", R"({"prompt": "x", "max_completion_tokens": -3})", 400, "max_completion_tokens", "≥ 1"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "a", "max_completion_tokens": 3})", 400, "max_tokens", "must be an integer"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})", 400, "messages[0].content", "only parts of type"},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"5": 2}})", 400, "logit_bias", "not supported"},
      {"/v1/completions", R"({"prompt": "x", "best_of": 2})", 400, "best_of", "not supported"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "tools": "bad"})", 400, "tools", "not supported"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"})", 400, "tool_choice", "not supported"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})", 400, "response_format", "not supported"},
  };
  for (const Case& c : cases) {
    const minfer::test::HttpResult r = post(server.port(), c.path, c.body);
    INFO(c.path << " " << c.body << " → " << r.status << " " << r.body);
    CHECK(r.status == c.status);
    REQUIRE(r.json.is_object());
    REQUIRE(r.json.contains("error"));
    const json& e = r.json["error"];
    CHECK(e["type"].is_string());
    CHECK(e["message"].get<std::string>().find(c.says) != std::string::npos);
    if (c.param) CHECK(e["param"] == c.param); else CHECK(e["param"].is_null());
  }
  // Too many stop strings.
  json many = {{"prompt", "x"}, {"stop", json::array()}};
  for (int i = 0; i < 17; ++i) many["stop"].push_back("s" + std::to_string(i));
  const minfer::test::HttpResult r = post(server.port(), "/v1/completions", many.dump());
  CHECK(r.status == 400);
  CHECK(r.json["error"]["param"] == "stop");
  CHECK(r.json["error"]["message"].get<std::string>().find("17 strings, at most 16") != std::string::npos);
  // A body over --body-limit: 413, still JSON.
  const minfer::test::HttpResult big = post(server.port(), "/v1/completions", json{{"prompt", std::string(8000, 'a')}}.dump());
  CHECK(big.status == 413);
  CHECK(big.json["error"]["message"].get<std::string>().find("4096 bytes") != std::string::npos);
  // An unknown endpoint.
  const minfer::test::HttpResult none = get(server.port(), "/v1/nothing");
  CHECK(none.status == 404);
  CHECK(none.json["error"]["type"] == "not_found_error");
  // A known endpoint asked with another method: 405, the method it takes in Allow and the message.
  httplib::Client hc("127.0.0.1", server.port());
  const auto wrong_methods = {std::tuple{"GET", "/v1/completions", "POST"}, std::tuple{"GET", "/chat/completions", "POST"},
                              std::tuple{"POST", "/health", "GET"}, std::tuple{"DELETE", "/v1/models", "GET"}};
  for (const auto& [method, path, allow] : wrong_methods) {
    CAPTURE(method);
    CAPTURE(path);
    const std::string m = method;
    const httplib::Result r = m == "GET"    ? hc.Get(path)
                              : m == "POST" ? hc.Post(path, "{}", "application/json")
                                            : hc.Delete(path);
    REQUIRE(r);
    CHECK(r->status == 405);
    CHECK(r->get_header_value("Allow") == allow);
    const json e = json::parse(r->body, nullptr, false);
    REQUIRE(!e.is_discarded());
    CHECK(e["error"]["code"] == "method_not_allowed");
    CHECK(e["error"]["message"].get<std::string>().find(std::string("allowed: ") + allow) != std::string::npos);
  }
  // Still serving, nothing leaked.
  CHECK(post(server.port(), "/v1/completions", completion("Once", 4).dump()).status == 200);
  const auto m = server.metrics();
  CHECK(m.at("minfer_requests_submitted_total") == 1);
  CHECK(m.at("minfer_http_errors_total{class=\"4xx\"}") == cases.size() + 3 + wrong_methods.size());
  CHECK(server.stop() == 0);
}

// The context bound is one rule whether or not max_tokens is given: a request generates until its next token would need
// a position past the context's (the scheduler's "length"), so prompt + completion = capacity + 1 — the last token is
// sampled, never evaluated. Before, a request without max_tokens stopped one token short of that (its default was the
// room left, capacity − prompt).
TEST_CASE("without max_tokens a request runs to the context's end, exactly as with a larger max_tokens") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-np", "1", "-c", "64", "-t", "1"});
  json unbounded = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"ignore_eos", true}};
  json bounded = unbounded;
  bounded["max_tokens"] = 10000;
  const minfer::test::HttpResult a = post(server.port(), "/v1/completions", unbounded.dump());
  const minfer::test::HttpResult b = post(server.port(), "/v1/completions", bounded.dump());
  INFO(a.body.substr(0, 300));
  INFO(b.body.substr(0, 300));
  REQUIRE(a.status == 200);
  REQUIRE(b.status == 200);
  for (const minfer::test::HttpResult* r : {&a, &b}) {
    CHECK(r->json["choices"][0]["finish_reason"] == "length");
    CHECK(r->json["usage"]["total_tokens"] == 65);  // -c 64 positions, the last token not evaluated
  }
  CHECK(a.json["choices"][0]["text"] == b.json["choices"][0]["text"]);
}

TEST_CASE("bodies up to --body-limit are read as JSON whatever their Content-Type; over it 413 with or without one") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-c", "64", "--body-limit", "20000", "-t", "1"});
  // 12 kB: over cpp-httplib's 8 KiB limit for form bodies, under --body-limit. JSON allows the padding.
  const std::string body = completion("Once", 2).dump() + std::string(12000, ' ');
  const std::string big = body + std::string(12000, ' ');
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60);
  // curl -d's default type, no type at all, and JSON: the same answer.
  for (const char* type : {"application/x-www-form-urlencoded", "", "application/json"}) {
    INFO("Content-Type \"" << type << "\"");
    const auto ok = c.Post("/v1/completions", body, type);
    REQUIRE(ok);
    CHECK(ok->status == 200);
    CHECK(ok->body.find("\"completion_tokens\":2") != std::string::npos);
    const auto over = c.Post("/v1/completions", big, type);
    REQUIRE(over);
    CHECK(over->status == 413);
    CHECK(over->body.find("exceeds the limit of 20000 bytes (--body-limit)") != std::string::npos);
  }
  // Chunked (no Content-Length): the limit is applied while reading.
  auto chunked = [&](const std::string& text) {
    return c.Post("/v1/completions", [&text](size_t offset, httplib::DataSink& sink) {
      sink.write(text.data() + offset, std::min<size_t>(4096, text.size() - offset));
      if (offset + 4096 >= text.size()) sink.done();
      return true;
    }, "application/json");
  };
  const auto chunked_ok = chunked(body);
  REQUIRE(chunked_ok);
  CHECK(chunked_ok->status == 200);
  // 1 MB more than the limit: the server stops keeping it early but reads the rest, so the 413 arrives
  // while the client is still sending (not a reset connection).
  const auto chunked_over = chunked(body + std::string(1 << 20, ' '));
  REQUIRE(chunked_over);
  CHECK(chunked_over->status == 413);
  CHECK(chunked_over->body.find("(--body-limit)") != std::string::npos);
  // A multipart form is not JSON: 415, said so.
  const auto form = c.Post("/v1/completions", httplib::MultipartFormDataItems{{"prompt", "Once", "", ""}});
  REQUIRE(form);
  CHECK(form->status == 415);
  CHECK(form->body.find("multipart/form-data bodies are not supported") != std::string::npos);
  CHECK(post(server.port(), "/v1/completions", completion("Once", 2).dump()).status == 200);
  CHECK(server.stop() == 0);
}

TEST_CASE("bodies nested deeper than kMaxJsonDepth are refused with 400; the handler does not overflow its stack") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-c", "64", "-t", "1"});  // the default 1 MiB body limit
  const auto nested = [](int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); };
  // 400000 levels fit the body limit; copying or dumping them (a bad token id's message, a chat message's
  // copy) recursed once per level.
  for (int depth : {129, 400000}) {
    for (const auto& [path, body] :
         {std::pair<std::string, std::string>{"/v1/completions", "{\"prompt\": [1, " + nested(depth) + "]}"},
          {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi", "x": )" + nested(depth) + "}]}"}}) {
      const minfer::test::HttpResult r = post(server.port(), path, body);
      INFO(path << " depth " << depth << " → " << r.status << " " << r.body.substr(0, 200));
      CHECK(r.status == 400);
      CHECK(r.body.find("deeper than 128") != std::string::npos);
    }
  }
  // 128 levels in all (the body's object is the first) are fine: the usual field error.
  const minfer::test::HttpResult ok = post(server.port(), "/v1/completions", "{\"prompt\": [1, " + nested(126) + "]}");
  CHECK(ok.status == 400);
  CHECK(ok.body.find("token ids must be non-negative integers") != std::string::npos);
  CHECK(get(server.port(), "/health").status == 200);
  CHECK(server.stop() == 0);
}

TEST_CASE("--api-key: 401 without the right bearer token; /health and /v1/models stay public") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "--api-key", "s3cret", "-c", "128", "-t", "1"});
  const std::string body = completion("Once", 4).dump();
  for (const std::string key : {"", "wrong"}) {
    const minfer::test::HttpResult r = post(server.port(), "/v1/completions", body, key);
    CHECK(r.status == 401);
    CHECK(r.json["error"]["type"] == "authentication_error");
    CHECK(post(server.port(), "/v1/chat/completions", body, key).status == 401);
    CHECK(get(server.port(), "/metrics", key).status == 401);
  }
  CHECK(post(server.port(), "/v1/completions", body, "s3cret").status == 200);
  CHECK(get(server.port(), "/metrics", "s3cret").status == 200);
  CHECK(get(server.port(), "/health").status == 200);
  CHECK(get(server.port(), "/v1/models").status == 200);
}

TEST_CASE("a client that goes away cancels its request and its blocks return to the pool") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-c", "8192", "-np", "2", "-t", "1"});
  // Long generations (ignore_eos: 8000 tokens); each client leaves early.
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8000}, {"ignore_eos", true}, {"temperature", 1.0}};
  {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(0, 50000);  // gives up after 50 ms: long before the answer
    CHECK(!c.Post("/v1/completions", body.dump(), "application/json"));
  }
  body["stream"] = true;
  {
    httplib::Client c("127.0.0.1", server.port());
    int events = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.headers.emplace("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++events < 2; };  // then hang up
    c.send(req);
    CHECK(events >= 1);
  }
  checkTwoCancelledByDisconnect(server);
}

// A raw loopback connection (cpp-httplib's client cannot half-close): sends `request`, reads until `enough`
// says the bytes so far suffice (or the server closes), then shuts its write side and reads to the end.
// Everything received; kStillOpen appended when the server kept the connection open for 30 s.
constexpr const char* kStillOpen = "[still open after 30 s]";

std::string halfCloseAfter(int port, const std::string& request, const std::function<bool(const std::string&)>& enough) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string got;
  char buf[4096];
  bool shut = false;
  for (;;) {
    if (!shut && enough(got)) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) break;
    if (n < 0) {
      if (errno != EINTR) {
        got += kStillOpen;
        break;
      }
      continue;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return got;
}

// HTTP/1.1 defines no meaning for a client's half-close (RFC 9112 §9.6 describes half-closing only as a
// server's staged close), and cpp-httplib 0.11 (Debian's) refuses every write once the peer's FIN has arrived
// (SocketStream::write checks is_socket_alive: a zero-byte MSG_PEEK): a half-closed client could not get
// its answer. So the server takes a half-close as the client leaving, like a close: it cancels at once
// (PeerWatch's POLLRDHUP) instead of generating an answer it cannot send.
TEST_CASE("a client that half-closes (shutdown SHUT_WR) is taken as gone: request cancelled, blocks freed") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-c", "8192", "-np", "2", "-t", "1"});
  auto request = [](bool stream) {
    const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 8000}, {"ignore_eos", true},
                                  {"temperature", 1.0}, {"stream", stream}}.dump();
    return "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  // Streamed: half-closed after the first event; the server then ends the response without [DONE].
  const std::string streamed = halfCloseAfter(server.port(), request(true), [](const std::string& got) {
    return got.find("data: ") != std::string::npos;
  });
  INFO("streamed: " << streamed.substr(0, 400));
  CHECK(streamed.find("200 OK") != std::string::npos);
  CHECK(streamed.find("[DONE]") == std::string::npos);
  CHECK(streamed.find(kStillOpen) == std::string::npos);
  // Not streamed: half-closed once the request is generating; no completion comes back.
  const std::string plain = halfCloseAfter(server.port(), request(false), [&](const std::string&) {
    for (int i = 0; i < 300 && server.metrics()["minfer_requests_running"] < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return true;
  });
  INFO("not streamed: " << plain.substr(0, 400));
  CHECK(plain.find("\"choices\"") == std::string::npos);
  CHECK(plain.find(kStillOpen) == std::string::npos);
  checkTwoCancelledByDisconnect(server);
  // The server still answers.
  CHECK(post(server.port(), "/v1/completions", completion("Once", 4).dump()).status == 200);
}

// A POST with neither Content-Length nor Transfer-Encoding has no body (RFC 9112 §6.3): answered 400 at once, not after
// cpp-httplib's read timeout.
TEST_CASE("a POST without a body gets its 400 at once") {
  if (!minfer::test::haveFixtures()) return;
  ServerProcess server({artifact(), "--device", "cpu", "-c", "64", "-t", "1"});
  const auto start = std::chrono::steady_clock::now();
  const std::string got = halfCloseAfter(server.port(), "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                                         [](const std::string& got) { return got.find("}}") != std::string::npos; });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(got.substr(0, 400));
  CHECK(got.rfind("HTTP/1.1 400", 0) == 0);
  CHECK(got.find("the request body is empty") != std::string::npos);
  CHECK(seconds < 10);
  CHECK(post(server.port(), "/v1/completions", completion("Once", 4).dump()).status == 200);
  // max_completion_tokens wins over max_tokens on /v1/completions too.
  json bounded = completion("Once", 24);
  bounded["max_completion_tokens"] = 3;
  bounded["ignore_eos"] = true;
  const minfer::test::HttpResult b = post(server.port(), "/v1/completions", bounded.dump());
  INFO(b.body);
  CHECK(b.status == 200);
  CHECK(b.json["usage"]["completion_tokens"] == 3);
}

// HttpServer::stop() before run() (minfer-server's signal thread taking a SIGTERM that arrived during start-up, before
// the main thread reached run()): run() then returns at once instead of serving on, unstoppable (the unfixed run/stop
// fail this); and stop() from another thread as run() begins, at delays that straddle the start of listening, is not
// lost (cpp-httplib's stop() acts only once it listens; this window is hit only at some delays).
TEST_CASE("HttpServer: stop() before run() or as it starts ends run()") {
  if (!minfer::test::haveFixtures()) return;
  auto model = minfer::Model::open(artifact(), minfer::BackendKind::kCpu);
  REQUIRE_MESSAGE(model.isOk(), model.status().message());
  auto session = (*model)->createBatchSession({.n_ctx = 64, .n_seq_max = 2});
  REQUIRE_MESSAGE(session.isOk(), session.status().message());
  minfer::SchedulerOptions so;
  so.n_vocab = (*model)->info().n_vocab;
  minfer::Scheduler scheduler(**session, (*model)->tokenizer(), so);
  // run() on a thread; whether it returned within 10 s.
  auto runReturns = [](minfer::server::HttpServer& server, const std::function<void()>& meanwhile) {
    std::promise<void> done;
    std::future<void> returned = done.get_future();
    std::thread t([&] {
      server.run();
      done.set_value();
    });
    meanwhile();
    const bool ok = returned.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    if (!ok) server.stop();  // a second stop() (the lost one is what failed): the thread must still end
    t.join();
    return ok;
  };
  for (int i = 0; i < 20; ++i) {
    CAPTURE(i);
    minfer::server::HttpServer early(**model, scheduler, {.model_id = "m"});
    REQUIRE(early.bind("127.0.0.1", 0).isOk());
    early.stop();
    CHECK(runReturns(early, [] {}));
    // From another thread, 0 … 1.9 ms after run()'s thread began: before, while and after it starts listening.
    minfer::server::HttpServer racing(**model, scheduler, {.model_id = "m"});
    REQUIRE(racing.bind("127.0.0.1", 0).isOk());
    CHECK(runReturns(racing, [&] {
      std::thread([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100 * i));
        racing.stop();
        racing.stop();  // idempotent
      }).join();
    }));
  }
}

TEST_CASE("bad options: a clear message and exit status 1") {
  if (!minfer::test::haveFixtures()) return;
  const std::string out = minfer::test::scratchDir() + "/server-cli.err";
  auto run = [&](const std::string& args) {
    const int raw = std::system((minfer::test::toolPath("minfer-server") + " " + args + " 2>" + out).c_str());
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    return std::make_pair(WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, ss.str());
  };
  const std::string mfb = artifact();
  const std::pair<std::string, std::string> cases[] = {
      {"", "no model"},
      {mfb + " --port 70000", "--port 70000 is out of range"},
      {mfb + " -np 0", "-np 0 is out of range"},
      {mfb + " -c 1", "-c 1 is out of range 2.."},
      {mfb + " --device cpu --kv-blocks 1 --kv-block-size 1", "a request could hold 1 position (--kv-blocks 1 of 1)"},
      {mfb + " --kv-block-size 3", "power of two"},
      {mfb + " --body-limit 10", "--body-limit 10"},
      {mfb + " --drain-timeout -1", "--drain-timeout -1 is out of range 0..86400 seconds"},
      {mfb + " --device tpu", "--device"},
      {mfb + " --chat-template /nonexistent/t.jinja", "cannot read the template"},
      {"/nonexistent.mfb", "/nonexistent.mfb"},
  };
  for (const auto& [args, says] : cases) {
    const auto [status, err] = run(args);
    INFO(args << " → " << err);
    CHECK(status == 1);
    CHECK(err.find(says) != std::string::npos);
  }
  // -c above the context the artifact was compiled for (minfer-compile -c): the tool's flags in the message.
  const std::string small = minfer::test::scratchDir() + "/server-c128.mfb";
  REQUIRE(std::system((minfer::test::toolPath("minfer-compile") + " " + minfer::test::fixturesDir() +
                       "/models/stories260K.gguf -o " + small + " -c 128 --target= > /dev/null 2>&1")
                          .c_str()) == 0);
  {
    const auto [status, err] = run(small + " --device cpu -c 1000");
    INFO(err);
    CHECK(status == 1);
    CHECK(err.find("-c 1000 exceeds the 128 positions") != std::string::npos);
    CHECK(err.find("minfer-compile -c 1000") != std::string::npos);
  }
  // A port already in use.
  ServerProcess server({mfb, "--device", "cpu", "-c", "64", "-t", "1"});
  const auto [status, err] = run(mfb + " --device cpu -c 64 --host 127.0.0.1 --port " + std::to_string(server.port()));
  INFO(err);
  CHECK(status == 1);
  CHECK(err.find("cannot listen on 127.0.0.1:" + std::to_string(server.port())) != std::string::npos);
}

namespace {

// A greedy generation long enough (ignore_eos) to be running when the test signals the server.
json longCompletion(int max_tokens, bool stream) {
  return {{"prompt", "Once upon a time"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"temperature", 0},
          {"stream", stream}};
}

// Polls `ready` every 20 ms for up to 60 s.
bool waitFor(const std::function<bool()>& ready) {
  for (int i = 0; i < 3000; ++i) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool logSays(const ServerProcess& server, const std::string& text) {
  return waitFor([&] { return server.log().find(text) != std::string::npos; });
}

constexpr int kLongTokens = 2000;  // ~2 s of stories260K on one CPU thread at -c 2048 (release; ~10x under ASan)

}  // namespace

TEST_CASE("SIGTERM drains: running requests finish, new ones and /health get 503, then exit 0") {
  if (!minfer::test::haveFixtures()) return;
  // A drain timeout no sanitized build reaches: the requests must finish, not be cancelled.
  ServerProcess server({artifact(), "--device", "cpu", "-np", "2", "-c", "2048", "-t", "1", "--drain-timeout", "600"});
  const int port = server.port();
  const int n = kLongTokens / 2;
  minfer::test::HttpResult plain;
  minfer::test::StreamResult streamed;
  std::thread a([&] { plain = post(port, "/v1/completions", longCompletion(n, false).dump()); });
  std::thread b([&] { streamed = postStream(port, "/v1/completions", longCompletion(n, true)); });
  REQUIRE(waitFor([&] { return server.metrics()["minfer_requests_running"] == 2; }));
  server.signal(SIGTERM);
  REQUIRE(logSays(server, "SIGTERM: stopping; new requests get 503; waiting up to 600 s for 2 running"));
  // Still listening while draining: a new request is refused with 503, and so is /health.
  const minfer::test::HttpResult late = post(port, "/v1/completions", completion("Once", 4).dump());
  INFO(late.body);
  CHECK(late.status == 503);
  CHECK(late.json["error"]["code"] == "shutting_down");
  const minfer::test::HttpResult health = get(port, "/health");
  CHECK(health.status == 503);
  CHECK(health.json["status"] == "shutting down");
  a.join();
  b.join();
  // The running requests were finished, not cut off.
  INFO(plain.body.substr(0, 300));
  CHECK(plain.status == 200);
  CHECK(plain.json["usage"]["completion_tokens"] == n);
  CHECK(plain.json["choices"][0]["finish_reason"] == "length");
  CHECK(streamed.status == 200);
  CHECK(streamed.done);
  CHECK(streamed.finish_reason == "length");
  CHECK(server.waitExit(60) == 0);
  CHECK(server.log().find("minfer-server: stopped") != std::string::npos);
}

TEST_CASE("shutdown cancels what is left after --drain-timeout or at a second signal; a full queue is 503 queue_full") {
  if (!minfer::test::haveFixtures()) return;
  {
    // One sequence, one place in the queue: a request runs, one waits, a third is refused for now (503).
    ServerProcess server({artifact(), "--device", "cpu", "-np", "1", "--max-queue", "1", "-c", "2048", "-t", "1",
                          "--drain-timeout", "0"});
    const int port = server.port();
    minfer::test::HttpResult plain;
    minfer::test::StreamResult streamed;
    std::thread a([&] { plain = post(port, "/v1/completions", longCompletion(kLongTokens, false).dump()); });
    REQUIRE(waitFor([&] { return server.metrics()["minfer_requests_running"] == 1; }));
    std::thread b([&] { streamed = postStream(port, "/v1/completions", longCompletion(kLongTokens, true)); });
    REQUIRE(waitFor([&] { return server.metrics()["minfer_requests_waiting"] == 1; }));
    const minfer::test::HttpResult full = post(port, "/v1/completions", completion("Once", 4).dump());
    INFO(full.body);
    CHECK(full.status == 503);
    CHECK(full.json["error"]["code"] == "queue_full");
    CHECK(full.json["error"]["message"].get<std::string>().find("queue full") != std::string::npos);
    server.signal(SIGTERM);
    a.join();
    b.join();
    // Both cancelled at once: the plain one gets 503, the stream an error event, then [DONE].
    CHECK(plain.status == 503);
    CHECK(plain.json["error"]["code"] == "shutting_down");
    CHECK(streamed.status == 200);
    CHECK(streamed.done);
    REQUIRE(streamed.events.size() >= 2);
    CHECK(streamed.events[streamed.events.size() - 2].find("the server is shutting down") != std::string::npos);
    CHECK(server.waitExit(30) == 0);
    CHECK(server.log().find("--drain-timeout 0 s reached: cancelling 2 requests") != std::string::npos);
  }
  {
    ServerProcess server({artifact(), "--device", "cpu", "-np", "1", "-c", "2048", "-t", "1"});
    const int port = server.port();
    minfer::test::HttpResult plain;
    std::thread a([&] { plain = post(port, "/v1/completions", longCompletion(kLongTokens, false).dump()); });
    REQUIRE(waitFor([&] { return server.metrics()["minfer_requests_running"] == 1; }));
    server.signal(SIGINT);
    REQUIRE(logSays(server, "SIGINT: stopping; new requests get 503; waiting up to 30 s for 1 running"));
    server.signal(SIGTERM);
    a.join();
    CHECK(plain.status == 503);
    CHECK(server.waitExit(30) == 0);
    CHECK(server.log().find("second signal: cancelling 1 requests") != std::string::npos);
  }
}
