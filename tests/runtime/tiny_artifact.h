// Test helper: a tiny random transformer written as a .mfb artifact by hand (FlatBufferBuilder +
// the compiler's ArtifactWriter), and an independent float64 forward pass over the same weights.
//
// The artifact follows the plan contract the compiler emits (schema/artifact.fbs; the lead's
// compiler/model lowering): buffers ids, x, h, q, k, v, attn, gate, up, logits; steps Embed, RmsNorm,
// MatMul (+bias), HeadRmsNorm, Rope, Attention, Add, SwiGlu. Weights mix every plane kind the CPU
// reads (dense f32/f16/bf16, i8 + scale (+ min), blocks), with padded row pitches; optional GPU-only
// extras (a QuantizeAct step, an I8 buffer, a 2nd MatMul input, a kPacked plane) that the CPU must
// skip. The float64 reference computes fixtures/README.md §3 directly from dequantizeBlock values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/block_formats.h"
#include "schema/artifact_generated.h"
#include "tests/runtime/weight_builder.h"

namespace minfer::test {

struct TinySpec {
  std::string arch = "llama";
  uint32_t n_embd = 256, n_layer = 2, n_head = 8, n_head_kv = 2, head_dim = 32, n_ff = 512, n_rot = 32;
  fb::RopeStyle rope_style = fb::RopeStyle::Norm;
  float rope_base = 10000.0f, rope_scale = 1.0f, eps = 1e-5f;
  bool qkv_bias = false, qk_norm = false, tied = false;
  uint32_t max_batch = 4;
  GgmlType embd = GgmlType::Q8_0, wq = GgmlType::Q4_K, wk = GgmlType::Q5_K, wv = GgmlType::Q6_K,
           wo = GgmlType::Q4_0, gate = GgmlType::Q8_0, up = GgmlType::F16, down0 = GgmlType::BF16,
           down1 = GgmlType::Q2_K, output = GgmlType::Q3_K;
  bool gpu_extras = true;
  int32_t eos_id = 2;
  uint64_t seed = 1;
  // Deliberate defects, to test the plan checks.
  enum class Defect { kNone, kMatMulRows, kBufferWidth, kNoScalePlane, kOpKind };
  Defect defect = Defect::kNone;
};

struct TinyWeight {
  std::string name;
  RandomWeight w;
  bool vector = false;  // 1-D (norm weight, bias): ne = {cols}
};

struct TinyModel {
  TinySpec spec;
  uint32_t n_vocab = 0;
  std::vector<std::string> tokens;  // the SentencePiece vocabulary
  std::vector<TinyWeight> weights;  // tensor index = position
  int find(const std::string& name) const;
  const RandomWeight& weight(const std::string& name) const { return weights[find(name)].w; }
};

TinyModel makeTinyModel(const TinySpec& spec);

// Writes `model` to `path`; returns "" or the writer's error message.
std::string writeTinyArtifact(const TinyModel& model, const std::string& path);

// Float64 forward pass over `tokens` at positions 0..n−1: n × n_vocab logits.
std::vector<double> referenceForward(const TinyModel& model, const std::vector<int32_t>& tokens);

}  // namespace minfer::test
