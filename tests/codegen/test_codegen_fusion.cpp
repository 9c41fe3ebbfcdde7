// Kernel codegen of the decode GEMV fusions that span steps: the gate|up pair (gemv_blocks.cuh GEMVB_PAIR) and the
// GEMV + Add + deferred RMSNorm (GEMVB_NORM) with the GEMV chains that apply its 1/rms (GEMVB_RMS_EPS): which steps
// fuse, what each launch writes and reads, and where the deferral must not apply.
#include <doctest/doctest.h>

#include <algorithm>

#include "compiler/codegen/codegen.h"
#include "compiler/codegen/nvrtc_compiler.h"
#include "kernels/gemv_blocks.cuh"
#include "tests/codegen/codegen_test_support.h"
#include "tests/test_support.h"

namespace minfer::codegen {
namespace {

// The GEMVB_RMS_EPS option of a launch's image; "" without.
std::string rmsEps(const KernelSet& set, const LaunchRecord& r) {
  for (const std::string& opt : set.images[r.images[0]].options)
    if (opt.rfind("-DGEMVB_RMS_EPS=", 0) == 0) return opt.substr(16);
  return {};
}

// Launches of `plan` compiled with GEMVB_RMS_EPS, except those of the steps `skip` marks.
size_t deferredLaunches(const KernelSet& set, const std::vector<std::vector<LaunchRecord>>& plan,
                        const std::vector<bool>& skip = {}) {
  size_t n = 0;
  for (size_t i = 0; i < plan.size(); ++i)
    if (i >= skip.size() || !skip[i])
      for (const LaunchRecord& r : plan[i]) n += !rmsEps(set, r).empty();
  return n;
}

bool writes(const LaunchRecord& r, uint32_t buffer, fb::ArgKind kind) {
  for (const KernelArgDesc& a : r.args)
    if (a.kind == kind && a.buffer == buffer && a.access == fb::Access::Write) return true;
  return false;
}

// A launch reading the deferred RmsNorm `norm` (of `width` values): compiled with its eps, its partial sums of squares
// (the norm's output buffer) the last argument, `rms`.
void checkReadsDeferred(const KernelSet& set, const LaunchRecord& r, const model::StepDesc& norm, uint32_t width) {
  const KernelArgDesc& last = r.args.back();
  CHECK(rmsEps(set, r) == floatLiteral(norm.eps));
  CHECK(last.name == "rms");
  CHECK(last.kind == fb::ArgKind::Activation);
  CHECK(last.access == fb::Access::Read);
  CHECK(last.buffer == norm.outputs[0]);
  CHECK(last.width == width);
}

// The decode plan's GEMV pairs and GEMV + Add + deferred RMSNorm launches, each checked; `consumer` marks the first
// step of each chain that reads a deferred norm.
struct DecodeGemvFusions {
  size_t pairs = 0, norms = 0;
  std::vector<bool> consumer;
};

// A minfer_gemv_add_norm launch at decode step i: the Add, RmsNorm and QuantizeAct fused; writes the sum, the partial
// sums into the RmsNorm's output and the q8 form, with n / 32 counter words; and the chain at step i + 4 (the pair or
// the fused QKV GEMV, with its paged GEMVs) reads the partials.
void checkAddNorm(const Loaded& l, const KernelSet& set, size_t i) {
  const auto& steps = l.desc.plan.decode;
  const LaunchRecord& r = set.decode[i][0];
  REQUIRE(i + 4 < steps.size());
  CHECK(steps[i + 1].op == fb::OpKind::Add);
  CHECK(steps[i + 2].op == fb::OpKind::RmsNorm);
  CHECK(steps[i + 3].op == fb::OpKind::QuantizeAct);
  for (size_t f = 1; f <= 3; ++f) CHECK(set.decode_fused[i + f] != 0);
  CHECK(writes(r, steps[i + 1].outputs[0], fb::ArgKind::Activation));
  CHECK(writes(r, steps[i + 2].outputs[0], fb::ArgKind::Activation));  // the partials
  CHECK(writes(r, steps[i + 3].outputs[0], fb::ArgKind::Q8Values));
  CHECK(writes(r, steps[i + 3].outputs[0], fb::ArgKind::Q8Meta));
  const uint32_t n = static_cast<uint32_t>(l.layouts[steps[i].weights[0]].desc.rows);
  CHECK(r.args.back().kind == fb::ArgKind::Counters);
  CHECK(r.args.back().bytes == n / 32 * 4);
  CHECK(r.args[r.args.size() - 2].name == "partial");
  CHECK(r.args[r.args.size() - 2].buffer == steps[i + 2].outputs[0]);
  CHECK(rmsEps(set, r).empty());
  REQUIRE(!set.decode[i + 4].empty());
  checkReadsDeferred(set, set.decode[i + 4][0], steps[i + 2], n);
  if (set.decode_paged[i + 4].empty()) return;
  REQUIRE(set.decode_paged[i + 4].size() >= 3);
  for (size_t k = 0; k < 3; ++k) checkReadsDeferred(set, set.decode_paged[i + 4][k], steps[i + 2], n);
}

DecodeGemvFusions checkDecodeGemvFusions(const Loaded& l, const KernelSet& set) {
  const auto& steps = l.desc.plan.decode;
  DecodeGemvFusions d;
  d.consumer.assign(steps.size(), false);
  for (size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(steps[i].name);
    if (set.decode[i].empty()) continue;
    const LaunchRecord& r = set.decode[i][0];
    const std::string& entry = set.images[r.images[0]].entry;
    if (entry == "minfer_gemv_pair") {
      ++d.pairs;
      REQUIRE(i + 1 < steps.size());
      CHECK(steps[i + 1].op == fb::OpKind::MatMul);
      CHECK(set.decode_fused[i + 1] != 0);
      CHECK(writes(r, steps[i].outputs[0], fb::ArgKind::Activation));
      CHECK(writes(r, steps[i + 1].outputs[0], fb::ArgKind::Activation));
      if (i + 2 < steps.size()) CHECK(set.decode_fused[i + 2] == 0);
    }
    if (entry == "minfer_gemv_add_norm") {
      ++d.norms;
      checkAddNorm(l, set, i);
      d.consumer[i + 4] = true;
    }
  }
  return d;
}

KernelSet generateFused(const Loaded& l, bool norm) {
  CodegenOptions o;
  o.targets = {"sm_90"};
  o.cache_dir = test::scratchDir() + "/kernel-cache-fusion";
  o.fuse_norm = norm;
  auto set = generateKernels(l.desc, l.layouts, o);
  REQUIRE_MESSAGE(static_cast<bool>(set), llvm::toString(set.takeError()));
  return std::move(*set);
}

// The index of the decode step named `name`.
size_t decodeStep(const Loaded& l, const std::string& name) {
  const auto& steps = l.desc.plan.decode;
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].name == name) return i;
  FAIL("no decode step " << name);
  return 0;
}

}  // namespace

