// minfer-server's HTTP routes (http_server.h): OpenAI-compatible endpoints onto the Scheduler.
#include "runtime/tools/server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <httplib.h>
#include <mutex>
#include <thread>

namespace minfer::server {

using nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a waiting handler looks at its client

// The text and end of one request, filled by the scheduler's callback, drained by the HTTP thread.
class Channel {
 public:
  void push(const RequestEvent& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      text_ += e.text;
      if (e.finished) {
        finished_ = true;
        reason_ = e.finish_reason;
        prompt_tokens_ = e.prompt_tokens;
        completion_tokens_ = e.completion_tokens;
        error_ = std::string(e.error);
      }
    }
    cv_.notify_one();
  }
  // Waits up to kPoll for new text or the end; moves the new text into `out`. True once finished (then
  // `out` holds the last text).
  bool take(std::string& out) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, kPoll, [&] { return finished_ || !text_.empty(); });
    out = std::move(text_);
    text_.clear();
    return finished_;
  }
  FinishReason reason() const { std::lock_guard<std::mutex> l(mutex_); return reason_; }
  int promptTokens() const { std::lock_guard<std::mutex> l(mutex_); return prompt_tokens_; }
  int completionTokens() const { std::lock_guard<std::mutex> l(mutex_); return completion_tokens_; }
  std::string error() const { std::lock_guard<std::mutex> l(mutex_); return error_; }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::string text_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::kError;
  int prompt_tokens_ = 0, completion_tokens_ = 0;
  std::string error_;
};

// The socket of the request's connection, found by its address pair among this process's descriptors
// (cpp-httplib 0.11 does not expose it). closed(): the client shut its side or reset (POLLRDHUP/HUP/ERR).
// Found once per request: O(open descriptors) getsockname/getpeername calls.
// A half-close (the client's shutdown(SHUT_WR), a FIN while its read side stays open) counts as gone, like a
// close, which the server cannot tell apart from it before writing: HTTP/1.1 defines no meaning for a
// client's half-close (RFC 9112 §9.6 describes half-closing only as a server's staged close), and
// cpp-httplib 0.11 itself refuses every write once the peer's FIN has arrived (SocketStream::write →
// is_socket_alive, a zero-byte MSG_PEEK), so no answer could reach such a client anyway. Cancelling at the
// FIN frees the sequence's KV blocks within kPoll, for a stream waiting on its first token as for a request
// answered at the end (tests/serve "half-closes").
class PeerWatch {
 public:
  explicit PeerWatch(const httplib::Request& req) {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return;
    while (dirent* d = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(d->d_name, &end, 10);
      if (end == d->d_name || *end != '\0' || fd == dirfd(dir)) continue;
      if (matches(static_cast<int>(fd), req)) {
        fd_ = static_cast<int>(fd);
        break;
      }
    }
    closedir(dir);
  }
  bool closed() const {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
  }

 private:
  static bool endpoint(const sockaddr_storage& a, std::string& host, int& port) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
      port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf));
      port = ntohs(in->sin6_port);
    } else {
      return false;
    }
    host = buf;
    return true;
  }
  static bool matches(int fd, const httplib::Request& req) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return false;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return false;
    std::string lh, ph;
    int lp = -1, pp = -1;
    return endpoint(local, lh, lp) && endpoint(peer, ph, pp) && lp == req.local_port && pp == req.remote_port &&
           ph == req.remote_addr && lh == req.local_addr;
  }
  int fd_ = -1;
};

// Counts a generation request in HttpServer::active_ for as long as it lives (a stream's provider holds
// it until the response has ended). The increment comes before the draining check, so a request either
// sees the drain or is counted by it.
class ActiveRequest {
 public:
  explicit ActiveRequest(std::atomic<int>& count) : count_(count) { ++count_; }
  ~ActiveRequest() { --count_; }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

 private:
  std::atomic<int>& count_;
};

std::string randomHex(uint64_t counter) {
  static const uint64_t salt = std::chrono::steady_clock::now().time_since_epoch().count();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>((counter * 0x9E3779B97F4A7C15ull) ^ salt));
  return buf;
}

void sendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(errorBody(e), "application/json");
}

