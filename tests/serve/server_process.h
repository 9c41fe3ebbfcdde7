// minfer-server as a child process for the end-to-end suites: started on a free loopback port (--port 0,
// the port read from its "listening on" line), stopped with SIGTERM; plus the HTTP helpers the suites share.
#pragma once

#include <sys/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "minfer/sampler.h"

namespace minfer::test {

class ServerProcess {
 public:
  // Starts build/bin/minfer-server with `args` (the artifact first) plus --host 127.0.0.1 --port 0,
  // stderr to a log file; waits (≤ 60 s) for its "listening on" line. Fails the test when it exits first.
  explicit ServerProcess(const std::vector<std::string>& args);
  // SIGTERM, then waits for the exit (SIGKILL after 30 s).
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return port_ > 0; }
  // Stops the server; its exit status (−1 when killed by a signal).
  int stop();
  // Sends `sig` and returns at once (stop() and waitExit() still apply).
  void signal(int sig) const;
  // Waits up to `seconds` for the server to exit on its own: its exit status, −1 when killed by a signal,
  // −2 when still running.
  int waitExit(double seconds);
  std::string log() const;
  // The server's resident set (VmRSS, kB).
  long rssKb() const;
  // GET /metrics parsed: sample name (with labels) → value.
  std::map<std::string, double> metrics(const std::string& api_key = "") const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

struct HttpResult {
  int status = -1;  // −1: no response (connection failed)
  std::string body;
  nlohmann::json json;  // the body parsed (null when it is not JSON)
};

// POST `body` to `path` on 127.0.0.1:port, optional bearer key.
HttpResult post(int port, const std::string& path, const std::string& body, const std::string& api_key = "");
HttpResult get(int port, const std::string& path, const std::string& api_key = "");

// A streamed (server-sent events) response: each "data:" payload in order, [DONE] included.
struct StreamResult {
  int status = -1;
  std::vector<std::string> events;
  std::string text;  // choices[0].text or .delta.content concatenated
  std::string finish_reason;
  nlohmann::json usage;  // from a usage chunk, when one came
  bool done = false;     // "data: [DONE]" seen last
};
StreamResult postStream(int port, const std::string& path, const nlohmann::json& body, const std::string& api_key = "");

// What the server must answer for a greedy request: Session::generate on the CPU with the prompt tokenized
// as the server does (BOS as the vocabulary says, control-token texts as tokens).
struct Reference {
  std::string text;
  std::string finish_reason;  // "stop" (end of generation) or "length"
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
// The session is made once per process (n_ctx 256) for `artifact`; later calls must name the same one.
// `sampling`: greedy when absent.
Reference single(const std::string& artifact, const std::string& prompt, int max_tokens,
                 const std::optional<SamplerParams>& sampling = std::nullopt);

// Path of an executable of this build (MINFER_TOOLS_DIR).
std::string toolPath(const char* name);

}  // namespace minfer::test
