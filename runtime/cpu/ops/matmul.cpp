// CPU op family MatMul: x · Wᵀ (+ bias) through the weight's stride tables (cpu::matmul).
#include "runtime/cpu/cpu_step.h"

#include <algorithm>

namespace minfer::cpu {

// inputs[1], when present, is the GPU-side quantized copy of the input: ignored here.
Status matmulPrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  MINFER_RETURN_IF_ERROR(positive(info, s.rows(), "rows"));
  MINFER_RETURN_IF_ERROR(positive(info, s.cols(), "cols"));
  info.rows = static_cast<int>(s.rows());
  info.cols = static_cast<int>(s.cols());
  info.weight = static_cast<int>(s.weights()->Get(0));
  MINFER_RETURN_IF_ERROR(c.resolveTensor(info.weight, info.label));
  const WeightPlanes& w = c.weight(info.weight);
  if (w.rows != s.rows() || w.cols != s.cols())
    return Status::error(info.label + ": weight '" + w.name + "' is " + std::to_string(w.rows) + " x " +
                         std::to_string(w.cols) + ", the step says rows = " + std::to_string(s.rows()) +
                         ", cols = " + std::to_string(s.cols()));
  Result<RowSource> src = pickRowSource(w, false);
  if (!src) return src.takeStatus().withContext(info.label + ": ");
  info.src = *src;
  if (info.in[0] == info.out[0])
    return Status::error(info.label + ": output buffer " + std::to_string(info.out[0]) + " is its input");
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], s.cols(), "input"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], s.rows(), "output"));
  if (count(s.weights()) == 2) {
    Result<const float*> bias = c.vectorWeight(s.weights()->Get(1), s.rows(), info.label);
    if (!bias) return bias.takeStatus();
    info.vec = *bias;
  }
  c.max_matmul_cols = std::max(c.max_matmul_cols, info.cols);
  info.logits = info.out[0] == c.logits;
  return Status::ok();
}

// The logits projection computes only the rows whose logits are wanted (c.out_rows), one matmul per run
// of consecutive rows (one run after a tail ran on those rows alone).
void matmulRun(RunContext& c, const StepInfo& s) {
  const auto run = [&](int first, int n) {
    matmul(c.weight(s.weight), s.src, s.vec, c.buf(s.in[0]) + int64_t(first) * s.cols, n,
           c.buf(s.out[0]) + int64_t(first) * s.rows, &c.pool, c.matmul_scratch.data());
  };
  if (!s.logits) return run(0, c.n);
  const std::vector<int32_t>& rows = c.out_rows;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    run(rows[i], static_cast<int>(j - i));
    i = j;
  }
}

}  // namespace minfer::cpu
