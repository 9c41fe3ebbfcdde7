// CPU op family Attention: stores the batch's K/V in the layer's cache, then causal GQA over it
// (cpu::kvStore, cpu::attention); q, k and v may be column views (format 1.4), the output is a whole buffer.
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

// The verifier has checked 0 ≤ layer < config.n_layer.
Status attentionPrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  MINFER_RETURN_IF_ERROR(positive(info, s.n_head(), "n_head"));
  MINFER_RETURN_IF_ERROR(positive(info, s.n_head_kv(), "n_head_kv"));
  MINFER_RETURN_IF_ERROR(positive(info, s.head_dim(), "head_dim"));
  if (s.n_head() % s.n_head_kv() != 0)
    return Status::error(info.label + ": n_head = " + std::to_string(s.n_head()) +
                         " is not a multiple of n_head_kv = " + std::to_string(s.n_head_kv()));
  if (info.out[0] == info.in[0]) return Status::error(info.label + ": output buffer is the q buffer");
  info.layer = s.layer();
  info.n_head = static_cast<int>(s.n_head());
  info.n_head_kv = static_cast<int>(s.n_head_kv());
  info.head_dim = static_cast<int>(s.head_dim());
  if (!(s.scale() >= 0) || !(s.softcap() >= 0) || s.window() > (1u << 30))
    return Status::error(info.label + ": scale " + std::to_string(s.scale()) + ", softcap " +
                         std::to_string(s.softcap()) + " must be ≥ 0 and window " + std::to_string(s.window()) +
                         " at most 2^30");
  info.attn = {.scale = s.scale(), .softcap = s.softcap(), .window = static_cast<int>(s.window())};
  const uint64_t q_width = uint64_t{s.n_head()} * s.head_dim(), kv_width = uint64_t{s.n_head_kv()} * s.head_dim();
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 0, q_width, "q"));
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 1, kv_width, "k"));
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 2, kv_width, "v"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], q_width, "output"));  // a whole buffer (cpu::attention)
  if (info.out_off[0] != 0 || info.out_w[0] != q_width)
    return Status::error(info.label + ": the output must be a whole buffer on the CPU");
  // The verifier bounded kv_ring to window + max_batch − 1 .. 2^30 on windowed steps (0 elsewhere).
  const KvShape shape{info.n_head_kv, info.head_dim, s.kv_ring(), info.attn.window};
  auto [it, inserted] = c.kv_layers.try_emplace(info.layer, shape);
  if (!inserted && (it->second.n_head_kv != shape.n_head_kv || it->second.head_dim != shape.head_dim ||
                    it->second.ring != shape.ring || (shape.ring > 0 && it->second.window != shape.window)))
    return Status::error(info.label + ": layer " + std::to_string(info.layer) + " was used with n_head_kv = " +
                         std::to_string(it->second.n_head_kv) + ", head_dim = " + std::to_string(it->second.head_dim) +
                         ", KV ring " + std::to_string(it->second.ring) + " (window " +
                         std::to_string(it->second.window) + ") by another step, here " +
                         std::to_string(shape.n_head_kv) + ", " + std::to_string(shape.head_dim) + ", " +
                         std::to_string(shape.ring) + " (window " + std::to_string(shape.window) + ")");
  return Status::ok();
}

void attentionRun(RunContext& c, const StepInfo& s) {
  const KvLayer& cache = c.kv_views.at(s.layer);
  kvStore(cache, c.in(s, 1), c.in(s, 2), c.n, c.kv, s.in_pitch[1], s.in_pitch[2]);
  attention(c.in(s, 0), cache, c.n, c.kv, s.n_head, c.buf(s.out[0]), &c.pool, c.attn_scratch.data(), s.attn,
            s.in_pitch[0]);
}

}  // namespace minfer::cpu
