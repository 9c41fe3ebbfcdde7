// A load client for minfer-server: threads that issue streaming completions back to back and time them
// (time to first token, gaps between text chunks). Shared by minfer-server-bench and the load test
// (tests/serve/test_server_load.cpp).
#pragma once

#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace minfer::server {

// What the clients measured, merged under `mutex`.
struct LoadStats {
  std::mutex mutex;
  std::vector<double> ttft_ms;  // per answered request: from sending it to its first non-empty text chunk, ms
  std::vector<double> itl_ms;   // gaps between consecutive non-empty text chunks of a request, ms
  long requests = 0;            // requests sent
  long answered = 0;            // answered completely: status 200, a finish_reason stop or length, usage, [DONE]
  long prompt_tokens = 0, completion_tokens = 0;  // usage of the answered ones
  std::vector<std::string> failures;              // the first 10 unanswered ones, described
};

// The body of client `client`'s k-th request (0-based). The load client sets "stream": true and
// stream_options.include_usage itself.
using RequestBody = std::function<nlohmann::json(int client, int k)>;

// Server-sent events from a byte stream read in arbitrary pieces: each event ends with a blank line; only its
// "data: " payload counts (an SSE comment, ": …", is skipped). feed() calls on_data(payload) per whole event.
class SseSplitter {
 public:
  void feed(const char* data, size_t n, const std::function<void(const std::string&)>& on_data) {
    buffer_.append(data, n);
    for (size_t end; (end = buffer_.find("\n\n")) != std::string::npos;) {
      std::string event = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) on_data(event.substr(6));
    }
  }

 private:
  std::string buffer_;
};

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string path = "/v1/completions";
  int clients = 1;             // concurrent connections, one thread each
  double seconds = 0;          // each client starts requests until this long after driveLoad began …
  int min_requests = 0;        // … and until it has made at least this many (requests in flight complete)
  long max_requests = 0;       // > 0: the clients start at most this many requests in all (overrides both)
  double read_timeout_s = 600;
};

// One streamed request: POST `body` (plus stream and include_usage) to options.path; its timings and
// outcome are added to `stats`. `what` names it in a failure.
void streamRequest(const LoadOptions& options, nlohmann::json body, const std::string& what, LoadStats& stats);

// options.clients threads, each issuing body(client, k) for k = 0, 1, … back to back (see LoadOptions for when
// they stop); returns when all have finished.
void driveLoad(const LoadOptions& options, const RequestBody& body, LoadStats& stats);

// The p-quantile (0 ≤ p ≤ 1) of `v` by the nearest rank; 0 for an empty vector.
double percentile(std::vector<double> v, double p);

}  // namespace minfer::server
