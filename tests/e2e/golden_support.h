// Golden cases of ../shared/fixtures/goldens and arch/goldens (llama.cpp logits + float64 reference), fixture models
// compiled at test time with the real compiler, and the logit comparisons every backend's tests use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace minfer::gguf {
class GgufWriter;
}

namespace minfer::test {

struct GoldenCase {
  std::string name;                  // e.g. "tiny-llama-Q4_K_M_ids48"
  std::string model;                 // file in fixtures/<model_dir>
  std::string model_dir = "models";  // "models", or "arch/models" for the arch/ cases (README §8)
  std::vector<int32_t> prompt_ids;   // (n_prompt)
  std::vector<int32_t> generated_ids;  // (n_generate) greedy continuation, teacher-forced in decode
  int n_vocab = 0;
  std::vector<float> prefill, ref64;              // (n_prompt, n_vocab) llama.cpp / float64 reference
  std::vector<float> decode, decode_ref64;        // (n_generate, n_vocab)
  std::vector<double> prefill_margin, decode_margin;  // golden top-1 minus top-2 logit, per row
  std::string generated_text;
  std::string prompt_text;           // empty for id prompts

  int nPrompt() const { return static_cast<int>(prompt_ids.size()); }
  int nGenerate() const { return static_cast<int>(generated_ids.size()); }
};

// Names of every case with a JSON in fixtures/goldens, then "arch/<case>" for each case in
// fixtures/arch/goldens of an architecture minfer supports (tiny-llama31, tiny-gemma2, tiny-gemma3 and
// tiny-qwen3moe: phi3 is not supported yet), each group sorted.
std::vector<std::string> goldenCaseNames();
// A case by name ("tiny-llama-F32_ids48" or "arch/tiny-llama31-F32_ids48").
GoldenCase loadGolden(const std::string& name);

// Path of an artifact compiled from fixtures/<dir>/<model> (compiled once per process, into the
// test's scratch directory). Fails the test (empty result) on a compile error.
std::string compiledFixture(const std::string& model, const std::string& dir = "models");

// Edits a tensor's bytes (by name) while a GGUF is copied.
using TensorEdit = std::function<void(const std::string& name, std::vector<uint8_t>& data)>;

// fixtures/<src> copied key by key and tensor by tensor with the GGUF writer (`tensor_edit` applied to
// each tensor's bytes), then `edit` applied, written into the test's scratch directory as <name>.gguf.
// Returns its path; fails the test on an error.
std::string ggufCopy(const std::string& src, const std::string& name, const std::function<void(gguf::GgufWriter&)>& edit,
                     const TensorEdit& tensor_edit = {});

// ggufCopy, then compiled at test time (max batch 64) for context `n_ctx` (0: the model's) as <name>.mfb.
// Returns the artifact's path; fails the test on an error.
std::string ggufVariant(const std::string& src, const std::string& name, const std::function<void(gguf::GgufWriter&)>& edit,
                        const TensorEdit& tensor_edit = {}, uint32_t n_ctx = 0);

// Comparison of rows × n_vocab logits with a reference, as the fixtures README §4 measures it.
struct LogitDiff {
  double max_abs = 0;        // max |got − want|
  double max_ref = 0;        // max |want|
  double rms_rel = 0;        // sqrt(mean((got − want)²)) / sqrt(mean(want²))
  int argmax_checked = 0;    // rows whose reference top-1 margin exceeds 2 × allowed_abs
  int argmax_mismatch = 0;   // ... of which the argmax differs
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
LogitDiff compareLogits(const float* got, const float* want, int rows, int n_vocab, const std::vector<double>& margin,
                        double allowed_abs);

}  // namespace minfer::test
