// minfer-run: maps a .mfb artifact and generates text from a prompt, streaming it to stdout.
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/version.h"
#include "minfer/runtime.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-run options");
llvm::cl::opt<std::string> kModel(llvm::cl::Positional, llvm::cl::desc("<model.mfb>"), llvm::cl::Required,
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kPrompt("p", llvm::cl::desc("Prompt text"), llvm::cl::value_desc("text"),
                                   llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kPromptFile("f", llvm::cl::desc("Read the prompt from a file"),
                                       llvm::cl::value_desc("file"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kNPredict("n", llvm::cl::desc("Tokens to generate (default -1: until end of text or a full context)"),
                             llvm::cl::init(-1), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kCtx("c", llvm::cl::desc("Context length in tokens; 0 = the model's, at most 4096 (default 0)"),
                        llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<float> kTemp("temp", llvm::cl::desc("Temperature; 0 = greedy (default 0.8)"), llvm::cl::init(0.8f),
                           llvm::cl::cat(kCategory));
llvm::cl::opt<int> kTopK("top-k", llvm::cl::desc("Top-k sampling; 0 = off (default 40)"), llvm::cl::init(40),
                         llvm::cl::cat(kCategory));
llvm::cl::opt<float> kTopP("top-p", llvm::cl::desc("Top-p sampling; 1 = off (default 0.95)"), llvm::cl::init(0.95f),
                           llvm::cl::cat(kCategory));
llvm::cl::opt<float> kMinP("min-p", llvm::cl::desc("Min-p sampling; 0 = off (default 0.05)"), llvm::cl::init(0.05f),
                           llvm::cl::cat(kCategory));
llvm::cl::opt<float> kRepeatPenalty("repeat-penalty", llvm::cl::desc("Repetition penalty; 1 = off (default 1)"),
                                    llvm::cl::init(1.0f), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kRepeatLastN("repeat-last-n", llvm::cl::desc("Tokens the repetition penalty looks back (default 64)"),
                                llvm::cl::init(64), llvm::cl::cat(kCategory));
llvm::cl::opt<long long> kSeed("seed", llvm::cl::desc("Sampling seed; -1 = random (default -1)"), llvm::cl::init(-1),
                               llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kDevice("device", llvm::cl::desc("Backend: auto, cpu or cuda (default auto)"),
                                   llvm::cl::init("auto"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kThreads("t", llvm::cl::desc("CPU threads (default: all cores)"), llvm::cl::init(0),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kVerify("verify", llvm::cl::desc("Check every checksum of the artifact before running"),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kVerbose("verbose", llvm::cl::desc("Print model facts and token ids to stderr"),
                             llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoEcho("no-display-prompt", llvm::cl::desc("Do not print the prompt before the generated text"),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kLogitsOut(
    "logits-out",
    llvm::cl::desc("Write logits as raw little-endian float32, shape (n_prompt + n_fed) x n_vocab, row-major: row r "
                   "holds the logits after the r-th token of prompt + generated text (the prompt's rows, then one row "
                   "per generated token that was fed back)"),
    llvm::cl::value_desc("file"), llvm::cl::cat(kCategory));

std::atomic<bool> g_interrupted{false};

void onSigint(int) { g_interrupted = true; }

int fail(const std::string& message) {
  llvm::errs() << "minfer-run: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-run (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-run: generate text with a minfer artifact\n");

  std::string prompt = kPrompt;
  if (!kPromptFile.empty()) {
    if (!kPrompt.empty()) return fail("-p and -f are mutually exclusive");
    std::error_code ec;
    if (std::filesystem::is_directory(kPromptFile.getValue(), ec)) return fail(kPromptFile + ": is a directory, not a prompt file");
    std::ifstream in(kPromptFile, std::ios::binary);
    if (!in) return fail(kPromptFile + ": cannot open the prompt file: " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
    // Like llama.cpp's -f: one trailing newline (as `echo text > file` writes) is not part of the prompt.
    if (!prompt.empty() && prompt.back() == '\n') prompt.pop_back();
  }
  if (kCtx < 0 || kCtx > minfer::Model::kMaxContext)
    return fail(llvm::formatv("-c {0} is out of range 0..{1} (0 = the model's context length)", kCtx.getValue(),
                              minfer::Model::kMaxContext)
                    .str());
  if (kNPredict < -1) return fail(llvm::formatv("-n {0} must be -1 (unlimited) or ≥ 0", kNPredict.getValue()).str());
  if (kThreads < 0 || kThreads > 4096) return fail(llvm::formatv("-t {0} is out of range 0..4096", kThreads.getValue()).str());
  if (!(kTemp >= 0) || !(kTopP >= 0 && kTopP <= 1) || !(kMinP >= 0 && kMinP <= 1) || !(kRepeatPenalty > 0) ||
      kTopK < 0 || kRepeatLastN < 0)
    return fail(llvm::formatv("sampling options out of range: --temp {0} (≥ 0), --top-p {1} and --min-p {2} (0..1), "
                              "--top-k {3} and --repeat-last-n {4} (≥ 0), --repeat-penalty {5} (> 0)",
                              kTemp.getValue(), kTopP.getValue(), kMinP.getValue(), kTopK.getValue(),
                              kRepeatLastN.getValue(), kRepeatPenalty.getValue())
                    .str());
  auto kind = minfer::parseBackendKind(kDevice.getValue());
  if (!kind) return fail("--device: " + kind.status().message());

  // Opened before the model loads, so a bad path fails at once.
  std::unique_ptr<std::ofstream> logits_out;
  if (!kLogitsOut.empty()) {
    logits_out = std::make_unique<std::ofstream>(kLogitsOut, std::ios::binary | std::ios::trunc);
    if (!*logits_out) return fail(kLogitsOut + ": cannot open for writing: " + std::strerror(errno));
  }

  const auto t_start = std::chrono::steady_clock::now();
  minfer::ModelOptions model_options;
  model_options.verify_checksums = kVerify;
  auto model = minfer::Model::open(kModel, *kind, model_options);
  if (!model) return fail(model.status().message());
  const minfer::ModelInfo& info = (*model)->info();
  if (!(*model)->hasTokenizer()) return fail(kModel + ": the artifact has no tokenizer");

  minfer::Model::SessionOptions session_options;
  session_options.n_ctx = kCtx > 0 ? kCtx.getValue() : (info.n_ctx_train > 0 ? std::min(info.n_ctx_train, 4096) : 4096);
  session_options.n_threads = kThreads;
  if (info.n_ctx_train > 0 && session_options.n_ctx > info.n_ctx_train)
    llvm::errs() << llvm::formatv("minfer-run: warning: -c {0} exceeds the {1} positions the model was trained with\n",
                                  session_options.n_ctx, info.n_ctx_train);
  auto session = (*model)->createSession(session_options);
  if (!session) return fail(session.status().message());
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  llvm::errs() << llvm::formatv("minfer-run: {0} ({1}, {2} layers), backend {3}{4}, context {5}, loaded in {6:f3} s\n",
                                kModel, info.architecture, info.n_layer, (*model)->backendName(),
                                (*model)->backendNote().empty() ? "" : " (" + (*model)->backendNote() + ")",
                                session_options.n_ctx, load_seconds);

  minfer::GenerateParams params;
  params.n_predict = kNPredict;
  params.sampling.temperature = kTemp;
  params.sampling.top_k = kTopK;
  params.sampling.top_p = kTopP;
  params.sampling.min_p = kMinP;
  params.sampling.repeat_penalty = kRepeatPenalty;
  params.sampling.repeat_last_n = kRepeatLastN;
  params.sampling.seed = kSeed >= 0 ? static_cast<uint64_t>(kSeed.getValue()) : std::random_device{}();
  if (kSeed < 0 && kTemp > 0) llvm::errs() << "minfer-run: seed " << params.sampling.seed << "\n";

  if (logits_out) {
    params.on_logits = [&](std::span<const float> logits, int) {
      logits_out->write(reinterpret_cast<const char*>(logits.data()),
                        static_cast<std::streamsize>(logits.size_bytes()));
    };
  }

  // A prompt that cannot fit is refused before anything is printed.
  auto prompt_ids = (*model)->tokenize(prompt, params.add_special);
  if (!prompt_ids) return fail(prompt_ids.status().message());
  if (static_cast<int>(prompt_ids->size()) >= session_options.n_ctx)
    return fail(llvm::formatv("prompt of {0} tokens does not fit the context of {1} (-c); at least one position "
                              "must remain for generation",
                              prompt_ids->size(), session_options.n_ctx)
                    .str());

  std::signal(SIGINT, onSigint);
  if (!kNoEcho) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
  }
  auto result = (*session)->generate(prompt, params, [&](std::string_view piece, int32_t token) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (kVerbose && token >= 0) llvm::errs() << "[" << token << "]";
    return !g_interrupted.load();
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!result) return fail(result.status().message());
  if (logits_out) {
    logits_out->close();
    if (!*logits_out) return fail(kLogitsOut + ": write failed");
  }
  const minfer::GenerateResult& r = *result;
  llvm::errs() << llvm::formatv(
      "minfer-run: prompt {0} tokens in {1:f3} s ({2:f1} tokens/s); generated {3} tokens in {4:f3} s ({5:f1} "
      "tokens/s); stop: {6}\n",
      r.n_prompt, r.prompt_seconds, r.prompt_seconds > 0 ? r.n_prompt / r.prompt_seconds : 0.0, r.n_generated,
      r.generate_seconds, r.generate_seconds > 0 ? r.n_generated / r.generate_seconds : 0.0,
      g_interrupted ? "interrupted" : minfer::stopReasonName(r.stop));
  return g_interrupted ? 130 : 0;
}