// The method an endpoint of this server takes (GET or POST; HEAD with GET is cpp-httplib's), null for other paths.
const char* endpointMethod(const std::string& path) {
  for (const char* p : {"/health", "/v1/models", "/models", "/metrics"})
    if (path == p) return "GET";
  for (const char* p : {"/v1/completions", "/completions", "/v1/chat/completions", "/chat/completions"})
    if (path == p) return "POST";
  return nullptr;
}

// New requests while draining, and requests the shutdown cancelled.
ApiError shuttingDown() { return {503, "the server is shutting down", "", "server_error", "shutting_down"}; }

// A refusal of Scheduler::submit: the request's fault (400), or the server's state (503, retry later).
ApiError submitError(SubmitError why, const std::string& message) {
  switch (why) {
    case SubmitError::kInvalidRequest: return {400, message};
    case SubmitError::kQueueFull: return {503, message, "", "server_error", "queue_full"};
    case SubmitError::kStopped: return shuttingDown();
  }
  return {500, message, "", "server_error"};
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace

HttpServer::HttpServer(const Model& model, Scheduler& scheduler, ServerOptions options)
    : model_(model), scheduler_(scheduler), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  if (options_.template_source.empty()) {
    template_problem_ = "this model has no chat template (tokenizer.chat_template): use /v1/completions, or start "
                        "minfer-server with --chat-template FILE";
  } else if (auto t = chat::ChatTemplate::parse(options_.template_source); !t) {
    template_problem_ = options_.template_origin + ": " + t.status().message();
  } else {
    template_ = std::move(*t);
  }
  routes();
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound < 0) return Status::error("cannot listen on " + host + ":" + std::to_string(port) + " (address in use or not available)");
  // cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
  // library): a burst of connections overflows it, and a connection whose handshake the kernel dropped can
  // reach a handler thread too late for its keep-alive wait (5 s) and be closed unanswered. listen() again
  // on the bound socket raises the backlog (Linux allows it on a listening socket).
  if (listen_socket_ >= 0) ::listen(listen_socket_, SOMAXCONN);
  return bound;
}

void HttpServer::run() {
  {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (stop_requested_) {  // stopped before it ran (a signal during start-up): nobody will accept on the socket
      if (listen_socket_ >= 0) ::close(listen_socket_);
      listen_socket_ = -1;
      return;
    }
    running_ = true;
  }
  http_->listen_after_bind();
  std::lock_guard<std::mutex> lock(run_mutex_);
  running_ = false;
}

