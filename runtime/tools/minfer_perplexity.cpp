// minfer-perplexity: perplexity of a model over a text file, with llama-perplexity's definition.
//
// Definition (llama.cpp tools/perplexity): the text is read as llama.cpp reads -f (one trailing newline
// dropped, backslash escapes processed unless --no-escape), tokenized with BOS (when the vocabulary
// adds one) and no special-token parsing; fewer than 2·n_ctx tokens are refused with llama-perplexity's
// message; the rest is cut into n_tokens / n_ctx consecutive non-overlapping windows of n_ctx tokens
// (the tail that does not fill a window is not scored); the first token of each
// window is replaced by BOS; only the second half of each window is scored: logits at window
// positions n_ctx/2 … n_ctx−2 predict the tokens at n_ctx/2+1 … n_ctx−1. PPL = exp(mean NLL) over all
// scored tokens; ± is PPL · sqrt((mean(NLL²) − mean(NLL)²) / (count − 1)).
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/version.h"
#include "minfer/runtime.h"
#include "runtime/util/terminal_text.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-perplexity options");
llvm::cl::opt<std::string> kModel(llvm::cl::Positional, llvm::cl::desc("<model.mfb>"), llvm::cl::Required,
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kText("f", llvm::cl::desc("Text file to score (also --file)"), llvm::cl::value_desc("file"),
                                 llvm::cl::Required, llvm::cl::cat(kCategory));
llvm::cl::opt<int> kCtx("c", llvm::cl::desc("Window length in tokens (default 512; also --ctx-size)"), llvm::cl::init(512),
                        llvm::cl::cat(kCategory));
llvm::cl::alias kCtxAlias("ctx-size", llvm::cl::desc("Alias for -c"), llvm::cl::aliasopt(kCtx), llvm::cl::cat(kCategory));
llvm::cl::alias kTextAlias("file", llvm::cl::desc("Alias for -f"), llvm::cl::aliasopt(kText), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoEscape("no-escape",
                              llvm::cl::desc("Take the text literally (default: process backslash escapes as "
                                             "llama-perplexity does)"),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<int> kChunks("chunks", llvm::cl::desc("Score at most this many windows (default: all)"),
                           llvm::cl::init(-1), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kDevice("device", llvm::cl::desc("Backend: auto, cpu or cuda (default auto)"),
                                   llvm::cl::init("auto"), llvm::cl::cat(kCategory));
llvm::cl::opt<int> kThreads("t", llvm::cl::desc("CPU threads (default: the physical cores, as llama.cpp)"), llvm::cl::init(0),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoVerify("no-verify",
                              llvm::cl::desc("Skip the data segments' checksums (checked by default while loading)"),
                              llvm::cl::cat(kCategory));

int fail(const std::string& message) {
  llvm::errs() << "minfer-perplexity: " << minfer::util::escapeForTerminal(message, std::string::npos, /*keep_newlines=*/true)
               << "\n";
  return 1;
}

// log softmax(logits)[token], accumulated in double.
double logProbability(const float* logits, int n_vocab, int token) {
  float max = logits[0];
  for (int i = 1; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return static_cast<double>(logits[token]) - max - std::log(sum);
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-perplexity (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-perplexity: perplexity of a minfer artifact over a text\n");
  if (kCtx < 4 || kCtx > minfer::Model::kMaxContext)
    return fail(llvm::formatv("-c {0} is out of range 4..{1}", kCtx.getValue(), minfer::Model::kMaxContext).str());
  auto kind = minfer::parseBackendKind(kDevice.getValue());
  if (!kind) return fail("--device: " + kind.status().message());

  if (kChunks == 0 || kChunks < -1) return fail(llvm::formatv("--chunks {0} must be ≥ 1 (or -1 for all)", kChunks.getValue()).str());
  std::error_code ec;
  if (std::filesystem::is_directory(kText.getValue(), ec)) return fail(kText + ": is a directory, not a text file");
  std::ifstream in(kText, std::ios::binary);
  if (!in) return fail(kText + ": cannot open the text file: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();

  minfer::ModelOptions model_options;
  model_options.verify_checksums = !kNoVerify;
  auto model = minfer::Model::open(kModel, *kind, model_options);
  if (!model) return fail(model.status().message());
  const int n_vocab = (*model)->info().n_vocab;
  std::string text = minfer::dropOneTrailingNewline(ss.str());  // llama.cpp's -f
  if (!kNoEscape) text = minfer::processEscapes(text);           // llama.cpp's --escape, its default
  auto tokens = (*model)->tokenize(text, /*add_special=*/true, /*parse_special=*/false);
  if (!tokens) return fail(tokens.status().message());
  const int n_ctx = kCtx;
  if (tokens->size() < 2 * static_cast<size_t>(n_ctx))  // llama-perplexity's refusal, word for word
    return fail(llvm::formatv("{0}: you need at least {1} tokens to evaluate perplexity with a context of {2}\n"
                              "minfer-perplexity: {0}: the data file you provided tokenizes to only {3} tokens",
                              kText, 2 * n_ctx, n_ctx, tokens->size())
                    .str());
  int n_chunks = static_cast<int>(tokens->size() / n_ctx);
  if (kChunks >= 0) n_chunks = std::min(n_chunks, kChunks.getValue());
  if (n_chunks == 0)
    return fail(llvm::formatv("{0}: {1} tokens are fewer than one window of -c {2}", kText, tokens->size(), n_ctx).str());

  minfer::Model::SessionOptions session_options;
  session_options.n_ctx = n_ctx;
  session_options.n_threads = kThreads;
  auto session = (*model)->createSession(session_options);
  if (!session) return fail(session.status().message());
  llvm::errs() << llvm::formatv("minfer-perplexity: {0} tokens, {1} window{4} of {2}, backend {3}\n", tokens->size(),
                                n_chunks, n_ctx, (*model)->backendName(), n_chunks == 1 ? "" : "s");

  const int bos = (*model)->tokenizer().vocabulary().bos_id;
  const bool add_bos = (*model)->tokenizer().vocabulary().add_bos && bos >= 0;
  std::vector<int32_t> window(n_ctx);
  std::vector<float> logits(static_cast<size_t>(n_ctx) * n_vocab);
  double nll = 0, nll2 = 0;
  long count = 0;
  for (int c = 0; c < n_chunks; ++c) {
    std::copy(tokens->begin() + static_cast<long>(c) * n_ctx, tokens->begin() + static_cast<long>(c + 1) * n_ctx,
              window.begin());
    if (add_bos) window[0] = bos;
    (*session)->reset();
    if (minfer::Status s = (*session)->prefill(window, logits); !s) return fail(s.message());
    for (int p = n_ctx / 2; p < n_ctx - 1; ++p) {
      const double v = -logProbability(&logits[static_cast<size_t>(p) * n_vocab], n_vocab, window[p + 1]);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    llvm::outs() << llvm::formatv("[{0}]{1:f4},", c + 1, std::exp(nll / count));
    llvm::outs().flush();
  }
  llvm::outs() << "\n";
  const double mean = nll / count, mean2 = nll2 / count, ppl = std::exp(mean);
  const double var = mean2 - mean * mean;
  const double err = count > 1 && var > 0 ? ppl * std::sqrt(var / (count - 1)) : 0.0;
  llvm::outs() << llvm::formatv("Final estimate: PPL = {0:f4} +/- {1:f5}\n", ppl, err);
  return 0;
}
