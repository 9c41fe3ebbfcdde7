// NVRTC driver for kernel specializations (see nvrtc_compiler.h).
#include "compiler/codegen/nvrtc_compiler.h"

#include <algorithm>

#include "compiler/codegen/kernel_sources.h"
#include "llvm/Support/FormatVariadic.h"

#if MINFER_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace minfer::codegen {
namespace {

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

// "sm_90a" → 90; 0 when malformed.
unsigned archNumber(llvm::StringRef arch) {
  if (!arch.consume_front("sm_")) return 0;
  arch.consume_back("a");
  unsigned n = 0;
  if (arch.getAsInteger(10, n)) return 0;
  return n;
}

}  // namespace

std::string archTag(llvm::StringRef arch) {
  std::string s;
  for (char c : arch)
    if (c != '_') s += c;
  return s;
}

std::vector<std::string> nvrtcOptions(const KernelSpec& spec, llvm::StringRef arch) {
  std::vector<std::string> o = {"--gpu-architecture=" + arch.str(), "--std=c++17", "-lineinfo"};
  for (const std::string& f : spec.flags) o.push_back(f);
  for (const auto& [name, value] : spec.defines) o.push_back("-D" + name + "=" + value);
  return o;
}

#if MINFER_HAVE_NVRTC

bool haveNvrtc() { return true; }

std::string nvrtcVersionString() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

llvm::Error checkArch(llvm::StringRef arch) {
  const unsigned n = archNumber(arch);
  if (n == 0) return makeError(llvm::formatv("'{0}' is not a GPU architecture like sm_80 or sm_90", arch));
  if (n < 80)
    return makeError(llvm::formatv("kernel images need sm_80 or newer (cp.async, int8 mma.sync); got {0}", arch));
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return llvm::Error::success();
  std::vector<int> archs(static_cast<size_t>(count));
  nvrtcGetSupportedArchs(archs.data());
  if (std::find(archs.begin(), archs.end(), static_cast<int>(n)) != archs.end()) return llvm::Error::success();
  std::string list;
  for (int a : archs) list += (list.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return makeError(llvm::formatv("NVRTC {0} cannot compile for {1} (supported: {2})", nvrtcVersionString(), arch, list));
}

llvm::Expected<CompiledKernel> compileKernel(const KernelSpec& spec, llvm::StringRef arch) {
  const std::string image = spec.key + "_" + archTag(arch);
  std::string program;
  if (!spec.inline_source.empty()) {
    program = spec.inline_source;
  } else {
    if (!findKernelSource(spec.source))
      return makeError(llvm::formatv("kernel {0}: no embedded source '{1}'", image, spec.source));
    program = "#include \"" + spec.source + "\"\n";
  }
  std::vector<const char*> header_text, header_names;
  for (const EmbeddedSource& s : kernelSources()) {
    header_text.push_back(s.text);
    header_names.push_back(s.name);
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&prog, program.c_str(), (spec.key + ".cu").c_str(),
                                     static_cast<int>(header_text.size()), header_text.data(), header_names.data());
  if (r != NVRTC_SUCCESS)
    return makeError(llvm::formatv("kernel {0}: nvrtcCreateProgram failed: {1}", image, nvrtcGetErrorString(r)));
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};

  const std::vector<std::string> options = nvrtcOptions(spec, arch);
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nvrtcGetProgramLog(prog, log.data());
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    std::string opts;
    for (const std::string& o : options) opts += " " + o;
    return makeError(llvm::formatv("NVRTC {0} failed to compile kernel {1} (entry {2}, source {3}): {4}\noptions:{5}\n{6}",
                                   nvrtcVersionString(), image, spec.entry, spec.source, nvrtcGetErrorString(r), opts,
                                   log));
  }
  CompiledKernel out;
  size_t size = 0;
  if (nvrtcGetCUBINSize(prog, &size) != NVRTC_SUCCESS || size == 0)
    return makeError(llvm::formatv("kernel {0}: NVRTC produced no cubin for {1}", image, arch));
  out.cubin.resize(size);
  nvrtcGetCUBIN(prog, reinterpret_cast<char*>(out.cubin.data()));
  if (nvrtcGetPTXSize(prog, &size) != NVRTC_SUCCESS || size == 0)
    return makeError(llvm::formatv("kernel {0}: NVRTC produced no PTX for {1}", image, arch));
  out.ptx.resize(size);
  nvrtcGetPTX(prog, out.ptx.data());
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();  // the artifact stores its own NUL
  return out;
}

#else  // !MINFER_HAVE_NVRTC

bool haveNvrtc() { return false; }
std::string nvrtcVersionString() { return "none"; }
llvm::Error checkArch(llvm::StringRef arch) {
  if (archNumber(arch) < 80)
    return makeError(llvm::formatv("kernel images need sm_80 or newer; got '{0}'", arch));
  return llvm::Error::success();
}
llvm::Expected<CompiledKernel> compileKernel(const KernelSpec& spec, llvm::StringRef arch) {
  return makeError(llvm::formatv("kernel {0}_{1}: this minfer-compile was built without NVRTC (CUDA toolkit not "
                                 "found at build time); compile without kernel images (--target=)",
                                 spec.key, archTag(arch)));
}

#endif

}  // namespace minfer::codegen
