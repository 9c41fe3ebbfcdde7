// The architecture registry (see architectures.h): the one list of supported architectures.
#include "compiler/model/architectures.h"

#include <string>

namespace minfer::model {

#define MINFER_ARCHITECTURE(k) extern const Architecture k;
#include "compiler/model/architectures.def"
#undef MINFER_ARCHITECTURE

constexpr const Architecture* kRegistry[] = {
#define MINFER_ARCHITECTURE(k) &k,
#include "compiler/model/architectures.def"
#undef MINFER_ARCHITECTURE
};

const Architecture* findArchitecture(llvm::StringRef name) {
  for (const Architecture* arch : kRegistry)
    if (name == arch->name) return arch;
  return nullptr;
}

const char* supportedArchitectures() {
  static const std::string list = [] {
    std::string out;
    for (const Architecture* arch : kRegistry) out += std::string(out.empty() ? "" : ", ") + arch->name;
    return out;
  }();
  return list.c_str();
}

}  // namespace minfer::model