// cpp-httplib's stop() acts only once listen_after_bind() has marked the server running: until then, wait for
// that (or for run() to have returned), so that a stop() right after run() began is not lost.
void HttpServer::stop() {
  {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (stop_requested_) return;  // the first stop() does the work (cpp-httplib's stop() asserts an open socket)
    stop_requested_ = true;
    if (!running_) return;  // run() has not begun: it returns at once when it does
  }
  while (!http_->is_running()) {
    {
      std::lock_guard<std::mutex> lock(run_mutex_);
      if (!running_) return;  // run() returned without listening
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  http_->stop();
}

bool HttpServer::authorized(const httplib::Request& req, httplib::Response& res) const {
  if (options_.api_key.empty() || req.get_header_value("Authorization") == "Bearer " + options_.api_key) return true;
  sendError(res, {401, "invalid or missing API key: send \"Authorization: Bearer <key>\"", "", "authentication_error",
                  "invalid_api_key"});
  return false;
}

void HttpServer::routes() {
  const int threads = options_.threads_http;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, which lets a second server bind a
  // port in use (and the kernel share connections between them) instead of failing.
  http_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_socket_ = sock;
  });
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_read_timeout(60);
  http_->set_write_timeout(60);

  // Every 4xx/5xx without a body yet (cpp-httplib's own 404, 413, 400 …) gets an OpenAI-style one. cpp-httplib answers
  // a known path asked with another method 404 too: that is a 405 with the methods it takes (RFC 9110 §15.5.6, Allow).
  http_->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    (res.status >= 500 ? http_errors_5xx_ : http_errors_4xx_)++;
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{res.status, "HTTP " + std::to_string(res.status)};
    const char* allowed = res.status == 404 ? endpointMethod(req.path) : nullptr;
    if (allowed) {
      e.status = 405;
      e.message = "method " + req.method + " is not allowed on " + req.path + " (allowed: " + allowed + ")";
      e.code = "method_not_allowed";
      res.set_header("Allow", allowed);
    } else if (res.status == 404) {
      e.message = "no such endpoint: " + req.method + " " + req.path;
      e.type = "not_found_error";
    } else if (res.status == 413) {
      e.message = "the request body exceeds the limit of " + std::to_string(options_.max_body_bytes) + " bytes (--body-limit)";
    } else if (res.status >= 500) {
      e.type = "server_error";
    }
    sendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    sendError(res, {500, "internal error: " + what, "", "server_error"});
  });

  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      res.status = 503;
      res.set_header("Connection", "close");
      res.set_content(R"({"status":"shutting down"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  auto models = [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", options_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "minfer"}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  };
  http_->Get("/v1/models", models);
  http_->Get("/models", models);
  http_->Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(metricsText(), "text/plain; version=0.0.4");
  });
  // The generation endpoints read their bodies themselves (readBody): cpp-httplib's own reading parses
  // an application/x-www-form-urlencoded body (curl -d's default type) as a form and refuses one over 8 KiB
  // with a 413, whatever --body-limit says.
  auto post = [this](Endpoint endpoint) {
    return httplib::Server::HandlerWithContentReader(
        [this, endpoint](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
          std::string body;
          if (readBody(req, res, reader, body)) generate(req, res, endpoint, body);
        });
  };
  for (const char* path : {"/v1/completions", "/completions"}) http_->Post(path, post(Endpoint::kCompletions));
  for (const char* path : {"/v1/chat/completions", "/chat/completions"}) http_->Post(path, post(Endpoint::kChat));
}

// The request body, whatever its Content-Type (parsed as JSON later), at most max_body_bytes. False with
// the response set: 413 over the limit (by Content-Length, whose body cpp-httplib then skips, or while
// reading a chunked body), 415 for multipart/form-data, 400 when the body cannot be read. The rest of a
// chunked body over the limit is read and dropped, up to kMaxDroppedBytes, so that a client still sending
// it gets the 413 rather than a reset connection; after a refusal the connection is closed.
bool HttpServer::readBody(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                          std::string& body) const {
  if (req.is_multipart_form_data()) {
    res.set_header("Connection", "close");
    sendError(res, {415, "multipart/form-data bodies are not supported: send the request as JSON "
                         "(Content-Type: application/json)", "", "invalid_request_error", "unsupported_media_type"});
    return false;
  }
  // HTTP/1.1 (RFC 9112 §6.3): a request with neither Content-Length nor Transfer-Encoding has no body. cpp-httplib
  // would read one until the client closes or its read timeout (`curl -X POST` without -d waited 60 s).
  if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
    res.set_header("Connection", "close");  // a client that sent a body anyway: not read as its next request
    return true;
  }
  constexpr size_t kMaxDroppedBytes = size_t{16} << 20;
  bool too_large = false;
  size_t dropped = 0;
  const bool ok = reader([&](const char* data, size_t n) {
    if (!too_large && body.size() + n <= options_.max_body_bytes) {
      body.append(data, n);
      return true;
    }
    if (!too_large) {
      too_large = true;
      std::string().swap(body);
    }
    dropped += n;
    return dropped <= kMaxDroppedBytes;
  });
  if (ok && !too_large) return true;
  res.set_header("Connection", "close");
  if (too_large || res.status == 413) {
    res.status = 413;  // the error handler writes the body, naming --body-limit
  } else {
    sendError(res, {400, "the request body could not be read (truncated, malformed chunked encoding, or not decodable "
                         "as its Content-Encoding)"});
  }
  return false;
}

