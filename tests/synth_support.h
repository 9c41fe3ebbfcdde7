// Shared by the tests that build small synthetic models (tests/codegen, tests/cuda). A qwen3moe: minfer-synth's
// qwen3-30b-a3b shape cut down to 2 layers at n_embd 256 (4 heads of 64), in llama.cpp's Q4_K_M mix, so that its
// experts are whole 256-weight K-quant blocks.
#pragma once

#include <string>

#include "compiler/tools/synth_model.h"
#include "tests/test_support.h"

namespace minfer::test {

// The parts of the cut-down shape that differ between the tests.
struct SmallMoeShape {
  uint32_t n_head_kv, n_expert, n_expert_used, n_ff_exp, n_vocab, n_ctx;
};

// Writes that model with shape `s` to scratchDir()/`file` and returns the path (callers write it once per process).
inline std::string writeSmallQwen3Moe(const std::string& file, const SmallMoeShape& s) {
  synth::SynthOptions so;
  so.shape = llvm::cantFail(synth::modelShape("qwen3-30b-a3b"));
  so.shape.n_layer = 2, so.shape.n_embd = 256, so.shape.n_head = 4, so.shape.head_dim = 64;
  so.shape.n_head_kv = s.n_head_kv, so.shape.n_expert = s.n_expert, so.shape.n_expert_used = s.n_expert_used;
  so.shape.n_ff_exp = s.n_ff_exp, so.shape.n_vocab = s.n_vocab, so.shape.n_ctx = s.n_ctx;
  so.mix = synth::TypeMix::kQ4_K_M;
  const std::string p = scratchDir() + "/" + file;
  llvm::cantFail(synth::writeSynthModel(so, p, nullptr));
  return p;
}

// minfer-synth's qwen2-7b shape cut down to n_layer layers of width n_embd (heads of 64, 2 KV heads), FFN width n_ff,
// vocabulary 512, context n_ctx, in llama.cpp's Q4_K_M mix; written to scratchDir()/`file`, whose path it returns.
inline std::string writeSmallQwen2(const std::string& file, uint32_t n_layer, uint32_t n_embd, uint32_t n_ff,
                                   uint32_t n_ctx) {
  synth::SynthOptions so;
  so.shape = llvm::cantFail(synth::modelShape("qwen2-7b"));
  so.shape.n_layer = n_layer, so.shape.n_embd = n_embd, so.shape.n_head = n_embd / 64, so.shape.n_head_kv = 2;
  so.shape.head_dim = 64;
  so.shape.n_ff = n_ff, so.shape.n_vocab = 512, so.shape.n_ctx = n_ctx;
  so.mix = synth::TypeMix::kQ4_K_M;
  const std::string p = scratchDir() + "/" + file;
  llvm::cantFail(synth::writeSynthModel(so, p, nullptr));
  return p;
}

}  // namespace minfer::test
