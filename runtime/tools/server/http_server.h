// minfer-server's HTTP side: cpp-httplib routes onto the Scheduler (OpenAI-compatible API, issue 14).
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (JSON, or server-sent events with
// "stream": true), GET /v1/models, GET /health, GET /metrics (Prometheus text format 0.0.4). Every error
// is an OpenAI-style JSON body (openai_api.h) with a 4xx/5xx status; a handler never takes the server
// down. With an API key, every endpoint but /health and /v1/models (public, as in llama-server) needs
// "Authorization: Bearer KEY" (else 401).
//
// Each generation request is handed to the Scheduler; the HTTP thread waits on a per-request channel
// that the scheduler's callback fills. A client that goes away cancels its request: a streamed write
// that fails ends the response and cancels it, and while nothing is written the thread checks the
// connection every 100 ms (PeerWatch: cpp-httplib 0.11 has no Request::is_connection_closed).
//
// Shutting down (SIGINT/SIGTERM in minfer-server): beginDrain() makes every new generation request and
// /health answer 503 ("shutting_down", Connection: close) while the listening socket stays open; requests
// already accepted carry on (streams keep streaming) and activeRequests() counts them down to 0; then
// stop(). Requests still running when the caller gives up are ended by stopping the Scheduler (they finish
// "cancelled": a 503, or an error event then [DONE] on a stream).
//
// Thread-safety: handlers run on cpp-httplib's pool (threads_http threads; a waiting or streaming
// request holds one, and so does an idle keep-alive connection); bind() and run() from one thread,
// beginDrain(), activeRequests() and stop() from any.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "minfer/chat_template.h"
#include "minfer/runtime.h"
#include "minfer/scheduler.h"
#include "runtime/tools/server/openai_api.h"

namespace httplib {
class Server;
class ContentReader;
struct Request;
struct Response;
}  // namespace httplib

namespace minfer::server {

struct ServerOptions {
  std::string model_id;            // the "model" clients name (and /v1/models lists)
  std::string api_key;             // "" = no authentication
  size_t max_body_bytes = 1 << 20; // larger request bodies get 413
  int threads_http = 8;            // handler threads
  ApiLimits limits;
  // The chat template: parsed at construction; without one (or when it does not parse) the chat
  // endpoint answers 400 with template_problem.
  std::string template_source;
  std::string template_origin;     // for messages: "FILE" or "model.mfb: tokenizer.chat_template"
};

class HttpServer {
 public:
  HttpServer(const Model& model, Scheduler& scheduler, ServerOptions options);
  ~HttpServer();

  // The chat endpoint's problem ("" when a template parsed).
  const std::string& templateProblem() const { return template_problem_; }
  // Binds host:port; port 0 picks a free port. Returns the port bound. Error: the address in use or
  // not available (the message names host and port).
  Result<int> bind(const std::string& host, int port);
  // Serves until stop(). Call after bind().
  void run();
  // Makes run() return: at once when it is serving, as soon as it starts when it has not yet (run() then
  // returns without serving). Any thread; idempotent.
  void stop();
  // New generation requests get 503 from now on (see above). Idempotent.
  void beginDrain() { draining_ = true; }
  // Generation requests accepted and not yet answered (a stream counts until its response has ended).
  int activeRequests() const { return active_; }

 private:
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res) const;
  bool readBody(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                std::string& body) const;
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint, const std::string& body);
  std::optional<ApiError> promptIds(const ParsedRequest& request, std::vector<int32_t>& ids) const;
  std::string metricsText() const;

  const Model& model_;
  Scheduler& scheduler_;
  ServerOptions options_;
  std::optional<chat::ChatTemplate> template_;
  std::string template_problem_;
  std::unique_ptr<httplib::Server> http_;
  int listen_socket_ = -1;  // the listening socket (from cpp-httplib's socket-options hook)
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> draining_{false};
  // run() and stop() in either order, from different threads (a signal during start-up: stop() before run()).
  std::mutex run_mutex_;
  bool stop_requested_ = false, running_ = false;
  std::atomic<int> active_{0};
  std::atomic<uint64_t> http_errors_4xx_{0}, http_errors_5xx_{0}, disconnects_{0};
};

}  // namespace minfer::server
