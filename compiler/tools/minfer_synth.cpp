// minfer-synth: writes a GGUF with random but valid weights in the shapes of a named model.
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "compiler/artifact/temp_file_signals.h"
#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "compiler/tools/synth_model.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "runtime/include/minfer/version.h"
#include "runtime/util/output_file.h"
#include "runtime/util/terminal_text.h"

using namespace minfer;

namespace {

llvm::cl::OptionCategory kCategory("minfer-synth options");
llvm::cl::opt<std::string> kModel(llvm::cl::Positional, llvm::cl::Required,
                                  llvm::cl::desc("<model: tiny-llama | tiny-qwen2 | qwen2-7b | llama3-8b | phi3-mini | "
                                                 "qwen3-30b-a3b | gemma2-9b | gemma3-12b>"),
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kTypes("types", llvm::cl::Required,
                                  llvm::cl::desc("Type mix: f32, f16, q8_0, q4_0 (output Q6_K), q6_k, or q4_k_m "
                                                 "(llama.cpp's Q4_K_M mix); norms and biases stay F32"),
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kVocab("vocab", llvm::cl::desc("Copy the tokenizer (all tokenizer.* keys) from this GGUF; "
                                                          "n_vocab follows its token count"),
                                  llvm::cl::value_desc("vocab.gguf"), llvm::cl::cat(kCategory));
llvm::cl::opt<uint64_t> kSeed("seed", llvm::cl::desc("Seed of the weights (default 1)"), llvm::cl::init(1),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kLayers("layers", llvm::cl::desc("Override the model's layer count (1..512)"), llvm::cl::init(0),
                                llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kThreads("threads", llvm::cl::desc("Generator threads (default: all cores)"),
                                 llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kOutput("o", llvm::cl::Required,
                                   llvm::cl::desc("Output GGUF file. A symbolic link is written through: its target is "
                                                  "replaced, the link stays. Refused: the --vocab file itself, a "
                                                  "directory, a device, FIFO or socket"),
                                   llvm::cl::value_desc("out.gguf"), llvm::cl::cat(kCategory));

// Prints an error (control characters escaped: messages may quote the --vocab GGUF) and exits 1.
[[noreturn]] void exitWith(const std::string& message) {
  llvm::errs() << "minfer-synth: " << util::escapeForTerminal(message, std::string::npos, /*keep_newlines=*/true)
               << "\n";
  std::exit(1);
}
void exitOnError(llvm::Error err) {
  if (err) exitWith(llvm::toString(std::move(err)));
}
template <typename T>
T exitOnError(llvm::Expected<T> value) {
  if (!value) exitWith(llvm::toString(value.takeError()));
  return std::move(*value);
}

}  // namespace

int main(int argc, char** argv) {
  artifact::armTempFileSignals();  // first: sees which signals the process started with ignored
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-synth (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv,
                                    "minfer-synth: write a GGUF with random but valid weights in the shapes of a "
                                    "named model (deterministic for a seed)\n");
  // Refused before any work: -o naming the --vocab file (also through a link), a directory, a device, …
  auto target = util::resolveOutputPath(kOutput, {kVocab});
  if (!target) exitWith(target.status().message());
  const auto start = std::chrono::steady_clock::now();

  synth::SynthOptions options;
  options.shape = exitOnError(synth::modelShape(kModel));
  if (kLayers.getNumOccurrences() > 0) {
    if (kLayers < 1 || kLayers > 512) {
      llvm::errs() << "minfer-synth: --layers " << kLayers << " is out of range 1..512\n";
      return 1;
    }
    options.shape.n_layer = kLayers;
  }
  options.mix = exitOnError(synth::parseTypeMix(kTypes));
  options.seed = kSeed;
  options.threads = kThreads > 0 ? kThreads : std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<gguf::GgufFile> vocab;
  if (!kVocab.empty()) {
    vocab = exitOnError(gguf::GgufFile::open(kVocab));
    options.vocab = vocab.get();
  }

  gguf::GgufWriter writer;
  std::vector<std::string> notes;
  exitOnError(synth::buildSynthModel(options, writer, &notes));
  for (const std::string& note : notes) llvm::errs() << "minfer-synth: note: " << note << "\n";
  const gguf::GgufLayout layout = exitOnError(writer.layout());
  exitOnError(writer.write(target->path));  // temp file beside the link's target; the link stays

  std::map<std::string, int> per_type;
  for (const auto& plan : exitOnError(synth::planTensors(options.shape, options.mix)))
    ++per_type[ggmlTypeTraits(plan.type).name];
  std::string types;
  for (const auto& [name, count] : per_type) types += llvm::formatv("{0}{1} {2}", types.empty() ? "" : ", ", count, name);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  llvm::errs() << llvm::formatv("minfer-synth: wrote {0}: {1} ({2} layers), {3}, seed {4}: {5} tensors ({6}), {7} bytes in {8:f1} s\n",
                                target->through_link ? kOutput + " (through the link, to " + target->path + ")"
                                                     : kOutput.getValue(),
                                options.shape.name, options.shape.n_layer, synth::typeMixName(options.mix),
                                options.seed, layout.tensors.size(), types, layout.file_size, seconds);
  return 0;
}
