// minfer-server under load on loopback: 64 concurrent streaming clients for 60 s (MINFER_LOAD_SECONDS
// overrides) on stories260K, CPU backend. Every request must be answered ([DONE] after a finish_reason),
// none lost (the server's counters agree with the clients'), and after the load the KV blocks in use
// return to 0 and the server's RSS to its baseline (measured after a warm-up with the same clients).
// Prints requests, tokens/s, p50/p99 time to first token and inter-token latency.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "runtime/tools/server/load_client.h"
#include "tests/e2e/golden_support.h"
#include "tests/serve/server_process.h"
#include "tests/test_support.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kClients = 64;
// RSS after the load vs after the warm-up. Release: ~0.2 MB measured (TESTING.md §6). Under ASan its
// allocator's per-thread caches and quarantine (8 MB here) keep freed memory resident: a looser bound.
#if defined(__SANITIZE_ADDRESS__)
constexpr long kRssGrowthLimitKb = 96 * 1024;
#else
constexpr long kRssGrowthLimitKb = 32 * 1024;
#endif

using minfer::server::LoadStats;
using minfer::server::percentile;

// kClients threads issuing streamed completions back to back (stories260K prompts, sampled, 8–48 tokens)
// until `seconds` have passed and each has made at least `min_requests` (in-flight ones complete).
void drive(int port, double seconds, int min_requests, LoadStats& load) {
  static const char* prompts[] = {"Once upon a time", "Tom had a big red ball.", "Lily and her mom", "The cat sat",
                                  "One day, a little boy", "There was a dog", "Sam liked to", "In the park"};
  minfer::server::LoadOptions options;
  options.port = port;
  options.clients = kClients;
  options.seconds = seconds;
  options.min_requests = min_requests;
  minfer::server::driveLoad(options, [](int client, int k) {
    return json{{"prompt", prompts[(client + k) % 8]},
                {"max_tokens", 8 + (client * 7 + k * 13) % 41},
                {"temperature", 0.8},
                {"seed", client * 1000 + k}};
  }, load);
}

// Waits (≤ 60 s) until nothing is queued or running; the metrics then.
std::map<std::string, double> idleMetrics(const minfer::test::ServerProcess& server) {
  std::map<std::string, double> m;
  for (int i = 0; i < 600; ++i) {
    m = server.metrics();
    if (m["minfer_requests_running"] == 0 && m["minfer_requests_waiting"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return m;
}

}  // namespace

TEST_CASE("64 concurrent streaming clients: every request answered, none lost, RSS and KV blocks back to baseline") {
  if (!minfer::test::haveFixtures()) return;
  const char* env = std::getenv("MINFER_LOAD_SECONDS");
  const double seconds = env ? std::atof(env) : 60.0;
  REQUIRE(seconds > 0);
  // A sanitized server keeps freed memory in ASan's quarantine (256 MB by default), which would read as
  // growth: the child gets a small one. No effect on other builds.
  const char* asan = std::getenv("ASAN_OPTIONS");
  setenv("ASAN_OPTIONS", (std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "quarantine_size_mb=8").c_str(), 1);
  minfer::test::ServerProcess server({minfer::test::compiledFixture("stories260K.gguf"), "--device", "cpu", "-np", "16",
                                      "-c", "256", "--threads-http", std::to_string(kClients + 16), "-t", "1"});
  REQUIRE(server.running());

  LoadStats warmup;
  drive(server.port(), std::min(5.0, seconds), 2, warmup);  // every client twice: the allocator's steady state
  CHECK(warmup.failures.empty());
  const auto before = idleMetrics(server);
  const long rss_before = server.rssKb();
  CHECK(before.at("minfer_kv_blocks_used") == 0);

  LoadStats load;
  const Clock::time_point t0 = Clock::now();
  drive(server.port(), seconds, 1, load);
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto after = idleMetrics(server);
  const long rss_after = server.rssKb();

  std::printf("load: %d streaming clients for %.1f s: %ld requests, %ld answered, %ld tokens (%.0f tokens/s)\n", kClients,
              elapsed, load.requests, load.answered, load.completion_tokens, load.completion_tokens / elapsed);
  std::printf("load: time to first token p50 %.1f ms, p99 %.1f ms; inter-token (between text chunks) p50 %.2f ms, "
              "p99 %.2f ms\n",
              percentile(load.ttft_ms, 0.5), percentile(load.ttft_ms, 0.99), percentile(load.itl_ms, 0.5),
              percentile(load.itl_ms, 0.99));
  std::printf("load: server RSS %ld kB after the warm-up, %ld kB after the load; KV blocks in use %.0f of %.0f; "
              "preemptions %.0f\n",
              rss_before, rss_after, after.at("minfer_kv_blocks_used"), after.at("minfer_kv_blocks_total"),
              after.at("minfer_preemptions_total"));
  for (const std::string& f : load.failures) std::printf("load: failed: %s\n", f.c_str());

  CHECK(load.requests > kClients);
  CHECK(load.failures.empty());
  CHECK(load.answered == load.requests);
  // None lost: the server saw exactly the clients' requests and finished each with stop or length.
  const double submitted = after.at("minfer_requests_submitted_total") - before.at("minfer_requests_submitted_total");
  const double finished = after.at("minfer_requests_finished_total{finish_reason=\"stop\"}") +
                          after.at("minfer_requests_finished_total{finish_reason=\"length\"}") -
                          before.at("minfer_requests_finished_total{finish_reason=\"stop\"}") -
                          before.at("minfer_requests_finished_total{finish_reason=\"length\"}");
  CHECK(submitted == load.requests);
  CHECK(finished == load.requests);
  CHECK(after.at("minfer_requests_finished_total{finish_reason=\"cancelled\"}") == 0);
  CHECK(after.at("minfer_requests_finished_total{finish_reason=\"error\"}") == 0);
  CHECK(after.at("minfer_generated_tokens_total") - before.at("minfer_generated_tokens_total") == load.completion_tokens);
  CHECK(after.at("minfer_kv_blocks_used") == 0);
  CHECK(rss_after - rss_before <= kRssGrowthLimitKb);
  CHECK(server.stop() == 0);
}