// On tiny-qwen2 (Q4_K / Q6_K kBlocks planes): every layer's gate step runs minfer_gemv_pair writing gate and up (the
// up step fused, nothing else); with fuse_norm every attn_output and ffn_down step whose norm feeds a fused GEMV chain
// (all but the last ffn_down: the output head is a plain MatMul) runs minfer_gemv_add_norm (checkAddNorm), and the
// chain after it reads the partial sums with the norm's eps. No other launch of either plan (prefill, paged, small
// batch) has that constant, and without fuse_norm none does.
TEST_CASE("decode GEMV pair and GEMV + Add + deferred RMSNorm launches: fused steps, what they write and read") {
  if (!test::haveFixtures()) return;
  const Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf");
  for (bool norm : {false, true}) {
    CAPTURE(norm);
    const KernelSet set = generateFused(l, norm);
    const DecodeGemvFusions d = checkDecodeGemvFusions(l, set);
    CHECK(d.pairs == l.desc.config.n_layer);
    // attn_output and ffn_down of every layer but the last ffn_down (its norm feeds the plain output GEMV).
    CHECK(d.norms == (norm ? 2 * l.desc.config.n_layer - 1 : 0u));
    CHECK(deferredLaunches(set, set.decode, d.consumer) == 0);
    CHECK(deferredLaunches(set, set.decode_paged, d.consumer) == 0);
    for (const auto* plan : {&set.prefill, &set.prefill_paged, &set.prefill_small})
      CHECK(deferredLaunches(set, *plan) == 0);
  }
}

