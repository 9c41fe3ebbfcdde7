// minfer-bench: prompt-processing and text-generation throughput with llama-bench's definitions.
//
//   ppP  one prompt of P random tokens evaluated from an empty KV cache (in batches of the artifact's
//        max batch, as llama.cpp splits into ubatches); t/s = P / seconds.
//   tgN  N single-token decode steps from an empty KV cache, each fed a random token, one logits row
//        in host memory per step (no sampling): stored there by the output head itself where the session can
//        (CudaBackendOptions::logits_to_host), else downloaded after the step; t/s = N / seconds.
//   "@ dD" (-d D, llama-bench's --n-depth): the same test with D random tokens already in the KV cache
//        (prefilled, untimed, before every repetition); the test's tokens go to positions D, D+1, ….
// Each test runs once as warm-up, then -r times; the table shows mean ± standard deviation of the
// per-repetition t/s (llama-bench's avg_ts ± stddev_ts). --profile adds one more run of each test with
// GPU time per plan step (CUDA events around every step, inside the decode graph; kernels do not
// overlap while profiled, so profiled tg is slower), the bytes each step moved (weight planes, K/V
// cache) and the bandwidth that gives, against the GPU's DRAM peak.
// --sample adds, after each tgN, the same N decode steps with sampling (llama.cpp's defaults: temperature
// 0.8, top-k 40, top-p 0.95, min-p 0.05; each sampled token fed back): "tgN +host sampling" copies every logits
// row back and runs the Sampler on it; "tgN +device top-k" (cuda) runs the device top-k on the row and copies
// 40 (id, logit) pairs back, then the Sampler's top-p / min-p / temperature steps (Sampler::sampleTopK). tgN
// itself stays llama-bench's definition.
// --no-overlap launches every kernel after the previous one has ended (no programmatic dependent launch).
// --logits-copy writes every decode step's logits row to device memory and downloads it after the step.
// --parallel B1,B2,… runs llama-batched-bench's test instead (bench_batched.h): per B, B sequences of a
// -p token prompt each (default 128) evaluated together, then -n decode steps of one token per sequence,
// through the public BatchSession API; prompt, aggregate decode and total t/s, time to first token and
// inter-token latency. --parallel-argmax brings back each sequence's argmax instead of its logits row (what
// minfer-server does for greedy requests; the backend column then says "argmax").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "minfer/version.h"
#include "runtime/backend.h"
#include "runtime/tools/bench_batched.h"
#include "runtime/util/terminal_text.h"
#if MINFER_HAVE_CUDA_BACKEND
#include "runtime/cuda/cuda_backend.h"
#endif

