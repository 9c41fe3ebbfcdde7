// minfer-server-bench: latency and throughput of a running minfer-server under concurrent streaming clients.
//
// --clients C connections, each sending streamed POST /v1/completions back to back: a prompt of -p random
// token ids (sent as an id array, so exactly -p prompt tokens; ids in [16, 256), ordinary tokens in both
// byte-level and SentencePiece vocabularies of ≥ 256 entries), -n tokens generated through end-of-generation
// (ignore_eos, as llama-batched-bench generates a fixed count), greedy unless --temp. It runs for --seconds, or
// until --requests requests were started. Printed: requests answered and per second, aggregate generated and
// prompt tokens/s (usage counts over the wall time of the timed run), p50/p99 time to first token (request
// sent → first text chunk) and inter-token latency (gaps between text chunks: a chunk may carry more than one
// token when the client lags behind), and the server's preemption and step counters from /metrics.
// --warmup W: each client first makes W untimed requests (kernel caches, allocator steady state).
// Exit status 1 when any request went unanswered.
#include <chrono>
#include <cstdio>
#include <httplib.h>
#include <map>
#include <random>
#include <sstream>

#include "llvm/Support/CommandLine.h"
#include "runtime/include/minfer/version.h"
#include "runtime/tools/server/load_client.h"

namespace {

using nlohmann::json;

llvm::cl::OptionCategory kCategory("minfer-server-bench options");
llvm::cl::opt<std::string> kHost("host", llvm::cl::desc("The server's address (default 127.0.0.1)"),
                                 llvm::cl::init("127.0.0.1"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kPort("port", llvm::cl::desc("The server's port (default 8080)"), llvm::cl::init(8080),
                         llvm::cl::cat(kCategory));
llvm::cl::opt<int> kClients("clients", llvm::cl::desc("Concurrent streaming clients (default 32)"), llvm::cl::init(32),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<int> kPromptTokens("p", llvm::cl::desc("Prompt tokens per request (default 128)"), llvm::cl::init(128),
                                 llvm::cl::cat(kCategory));
llvm::cl::opt<int> kMaxTokens("n", llvm::cl::desc("Tokens generated per request, max_tokens (default 128)"),
                              llvm::cl::init(128), llvm::cl::cat(kCategory));
llvm::cl::opt<double> kSeconds("seconds", llvm::cl::desc("Start requests for this long (default 60)"), llvm::cl::init(60),
                               llvm::cl::cat(kCategory));
llvm::cl::opt<long> kRequests("requests", llvm::cl::desc("Start this many requests in all instead of --seconds"),
                              llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kWarmup("warmup", llvm::cl::desc("Untimed requests per client before the run (default 1)"),
                           llvm::cl::init(1), llvm::cl::cat(kCategory));
llvm::cl::opt<double> kTemp("temp", llvm::cl::desc("Sampling temperature (default 0: greedy)"), llvm::cl::init(0),
                            llvm::cl::cat(kCategory));

// The random prompt of client c's k-th request: -p ids in [16, 256), seeded by (c, k).
json requestBody(int client, int k) {
  std::mt19937 rng(static_cast<uint32_t>(client * 100003 + k));
  std::uniform_int_distribution<int> id(16, 255);
  json prompt = json::array();
  for (int i = 0; i < kPromptTokens; ++i) prompt.push_back(id(rng));
  return {{"prompt", prompt}, {"max_tokens", kMaxTokens.getValue()}, {"ignore_eos", true},
          {"temperature", kTemp.getValue()}, {"seed", client * 1000 + k}};
}

// GET /metrics: sample (with labels) → value; empty when the server does not answer.
std::map<std::string, double> metrics() {
  httplib::Client cli(kHost, kPort);
  std::map<std::string, double> out;
  auto r = cli.Get("/metrics");
  if (!r || r->status != 200) return out;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp != std::string::npos) out[line.substr(0, sp)] = std::atof(line.c_str() + sp + 1);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-server-bench (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-server-bench: concurrent streaming clients against minfer-server\n");
  if (kClients < 1 || kPromptTokens < 1 || kMaxTokens < 1 || (kSeconds <= 0 && kRequests <= 0)) {
    std::fprintf(stderr, "minfer-server-bench: --clients, -p and -n must be ≥ 1, and --seconds or --requests > 0\n");
    return 2;
  }
  minfer::server::LoadOptions options;
  options.host = kHost;
  options.port = kPort;
  options.clients = kClients;
  if (kWarmup > 0) {
    minfer::server::LoadStats warm;
    options.min_requests = kWarmup;
    minfer::server::driveLoad(options, [](int c, int k) { return requestBody(c, 1000000 + k); }, warm);
    if (!warm.failures.empty()) {
      for (const std::string& f : warm.failures) std::fprintf(stderr, "minfer-server-bench: warm-up failed: %s\n", f.c_str());
      return 1;
    }
  }
  options.min_requests = 0;
  options.seconds = kSeconds;
  options.max_requests = kRequests;
  const auto before = metrics();
  minfer::server::LoadStats load;
  const auto t0 = std::chrono::steady_clock::now();
  minfer::server::driveLoad(options, requestBody, load);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto after = metrics();
  auto delta = [&](const char* name) { return after.count(name) && before.count(name) ? after.at(name) - before.at(name) : -1.0; };
  using minfer::server::percentile;
  std::printf("clients %d, prompt %d tokens, max_tokens %d, temperature %g, %.1f s\n", kClients.getValue(),
              kPromptTokens.getValue(), kMaxTokens.getValue(), kTemp.getValue(), wall);
  std::printf("requests %ld answered of %ld (%.2f requests/s)\n", load.answered, load.requests, load.answered / wall);
  std::printf("generated %ld tokens (%.1f t/s aggregate), prompt %ld tokens (%.1f t/s)\n", load.completion_tokens,
              load.completion_tokens / wall, load.prompt_tokens, load.prompt_tokens / wall);
  std::printf("time to first token: p50 %.1f ms, p99 %.1f ms (%zu requests)\n", percentile(load.ttft_ms, 0.5),
              percentile(load.ttft_ms, 0.99), load.ttft_ms.size());
  std::printf("inter-token latency: p50 %.2f ms, p99 %.2f ms (%zu gaps between text chunks)\n", percentile(load.itl_ms, 0.5),
              percentile(load.itl_ms, 0.99), load.itl_ms.size());
  std::printf("server: %.0f steps, %.0f evaluated tokens, %.0f preemptions during the run\n", delta("minfer_steps_total"),
              delta("minfer_evaluated_tokens_total"), delta("minfer_preemptions_total"));
  for (const std::string& f : load.failures) std::fprintf(stderr, "minfer-server-bench: failed: %s\n", f.c_str());
  return load.answered == load.requests ? 0 : 1;
}
