// One NVRTC compilation: a KernelSpec for one GPU arch → cubin + PTX (no GPU needed).
//
// The program is `#include "<spec.source>"` (or spec.inline_source) with every embedded kernel file
// available as a header; the options are nvrtcOptions(): the arch, C++17, -lineinfo, the spec's
// flags and its -D constants (recorded verbatim in the artifact's KernelImage.options).
// Thread-safety: compileKernel may run concurrently on different threads (one nvrtcProgram each).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_spec.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace minfer::codegen {

struct CompiledKernel {
  std::vector<uint8_t> cubin;  // ELF for the real arch
  std::string ptx;             // PTX text for the matching virtual arch (JIT fallback on newer GPUs)
};

// True when this compiler was built with NVRTC.
bool haveNvrtc();
// "13.0" (major.minor of the NVRTC library in use); "none" without NVRTC.
std::string nvrtcVersionString();

// Checks that `arch` is sm_XY or sm_XYa with XY ≥ 80 (the kernels use cp.async and int8 mma.sync),
// and that this NVRTC supports it. Error names the arch and the supported list.
llvm::Error checkArch(llvm::StringRef arch);
// "sm_90" → "sm90" (key suffix).
std::string archTag(llvm::StringRef arch);

std::vector<std::string> nvrtcOptions(const KernelSpec& spec, llvm::StringRef arch);

// Compiles `spec` for `arch`. Errors: NVRTC failure (message: the image key, the arch, the NVRTC
// status and its full log), an unknown embedded source, no cubin produced.
llvm::Expected<CompiledKernel> compileKernel(const KernelSpec& spec, llvm::StringRef arch);

}  // namespace minfer::codegen