// The prompt's token ids: the completion prompt tokenized (BOS as the vocabulary says, control-token
// texts as tokens, like llama-server), or the chat rendered with the template first.
std::optional<ApiError> HttpServer::promptIds(const ParsedRequest& request, std::vector<int32_t>& ids) const {
  const char* field = request.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (request.prompt_is_ids) {
    ids = request.prompt_ids;
    for (int32_t id : ids)
      if (id >= model_.info().n_vocab)
        return ApiError{400, "prompt: token id " + std::to_string(id) + " outside [0, " + std::to_string(model_.info().n_vocab) + ")", "prompt"};
  } else {
    std::string_view text = request.prompt_text;
    std::string rendered;
    const Tokenizer& tok = model_.tokenizer();
    const Vocabulary& vocab = tok.vocabulary();
    if (request.endpoint == Endpoint::kChat) {
      if (!template_) return ApiError{400, template_problem_, "", "invalid_request_error", "no_chat_template"};
      chat::ChatInputs in;
      in.messages = request.messages;
      in.add_generation_prompt = true;
      in.bos_token = vocab.bos_id >= 0 ? tok.tokenToPiece(vocab.bos_id, true) : "";
      in.eos_token = vocab.eos_id >= 0 ? tok.tokenToPiece(vocab.eos_id, true) : "";
      auto r = template_->render(in);
      if (!r) return ApiError{400, "messages: " + r.status().message(), "messages"};
      rendered = std::move(*r);
      text = rendered;
      // The tokenizer adds BOS itself when the vocabulary says so: a BOS the template rendered is dropped
      // (as minfer-run -cnv and llama.cpp's common_chat_templates_apply do).
      if (vocab.add_bos && !in.bos_token.empty() && text.starts_with(in.bos_token)) text.remove_prefix(in.bos_token.size());
    }
    auto r = model_.tokenize(text, /*add_special=*/true, /*parse_special=*/true);
    if (!r) return ApiError{500, r.status().message(), "", "server_error"};
    ids = std::move(*r);
  }
  if (ids.empty()) return ApiError{400, std::string(field) + ": empty (no tokens)", field};
  if (ids.size() >= static_cast<size_t>(scheduler_.capacity()))
    return ApiError{400,
                    std::string(field) + ": the prompt is " + std::to_string(ids.size()) +
                        " tokens; the context holds " + std::to_string(scheduler_.capacity()) +
                        " positions and at least one must remain for generation",
                    field, "invalid_request_error", "context_length_exceeded"};
  return std::nullopt;
}

