// The kernel sources (kernels/*.cuh and the headers they include), embedded into the compiler at
// build time (embed_sources.cmake), so minfer-compile needs no source tree to specialize kernels.
#pragma once

#include <cstddef>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

namespace minfer::codegen {

struct EmbeddedSource {
  const char* name;  // include path as the kernels write it, e.g. "kernels/mmq.cuh"
  const char* text;  // file contents (NUL-terminated)
  size_t size;       // bytes, without the terminating NUL
};

// Every embedded file, in a fixed order (kernels/CMakeLists.txt's list).
llvm::ArrayRef<EmbeddedSource> kernelSources();

// The file named `name`, or nullptr.
inline const EmbeddedSource* findKernelSource(llvm::StringRef name) {
  for (const EmbeddedSource& s : kernelSources())
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace minfer::codegen
