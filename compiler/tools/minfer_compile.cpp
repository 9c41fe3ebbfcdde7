// minfer-compile: compiles a GGUF model into a .mfb artifact (planes, stride tables, plan, kernels).
#include <chrono>
#include <string>

#include "compiler/artifact/temp_file_signals.h"
#include "compiler/compile_model.h"
#if defined(MINFER_HAVE_CUDA)
#include "runtime/cuda/cuda_device.h"
#endif
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/artifact.h"
#include "runtime/include/minfer/version.h"
#include "runtime/util/output_file.h"
#include "runtime/util/terminal_text.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-compile options");
llvm::cl::opt<std::string> kInput(llvm::cl::Positional, llvm::cl::desc("<model.gguf>"), llvm::cl::Required,
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kOutput(
    "o", llvm::cl::desc("Output artifact (.mfb). A symbolic link is written through: its target is replaced, the link "
                        "stays. Refused: the input itself, a directory, a device, FIFO or socket"),
    llvm::cl::value_desc("file"), llvm::cl::Required, llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kMaxBatch("max-batch", llvm::cl::desc("Largest number of tokens per step (default 512)"),
                                  llvm::cl::init(512), llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kCtx(
    "c",
    llvm::cl::desc("Context the artifact is compiled for (llama.cpp's -c): sessions may use at most this many "
                   "positions, and LongRoPE models (phi3 128k) take their long factors iff it exceeds "
                   "rope.scaling.original_context_length. 0 (default): the model's context_length for that "
                   "choice, and no limit, except for a LongRoPE model given its short factors: sessions then "
                   "stop at the original context (beyond it llama.cpp would use the long ones)"),
    llvm::cl::value_desc("n"), llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::alias kCtxLong("ctx-size", llvm::cl::desc("Alias for -c"), llvm::cl::aliasopt(kCtx), llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kJobs("j", llvm::cl::desc("Worker threads for the plane transforms (default: all cores)"),
                              llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kTarget(
    "target",
    llvm::cl::desc("GPU architectures for kernel images, comma-separated (sm_80,sm_90a); '' = none (CPU only); "
                   "auto (default) = this machine's GPU if it has one (sm_90a on Hopper), else sm_80,sm_86,sm_89,"
                   "sm_90 (each image also carries PTX, which newer GPUs compile at load). With sm_90a alone, prefill "
                   "matmuls use Hopper's wgmma on f16 weights expanded at load; any other set uses int8 mma.sync"),
    llvm::cl::init("auto"), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kKernelCache(
    "kernel-cache", llvm::cl::desc("NVRTC kernel image cache directory, or 'off' (default: $MINFER_CACHE_DIR, "
                                   "$XDG_CACHE_HOME/minfer/kernels or ~/.cache/minfer/kernels)"),
    llvm::cl::value_desc("dir"), llvm::cl::init(""), llvm::cl::cat(kCategory));
llvm::cl::opt<minfer::planes::PlaneForm> kPlanes(
    "planes",
    llvm::cl::desc("How quantized weights are stored (default compact)"),
    llvm::cl::values(clEnumValN(minfer::planes::PlaneForm::kCompact, "compact",
                                "the GGUF blocks only; the GPU expands the prefill planes at load (file ~ GGUF size)"),
                     clEnumValN(minfer::planes::PlaneForm::kExpanded, "expanded",
                                "every plane stored, nothing expanded at load (file ~2.9x the GGUF for a Q4_K_M model)")),
    llvm::cl::init(minfer::planes::PlaneForm::kCompact), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kNoFuse("no-fuse",
                            llvm::cl::desc("Give every plan step its own kernel launches (no quantization or norm "
                                           "fused into the kernel before it; same results)"),
                            llvm::cl::cat(kCategory));
enum class GemvFusion { kNone, kQkv, kPair, kNorm, kAll };
llvm::cl::opt<GemvFusion> kFuseGemv(
    "fuse-gemv", llvm::cl::ValueOptional, llvm::cl::init(GemvFusion::kNorm),
    llvm::cl::desc("Decode GEMV fusions (qkv also fuses the prefill q, k, v of calls of 5 … 64 rows on sm_90a into "
                   "one mmq_blocks launch: the same f16 rounding, not always the same split of K): norm (the default: "
                   "q, k, v with their RoPE and KV store in one launch, "
                   "or the three GEMVs alone where q/k norms sit before the RoPE; gate and up in one launch; the o "
                   "and down GEMVs (a MoE FFN's down GEMV) each with the residual Add and RMSNorm after them, the "
                   "1/rms applied by the GEMVs that read the norm), pair (the same without the last: every result "
                   "bit for bit the unfused steps'), qkv (the first only), all (norm, with gate|up and its GLU instead of the pair, which "
                   "measured slower; a bare --fuse-gemv), none (BENCHMARKS.md)"),
    llvm::cl::values(clEnumValN(GemvFusion::kNone, "none", "no decode GEMV fusion"),
                     clEnumValN(GemvFusion::kQkv, "qkv", "q, k, v GEMVs (with RoPE and KV store) in one launch"),
                     clEnumValN(GemvFusion::kPair, "pair", "and the gate and up GEMVs in one launch"),
                     clEnumValN(GemvFusion::kNorm, "norm", "and the o and down GEMVs with the Add and RMSNorm (default)"),
                     clEnumValN(GemvFusion::kAll, "all", "and gate|up GEMVs with their GLU"),
                     clEnumValN(GemvFusion::kAll, "", "")),
    llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kFusePrefillPair(
    "fuse-prefill-pair",
    llvm::cl::desc("Run the prefill gate and up of calls of 5 … 64 rows on sm_90a as one mmq_blocks launch, as "
                   "--fuse-gemv's q, k, v (default on; --fuse-prefill-pair=false: each its own, BENCHMARKS.md)"),
    llvm::cl::init(true), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kMmqbWgmma(
    "mmqb-wgmma",
    llvm::cl::desc("Run the 64-token tiles of the small-batch mmq_blocks launches of sm_90a images on Hopper's "
                   "warpgroup MMA (wgmma; default on; --mmqb-wgmma=false: mma.sync, kernels/mmq_blocks.cuh MMQB_WGMMA)"),
    llvm::cl::init(true), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kMmqbF16Act(
    "mmqb-f16act",
    llvm::cl::desc("Give the 64-token warpgroup mmq_blocks tiles (--mmqb-wgmma, sm_90a) their activations as f16, "
                   "staged once per step (default on; +3.4% aggregate decode at 64 sequences on an H100; "
                   "--mmqb-f16act=false: each thread block converts the q8 input at every stage, kernels/mmq_blocks.cuh "
                   "MMQB_F16ACT)"),
    llvm::cl::init(true), llvm::cl::cat(kCategory));
enum class WgmmaSplitForm { kOff, kPlain, kAll };
llvm::cl::opt<WgmmaSplitForm> kWgmmaSplit(
    "wgmma-split", llvm::cl::ValueOptional, llvm::cl::init(WgmmaSplitForm::kPlain),
    llvm::cl::desc("Run the prefill matmuls of 33 ... 64-row calls (batched decode of 33 ... 64 sequences) of sm_90a "
                   "images on the Hopper f16 matmul, split over K where its weight tiles leave SMs idle and K is long "
                   "(kernels/wgmma_matmul.cuh minfer_wgmma_matmul_split: a 7B's down in 3, its o unsplit; +3.7% "
                   "aggregate decode at 64 sequences on an H100, BENCHMARKS.md): plain (the default, or a bare "
                   "--wgmma-split) the o and down projections, all also the fused q, k, v and gate and up instead of "
                   "their 64-token mmq_blocks tile"),
    llvm::cl::values(clEnumValN(WgmmaSplitForm::kOff, "off", "the prefill launch and the mmq_blocks tiles"),
                     clEnumValN(WgmmaSplitForm::kPlain, "plain", "the o and down projections (default)"),
                     clEnumValN(WgmmaSplitForm::kAll, "all", "and the fused q, k, v and gate and up"),
                     clEnumValN(WgmmaSplitForm::kPlain, "", "")),
    llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kWgmmaSplitMinStages(
    "wgmma-split-min-stages", llvm::cl::Hidden,
    llvm::cl::desc("With --wgmma-split (plain or all): stages of 64 columns per split of K at least (default 0: the kernel's "
                   "kWgmmaSplitMinStages), for measuring the split rule"),
    llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kSwaFull("swa-full",
                             llvm::cl::desc("Give sliding-window layers a full-size KV cache of n_ctx positions (as "
                                            "llama.cpp's --swa-full) instead of a ring of window + max batch - 1"),
                             llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kVerbose("v", llvm::cl::desc("Print a progress line after every tensor"), llvm::cl::cat(kCategory));

// The portable default: cubins for Ampere (sm_80, sm_86), Ada (sm_89) and Hopper (sm_90); a newer GPU
// JIT-compiles the sm_90 PTX every image carries (minfer-run says so).
constexpr const char* kPortableTargets = "sm_80,sm_86,sm_89,sm_90";

// --target auto: this machine's GPU (sm_80 or newer) when the driver finds one, else the portable set.
// `why` says which, for the summary line.
std::string autoTargets(std::string* why) {
#if defined(MINFER_HAVE_CUDA)
  auto dev = minfer::cuda::CudaDevice::open(0);
  if (dev && (*dev)->info().cc_major >= 8) {
    *why = "this machine's " + (*dev)->info().name;
    // Hopper (9.0): the arch-specific target, whose images may use wgmma (usesHopperPrefill).
    const bool hopper = (*dev)->info().cc_major == 9 && (*dev)->info().cc_minor == 0;
    return (*dev)->info().arch() + (hopper ? "a" : "");
  }
#endif
  *why = "no usable GPU here: the portable set";
  return kPortableTargets;
}

// Accepts sm_XY or sm_XYa with XY ≥ 50, e.g. sm_80, sm_90a.
bool validArch(llvm::StringRef arch) {
  if (!arch.consume_front("sm_")) return false;
  arch.consume_back("a");
  unsigned cc = 0;
  return !arch.getAsInteger(10, cc) && cc >= 50 && cc < 200;
}

}  // namespace

int main(int argc, char** argv) {
  minfer::artifact::armTempFileSignals();  // first: sees which signals the process started with ignored
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-compile (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-compile: compile a GGUF model into a minfer artifact\n");
  // Refused before any work: -o naming the input (also through a link), a directory, a device, …
  auto target = minfer::util::resolveOutputPath(kOutput, {kInput});
  if (!target) {
    llvm::errs() << "minfer-compile: " << target.status().message() << "\n";
    return 1;
  }

  minfer::CompileOptions options;
  options.input = kInput;
  options.output = kOutput;
  options.max_batch = kMaxBatch;
  options.n_ctx = kCtx;
  options.jobs = kJobs;
  options.kernel_cache_dir = kKernelCache;
  options.plane_form = kPlanes;
  options.fuse_launches = !kNoFuse;
  options.fuse_qkv = kFuseGemv != GemvFusion::kNone;
  options.fuse_glu = kFuseGemv == GemvFusion::kAll;
  options.fuse_pair = kFuseGemv == GemvFusion::kPair || kFuseGemv == GemvFusion::kNorm;
  options.fuse_norm = kFuseGemv == GemvFusion::kNorm || kFuseGemv == GemvFusion::kAll;
  options.fuse_prefill_pair = kFusePrefillPair;
  options.mmqb_wgmma = kMmqbWgmma;
  options.mmqb_f16act = kMmqbF16Act;
  options.wgmma_split = kWgmmaSplit != WgmmaSplitForm::kOff;
  options.wgmma_split_fused = kWgmmaSplit == WgmmaSplitForm::kAll;
  options.wgmma_split_min_stages = kWgmmaSplitMinStages;
  options.swa_full = kSwaFull;
  std::string target_list = kTarget, target_why;
  if (target_list == "auto") target_list = autoTargets(&target_why);
  llvm::SmallVector<llvm::StringRef, 8> archs;
  llvm::StringRef(target_list).split(archs, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef arch : archs) {
    if (!validArch(arch.trim())) {
      llvm::errs() << "minfer-compile: --target: '" << arch << "' is not a GPU architecture like sm_80 or sm_90a\n";
      return 1;
    }
    options.targets.push_back(arch.trim().str());
  }
  if (options.max_batch == 0 || options.max_batch > minfer::kArtifactMaxBatch) {
    llvm::errs() << "minfer-compile: --max-batch " << options.max_batch << " is out of range 1.."
                 << minfer::kArtifactMaxBatch << "\n";
    return 1;
  }
  if (kMmqbF16Act.getNumOccurrences() > 0 && kMmqbF16Act && !kMmqbWgmma) {
    llvm::errs() << "minfer-compile: --mmqb-f16act needs --mmqb-wgmma (its f16 activations feed the warpgroup MMA; "
                    "--mmqb-wgmma=false runs mma.sync)\n";
    return 1;
  }
  if (kWgmmaSplitMinStages.getNumOccurrences() > 0 && kWgmmaSplit == WgmmaSplitForm::kOff) {
    llvm::errs() << "minfer-compile: --wgmma-split-min-stages " << kWgmmaSplitMinStages
                 << " needs --wgmma-split (--wgmma-split=off splits no matmul)\n";
    return 1;
  }

  if (options.n_ctx > (1u << 20)) {
    llvm::errs() << "minfer-compile: -c " << options.n_ctx << " is out of range 0..1048576 (0: the model's)\n";
    return 1;
  }

  const bool terminal = llvm::sys::Process::StandardErrIsDisplayed();
  options.progress = [&](size_t done, size_t total, uint64_t bytes, uint64_t total_bytes) {
    if (kVerbose || !terminal) {
      if (kVerbose || done == total)
        llvm::errs() << llvm::formatv("minfer-compile: {0}/{1} tensors, {2:f1}/{3:f1} MB\n", done, total,
                                      bytes / 1e6, total_bytes / 1e6);
      return;
    }
    const unsigned width = 40, filled = total_bytes ? static_cast<unsigned>(width * bytes / total_bytes) : width;
    llvm::errs() << llvm::formatv("\r[{0}{1}] {2,3}% {3}/{4} tensors", std::string(filled, '#'),
                                  std::string(width - filled, ' '), total_bytes ? 100 * bytes / total_bytes : 100,
                                  done, total);
    if (done == total) llvm::errs() << "\n";
  };

  const auto start = std::chrono::steady_clock::now();
  auto summary = minfer::compileModel(options);
  if (!summary) {
    // Messages may quote the GGUF (names, keys, strings): shown with control characters escaped.
    llvm::errs() << "minfer-compile: "
                 << minfer::util::escapeForTerminal(llvm::toString(summary.takeError()), std::string::npos,
                                                    /*keep_newlines=*/true)
                 << "\n";
    return 1;
  }
  const minfer::CompileSummary& s = *summary;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  llvm::errs() << llvm::formatv(
      "minfer-compile: wrote {0}: {1} tensors, {2} planes ({8}: {3:f1} MB stored, {9:f1} MB derived at load) from "
      "{4:f1} MB of GGUF tensor data, {5} plan steps, {6:f1} MB in all, {7:f2} s\n",
      target->through_link ? options.output + " (through the link, to " + target->path + ")" : options.output,
      s.tensors, s.planes, s.plane_bytes / 1e6, s.source_bytes / 1e6, s.steps, s.artifact_bytes / 1e6, seconds,
      minfer::planes::planeFormName(options.plane_form), s.derived_bytes / 1e6);
  if (s.kernel_images)
    llvm::errs() << llvm::formatv(
        "minfer-compile: kernels: {0} images ({1} specializations × {2} targets: {6}{7}), {3:f1} MB, {4} from "
        "cache, {5:f2} s\n",
        s.kernel_images, s.kernel_specs, options.targets.size(), s.kernel_bytes / 1e6, s.kernel_cache_hits,
        s.kernel_seconds, target_list, target_why.empty() ? "" : " (--target auto: " + target_why + ")");
  return 0;
}
