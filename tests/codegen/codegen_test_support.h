// Shared by the codegen test files: a fixture GGUF read, lowered and planned as the compiler does it (no plane
// transforms: codegen needs only the stride tables).
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "compiler/codegen/plan_rewrite.h"
#include "compiler/gguf/gguf_reader.h"
#include "compiler/model/model_desc.h"
#include "compiler/planes/layout_planner.h"
#include "tests/synth_support.h"

namespace minfer::codegen {

struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  model::ModelDescription desc;
  std::vector<planes::TensorLayout> layouts;
};

// Reads a GGUF, lowers it for batches of up to `max_batch` tokens and plans its planes (no transforms: codegen needs
// only the stride tables).
inline Loaded load(const std::string& path, bool rewrite = true, bool f16_prefill = false, uint32_t max_batch = 512) {
  Loaded l;
  auto file = gguf::GgufFile::open(path);
  REQUIRE_MESSAGE(static_cast<bool>(file), llvm::toString(file.takeError()));
  l.file = std::move(*file);
  auto desc = model::describeModel(*l.file, max_batch);
  REQUIRE_MESSAGE(static_cast<bool>(desc), llvm::toString(desc.takeError()));
  l.desc = std::move(*desc);
  for (const model::WeightDesc& w : l.desc.weights) {
    auto layout = planes::planLayout({w.name, w.info->type, w.info->rows(), w.info->cols(), w.role, w.experts},
                                     planes::PlaneForm::kCompact, f16_prefill);
    REQUIRE_MESSAGE(static_cast<bool>(layout), llvm::toString(layout.takeError()));
    l.layouts.push_back(std::move(*layout));
  }
  if (rewrite) {
    llvm::Error e = insertActivationQuantization(l.desc, l.layouts);
    REQUIRE_MESSAGE(!e, llvm::toString(std::move(e)));
    buildLoadPlan(l.desc, l.layouts);
  }
  return l;
}

// A two-layer minfer-synth qwen3-30b-a3b at 256 wide in llama.cpp's Q4_K_M mix (the GEMV triple, decode MoE and
// deferred-norm tests), written once per process.
inline std::string synthQwen3MoeQ4KM() {
  static const std::string path = test::writeSmallQwen3Moe(
      "synth-qwen3moe-q4_k_m.gguf",
      {.n_head_kv = 1, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_vocab = 300, .n_ctx = 4096});
  return path;
}

}  // namespace minfer::codegen
