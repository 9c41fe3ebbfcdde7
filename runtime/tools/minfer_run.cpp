// minfer-run: maps a .mfb artifact and generates text from a prompt, streaming it to stdout; -cnv chats
// through the chat template instead (run_chat.cpp).
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
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
#include "minfer/artifact.h"
#include "minfer/version.h"
#include "minfer/runtime.h"
#include "runtime/tools/chat_template_file.h"
#include "runtime/tools/model_argument.h"
#include "runtime/tools/run_chat.h"
#include "runtime/util/output_file.h"
#include "runtime/util/terminal_text.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-run options");
// llama.cpp's spellings (common/arg.cpp) are accepted as aliases: -m/--model, --prompt, --file,
// --n-predict/--predict, --ctx-size, --threads, -s.
llvm::cl::opt<std::string> kModel(llvm::cl::Positional, llvm::cl::desc("<model.mfb>"), llvm::cl::Optional,
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kModelFlag("m", llvm::cl::desc("The artifact, instead of the positional argument (also --model)"),
                                      llvm::cl::value_desc("model.mfb"), llvm::cl::cat(kCategory));
llvm::cl::alias kModelAlias("model", llvm::cl::desc("Alias for -m"), llvm::cl::aliasopt(kModelFlag),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kPrompt("p", llvm::cl::desc("Prompt text (also --prompt)"), llvm::cl::value_desc("text"),
                                   llvm::cl::cat(kCategory));
llvm::cl::alias kPromptAlias("prompt", llvm::cl::desc("Alias for -p"), llvm::cl::aliasopt(kPrompt),
                             llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kPromptFile("f", llvm::cl::desc("Read the prompt from a file, one trailing newline dropped (also --file)"),
                                       llvm::cl::value_desc("file"), llvm::cl::cat(kCategory));
llvm::cl::alias kPromptFileAlias("file", llvm::cl::desc("Alias for -f"), llvm::cl::aliasopt(kPromptFile),
                                 llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoEscape("no-escape",
                              llvm::cl::desc("Take -p / -f text literally (default: process \\n \\t \\\\ \\\" \\' \\r \\xHH "
                                             "as llama.cpp's --escape does)"),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kEscape("escape", llvm::cl::desc("Process escapes in the prompt (the default; also -e)"),
                            llvm::cl::cat(kCategory));
llvm::cl::alias kEscapeAlias("e", llvm::cl::desc("Alias for --escape"), llvm::cl::aliasopt(kEscape),
                             llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoParseSpecial(
    "no-parse-special",
    llvm::cl::desc("Tokenize control-token text in the prompt (\"</s>\", \"<|user|>\") as plain text (default: it "
                   "becomes that token, as in llama-completion)"),
    llvm::cl::cat(kCategory));
llvm::cl::opt<int> kNPredict("n",
                             llvm::cl::desc("Tokens to generate (default -1: until end of text or a full context; -2 "
                                            "is the same; also --n-predict, --predict)"),
                             llvm::cl::init(-1), llvm::cl::cat(kCategory));
llvm::cl::alias kNPredictAlias("n-predict", llvm::cl::desc("Alias for -n"), llvm::cl::aliasopt(kNPredict),
                               llvm::cl::cat(kCategory));
llvm::cl::alias kPredictAlias("predict", llvm::cl::desc("Alias for -n"), llvm::cl::aliasopt(kNPredict),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<int> kCtx("c", llvm::cl::desc("Context length in tokens; 0 = the model's, at most 4096 and at most the context the artifact was compiled for (default 0; also --ctx-size)"),
                        llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::alias kCtxAlias("ctx-size", llvm::cl::desc("Alias for -c"), llvm::cl::aliasopt(kCtx),
                          llvm::cl::cat(kCategory));
llvm::cl::opt<int> kGpuLayers("ngl",
                              llvm::cl::desc("Accepted for llama.cpp compatibility and ignored: every layer runs on "
                                             "the backend --device picks (all on the GPU with cuda; also --n-gpu-layers)"),
                              llvm::cl::value_desc("N"), llvm::cl::cat(kCategory));
llvm::cl::alias kGpuLayersAlias("n-gpu-layers", llvm::cl::desc("Alias for -ngl"), llvm::cl::aliasopt(kGpuLayers),
                                llvm::cl::cat(kCategory));
llvm::cl::opt<float> kTemp("temp", llvm::cl::desc("Temperature; <= 0 = greedy (default 0.8)"), llvm::cl::init(0.8f),
                           llvm::cl::cat(kCategory));
llvm::cl::opt<int> kTopK("top-k", llvm::cl::desc("Top-k sampling; <= 0 = off (default 40)"), llvm::cl::init(40),
                         llvm::cl::cat(kCategory));
llvm::cl::opt<float> kTopP("top-p", llvm::cl::desc("Top-p sampling; 1 = off (default 0.95)"), llvm::cl::init(0.95f),
                           llvm::cl::cat(kCategory));
llvm::cl::opt<float> kMinP("min-p", llvm::cl::desc("Min-p sampling; 0 = off (default 0.05)"), llvm::cl::init(0.05f),
                           llvm::cl::cat(kCategory));
llvm::cl::opt<float> kRepeatPenalty("repeat-penalty", llvm::cl::desc("Repetition penalty; 1 = off (default 1)"),
                                    llvm::cl::init(1.0f), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kRepeatLastN("repeat-last-n", llvm::cl::desc("Tokens the repetition penalty looks back (default 64)"),
                                llvm::cl::init(64), llvm::cl::cat(kCategory));
llvm::cl::opt<long long> kSeed("seed", llvm::cl::desc("Sampling seed; -1 = random (default -1; also -s)"), llvm::cl::init(-1),
                               llvm::cl::cat(kCategory));
llvm::cl::alias kSeedAlias("s", llvm::cl::desc("Alias for --seed"), llvm::cl::aliasopt(kSeed), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kDevice("device", llvm::cl::desc("Backend: auto, cpu or cuda (default auto)"),
                                   llvm::cl::init("auto"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kThreads("t",
                            llvm::cl::desc("CPU threads (default: the physical cores, as llama.cpp; also --threads)"),
                            llvm::cl::init(0),
                            llvm::cl::cat(kCategory));
llvm::cl::alias kThreadsAlias("threads", llvm::cl::desc("Alias for -t"), llvm::cl::aliasopt(kThreads),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoVerify("no-verify",
                              llvm::cl::desc("Skip the data segments' checksums (checked by default while loading)"),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kVerbose("verbose", llvm::cl::desc("Print model facts and token ids to stderr"),
                             llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoEcho("no-display-prompt", llvm::cl::desc("Do not print the prompt before the generated text"),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kLogitsOut(
    "logits-out",
    llvm::cl::desc("Write logits as raw little-endian float32, shape (n_prompt + n_fed) x n_vocab, row-major: row r "
                   "holds the logits after the r-th token of prompt + generated text (the prompt's rows, then one row "
                   "per generated token that was fed back). Written through a temporary file renamed over it at the "
                   "end; a symbolic link is written through (its target is replaced, the link stays). Refused: the "
                   "model or prompt file itself, a directory, a device, FIFO or socket"),
    llvm::cl::value_desc("file"), llvm::cl::cat(kCategory));

llvm::cl::opt<bool> kConversation(
    "cnv",
    llvm::cl::desc("Conversation mode (also --conversation): chat with the model through its chat template, one user "
                   "message per line of stdin (a \"> \" prompt on stderr when stdin is a terminal) until EOF; -sys "
                   "adds a system message first, -p / -f is the first user message (as llama-cli -cnv), -n limits "
                   "each reply"),
    llvm::cl::cat(kCategory));
llvm::cl::alias kConversationAlias("conversation", llvm::cl::desc("Alias for -cnv"), llvm::cl::aliasopt(kConversation),
                                   llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kSystemPrompt("sys",
                                         llvm::cl::desc("System message of the conversation (-cnv), taken literally "
                                                        "(also --system-prompt)"),
                                         llvm::cl::value_desc("text"), llvm::cl::cat(kCategory));
llvm::cl::alias kSystemPromptAlias("system-prompt", llvm::cl::desc("Alias for -sys"), llvm::cl::aliasopt(kSystemPrompt),
                                   llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kChatTemplateFile(
    "chat-template",
    llvm::cl::desc("Jinja chat template for -cnv, instead of the artifact's tokenizer.chat_template"),
    llvm::cl::value_desc("file"), llvm::cl::cat(kCategory));

std::atomic<bool> g_interrupted{false};

void onSigint(int) { g_interrupted = true; }

// Messages may quote the artifact (names, token texts): shown with control characters escaped.
int fail(const std::string& message) {
  llvm::errs() << "minfer-run: " << minfer::util::escapeForTerminal(message, std::string::npos, /*keep_newlines=*/true)
               << "\n";
  return 1;
}

// The prompt text: -p, or -f's file without one trailing newline (llama.cpp's -f); escapes processed
// unless --no-escape (llama.cpp's default --escape), for both.
minfer::Result<std::string> promptText() {
  std::string prompt = kPrompt;
  if (!kPromptFile.empty()) {
    if (!kPrompt.empty()) return minfer::Status::error("-p and -f are mutually exclusive");
    std::error_code ec;
    if (std::filesystem::is_directory(kPromptFile.getValue(), ec))
      return minfer::Status::error(kPromptFile + ": is a directory, not a prompt file");
    std::ifstream in(kPromptFile, std::ios::binary);
    if (!in) return minfer::Status::error(kPromptFile + ": cannot open the prompt file: " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = minfer::dropOneTrailingNewline(ss.str());
  }
  if (!kNoEscape) prompt = minfer::processEscapes(prompt);
  return prompt;
}

// "" when the numeric options are in range, else the message.
std::string optionProblem() {
  if (kCtx < 0 || kCtx > minfer::Model::kMaxContext)
    return llvm::formatv("-c {0} is out of range 0..{1} (0 = the model's context length)", kCtx.getValue(),
                         minfer::Model::kMaxContext);
  if (kNPredict < -2)
    return llvm::formatv("-n {0} must be -1 or -2 (until end of text or a full context) or ≥ 0", kNPredict.getValue());
  if (kThreads < 0 || kThreads > 4096) return llvm::formatv("-t {0} is out of range 0..4096", kThreads.getValue());
  // As in llama.cpp: --temp ≤ 0 is greedy, --top-k ≤ 0 turns top-k off.
  if (std::isnan(kTemp) || !(kTopP >= 0 && kTopP <= 1) || !(kMinP >= 0 && kMinP <= 1) || !(kRepeatPenalty > 0) ||
      kRepeatLastN < 0)
    return llvm::formatv("sampling options out of range: --temp {0} (a number), --top-p {1} and --min-p {2} (0..1), "
                         "--top-k {3} (any), --repeat-last-n {4} (≥ 0), --repeat-penalty {5} (> 0)",
                         kTemp.getValue(), kTopP.getValue(), kMinP.getValue(), kTopK.getValue(), kRepeatLastN.getValue(),
                         kRepeatPenalty.getValue());
  return "";
}

minfer::GenerateParams generateParams() {
  minfer::GenerateParams params;
  params.n_predict = kNPredict;
  params.parse_special = !kNoParseSpecial;  // llama-completion tokenizes its prompt with parse_special
  params.sampling.temperature = kTemp;
  params.sampling.top_k = kTopK;
  params.sampling.top_p = kTopP;
  params.sampling.min_p = kMinP;
  params.sampling.repeat_penalty = kRepeatPenalty;
  params.sampling.repeat_last_n = kRepeatLastN;
  params.sampling.seed = kSeed >= 0 ? static_cast<uint64_t>(kSeed.getValue()) : std::random_device{}();
  if (kSeed < 0 && kTemp > 0) llvm::errs() << "minfer-run: seed " << params.sampling.seed << "\n";
  return params;
}

// The load line, and with --verbose the model's facts.
void printLoaded(const minfer::Model& model, int n_ctx, double load_seconds) {
  const minfer::ModelInfo& info = model.info();
  llvm::errs() << llvm::formatv("minfer-run: {0} ({1}, {2} layers), backend {3}{4}, context {5}, loaded in {6:f3} s\n",
                                kModel, minfer::util::escapeForTerminal(info.architecture), info.n_layer,
                                model.backendName(), model.backendNote().empty() ? "" : " (" + model.backendNote() + ")",
                                n_ctx, load_seconds);
  if (kVerbose)
    llvm::errs() << llvm::formatv("minfer-run: model \"{0}\" from {1}: n_vocab {2}, n_embd {3}, n_head {4}, n_head_kv "
                                  "{5}, head_dim {6}, n_ctx_train {7}, max batch {8}, {9} bytes\n",
                                  minfer::util::escapeForTerminal(info.name), minfer::util::escapeForTerminal(info.source),
                                  info.n_vocab, info.n_embd, info.n_head, info.n_head_kv, info.head_dim,
                                  info.n_ctx_train, info.max_batch, info.file_bytes);
}

// -cnv's settings: the template (--chat-template's file, else the artifact's), -sys, and -p / -f as the
// first user message.
minfer::Result<minfer::tools::ChatOptions> chatOptions(const minfer::Model& model, std::string first_user) {
  minfer::tools::ChatOptions options;
  auto text = minfer::tools::chatTemplateText(model, kModel, kChatTemplateFile);
  if (!text) return text.takeStatus();
  if (text->source.empty())
    return minfer::Status::error(kModel + ": the model has no chat template (tokenizer.chat_template); pass "
                                 "--chat-template FILE");
  options.template_source = std::move(text->source);
  options.template_origin = std::move(text->origin);
  options.system_prompt = kSystemPrompt;
  options.first_user = std::move(first_user);
  options.escape = !kNoEscape;
  options.verbose = kVerbose;
  return options;
}

void printSummary(const minfer::GenerateResult& r, bool context_full) {
  llvm::errs() << llvm::formatv(
      "minfer-run: prompt {0} tokens in {1:f3} s ({2:f1} tokens/s); generated {3} tokens in {4:f3} s ({5:f1} "
      "tokens/s); stop: {6}\n",
      r.n_prompt, r.prompt_seconds, r.prompt_seconds > 0 ? r.n_prompt / r.prompt_seconds : 0.0, r.n_generated,
      r.generate_seconds, r.generate_seconds > 0 ? r.n_generated / r.generate_seconds : 0.0,
      g_interrupted ? "interrupted" : context_full ? "context full" : minfer::stopReasonName(r.stop));
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-run (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-run: generate text with a minfer artifact\n");

  auto model_path = minfer::tools::modelArgument(kModel, kModelFlag);
  if (!model_path) return fail(model_path.status().message());
  kModel.setValue(*model_path);
  if (kGpuLayers.getNumOccurrences())
    llvm::errs() << "minfer-run: note: -ngl is ignored: every layer runs on the backend --device picks\n";
  auto prompt_text = promptText();
  if (!prompt_text) return fail(prompt_text.status().message());
  const std::string& prompt = *prompt_text;
  if (const std::string problem = optionProblem(); !problem.empty()) return fail(problem);
  if (!kConversation && (kSystemPrompt.getNumOccurrences() || kChatTemplateFile.getNumOccurrences()))
    return fail("-sys and --chat-template apply to conversation mode: add -cnv");
  if (kConversation && !kLogitsOut.empty()) return fail("--logits-out is not supported with -cnv");
  auto kind = minfer::parseBackendKind(kDevice.getValue());
  if (!kind) return fail("--device: " + kind.status().message());

  // Checked and created before the model loads, so a bad path fails at once (output_file.h).
  std::unique_ptr<minfer::util::OutputFile> logits_out;
  if (!kLogitsOut.empty()) {
    auto target = minfer::util::resolveOutputPath(kLogitsOut, {kModel, kPromptFile});
    if (!target) return fail("--logits-out " + target.status().message());
    auto file = minfer::util::OutputFile::create(*target);
    if (!file) return fail("--logits-out " + file.status().message());
    logits_out = std::move(*file);
  }

  const auto t_start = std::chrono::steady_clock::now();
  minfer::ModelOptions model_options;
  model_options.verify_checksums = !kNoVerify;
  auto model = minfer::Model::open(kModel, *kind, model_options);
  if (!model) return fail(model.status().message());
  const minfer::ModelInfo& info = (*model)->info();
  if (!(*model)->hasTokenizer()) return fail(kModel + ": the artifact has no tokenizer");

  minfer::Model::SessionOptions session_options;
  session_options.n_ctx = kCtx > 0 ? kCtx.getValue() : (info.n_ctx_train > 0 ? std::min(info.n_ctx_train, 4096) : 4096);
  // The default stays within the context the artifact was compiled for (minfer-compile -c); an explicit
  // larger -c is refused by createSession with both numbers.
  if (kCtx == 0 && info.n_ctx_max > 0) session_options.n_ctx = std::min(session_options.n_ctx, info.n_ctx_max);
  session_options.n_threads = kThreads;
  if (info.n_ctx_train > 0 && session_options.n_ctx > info.n_ctx_train)
    llvm::errs() << llvm::formatv("minfer-run: warning: -c {0} exceeds the {1} positions the model was trained with\n",
                                  session_options.n_ctx, info.n_ctx_train);
  auto session = (*model)->createSession(session_options);
  if (!session) return fail(session.status().message());
  printLoaded(**model, session_options.n_ctx,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  if (kVerbose)  // the session's memory: sliding-window layers' rings make the KV cache less than n_ctx's
    llvm::errs() << llvm::formatv("minfer-run: session: {0} bytes allocated, of which KV cache {1} bytes\n",
                                  (*session)->allocatedBytes(), (*session)->kvCacheBytes());

  minfer::GenerateParams params = generateParams();
  if (kConversation) {
    auto options = chatOptions(**model, prompt);
    if (!options) return fail(options.status().message());
    options->params = params;
    // Without SA_RESTART, so that Ctrl+C also interrupts the wait for the next line and ends the chat.
    struct sigaction on_sigint {};
    on_sigint.sa_handler = onSigint;
    sigemptyset(&on_sigint.sa_mask);
    sigaction(SIGINT, &on_sigint, nullptr);
    if (minfer::Status s = minfer::tools::runChat(**model, **session, *options, g_interrupted); !s)
      return fail(s.message());
    return g_interrupted ? 130 : 0;
  }
  if (logits_out) {
    params.on_logits = [&](std::span<const float> logits, int) {
      (void)logits_out->write(logits.data(), logits.size_bytes());  // a failure is kept; commit() reports it
    };
  }

  // A prompt that cannot fit is refused before anything is printed.
  auto prompt_ids = (*model)->tokenize(prompt, params.add_special, params.parse_special);
  if (!prompt_ids) return fail(prompt_ids.status().message());
  if (static_cast<int>(prompt_ids->size()) >= session_options.n_ctx)
    return fail(llvm::formatv("prompt of {0} tokens does not fit the context of {1} (-c); at least one position "
                              "must remain for generation",
                              prompt_ids->size(), session_options.n_ctx)
                    .str());
  // llama-completion (no context shift, its default) samples at most n_ctx − n_prompt tokens: it stops
  // before evaluating the token that would take the last position. Capping n_predict there gives the
  // same tokens; context_full says the cap, not the user's -n, ended the run.
  const int room = session_options.n_ctx - static_cast<int>(prompt_ids->size());
  const bool context_capped = params.n_predict < 0 || params.n_predict > room;
  if (context_capped) params.n_predict = room;

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
  // What llama-completion prints when it stops: " [end of text]" at an end-of-generation token
  // (stdout), a warning on stderr at a full context.
  const bool eog = result && result->stop == minfer::StopReason::kEndOfGeneration;
  const bool context_full = result && context_capped && result->stop == minfer::StopReason::kMaxTokens;
  std::fputs(eog ? " [end of text]\n" : "\n", stdout);
  std::fflush(stdout);
  if (kVerbose) llvm::errs() << "\n";  // ends the line of token ids before the summary
  if (context_full) llvm::errs() << "minfer-run: context full and context shift is disabled => stopping\n";
  if (!result) return fail(result.status().message());
  if (logits_out) {
    if (minfer::Status s = logits_out->commit(); !s) return fail("--logits-out " + s.message());
  }
  printSummary(*result, context_full);
  return g_interrupted ? 130 : 0;
}