// The GEMV pair's two forms (gemv_blocks.cuh gemvPairPersists): tiny-qwen2's pairs (block grids of at most
// kGemvPairPersistBlocks) launch the block grid without GEMVB_PERSIST; a cut-down qwen2 whose gate and up have 2,304
// rows (1,152 thread blocks of 4 rows) gets the persistent form: GEMVB_PERSIST and a grid of kGemvPairPersistBlocks.
TEST_CASE("decode GEMV pair: the persistent form's define and grid exactly where the block grid exceeds its blocks") {
  if (!test::haveFixtures()) return;
  const std::string wide = test::writeSmallQwen2("qwen2-ffn2304.gguf", 1, 256, 2304, 64);
  for (const auto& [path, persistent] :
       {std::pair{test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", false}, std::pair{wide, true}}) {
    CAPTURE(path);
    const Loaded l = load(path);
    const KernelSet set = generateFused(l, true);
    size_t pairs = 0;
    for (const std::vector<LaunchRecord>& step : set.decode)
      for (const LaunchRecord& r : step) {
        const KernelImageData& img = set.images[r.images[0]];
        if (img.entry != "minfer_gemv_pair") continue;
        ++pairs;
        const auto option = [&](const std::string& define) {
          for (const std::string& o : img.options)
            if (o.rfind("-D" + define + "=", 0) == 0) return static_cast<unsigned>(std::stoul(o.substr(define.size() + 3)));
          return 0u;
        };
        const unsigned n = option("GEMVB_N"), k = option("GEMVB_K");
        const kern::GemvBlocksShape sh = kern::gemvBlocksShape(n, k);
        const unsigned block_grid = 2 * kern::ceilDiv(n, kern::gemvBlocksRowsPerCta(sh));
        CHECK(kern::gemvPairPersists(n, sh) == persistent);
        CHECK(option("GEMVB_PERSIST") == (persistent ? 1u : 0u));
        CHECK(r.rule.at(1).grid.x == (persistent ? kern::kGemvPairPersistBlocks : block_grid));
        CHECK((block_grid > kern::kGemvPairPersistBlocks) == persistent);
      }
    CHECK(pairs == l.desc.config.n_layer);
  }
}

// Where a deferred norm's outputs have another reader, or its launch would overwrite its own input, the o / down
// GEMV keeps its plain launch and its Add + RmsNorm theirs (the 1/rms applied by the RmsNorm kernel). tiny-qwen2's
// decode plan edited: (a) layer 1's attn_output writes another buffer of its width, so that its attn_residual Add
// reads layer 1's attn_norm output after the QKV chain: layer 0's ffn_down keeps its plain launch (and layer 1's
// attn_output, whose chain with the Add is broken), layer 0's attn_output still defers to the pair; (b) layer 0's
// attn_output reads the q8 buffer its deferred norm would write: it keeps its plain launch, layer 0's ffn_down and
// layer 1's attn_output still defer.
TEST_CASE("GEMV + Add + deferred RMSNorm: not where the norm's output has a later reader or the q8 form is the input") {
  if (!test::haveFixtures()) return;
  const Loaded base = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf");
  const size_t o0 = decodeStep(base, "blk.0.attn_output"), down0 = decodeStep(base, "blk.0.ffn_down"),
               o1 = decodeStep(base, "blk.1.attn_output"), down1 = decodeStep(base, "blk.1.ffn_down"),
               q1 = decodeStep(base, "blk.1.attn_q");
  for (const char* edit : {"a", "b"}) {
    CAPTURE(edit);
    Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf");
    auto& steps = l.desc.plan.decode;
    const auto width = [&](uint32_t buffer) { return l.desc.plan.buffers[buffer].width; };
    if (edit[0] == 'a') {  // layer 1's q buffer is as wide as the residual
      REQUIRE(width(steps[q1].outputs[0]) == width(steps[o1].outputs[0]));
      steps[o1].outputs[0] = steps[q1].outputs[0];
    } else {
      REQUIRE(steps[o0 + 3].op == fb::OpKind::QuantizeAct);
      REQUIRE(width(steps[o0 + 3].outputs[0]) == width(steps[o0].inputs[1]));
      steps[o0].inputs[1] = steps[o0 + 3].outputs[0];
    }
    const KernelSet set = generateFused(l, true);
    const auto entry = [&](size_t i) {
      return set.decode[i].empty() ? std::string() : set.images[set.decode[i][0].images[0]].entry;
    };
    const bool a = edit[0] == 'a';
    CHECK(entry(o0) == (a ? "minfer_gemv_add_norm" : "minfer_gemv_blocks"));
    CHECK(entry(down0) == (a ? "minfer_gemv_blocks" : "minfer_gemv_add_norm"));
    CHECK(entry(o1) == (a ? "minfer_gemv_blocks" : "minfer_gemv_add_norm"));
    CHECK(entry(down1) == "minfer_gemv_blocks");  // its norm feeds the output head
    const DecodeGemvFusions d = checkDecodeGemvFusions(l, set);
    CHECK(d.norms == (a ? 1u : 2u));
    CHECK(deferredLaunches(set, set.decode, d.consumer) == 0);
    CHECK(deferredLaunches(set, set.decode_paged, d.consumer) == 0);
  }
}

// The decode MoE layer's residual Add, the next attn_norm and its QuantizeAct in minfer_moe_down_dec (MOE_ADD_NORM),
// deferred to the q, k, v GEMV triple: on the two-layer synthetic qwen3moe (every expert on Q4_K / Q6_K blocks), layer
// 0's MoE launches write the sum, the q8 form (values and meta) and the partials with E / 32 counter words, the Add,
// RmsNorm and QuantizeAct fused, and layer 1's triple reads the partials with the norm's eps; layer 1's (the last:
// its output_norm feeds the output GEMV) keeps its Add + RmsNorm launch. Edited so that layer 1's attn_output writes
// its q buffer (of the residual's width), its attn_residual Add then reads the attn_norm's output after the triple:
// layer 0's down launch takes no norm and no launch reads partials.
TEST_CASE("MoE down + Add + deferred RMSNorm: in every layer but the last; not where the norm's output has a later reader") {
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED: built without NVRTC");
    return;
  }
  for (bool edited : {false, true}) {
    CAPTURE(edited);
    Loaded l = load(synthQwen3MoeQ4KM());
    auto& steps = l.desc.plan.decode;
    const size_t o1 = decodeStep(l, "blk.1.attn_output"), q1 = decodeStep(l, "blk.1.attn_q");
    const size_t ffn0 = decodeStep(l, "blk.0.moe_ffn"), ffn1 = decodeStep(l, "blk.1.moe_ffn");
    if (edited) {
      REQUIRE(l.desc.plan.buffers[steps[q1].outputs[0]].width == l.desc.plan.buffers[steps[o1].outputs[0]].width);
      steps[o1].outputs[0] = steps[q1].outputs[0];
    }
    const KernelSet set = generateFused(l, true);
    for (size_t ffn : {ffn0, ffn1}) {
      CAPTURE(steps[ffn].name);
      REQUIRE(ffn >= 2);
      const LaunchRecord& dn = set.decode[ffn - 2].back();  // the router MatMul's launches run the MoE step's
      REQUIRE(set.images[dn.images[0]].entry == "minfer_moe_down_dec");
      const bool defers = !edited && ffn == ffn0;
      CHECK(set.decode_fused[ffn + 1] == defers);
      CHECK(dn.args.size() == (defers ? 12u : 5u));
      if (!defers) continue;
      CHECK(writes(dn, steps[ffn + 1].outputs[0], fb::ArgKind::Activation));  // the sum
      CHECK(writes(dn, steps[ffn + 2].outputs[0], fb::ArgKind::Activation));  // the partials
      CHECK(writes(dn, steps[ffn + 3].outputs[0], fb::ArgKind::Q8Values));
      CHECK(writes(dn, steps[ffn + 3].outputs[0], fb::ArgKind::Q8Meta));
      CHECK(dn.args[7].kind == fb::ArgKind::Weight);
      CHECK(dn.args[7].tensor == steps[ffn + 2].weights[0]);
      CHECK(dn.args[5].access == fb::Access::Read);
      CHECK(dn.args.back().kind == fb::ArgKind::Counters);
      CHECK(dn.args.back().bytes == steps[ffn].cols / 32 * 4);
      REQUIRE(!set.decode[ffn + 4].empty());
      checkReadsDeferred(set, set.decode[ffn + 4][0], steps[ffn + 2], steps[ffn].cols);
    }
    CHECK(deferredLaunches(set, set.decode) == (edited ? 0u : 1u));
  }
}

}  // namespace minfer::codegen