void HttpServer::generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint,
                          const std::string& body) {
  auto active = std::make_shared<ActiveRequest>(active_);
  if (draining_) {
    res.set_header("Connection", "close");
    return sendError(res, shuttingDown());
  }
  if (!authorized(req, res)) return;
  ParsedRequest request;
  if (auto e = parseRequest(body, endpoint, options_.model_id, options_.limits, request)) return sendError(res, *e);
  RequestParams params = request.params;
  if (auto e = promptIds(request, params.prompt)) return sendError(res, *e);
  // Without max_tokens, as many as the context takes: the scheduler stops a request once its next token would need a
  // position past the capacity, so capacity − prompt + 1 tokens (the last one is sampled, never evaluated).
  const int room = scheduler_.capacity() - static_cast<int>(params.prompt.size()) + 1;
  params.max_tokens = request.max_tokens ? *request.max_tokens : room;

  auto channel = std::make_shared<Channel>();
  SubmitError why = SubmitError::kInvalidRequest;
  auto handle = scheduler_.submit(std::move(params), [channel](const RequestEvent& e) { channel->push(e); }, &why);
  if (!handle) return sendError(res, submitError(why, handle.status().message()));
  ResponseMeta meta;
  meta.endpoint = endpoint;
  meta.id = std::string(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + randomHex(next_id_++);
  meta.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  meta.model = options_.model_id;
  auto watch = std::make_shared<PeerWatch>(req);

  if (!request.stream) {
    std::string text, piece;
    for (bool done = false; !done;) {
      done = channel->take(piece);
      text += piece;
      if (!done && watch->closed()) {  // nobody to answer: free the sequence now
        handle->cancel();
        ++disconnects_;
        return;
      }
    }
    const FinishReason reason = channel->reason();
    if (reason == FinishReason::kError) return sendError(res, {500, channel->error(), "", "server_error"});
    if (reason == FinishReason::kCancelled) return sendError(res, shuttingDown());
    res.set_content(completionResponse(meta, text, reason, channel->promptTokens(), channel->completionTokens())
                        .dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    return;
  }

  struct Stream {
    bool first = true;
    bool done = false;
  };
  auto state = std::make_shared<Stream>();
  const bool include_usage = request.include_usage;
  RequestHandle h = *handle;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      // `active` is held by the provider: the request counts until the response has ended.
      [this, channel, state, meta, include_usage, watch, active](size_t, httplib::DataSink& sink) {
        std::string piece;
        const bool finished = channel->take(piece);
        std::string out;
        if (!piece.empty() || (state->first && meta.endpoint == Endpoint::kChat))
          out += sse(streamChunk(meta, piece, std::nullopt, state->first));
        if (!out.empty()) state->first = false;
        if (finished) {
          const FinishReason reason = channel->reason();
          if (reason == FinishReason::kError || reason == FinishReason::kCancelled) {
            const ApiError e = reason == FinishReason::kError ? ApiError{500, channel->error(), "", "server_error"}
                                                              : shuttingDown();
            out += "data: " + errorBody(e) + "\n\n";
          } else {
            out += sse(streamChunk(meta, "", reason, state->first && meta.endpoint == Endpoint::kChat));
            if (include_usage) out += sse(usageChunk(meta, channel->promptTokens(), channel->completionTokens()));
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;  // the client is gone
        if (finished) {
          state->done = true;
          sink.done();
          return true;
        }
        if (out.empty() && watch->closed()) return false;  // the releaser cancels
        return true;
      },
      [this, state, h](bool) {
        if (state->done) return;
        h.cancel();  // the response ended early: the client went away (or the server is stopping)
        ++disconnects_;
      });
}

std::string HttpServer::metricsText() const {
  const SchedulerMetrics m = scheduler_.metrics();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& samples) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + samples;
  };
  auto sample = [](const char* name, uint64_t v, const std::string& labels = "") {
    return std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(v) + "\n";
  };
  std::string finished;
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled, FinishReason::kError})
    finished += sample("minfer_requests_finished_total", m.requests_finished[static_cast<int>(r)],
                       std::string("finish_reason=\"") + finishReasonName(r) + "\"");
  metric("minfer_requests_submitted_total", "counter", "Generation requests accepted by the scheduler.",
         sample("minfer_requests_submitted_total", m.requests_submitted));
  metric("minfer_requests_finished_total", "counter", "Generation requests finished, by finish reason.", finished);
  metric("minfer_http_errors_total", "counter", "HTTP responses with an error status.",
         sample("minfer_http_errors_total", http_errors_4xx_, "class=\"4xx\"") +
             sample("minfer_http_errors_total", http_errors_5xx_, "class=\"5xx\""));
  metric("minfer_client_disconnects_total", "counter", "Requests cancelled because their client went away.",
         sample("minfer_client_disconnects_total", disconnects_));
  metric("minfer_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         sample("minfer_prompt_tokens_total", m.prompt_tokens));
  metric("minfer_generated_tokens_total", "counter", "Tokens generated.", sample("minfer_generated_tokens_total", m.generated_tokens));
  metric("minfer_evaluated_tokens_total", "counter", "Tokens evaluated by batch steps (prompts, decodes, recomputation).",
         sample("minfer_evaluated_tokens_total", m.evaluated_tokens));
  metric("minfer_steps_total", "counter", "Batch steps executed.", sample("minfer_steps_total", m.steps));
  metric("minfer_preemptions_total", "counter", "Sequences preempted (recomputed later) for lack of KV blocks.",
         sample("minfer_preemptions_total", m.preemptions));
  metric("minfer_requests_waiting", "gauge", "Requests queued, not yet admitted.", sample("minfer_requests_waiting", m.requests_waiting));
  metric("minfer_requests_running", "gauge", "Requests holding a sequence.", sample("minfer_requests_running", m.requests_running));
  metric("minfer_kv_blocks_used", "gauge", "KV cache blocks in use.", sample("minfer_kv_blocks_used", m.kv_blocks_used));
  metric("minfer_kv_blocks_total", "gauge", "KV cache blocks in the pool.", sample("minfer_kv_blocks_total", m.kv_blocks_total));
  return out;
}

}  // namespace minfer::server
