// minfer-server as a child process, and HTTP helpers (server_process.h).
#include "tests/serve/server_process.h"

#include "runtime/tools/server/load_client.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <httplib.h>
#include <regex>
#include <sstream>
#include <thread>

#include "minfer/runtime.h"
#include "tests/test_support.h"

namespace minfer::test {

std::string toolPath(const char* name) { return std::string(MINFER_TOOLS_DIR) + "/" + name; }

ServerProcess::ServerProcess(const std::vector<std::string>& args) {
  // A server that closes a connection the client is still writing to (a refused body) must fail that
  // request, not kill the test process (cpp-httplib 0.11's client sends without MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  static int counter = 0;
  log_path_ = scratchDir() + "/server-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log";
  std::vector<std::string> argv = {toolPath("minfer-server")};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* a : {"--host", "127.0.0.1", "--port", "0"}) argv.push_back(a);
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    FILE* log = std::freopen(log_path_.c_str(), "w", stderr);
    if (!log) _exit(126);
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
  for (int i = 0; i < 600; ++i) {
    std::smatch m;
    const std::string text = log();
    if (std::regex_search(text, m, listening)) {
      port_ = std::stoi(m[1]);
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      FAIL("minfer-server exited before listening: " << text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("minfer-server did not listen within 60 s: " << log());
}

ServerProcess::~ServerProcess() { stop(); }

int ServerProcess::stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  if (const int status = waitExit(30); status != -2) return status;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  port_ = 0;
  return -1;
}

void ServerProcess::signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

int ServerProcess::waitExit(double seconds) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      port_ = 0;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -2;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string ServerProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

long ServerProcess::rssKb() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

std::map<std::string, double> ServerProcess::metrics(const std::string& api_key) const {
  std::map<std::string, double> out;
  const HttpResult r = get(port_, "/metrics", api_key);
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

namespace {

httplib::Headers headers(const std::string& api_key) {
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  return h;
}

HttpResult result(const httplib::Result& r) {
  HttpResult out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.json = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (out.json.is_discarded()) out.json = nullptr;
  return out;
}

}  // namespace

HttpResult post(int port, const std::string& path, const std::string& body, const std::string& api_key) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(600);
  return result(client.Post(path, headers(api_key), body, "application/json"));
}

HttpResult get(int port, const std::string& path, const std::string& api_key) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  return result(client.Get(path, headers(api_key)));
}

StreamResult postStream(int port, const std::string& path, const nlohmann::json& body, const std::string& api_key) {
  StreamResult out;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(600);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers(api_key);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  server::SseSplitter sse;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.feed(data, n, [&](const std::string& event) {
      out.events.push_back(event);
      if (event == "[DONE]") {
        out.done = true;
        return;
      }
      const nlohmann::json j = nlohmann::json::parse(event, nullptr, false);
      if (j.is_discarded() || !j.contains("choices")) return;
      if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
      for (const auto& c : j["choices"]) {
        if (c.contains("text")) out.text += c["text"].get<std::string>();
        if (c.contains("delta") && c["delta"].contains("content")) out.text += c["delta"]["content"].get<std::string>();
        if (!c["finish_reason"].is_null()) out.finish_reason = c["finish_reason"].get<std::string>();
      }
    });
    return true;
  };
  auto r = client.send(req);
  if (!r) out.status = -1;
  out.done = out.done && !out.events.empty() && out.events.back() == "[DONE]";
  return out;
}

Reference single(const std::string& artifact, const std::string& prompt, int max_tokens,
                 const std::optional<SamplerParams>& sampling) {
  static std::unique_ptr<Model> model;
  static std::unique_ptr<Session> session;
  if (!model) {
    auto m = Model::open(artifact, BackendKind::kCpu);
    REQUIRE_MESSAGE(bool(m), m.status().message());
    model = std::move(*m);
    auto s = model->createSession({256, 1});
    REQUIRE_MESSAGE(bool(s), s.status().message());
    session = std::move(*s);
  }
  session->reset();
  GenerateParams params;
  params.n_predict = max_tokens;
  params.sampling.temperature = 0;
  if (sampling) params.sampling = *sampling;
  params.parse_special = true;
  Reference ref;
  auto r = session->generate(prompt, params, [&](std::string_view piece, int32_t) {
    ref.text += piece;
    return true;
  });
  REQUIRE_MESSAGE(bool(r), r.status().message());
  ref.finish_reason = r->stop == StopReason::kEndOfGeneration ? "stop" : "length";
  ref.prompt_tokens = r->n_prompt;
  ref.completion_tokens = r->n_generated;
  return ref;
}

}  // namespace minfer::test