namespace {

llvm::cl::OptionCategory kCategory("minfer-bench options");
llvm::cl::list<std::string> kModels(llvm::cl::Positional, llvm::cl::desc("<model.mfb>..."), llvm::cl::OneOrMore,
                                    llvm::cl::cat(kCategory));
llvm::cl::list<int> kPrompt("p", llvm::cl::desc("Prompt lengths to test, comma-separated (default 512)"),
                            llvm::cl::CommaSeparated, llvm::cl::cat(kCategory));
llvm::cl::list<int> kGen("n", llvm::cl::desc("Generation lengths to test, comma-separated (default 128)"),
                         llvm::cl::CommaSeparated, llvm::cl::cat(kCategory));
llvm::cl::list<int> kDepth("d",
                           llvm::cl::desc("Depths to test: tokens already in the KV cache before each test, "
                                          "comma-separated (default 0; llama-bench's -d)"),
                           llvm::cl::CommaSeparated, llvm::cl::cat(kCategory));
llvm::cl::opt<int> kReps("r", llvm::cl::desc("Repetitions of each test (default 5)"), llvm::cl::init(5),
                         llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kDevice("device",
                                   llvm::cl::desc("Backend: auto, cuda or cpu (default auto: cuda when usable)"),
                                   llvm::cl::init("auto"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kThreads("t", llvm::cl::desc("CPU threads (default: the physical cores, as llama.cpp)"), llvm::cl::init(0),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kJson("json", llvm::cl::desc("Print results as JSON"), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kCsv("csv", llvm::cl::desc("Print results as CSV"), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kProfile("profile", llvm::cl::desc("Also time every plan step with CUDA events (cuda only)"),
                             llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kSeed("seed", llvm::cl::desc("Seed of the random tokens (default 1)"), llvm::cl::init(1),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoOverlap("no-overlap",
                               llvm::cl::desc("Launch each kernel after the previous one ends (no programmatic dependent launch)"),
                               llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kLogitsCopy("logits-copy",
                                llvm::cl::desc("Download each decode step's logits row after the step instead of the "
                                               "output head storing it into pinned host memory"),
                                llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kParallel(
    "parallel",
    llvm::cl::desc("Batched test (llama-batched-bench): numbers of sequences B, comma-separated, each in 1..4096; "
                   "per B, B prompts of -p tokens (default 128) then -n decode steps of one token per sequence"),
    llvm::cl::value_desc("B,B,..."), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kParallelArgmax(
    "parallel-argmax",
    llvm::cl::desc("With --parallel: each step brings back every sequence's argmax (on the GPU with cuda) instead of its "
                   "logits row, as minfer-server does for greedy requests (llama-batched-bench copies the rows)"),
    llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kSample("sample",
                            llvm::cl::desc("Also time tg with sampling: on the host (logits row copied back) and with "
                                           "the device top-k (40 pairs copied back; cuda)"),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoVerify("no-verify",
                              llvm::cl::desc("Skip the data segments' checksums (checked by default while loading)"),
                              llvm::cl::cat(kCategory));

struct Result {
  std::string model, backend, test;
  int n_prompt = 0, n_gen = 0, n_depth = 0;
  double size_bytes = 0, params = 0, load_s = 0;
  std::vector<double> ts;  // tokens per second, one per repetition
  double mean() const {
    double s = 0;
    for (double v : ts) s += v;
    return ts.empty() ? 0 : s / ts.size();
  }
  double sd() const {
    if (ts.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double v : ts) s += (v - m) * (v - m);
    return std::sqrt(s / (ts.size() - 1));
  }
};

[[noreturn]] void die(const std::string& msg) {
  llvm::errs() << "minfer-bench: " << minfer::util::escapeForTerminal(msg, std::string::npos, /*keep_newlines=*/true) << "\n";
  std::exit(1);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Weights of the artifact: count of logical elements of all tensors (llama-bench's "params").
double paramCount(const minfer::fb::Artifact& m) {
  double n = 0;
  if (m.tensors())
    for (const minfer::fb::Tensor* t : *m.tensors()) {
      double e = 1;
      if (t->ne())
        for (uint64_t d : *t->ne()) e *= static_cast<double>(d);
      n += e;
    }
  return n;
}

// Sizes as llama-bench prints them (GiB), with MiB/KiB for small models so they do not read 0.00.
std::string human(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return llvm::formatv("{0:f2} GiB", bytes / (1024.0 * 1024 * 1024)).str();
  if (bytes >= 1024.0 * 1024) return llvm::formatv("{0:f2} MiB", bytes / (1024.0 * 1024)).str();
  return llvm::formatv("{0:f2} KiB", bytes / 1024.0).str();
}

// Parameter counts as llama-bench prints them (B), with M/K for small models.
std::string humanCount(double n) {
  if (n >= 1e9) return llvm::formatv("{0:f2} B", n / 1e9).str();
  if (n >= 1e6) return llvm::formatv("{0:f2} M", n / 1e6).str();
  return llvm::formatv("{0:f2} K", n / 1e3).str();
}

#if MINFER_HAVE_CUDA_BACKEND
// The --profile tables of one test run of `tokens` tokens: time, bytes and bandwidth by op kind, then the
// 40 most expensive steps. `peak`: the GPU's DRAM bytes per second (0: not shown).
std::string profileTable(const std::string& model, const std::string& test, int tokens,
                         std::vector<minfer::cuda::StepTime> steps, double peak) {
  struct Sum {
    double ms = 0, bytes = 0;
  };
  Sum total;
  std::map<std::string, Sum> by_op;
  for (const auto& s : steps) {
    Sum& o = by_op[s.op + (s.prefill ? " (prefill)" : " (decode)")];
    o.ms += s.ms, o.bytes += s.bytes, total.ms += s.ms, total.bytes += s.bytes;
  }
  auto rate = [&](const Sum& x) {
    const double bps = x.ms > 0 ? x.bytes / (x.ms * 1e-3) : 0;
    return llvm::formatv("{0:f1} | {1}", bps / 1e9, peak > 0 ? llvm::formatv("{0:f1}%", 100 * bps / peak).str() : "–").str();
  };
  std::string out = llvm::formatv("\n### profile: {0} {1} (one run; GPU time {2:f3} ms; {3:f3} GB moved, {4:f3} GB "
                                  "per token; DRAM peak {5:f0} GB/s)\n\n",
                                  model, test, total.ms, total.bytes / 1e9, total.bytes / 1e9 / tokens, peak / 1e9);
  out += "| op | ms | share | GB | GB/s | % of peak |\n|---|---:|---:|---:|---:|---:|\n";
  std::vector<std::pair<std::string, Sum>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
  for (const auto& [op, x] : ops)
    out += llvm::formatv("| {0} | {1:f3} | {2:f1}% | {3:f3} | {4} |\n", op, x.ms, 100 * x.ms / total.ms, x.bytes / 1e9,
                         rate(x));
  out += llvm::formatv("| all | {0:f3} | 100% | {1:f3} | {2} |\n", total.ms, total.bytes / 1e9, rate(total));
  std::sort(steps.begin(), steps.end(), [](auto& a, auto& b) { return a.ms > b.ms; });
  out += "\n| step | op | calls | ms | share | GB/s | % of peak |\n|---|---|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < steps.size() && i < 40; ++i)
    out += llvm::formatv("| {0} | {1} | {2} | {3:f3} | {4:f1}% | {5} |\n", steps[i].name, steps[i].op, steps[i].calls,
                         steps[i].ms, 100 * steps[i].ms / total.ms, rate({steps[i].ms, steps[i].bytes}));
  if (steps.size() > 40) out += llvm::formatv("| … {0} more steps | | | | | | |\n", steps.size() - 40);
  return out;
}
#endif

// --parallel: one row per (model, PP, TG, B).
struct BatchedRow {
  std::string model, backend;
  double size_bytes = 0, params = 0, load_s = 0;
  bool batched_kernels = false;
  minfer::tools::BatchedResult r;
};

void printBatched(const std::vector<BatchedRow>& rows) {
  using minfer::tools::Series;
  auto f = [](const Series& x, const char* spec) {
    return llvm::formatv(spec, x.mean(), x.sd()).str();
  };
  if (kJson) {
    auto samples = [](const Series& x) {
      std::string out;
      for (double v : x.samples) out += (out.empty() ? "" : ", ") + llvm::formatv("{0:f3}", v).str();
      return "[" + out + "]";
    };
    llvm::outs() << "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const BatchedRow& w = rows[i];
      const minfer::tools::BatchedResult& r = w.r;
      std::string model;
      llvm::raw_string_ostream(model) << llvm::json::Value(w.model);
      llvm::outs() << llvm::formatv(
          "  {{\"model\": {0}, \"backend\": \"{1}\", \"batched_kernels\": {2}, \"n_prompt\": {3}, \"n_gen\": {4}, "
          "\"n_parallel\": {5}, \"n_kv\": {6}, \"model_size\": {7:f0}, \"model_n_params\": {8:f0}, \"load_s\": {9:f3}, ",
          minfer::util::escapeJsonForTerminal(model), w.backend, w.batched_kernels ? "true" : "false", r.n_prompt,
          r.n_gen, r.n_parallel, r.nKv(), w.size_bytes, w.params, w.load_s);
      llvm::outs() << llvm::formatv(
          "\"pp_avg_ts\": {0:f3}, \"pp_stddev_ts\": {1:f3}, \"tg_avg_ts\": {2:f3}, \"tg_stddev_ts\": {3:f3}, "
          "\"total_avg_ts\": {4:f3}, \"total_stddev_ts\": {5:f3}, \"ttft_avg_ms\": {6:f3}, \"ttft_stddev_ms\": {7:f3}, "
          "\"itl_avg_ms\": {8:f3}, \"itl_stddev_ms\": {9:f3}, \"tg_samples_ts\": {10}}{11}\n",
          r.prompt_ts.mean(), r.prompt_ts.sd(), r.decode_ts.mean(), r.decode_ts.sd(), r.total_ts.mean(),
          r.total_ts.sd(), r.ttft_ms.mean(), r.ttft_ms.sd(), r.itl_ms.mean(), r.itl_ms.sd(), samples(r.decode_ts),
          i + 1 < rows.size() ? "," : "");
    }
    llvm::outs() << "]\n";
  } else if (kCsv) {
    llvm::outs() << "model,backend,batched_kernels,n_prompt,n_gen,n_parallel,n_kv,model_size,model_n_params,load_s,"
                    "pp_avg_ts,pp_stddev_ts,tg_avg_ts,tg_stddev_ts,total_avg_ts,total_stddev_ts,ttft_avg_ms,"
                    "ttft_stddev_ms,itl_avg_ms,itl_stddev_ms\n";
    for (const BatchedRow& w : rows) {
      const minfer::tools::BatchedResult& r = w.r;
      llvm::outs() << llvm::formatv("{0},{1},{2},{3},{4},{5},{6},{7:f0},{8:f0},{9:f3},", minfer::util::escapeForTerminal(w.model),
                                    w.backend, w.batched_kernels ? 1 : 0, r.n_prompt, r.n_gen, r.n_parallel,
                                    r.nKv(), w.size_bytes, w.params, w.load_s)
                   << f(r.prompt_ts, "{0:f3},{1:f3},") << f(r.decode_ts, "{0:f3},{1:f3},")
                   << f(r.total_ts, "{0:f3},{1:f3},") << f(r.ttft_ms, "{0:f3},{1:f3},") << f(r.itl_ms, "{0:f3},{1:f3}")
                   << "\n";
    }
  } else {
    // llama-batched-bench's PP, TG, B, N_KV; its S_PP, S_TG, S as prompt, decode and total t/s.
    llvm::outs() << "| model | size | params | backend | PP | TG | B | N_KV | prompt t/s | decode t/s | total t/s | "
                    "TTFT ms | ITL ms |\n"
                    "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for (const BatchedRow& w : rows) {
      const minfer::tools::BatchedResult& r = w.r;
      llvm::outs() << llvm::formatv("| {0} | {1} | {2} | {3} | {4} | {5} | {6} | {7} | ", minfer::util::escapeForTerminal(w.model),
                                    human(w.size_bytes), humanCount(w.params), w.backend, r.n_prompt, r.n_gen,
                                    r.n_parallel, r.nKv())
                   << f(r.prompt_ts, "{0:f2} ± {1:f2} | ") << f(r.decode_ts, "{0:f2} ± {1:f2} | ")
                   << f(r.total_ts, "{0:f2} ± {1:f2} | ") << f(r.ttft_ms, "{0:f2} ± {1:f2} | ")
                   << f(r.itl_ms, "{0:f3} ± {1:f3} |") << "\n";
    }
  }
}

// minfer-bench --parallel: every model through Model::open and its BatchSession.
int batchedMain(const std::vector<int>& parallel, const std::vector<int>& prompts, const std::vector<int>& gens) {
  auto kind = minfer::parseBackendKind(kDevice.getValue());
  if (!kind) die("--device: " + kind.status().message());
  minfer::tools::BatchedBenchOptions options{
      .parallel = parallel, .prompts = prompts, .gens = gens, .reps = kReps, .n_threads = kThreads, .seed = kSeed,
      .argmax = kParallelArgmax};
  std::vector<BatchedRow> rows;
  for (const std::string& path : kModels) {
    const double t0 = now();
    minfer::ModelOptions model_options;
    model_options.verify_checksums = !kNoVerify;
    auto model = minfer::Model::open(path, *kind, model_options);
    if (!model) die(model.status().message());
    const double load_s = now() - t0;
    const std::string backend = (*model)->backendName();
    const std::string note = (*model)->backendNote().empty() ? backend : (*model)->backendNote();
    llvm::errs() << llvm::formatv("minfer-bench: {0}: {1}; loaded in {2:f2} s\n", path, note, load_s);
    bool batched_kernels = false;
    auto results = minfer::tools::runBatchedBench(**model, options, batched_kernels);
    if (!results) die(results.status().message());
    if (!batched_kernels)
      llvm::errs() << "minfer-bench: " << path << ": no batched kernels on the " << backend
                   << " backend: each step runs its sequences one after another\n";
    const minfer::fb::Artifact& m = *(*model)->artifact().manifest();
    std::string name = m.config()->architecture()->str();
    if (m.source() && m.source()->name()) name = m.source()->name()->str();
    for (minfer::tools::BatchedResult& r : *results)
      rows.push_back({.model = name,
                      .backend = std::string(backend == "cuda" ? "CUDA" : "CPU") + (kParallelArgmax ? " argmax" : ""),
                      .size_bytes = static_cast<double>((*model)->artifact().fileSize()),
                      .params = paramCount(m),
                      .load_s = load_s,
                      .batched_kernels = batched_kernels,
                      .r = std::move(r)});
  }
  printBatched(rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-bench (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-bench: prompt processing (pp) and generation (tg) speed\n");
  std::vector<int> prompts(kPrompt.begin(), kPrompt.end()), gens(kGen.begin(), kGen.end());
  if (kParallel.getNumOccurrences() > 0) {  // llama-batched-bench's test
    auto parallel = minfer::tools::parseIntList("--parallel", kParallel, 1, minfer::tools::kMaxParallel);
    if (!parallel) die(parallel.status().message());
    if (prompts.empty()) prompts = {128};
    if (gens.empty()) gens = {128};
    for (int p : prompts)
      if (p < 1) die("-p " + std::to_string(p) + ": with --parallel every prompt needs at least 1 token");
    for (int n : gens)
      if (n < 1) die("-n " + std::to_string(n) + ": with --parallel every sequence needs at least 1 decode step");
    if (kReps < 1) die("-r must be at least 1");
    if (!kDepth.empty()) die("-d is not supported with --parallel (the sequences start from an empty KV cache)");
    if (kProfile) die("--profile is not supported with --parallel");
    if (kDevice != "auto" && kDevice != "cuda" && kDevice != "cpu") die("--device must be auto, cuda or cpu");
    return batchedMain(*parallel, prompts, gens);
  }
  if (kParallelArgmax) die("--parallel-argmax needs --parallel");
  if (prompts.empty()) prompts = {512};
  if (gens.empty()) gens = {128};
  std::vector<int> depths(kDepth.begin(), kDepth.end());
  if (depths.empty()) depths = {0};
  for (int d : depths)
    if (d < 0 || d > (1 << 24)) die("-d values must be in 0..2^24");
  if (kReps < 1) die("-r must be at least 1");
  for (int p : prompts)
    if (p < 0) die("-p values must be ≥ 0");
  for (int n : gens)
    if (n < 0) die("-n values must be ≥ 0");
  if (kDevice != "auto" && kDevice != "cuda" && kDevice != "cpu") die("--device must be auto, cuda or cpu");
  if (kProfile && kDevice == "cpu") die("--profile needs the cuda backend");

  std::vector<Result> results;
  std::vector<std::string> profiles;
  std::mt19937 rng(kSeed);
  for (const std::string& path : kModels) {
    const double t0 = now();
    auto file = minfer::ArtifactFile::open(path);
    if (!file) die(file.status().message());
    const minfer::fb::Artifact& m = *(*file)->manifest();
    const int n_vocab = static_cast<int>(m.config()->n_vocab());
    const int max_p = *std::max_element(prompts.begin(), prompts.end());
    const int max_n = *std::max_element(gens.begin(), gens.end());
    const int n_ctx = std::max({max_p, max_n, 1}) + *std::max_element(depths.begin(), depths.end());

    std::unique_ptr<minfer::Backend> backend;
    std::unique_ptr<minfer::BackendSession> session;
    std::string note;
#if MINFER_HAVE_CUDA_BACKEND
    minfer::cuda::CudaSession* cuda_session = nullptr;
#endif
    // auto: the CUDA backend when it can be created here, else the CPU (and say why).
    bool cuda = false;
    std::string fallback;
    if (kDevice != "cpu") {
#if MINFER_HAVE_CUDA_BACKEND
      minfer::CudaBackendOptions options;
      options.verify_checksums = !kNoVerify;  // hashed while staging the upload
      options.overlap_launches = !kNoOverlap;
      options.logits_to_host = !kLogitsCopy;
      auto b = minfer::cuda::CudaBackend::create(**file, options);
      if (b) {
        cuda = true;
        note = (*b)->note();
        auto s = (*b)->createCudaSession({n_ctx, kThreads});
        if (!s) die(s.status().message());
        cuda_session = s->get();
        session = std::move(*s);
        backend = std::move(*b);
      } else if (kDevice == "cuda") {
        die(b.status().message());
      } else {
        fallback = "auto: " + b.status().message() + "; using cpu";
      }
#else
      if (kDevice == "cuda") die("this build has no CUDA backend");
      fallback = "auto: this build has no CUDA backend; using cpu";
#endif
    }
    if (kProfile && !cuda) die("--profile needs the cuda backend: " + fallback);
    if (!cuda) {
      if (!kNoVerify)  // as Model::open: the CPU reads the mapping directly, so one pass first
        if (minfer::Status s = (*file)->verifySegments(); !s) die(s.message());
      auto b = minfer::createCpuBackend(**file);
      if (!b) die(b.status().message());
      auto s = (*b)->createSession({n_ctx, kThreads});
      if (!s) die(s.status().message());
      session = std::move(*s);
      backend = std::move(*b);
      note = fallback.empty() ? "cpu" : fallback;
    }
    const double load_s = now() - t0;
    llvm::errs() << llvm::formatv("minfer-bench: {0}: {1}; loaded in {2:f2} s\n", path, note, load_s);

    const int max_batch = session->maxBatch();
    std::vector<float> logits(n_vocab);
    std::uniform_int_distribution<int32_t> token(0, n_vocab - 1);
    // p random tokens at positions from..from+p-1, in batches of max_batch.
    auto prompt = [&](int p, int from) {
      std::vector<int32_t> ids(p);
      for (int32_t& t : ids) t = token(rng);
      for (int pos = 0; pos < p; pos += max_batch) {
        const int n = std::min(max_batch, p - pos);
        minfer::Status s = session->forward({ids.data() + pos, static_cast<size_t>(n)}, from + pos, logits.data(), false);
        if (!s) die(s.message());
      }
    };
    // --sample: llama.cpp's default chain; the device top-k's k.
    minfer::SamplerParams sampling;
    sampling.top_k = 40;
    minfer::Sampler sampler(sampling, n_vocab);
    std::vector<minfer::TokenLogit> top(static_cast<size_t>(sampling.top_k));
    const bool device_top_k = session->deviceSampling().top_k_max >= sampling.top_k && sampling.top_k < n_vocab;
    // The timed part of a test (a prompt of `count` tokens, or `count` decode steps) at `depth`;
    // seconds. Decode steps feed random tokens (llama-bench), or with `sample` the token sampled from
    // the previous step's logits (on the device with `device`).
    auto timed = [&](bool pp, int count, int depth, bool sample = false, bool device = false) {
      sampler.reset();
      int32_t next = sample ? token(rng) : 0;
      const double start = now();
      if (pp) prompt(count, depth);
      for (int i = 0; !pp && i < count; ++i) {
        const int32_t t = sample ? next : token(rng);
        if (device) {
          minfer::Status s = session->forwardTopK({&t, 1}, depth + i, 1.0f, {}, top);
          if (!s) die(s.message());
          next = sampler.sampleTopK(top);
        } else {
          // The row where the backend session left it (CUDA: its pinned buffer, as llama.cpp's logits land in its
          // pinned output buffer), not copied.
          minfer::Result<std::span<const float>> row = session->forwardLast({&t, 1}, depth + i);
          if (!row) die(row.status().message());
          if (sample) next = sampler.sample(*row);
        }
      }
      return now() - start;
    };
    // One repetition: the depth's tokens prefilled (untimed), then the timed part.
    auto run = [&](bool pp, int count, int depth, bool sample = false, bool device = false) {
      prompt(depth, 0);
      return timed(pp, count, depth, sample, device);
    };

    std::string name = m.config()->architecture()->str();
    if (m.source() && m.source()->name()) name = m.source()->name()->str();
    auto bench = [&](bool pp, int count, int depth, bool sample = false, bool device = false) {
      if (count == 0) return;
      Result r;
      r.model = name;
      r.backend = cuda ? "CUDA" : "CPU";
      r.test = (pp ? "pp" : "tg") + std::to_string(count) + (depth ? " @ d" + std::to_string(depth) : "") +
               (device ? " +device top-k" : sample ? " +host sampling" : "");
      r.n_prompt = pp ? count : 0;
      r.n_gen = pp ? 0 : count;
      r.n_depth = depth;
      r.size_bytes = static_cast<double>((*file)->fileSize());
      r.params = paramCount(m);
      r.load_s = load_s;
      run(pp, count, depth, sample, device);  // warm-up
      for (int i = 0; i < kReps; ++i) r.ts.push_back(count / run(pp, count, depth, sample, device));
      results.push_back(r);
#if MINFER_HAVE_CUDA_BACKEND
      if (kProfile && cuda_session && !sample) {
        prompt(depth, 0);  // not profiled: not part of the test
        cuda_session->resetProfile();
        cuda_session->setProfiling(true);
        timed(pp, count, depth);
        cuda_session->setProfiling(false);
        // Per step: ms per run of the test; summed by op kind as well.
        profiles.push_back(profileTable(name, r.test, count, cuda_session->profile(), cuda_session->peakBytesPerSecond()));
      }
#endif
    };
    for (int d : depths) {
      for (int p : prompts) bench(true, p, d);
      for (int n : gens) {
        bench(false, n, d);
        if (kSample) bench(false, n, d, /*sample=*/true);
        if (kSample && device_top_k) bench(false, n, d, /*sample=*/true, /*device=*/true);
      }
    }
  }

  if (kJson) {
    llvm::outs() << "[\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::string samples;
      for (double v : r.ts) samples += (samples.empty() ? "" : ", ") + llvm::formatv("{0:f3}", v).str();
      // The model name comes from the file: quoted by the JSON writer, then made terminal-safe.
      std::string model;
      llvm::raw_string_ostream(model) << llvm::json::Value(r.model);
      llvm::outs() << llvm::formatv(
          "  {{\"model\": {0}, \"backend\": \"{1}\", \"test\": \"{2}\", \"n_prompt\": {3}, \"n_gen\": {4}, "
          "\"n_depth\": {12}, \"model_size\": {5:f0}, \"model_n_params\": {6:f0}, \"load_s\": {7:f3}, "
          "\"avg_ts\": {8:f3}, \"stddev_ts\": {9:f3}, \"samples_ts\": [{10}]}{11}\n",
          minfer::util::escapeJsonForTerminal(model), r.backend, r.test, r.n_prompt, r.n_gen, r.size_bytes, r.params,
          r.load_s, r.mean(), r.sd(), samples, i + 1 < results.size() ? "," : "", r.n_depth);
    }
    llvm::outs() << "]\n";
  } else if (kCsv) {
    llvm::outs() << "model,backend,test,n_prompt,n_gen,n_depth,model_size,model_n_params,load_s,avg_ts,stddev_ts\n";
    for (const Result& r : results)
      llvm::outs() << llvm::formatv("{0},{1},{2},{3},{4},{10},{5:f0},{6:f0},{7:f3},{8:f3},{9:f3}\n",
                                    minfer::util::escapeForTerminal(r.model), r.backend, r.test, r.n_prompt, r.n_gen,
                                    r.size_bytes, r.params, r.load_s, r.mean(), r.sd(), r.n_depth);
  } else {
    llvm::outs() << "| model | size | params | backend | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: |\n";
    for (const Result& r : results)
      llvm::outs() << llvm::formatv("| {0} | {1} | {2} | {3} | {4} | {5:f2} ± {6:f2} |\n",
                                    minfer::util::escapeForTerminal(r.model),
                                    human(r.size_bytes), humanCount(r.params), r.backend, r.test, r.mean(), r.sd());
  }
  for (const std::string& p : profiles) llvm::outs() << p;
  return 0;
}
