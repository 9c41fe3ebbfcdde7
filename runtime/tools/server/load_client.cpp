// The load client (load_client.h): cpp-httplib clients parsing server-sent events as they arrive.
#include "runtime/tools/server/load_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <httplib.h>
#include <thread>

namespace minfer::server {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

void streamRequest(const LoadOptions& options, json body, const std::string& what, LoadStats& stats) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Clock::time_point t0 = Clock::now();
  std::vector<Clock::time_point> arrivals;  // of the non-empty text chunks
  httplib::Client cli(options.host, options.port);
  cli.set_read_timeout(static_cast<time_t>(options.read_timeout_s));
  cli.set_connection_timeout(60);
  std::string finish;
  bool done = false;
  long prompt_tokens = -1, completion_tokens = -1;
  httplib::Request req;
  req.method = "POST";
  req.path = options.path;
  req.body = body.dump();
  req.headers.emplace("Content-Type", "application/json");
  SseSplitter sse;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.feed(data, n, [&](const std::string& event) {
      if (event == "[DONE]") {
        done = true;
        return;
      }
      const json j = json::parse(event, nullptr, false);
      if (j.is_discarded() || !j.contains("choices")) return;
      if (j.contains("usage") && j["usage"].is_object()) {
        prompt_tokens = j["usage"].value("prompt_tokens", -1L);
        completion_tokens = j["usage"].value("completion_tokens", -1L);
      }
      if (j["choices"].empty()) return;
      const json& c = j["choices"][0];
      const json* text = c.contains("text") ? &c["text"] : c.contains("delta") && c["delta"].contains("content") ? &c["delta"]["content"] : nullptr;
      if (text && text->is_string() && !text->get<std::string>().empty()) arrivals.push_back(Clock::now());
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish = c["finish_reason"].get<std::string>();
    });
    return true;
  };
  auto res = cli.send(req);
  std::lock_guard<std::mutex> lock(stats.mutex);
  ++stats.requests;
  const bool ok = res && res->status == 200 && done && (finish == "stop" || finish == "length") && completion_tokens >= 0;
  if (!ok) {
    if (stats.failures.size() < 10)
      stats.failures.push_back(what + ": status " + (res ? std::to_string(res->status) : "none (" + httplib::to_string(res.error()) + ")") +
                               ", [DONE] " + (done ? "seen" : "missing") + ", finish \"" + finish + "\"");
    return;
  }
  ++stats.answered;
  stats.prompt_tokens += prompt_tokens;
  stats.completion_tokens += completion_tokens;
  if (!arrivals.empty()) stats.ttft_ms.push_back(std::chrono::duration<double, std::milli>(arrivals[0] - t0).count());
  for (size_t i = 1; i < arrivals.size(); ++i)
    stats.itl_ms.push_back(std::chrono::duration<double, std::milli>(arrivals[i] - arrivals[i - 1]).count());
}

void driveLoad(const LoadOptions& options, const RequestBody& body, LoadStats& stats) {
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.seconds));
  std::atomic<long> started{0};
  auto another = [&](int k) {
    if (options.max_requests > 0) return started.fetch_add(1) < options.max_requests;
    return k < options.min_requests || Clock::now() < end;
  };
  std::vector<std::thread> clients;
  for (int c = 0; c < options.clients; ++c)
    clients.emplace_back([&, c] {
      for (int k = 0; another(k); ++k)
        streamRequest(options, body(c, k), "client " + std::to_string(c) + " request " + std::to_string(k), stats);
    });
  for (auto& t : clients) t.join();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace minfer::server
