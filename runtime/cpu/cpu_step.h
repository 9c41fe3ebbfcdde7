// CPU backend internals shared by cpu_backend.cpp and the op families (runtime/cpu/ops/<family>.cpp):
// a prepared plan step, the plan-phase and execute-phase contexts, and the families' entry points.
//
// Each op of schema/op_traits.h MINFER_OPS has a family with two functions:
//   Status <family>Prepare(PrepareContext&, const fb::Step&, StepInfo&)  plan phase: checks the
//       step's parameters, buffers and weights (after prepareStep has checked its arity and filled
//       info.in / info.out) and fills `info`; errors start with info.label.
//   void <family>Run(RunContext&, const StepInfo&)  execute phase: runs the step on the batch of the
//       RunContext with the reference ops of cpu_ops.h; allocates nothing.
// Adding an op to the CPU backend = one file ops/<family>.cpp defining both (cpu_step.cpp's tables
// are expanded from MINFER_OPS; CMake globs ops/*.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "minfer/artifact.h"
#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/thread_pool.h"
#include "schema/op_traits.h"

namespace minfer::cpu {

// One plan step after validation: buffer ids, weight, and parameters as the ops take them.
struct StepInfo {
  fb::OpKind op = fb::OpKind::Embed;
  std::string label;  // "prefill step 12 'blk.0.attn_q' (MatMul)"
  static constexpr uint32_t kMaxIn = 3, kMaxOut = 2;
  uint32_t in[kMaxIn] = {0, 0, 0};
  uint32_t out[kMaxOut] = {0, 0};
  uint32_t n_in = 0;              // inputs the step has (≤ kMaxIn)
  // The operands as column views (format 1.4, schema ColumnView): the first column, the operand's width
  // and the buffer's width (the row pitch). A whole buffer is (0, its width, its width).
  uint32_t in_off[kMaxIn] = {}, out_off[kMaxOut] = {};
  uint32_t in_w[kMaxIn] = {}, out_w[kMaxOut] = {};
  int64_t in_pitch[kMaxIn] = {}, out_pitch[kMaxOut] = {};
  bool views = false;             // some operand is a proper column range (not its whole buffer)
  int weight = -1;                // tensor index (Embed, MatMul)
  RowSource src = RowSource::kDense;
  const float* vec = nullptr;     // norm weight (RmsNorm, HeadRmsNorm), bias (MatMul) or RoPE frequency factors (Rope), else null
  int layer = -1;
  float eps = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  RopeStyle rope_style = RopeStyle::kNorm;
  float rope_base = 10000, rope_scale = 1;
  kern::RopeYarn rope_yarn;        // Rope: YaRN constants and the cos/sin scale (default: none, 1)
  int rows = 0, cols = 0;         // MatMul; width of elementwise ops in `cols`
  AttentionOptions attn;          // Attention: query scale, softcap, window
  float scale = 1, softcap = 0;   // Scale
  int n_expert = 0, n_expert_used = 0;  // MoeRoute, MoeFfn
  bool moe_norm = false;                // MoeRoute: renormalise the chosen weights
  int moe_weights[3] = {-1, -1, -1};    // MoeFfn: gate_exps, up_exps, down_exps tensor indices
  RowSource moe_src[3] = {RowSource::kDense, RowSource::kDense, RowSource::kDense};
  bool skip = false;              // GPU-only step
  bool logits = false;            // writes memory.logits
  bool tail = false;              // part of the plan's last-token tail (schema Plan; prefill plans)
};

// The KV cache shape of one attention layer, and its ring (schema Step.kv_ring; 0: none) and window.
struct KvShape {
  int n_head_kv = 0, head_dim = 0;
  int64_t ring = 0;
  int window = 0;
};

// Plan phase: the artifact, its weights resolved into plane views of the mapping, and what the
// prepared steps need from a session (buffers used, KV cache layers, matmul scratch width). Families
// read and extend it; sessions read it afterwards. Errors name `label` (the step), the tensor or
// buffer, and the numbers.
struct PrepareContext {
  explicit PrepareContext(const ArtifactFile& f) : file(f), m(f.manifest()) {}

  // Resolves tensor `index` into plane views once (weight(index) afterwards); kPacked planes are
  // skipped (GPU decode GEMV only).
  Status resolveTensor(uint32_t index, const std::string& label);
  const WeightPlanes& weight(int index) const { return weights[static_cast<size_t>(index)]; }
  // Tensor `index` as `length` floats (a 1 × length or length × 1 tensor), materialized once.
  Result<const float*> vectorWeight(uint32_t index, uint64_t length, const std::string& label);
  uint64_t bufferWidth(uint32_t id) const;  // 0 for an id outside memory.buffers
  // Checks that buffer `id` is F32 (I32 when `ids`) of `width` and marks it used; `role` names it
  // in the error ("input", "q").
  Status buffer(const StepInfo& info, uint32_t id, uint64_t width, const char* role, bool ids = false);
  // For ops that take column views (schema/op_traits.h takesColumnViews): checks that operand i (an
  // input, or an output) is F32 and `width` wide (a view's width, or the whole buffer's) and marks its
  // buffer used.
  Status operand(const StepInfo& info, bool input, uint32_t i, uint64_t width, const char* role);

