// The architecture registry: every GGUF general.architecture minfer compiles, each with its facts
// and its forward pass (arch/<name>.cpp, written with GraphBuilder's blocks).
//
// Adding a llama-like architecture: write arch/<name>.cpp defining `extern const Architecture k<Name>`
// and add the line MINFER_ARCHITECTURE(k<Name>) to architectures.def (CMake picks up arch/*.cpp).
#pragma once

#include "compiler/model/graph_builder.h"
#include "llvm/ADT/StringRef.h"

namespace minfer::model {

// Facts of an architecture that the hyperparameters do not carry and that outlive the forward pass
// (they are written into the artifact's config).
struct ArchitectureFacts {
  // Norm: RoPE rotates adjacent pairs (2i, 2i + 1) (llama); Neox: pairs (i, i + n_rot / 2).
  fb::RopeStyle rope_style = fb::RopeStyle::Norm;
};

// Appends the whole prefill plan (embedding, every layer, output head) to the builder's description.
// Errors: a missing or malformed tensor (GraphBuilder::weight).
using ForwardPass = llvm::Error (*)(GraphBuilder& g);

struct Architecture {
  const char* name;  // GGUF general.architecture
  ArchitectureFacts facts;
  ForwardPass forward;
};

// The registry entry for `name`, or nullptr when minfer does not support it.
const Architecture* findArchitecture(llvm::StringRef name);

}  // namespace minfer::model
