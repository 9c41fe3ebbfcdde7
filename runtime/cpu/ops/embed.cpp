// CPU op family Embed: token ids → rows of the embedding table (cpu::embed).
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

Status embedPrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  info.weight = static_cast<int>(s.weights()->Get(0));
  MINFER_RETURN_IF_ERROR(c.resolveTensor(info.weight, info.label));
  const WeightPlanes& w = c.weight(info.weight);
  if (w.rows != static_cast<uint64_t>(c.n_vocab))
    return Status::error(info.label + ": embedding '" + w.name + "' has " + std::to_string(w.rows) +
                         " rows, n_vocab is " + std::to_string(c.n_vocab));
  Result<RowSource> src = pickRowSource(w, true);
  if (!src) return src.takeStatus().withContext(info.label + ": ");
  info.src = *src;
  info.cols = static_cast<int>(w.cols);
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], 1, "input", true));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], w.cols, "output"));
  return Status::ok();
}

void embedRun(RunContext& c, const StepInfo& s) {
  embed(c.weight(s.weight), s.src, c.ids.data(), c.n, c.buf(s.out[0]));
}

}  // namespace minfer::cpu