  const ArtifactFile& file;
  const fb::Artifact* m;
  std::vector<WeightPlanes> weights;          // per tensor index (resolved when a step uses it)
  std::vector<bool> resolved;                 // per tensor index
  std::vector<std::vector<float>> vectors;    // per tensor index: materialized vector weights
  std::vector<bool> used;                     // per buffer: read or written by a CPU step
  std::map<int, KvShape> kv_layers;           // attention layer → cache shape
  int max_batch = 0;
  int n_vocab = 0;
  uint32_t ids = 0, logits = 0;               // memory.input_ids, memory.logits
  int max_matmul_cols = 0;                    // scratch floats per thread: widest MatMul input, or MoeFfn's need
};

// A Step count field (n_head, head_dim, rows, ...) must be 1..2^20 on the CPU.
Status positive(const StepInfo& info, uint32_t v, const char* field);
// Length of a Step id vector (absent = 0).
inline uint32_t count(const flatbuffers::Vector<uint32_t>* v) { return v ? v->size() : 0u; }

// Checks the arity of step `s` (schema/op_traits.h; gpu_only steps are not checked, the CPU reads
// none of their buffers), fills info.in / info.out and calls the op's family. Error for an op kind
// outside OpKind.
Status prepareStep(PrepareContext& c, const fb::Step& s, StepInfo& info);

// Execute phase: a session's activation buffers, KV cache views, scratch and thread pool, and the
// batch being run. Filled by the session's allocate phase; nothing here allocates afterwards.
struct RunContext {
  explicit RunContext(int n_threads) : pool(n_threads) {}
  float* buf(uint32_t id) { return f32[id].data(); }
  // Row 0 of input / output operand i of step s (its view's first column; rows s.in_pitch[i] apart).
  float* in(const StepInfo& s, int i) { return buf(s.in[i]) + s.in_off[i]; }
  float* out(const StepInfo& s, int i) { return buf(s.out[i]) + s.out_off[i]; }
  const WeightPlanes& weight(int index) const { return (*weights)[static_cast<size_t>(index)]; }

  const std::vector<WeightPlanes>* weights = nullptr;  // PrepareContext::weights
  std::vector<std::vector<float>> f32;  // per buffer id: max_batch × width (empty if unused)
  int max_batch = 0;                    // rows of every buffer
  std::vector<int32_t> ids;             // max_batch token ids
  std::map<int, KvLayer> kv_views;      // attention layer → its K and V in the session's cache
  std::vector<float> matmul_scratch;    // threads × max matmul cols (MatMul and MoeFfn)
  std::vector<float> attn_scratch;      // threads × n_ctx (positions of one sequence at most)
  ThreadPool pool;
  // The batch: n rows (ids[0..n)); row t at position kv.pos[t] of the sequence whose KV blocks are
  // kv.tables[t] (cpu_ops.h KvRows: RoPE angles, the KV slot it writes, the keys it attends to).
  int n = 0;
  KvRowStorage kv_storage;  // (max_batch) positions and table pointers behind kv
  KvRows kv;
  // Rows whose logits are wanted, increasing (≥ 1). After runPlan their logits are in these rows of the
  // logits buffer (a tail run on them alone moves them to rows 0 .. out_rows.size()−1 and rewrites this).
  std::vector<int32_t> out_rows;  // capacity max_batch
};

// A prepared plan: its steps, the first step of its last-token tail (schema Plan; steps.size() when it has
// none) and the buffers the tail reads before writing them (its inputs from the rest of the plan).
struct PreparedPlan {
  std::vector<StepInfo> steps;
  size_t tail = 0;
  std::vector<uint32_t> tail_inputs;
};

// Finds the plan's tail: the suffix of steps flagged `tail` when it is row-wise (op_traits.h), ends in
// the logits and leaves something before it; otherwise none.
void findTail(PreparedPlan& plan, uint32_t logits);

// Runs a prepared, not skipped step (its op is in OpKind: prepareStep checked).
void runStep(RunContext& c, const StepInfo& s);

// Runs every step of `plan` over the batch of `c`. When the plan has a tail and fewer rows than n want
// logits, the wanted rows of the tail's inputs move to rows 0 .. k−1 first and the tail runs on those k
// rows only (each tail step is row-wise, so every row's values are those of a full run).
void runPlan(RunContext& c, const PreparedPlan& plan, uint32_t ids);

// The families, one per op of MINFER_OPS, defined in ops/<family>.cpp (SwiGlu, GeGlu and Add share
// ops/elementwise.cpp, RmsNorm and HeadRmsNorm ops/norm.cpp, MoeRoute and MoeFfn ops/moe.cpp).
#define MINFER_CPU_DECLARE_FAMILY(kind, family, ...)                         \
  Status family##Prepare(PrepareContext& c, const fb::Step& s, StepInfo& info); \
  void family##Run(RunContext& c, const StepInfo& s);
MINFER_OPS(MINFER_CPU_DECLARE_FAMILY)
#undef MINFER_CPU_DECLARE_FAMILY

}  // namespace minfer::cpu
