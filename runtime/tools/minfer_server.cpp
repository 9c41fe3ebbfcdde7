// minfer-server: serves a .mfb artifact over an OpenAI-compatible HTTP API with continuous batching
// (runtime/tools/server/http_server.h for the endpoints, minfer/scheduler.h for the batching).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/runtime.h"
#include "minfer/scheduler.h"
#include "minfer/version.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/tools/chat_template_file.h"
#include "runtime/tools/model_argument.h"
#include "runtime/tools/server/http_server.h"
#include "runtime/util/terminal_text.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-server options");
// llama-server's spellings (tools/server/README.md) where it has the option.
llvm::cl::opt<std::string> kModel(llvm::cl::Positional, llvm::cl::desc("<model.mfb>"), llvm::cl::Optional,
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kModelFlag("m", llvm::cl::desc("The artifact, instead of the positional argument (also --model)"),
                                      llvm::cl::value_desc("model.mfb"), llvm::cl::cat(kCategory));
llvm::cl::alias kModelAlias("model", llvm::cl::desc("Alias for -m"), llvm::cl::aliasopt(kModelFlag), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kHost("host", llvm::cl::desc("Address to listen on (default 127.0.0.1)"),
                                 llvm::cl::init("127.0.0.1"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kPort("port", llvm::cl::desc("Port to listen on; 0 = any free port, printed at start (default 8080)"),
                         llvm::cl::init(8080), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kParallel("np", llvm::cl::desc("Sequences generated at once (also --parallel; default 4)"),
                             llvm::cl::init(4), llvm::cl::cat(kCategory));
llvm::cl::alias kParallelAlias("parallel", llvm::cl::desc("Alias for -np"), llvm::cl::aliasopt(kParallel),
                               llvm::cl::cat(kCategory));
llvm::cl::opt<int> kCtx("c",
                        llvm::cl::desc("Context of each sequence in tokens (llama-server divides -c among its slots; here "
                                       "each of the -np sequences gets it); 0 = the model's, at most 4096 and at most the "
                                       "context the artifact was compiled for (default 0; also --ctx-size)"),
                        llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::alias kCtxAlias("ctx-size", llvm::cl::desc("Alias for -c"), llvm::cl::aliasopt(kCtx), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kKvBlocks("kv-blocks",
                             llvm::cl::desc("KV cache blocks in the pool; 0 = enough for every sequence's whole context "
                                            "(default 0). Fewer makes requests queue or be preempted when it runs out"),
                             llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kBlockSize("kv-block-size", llvm::cl::desc("Positions per KV block, a power of two (default 16)"),
                              llvm::cl::init(16), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kApiKey("api-key", llvm::cl::desc("Require \"Authorization: Bearer KEY\" (default: none)"),
                                   llvm::cl::value_desc("KEY"), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kAlias("alias", llvm::cl::desc("Model name clients use and /v1/models lists (default: the "
                                                          "artifact's file name; also -a)"),
                                  llvm::cl::cat(kCategory));
llvm::cl::alias kAliasShort("a", llvm::cl::desc("Alias for --alias"), llvm::cl::aliasopt(kAlias), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kChatTemplateFile(
    "chat-template", llvm::cl::desc("Jinja chat template for /v1/chat/completions, instead of the artifact's"),
    llvm::cl::value_desc("file"), llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kBodyLimit("body-limit", llvm::cl::desc("Largest request body in bytes; larger ones get 413 "
                                                                "(default 1048576)"),
                                   llvm::cl::init(1u << 20), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kThreadsHttp("threads-http",
                                llvm::cl::desc("HTTP handler threads; each streaming or waiting request and each idle "
                                               "keep-alive connection holds one (default 0: max(8, 4 x -np + 4))"),
                                llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kMaxQueue("max-queue", llvm::cl::desc("Requests waiting for a sequence at most; more get 503 (default 4096)"),
                             llvm::cl::init(4096), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kDevice("device", llvm::cl::desc("Backend: auto, cpu or cuda (default auto)"),
                                   llvm::cl::init("auto"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kThreads("t", llvm::cl::desc("CPU threads: the CPU backend's, and those sampling a step's rows (at most "
                                                "-np; default: the physical cores; also --threads)"),
                            llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::alias kThreadsAlias("threads", llvm::cl::desc("Alias for -t"), llvm::cl::aliasopt(kThreads), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kDrainTimeout("drain-timeout",
                                 llvm::cl::desc("Seconds that requests running at SIGINT/SIGTERM may take to finish "
                                                "before they are cancelled; new ones get 503 meanwhile, a second "
                                                "signal cancels at once (default 30)"),
                                 llvm::cl::init(30), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoVerify("no-verify", llvm::cl::desc("Skip the data segments' checksums at load"),
                              llvm::cl::cat(kCategory));

int fail(const std::string& message) {
  llvm::errs() << "minfer-server: " << minfer::util::escapeForTerminal(message, std::string::npos, true) << "\n";
  return 1;
}

// "" when the numeric options are in range, else the message.
std::string optionProblem() {
  if (kPort < 0 || kPort > 65535) return llvm::formatv("--port {0} is out of range 0..65535", kPort.getValue());
  if (kParallel < 1 || kParallel > 4096) return llvm::formatv("-np {0} is out of range 1..4096", kParallel.getValue());
  if (kCtx < 0 || kCtx == 1 || kCtx > minfer::Model::kMaxContext)
    return llvm::formatv("-c {0} is out of range 2..{1}, or 0 for the model's context length (a request needs a "
                         "prompt token and the token it generates)", kCtx.getValue(), minfer::Model::kMaxContext);
  if (kKvBlocks < 0) return llvm::formatv("--kv-blocks {0} must be ≥ 0", kKvBlocks.getValue());
  if (kBlockSize < 1 || kBlockSize > 1024 || (kBlockSize & (kBlockSize - 1)))
    return llvm::formatv("--kv-block-size {0} must be a power of two in 1..1024", kBlockSize.getValue());
  if (kBodyLimit < 1024) return llvm::formatv("--body-limit {0} must be ≥ 1024 bytes", kBodyLimit.getValue());
  if (kThreadsHttp < 0 || kThreadsHttp > 4096) return llvm::formatv("--threads-http {0} is out of range 0..4096", kThreadsHttp.getValue());
  if (kMaxQueue < 1) return llvm::formatv("--max-queue {0} must be ≥ 1", kMaxQueue.getValue());
  if (kThreads < 0 || kThreads > 4096) return llvm::formatv("-t {0} is out of range 0..4096", kThreads.getValue());
  if (kDrainTimeout < 0 || kDrainTimeout > 86400)
    return llvm::formatv("--drain-timeout {0} is out of range 0..86400 seconds", kDrainTimeout.getValue());
  return "";
}

void note(const std::string& message) {
  llvm::errs() << "minfer-server: " << message << "\n";
  llvm::errs().flush();
}

// The signal thread: waits for SIGINT/SIGTERM, then shuts down gracefully. New requests get 503 while the
// running ones finish, for up to --drain-timeout seconds or until a second signal; those still running
// then are cancelled (the scheduler stops: they are answered "shutting down"); then the server stops and
// run() returns. Returns at once, doing nothing, when `exiting` is set (main woke it after run() ended).
void stopOnSignal(const sigset_t& signals, minfer::server::HttpServer& server, minfer::Scheduler& scheduler,
                  const std::atomic<bool>& exiting) {
  int sig = 0;
  sigwait(&signals, &sig);
  if (exiting) return;
  server.beginDrain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kDrainTimeout);
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (server.activeRequests() == 0)
    note(std::string(name) + ": stopping");
  else
    note(llvm::formatv("{0}: stopping; new requests get 503; waiting up to {1} s for {2} running (a second signal "
                       "cancels them)", name, kDrainTimeout.getValue(), server.activeRequests()));
  while (server.activeRequests() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      note(llvm::formatv("--drain-timeout {0} s reached: cancelling {1} requests", kDrainTimeout.getValue(),
                         server.activeRequests()));
      break;
    }
    const timespec poll{0, 50'000'000};  // 50 ms
    if (sigtimedwait(&signals, nullptr, &poll) > 0) {
      if (exiting) return;
      note(llvm::formatv("second signal: cancelling {0} requests", server.activeRequests()));
      break;
    }
  }
  if (server.activeRequests() > 0) {
    scheduler.stop();  // every request finishes "cancelled"; its handler answers and ends
    for (int i = 0; i < 200 && server.activeRequests() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  server.stop();
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-server (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-server: an OpenAI-compatible HTTP server for a minfer artifact\n");

  auto model_path = minfer::tools::modelArgument(kModel, kModelFlag);
  if (!model_path) return fail(model_path.status().message());
  kModel.setValue(*model_path);
  if (const std::string problem = optionProblem(); !problem.empty()) return fail(problem);
  auto kind = minfer::parseBackendKind(kDevice.getValue());
  if (!kind) return fail("--device: " + kind.status().message());

  // SIGINT/SIGTERM are taken by a waiting thread (they stop the server); blocked before any thread
  // starts, so no other thread receives them. A client that goes away must not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  minfer::ModelOptions model_options;
  model_options.verify_checksums = !kNoVerify;
  auto model = minfer::Model::open(kModel, *kind, model_options);
  if (!model) return fail(model.status().message());
  const minfer::ModelInfo& info = (*model)->info();
  if (!(*model)->hasTokenizer()) return fail(kModel + ": the artifact has no tokenizer");
  auto tmpl = minfer::tools::chatTemplateText(**model, kModel, kChatTemplateFile);
  if (!tmpl) return fail(tmpl.status().message());

  minfer::BatchOptions batch;
  batch.n_ctx = kCtx > 0 ? kCtx.getValue() : (info.n_ctx_train > 0 ? std::min(info.n_ctx_train, 4096) : 4096);
  if (kCtx == 0 && info.n_ctx_max > 0) batch.n_ctx = std::min(batch.n_ctx, info.n_ctx_max);
  batch.n_seq_max = kParallel;
  batch.n_blocks = kKvBlocks;
  batch.block_size = kBlockSize;
  batch.n_threads = kThreads;
  if (info.n_ctx_max > 0 && batch.n_ctx > info.n_ctx_max)
    return fail(llvm::formatv("-c {0} exceeds the {1} positions {2} was compiled for; recompile it with "
                              "minfer-compile -c {0} (or larger)",
                              batch.n_ctx, info.n_ctx_max, kModel.getValue()).str());
  if (info.n_ctx_train > 0 && batch.n_ctx > info.n_ctx_train)
    llvm::errs() << llvm::formatv("minfer-server: warning: -c {0} exceeds the {1} positions the model was trained with\n",
                                  batch.n_ctx, info.n_ctx_train);
  auto session = (*model)->createBatchSession(batch);
  if (!session)
    return fail(session.status().message() + " (-np " + std::to_string(batch.n_seq_max) + ", -c " +
                std::to_string(batch.n_ctx) + ", --kv-blocks " + std::to_string(batch.n_blocks) + ")");

  minfer::SchedulerOptions sched_options;
  sched_options.n_vocab = info.n_vocab;
  sched_options.max_queue = kMaxQueue;
  sched_options.sampling_threads = std::min(kThreads > 0 ? kThreads.getValue() : minfer::cpu::defaultThreads(),
                                            kParallel.getValue());
  minfer::Scheduler scheduler(**session, (*model)->tokenizer(), sched_options);
  if (scheduler.capacity() < 2)
    return fail(llvm::formatv("a request could hold {0} position (--kv-blocks {1} of {2}): it needs two, a prompt "
                              "token and the token it generates", scheduler.capacity(), (*session)->totalBlocks(),
                              (*session)->blockSize()).str());

  minfer::server::ServerOptions options;
  options.model_id = kAlias.empty() ? std::filesystem::path(kModel.getValue()).filename().string() : kAlias.getValue();
  options.api_key = kApiKey;
  options.max_body_bytes = kBodyLimit;
  options.threads_http = kThreadsHttp > 0 ? kThreadsHttp.getValue() : std::max(8, 4 * kParallel + 4);
  options.template_source = tmpl->source;
  options.template_origin = tmpl->origin;
  minfer::server::HttpServer server(**model, scheduler, options);
  if (!server.templateProblem().empty() && !kChatTemplateFile.empty()) return fail(server.templateProblem());
  auto port = server.bind(kHost, kPort);
  if (!port) return fail(port.status().message());

  scheduler.start();
  std::atomic<bool> exiting{false};
  std::thread signals([&] { stopOnSignal(stop_signals, server, scheduler, exiting); });
  llvm::errs() << llvm::formatv(
      "minfer-server: {0} ({1}), backend {2}{3}; {4} sequences of {5} positions, {6} KV blocks of {7}, {8} tokens per "
      "step{9}\n",
      options.model_id, minfer::util::escapeForTerminal(info.architecture), (*model)->backendName(),
      (*model)->backendNote().empty() ? "" : " (" + (*model)->backendNote() + ")", batch.n_seq_max, batch.n_ctx,
      (*session)->totalBlocks(), (*session)->blockSize(), (*session)->maxTokensPerStep(),
      (*session)->batchedKernels() ? "" : " (no batched kernels on this backend: sequences run one after another)");
  if (scheduler.capacity() < batch.n_ctx)
    llvm::errs() << llvm::formatv("minfer-server: note: a request holds at most {0} positions, what the pool of {1} "
                                  "KV blocks of {2} gives (--kv-blocks), not -c's {3}\n",
                                  scheduler.capacity(), (*session)->totalBlocks(), (*session)->blockSize(), batch.n_ctx);
  if (!server.templateProblem().empty()) llvm::errs() << "minfer-server: note: /v1/chat/completions: " << server.templateProblem() << "\n";
  llvm::errs() << llvm::formatv("minfer-server: listening on http://{0}:{1}\n", kHost, *port);
  llvm::errs().flush();
  server.run();
  // run() returns after stop(): from the signal thread, or because listening failed.
  exiting = true;
  pthread_kill(signals.native_handle(), SIGTERM);  // wakes a thread still waiting; no-op when it returned
  signals.join();
  scheduler.stop();
  llvm::errs() << "minfer-server: stopped\n";
  return 0;
}
