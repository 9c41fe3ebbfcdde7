// Kernel codegen: every fixture model gets kernel images (sm_90 and a multi-arch list), keys are
// readable and deterministic, the disk cache hits on the second compile, NVRTC errors carry the log
// and the key, and the activation-quantization rewrite leaves the CPU plan's meaning unchanged.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include "compiler/codegen/codegen.h"
#include "compiler/codegen/kernel_spec.h"
#include "compiler/codegen/kernel_cache.h"
#include "compiler/codegen/nvrtc_compiler.h"
#include "compiler/codegen/ops/op_family.h"
#include "compiler/codegen/plan_rewrite.h"
#include "compiler/compile_model.h"
#include "compiler/gguf/gguf_reader.h"
#include "kernels/attention.cuh"
#include "kernels/gemm_small.cuh"
#include "kernels/gemv_blocks.cuh"
#include "kernels/mmq_blocks.cuh"
#include "kernels/moe.cuh"
#include "kernels/topk.cuh"
#include "kernels/wgmma_matmul.cuh"
#include "tests/codegen/codegen_test_support.h"
#include "tests/test_support.h"

namespace minfer::codegen {
namespace {

std::vector<std::string> fixtureModels() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(test::fixturesDir() + "/models"))
    if (e.path().extension() == ".gguf") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

KernelSet generate(const Loaded& l, std::vector<std::string> targets, std::string cache_dir) {
  CodegenOptions o;
  o.targets = std::move(targets);
  o.cache_dir = std::move(cache_dir);
  auto set = generateKernels(l.desc, l.layouts, o);
  REQUIRE_MESSAGE(static_cast<bool>(set), llvm::toString(set.takeError()));
  return std::move(*set);
}

bool isQuantizedMatMul(const Loaded& l, const model::StepDesc& s) {
  return s.op == fb::OpKind::MatMul && l.layouts[s.weights[0]].find(PlaneKind::kI8) >= 0;
}

// The decode GEMV reads GGUF blocks (minfer_gemv_blocks) for a kBlocks plane of Q4_K or Q6_K whose blocks
// start 16-byte aligned (restated from matmul.cpp's rule; the planner gives every Q4_K / Q6_K matmul weight one),
// and so do the small-batch launches (minfer_gemv_batch).
bool readsBlocksInDecode(const Loaded& l, const model::StepDesc& s, size_t weight = 0) {
  const planes::TensorLayout& w = l.layouts[s.weights[weight]];
  const int b = w.find(PlaneKind::kBlocks);
  if (b < 0) return false;
  const StrideTable& t = w.planes[static_cast<size_t>(b)];
  const bool k_quant = t.ggml_type == static_cast<uint32_t>(GgmlType::Q4_K) ||
                       t.ggml_type == static_cast<uint32_t>(GgmlType::Q6_K);
  return k_quant && t.group_pitch % 16 == 0 && t.row_pitch % 16 == 0;
}

// Whether a MoeFfn step's decode experts run as GEMVs on the GGUF blocks (ops/moe.cpp decodeExpertLaunches:
// minfer_moe_gate_up_dec, minfer_moe_down_dec): gate, up and down all read from their blocks.
bool decodeExpertsOnBlocks(const Loaded& l, const model::StepDesc& s) {
  return readsBlocksInDecode(l, s, 0) && readsBlocksInDecode(l, s, 1) && readsBlocksInDecode(l, s, 2);
}
// The decode MoeFfn's launches after its sort launch (which the router or route launch may replace).
std::vector<std::string> decodeExpertEntries(const Loaded& l, const model::StepDesc& s) {
  if (decodeExpertsOnBlocks(l, s)) return {"minfer_moe_gate_up_dec", "minfer_moe_down_dec"};
  return {"minfer_moe_gate_up", "minfer_moe_down_combine"};
}

std::string optionValue(const KernelImageData& img, const std::string& name) {
  const std::string prefix = "-D" + name + "=";
  for (const std::string& o : img.options)
    if (o.rfind(prefix, 0) == 0) return o.substr(prefix.size());
  return "";
}

// The entries a step must launch, from its op kind and weights (independent of kernel_spec.cpp's tables).
std::vector<std::string> expectedEntries(const Loaded& l, const model::StepDesc& s, bool prefill) {
  switch (s.op) {
    case fb::OpKind::Embed: return {"minfer_embed"};
    case fb::OpKind::RmsNorm: return {"minfer_rms_norm"};
    case fb::OpKind::HeadRmsNorm: return {"minfer_head_rms_norm"};
    case fb::OpKind::QuantizeAct: return {"minfer_quantize_act"};
    case fb::OpKind::MatMul:
      if (isQuantizedMatMul(l, s))
        return {prefill ? "minfer_mmq" : readsBlocksInDecode(l, s) ? "minfer_gemv_blocks" : "minfer_gemv"};
      return {prefill ? "minfer_dense_mm" : "minfer_dense_gemv"};
    case fb::OpKind::Rope: return {"minfer_rope"};
    case fb::OpKind::Attention:
      if (prefill) return {"minfer_kv_store", "minfer_attn_prefill"};
      return {"minfer_kv_store", "minfer_attn_decode", "minfer_attn_combine"};
    case fb::OpKind::SwiGlu: return {"minfer_swiglu"};
    case fb::OpKind::Add: return {"minfer_add"};
    case fb::OpKind::GeGlu: return {"minfer_geglu"};
    case fb::OpKind::Scale: return {"minfer_scale"};
    case fb::OpKind::ExpandBlocks: return {"minfer_expand_blocks"};
    case fb::OpKind::MoeRoute: return {"minfer_moe_route"};
    case fb::OpKind::MoeFfn: {  // in decode the combine runs in the down launch
      if (prefill) return {"minfer_moe_sort", "minfer_moe_gate_up", "minfer_moe_down", "minfer_moe_combine"};
      std::vector<std::string> e = decodeExpertEntries(l, s);
      e.insert(e.begin(), "minfer_moe_sort");
      return e;
    }
  }
  return {};
}

// A launch record against its image's compile-time constants and the model: every plane constant the
// kernel was compiled with (-D…PITCH) is the row pitch of the Weight argument that binds that plane (so
// the verifier's load-time check covers it), every Weight argument carries its tensor's plane table as
// the layout planner made it, and every buffer argument the width of its buffer.
void checkRecord(const Loaded& l, const LaunchRecord& r, const KernelImageData& img) {
  static const std::pair<const char*, const char*> kPitchArgs[] = {
      {"MMQ_Q_PITCH", "wq"},   {"MMQ_S_PITCH", "wscale"},  {"MMQ_M_PITCH", "wmin"}, {"GEMV_PITCH", "wq"},
      {"GEMV_S_PITCH", "wscale"}, {"GEMV_M_PITCH", "wmin"}, {"DMM_PITCH", "w"},     {"DGEMV_PITCH", "w"},
      {"EMBED_ROW_PITCH", "table"}, {"GEMVB_PITCH", "w"}, {"GEMVB_Q_PITCH", "wq"}, {"GEMVB_K_PITCH", "wk"},
      {"GEMVB_V_PITCH", "wv"}, {"GEMVB_PITCH0", "w0"}, {"GEMVB_PITCH1", "w1"}, {"GEMVB_PITCH2", "w2"},
      {"MOE_R_PITCH", "rw"}, {"EXPAND_SRC_PITCH", "blocks"},
      {"EXPAND_I8_PITCH", "q"}, {"EXPAND_S_PITCH", "scale"}, {"EXPAND_M_PITCH", "min"},
      {"EXPAND_P_PITCH", "packed"}, {"MOE_G_PITCH", "gq"}, {"MOE_G_S_PITCH", "gs"}, {"MOE_G_M_PITCH", "gm"},
      {"MOE_U_PITCH", "uq"}, {"MOE_U_S_PITCH", "us"}, {"MOE_U_M_PITCH", "um"}, {"MOE_D_PITCH", "dq"},
      {"MOE_D_S_PITCH", "ds"}, {"MOE_D_M_PITCH", "dm"}, {"SB_PITCH", "wq"}, {"SB_S_PITCH", "wscale"},
      {"SB_M_PITCH", "wmin"}};
  // Expert pitches (-D…EPITCH) likewise equal the expert_pitch of the table their argument carries.
  static const std::pair<const char*, const char*> kExpertPitchArgs[] = {
      {"MOE_G_EPITCH", "gq"}, {"MOE_G_S_EPITCH", "gs"}, {"MOE_G_M_EPITCH", "gm"}, {"MOE_U_EPITCH", "uq"},
      {"MOE_U_S_EPITCH", "us"}, {"MOE_U_M_EPITCH", "um"}, {"MOE_D_EPITCH", "dq"}, {"MOE_D_S_EPITCH", "ds"},
      {"MOE_D_M_EPITCH", "dm"}};
  auto arg = [&](const std::string& name) -> const KernelArgDesc* {
    for (const KernelArgDesc& a : r.args)
      if (a.name == name) return &a;
    return nullptr;
  };
  // The kernel's parameter list as its PTX declares it (".param .u64" pointers, ".param .u32" ints):
  // as many parameters as the record has arguments, each of the kind's size.
  const size_t entry = img.ptx.find(".entry " + img.entry + "(");
  REQUIRE(entry != std::string::npos);
  const std::string signature = img.ptx.substr(entry, img.ptx.find(')', entry) - entry);
  std::vector<std::string> params;
  const std::regex param_re("\\.param \\.(u64|u32|b64|b32|s32)");
  for (auto it = std::sregex_iterator(signature.begin(), signature.end(), param_re); it != std::sregex_iterator(); ++it)
    params.push_back((*it)[1]);
  REQUIRE_MESSAGE(params.size() == r.args.size(), img.key);
  for (size_t i = 0; i < params.size(); ++i) {
    const bool is_int = r.args[i].kind == fb::ArgKind::TokenCount || r.args[i].kind == fb::ArgKind::Int ||
                        r.args[i].kind == fb::ArgKind::BlockSize;
    CHECK_MESSAGE((params[i].substr(1) == "32") == is_int, img.key << " parameter " << i << " " << r.args[i].name);
  }
  size_t pitches = 0;
  for (const auto& [define, name] : kPitchArgs) {
    const std::string v = optionValue(img, define);
    if (v.empty()) continue;
    ++pitches;
    const bool pair = img.entry == "minfer_gemv_pair";
    if ((img.entry == "minfer_gemv_glu" || pair) && std::string(define) == "GEMVB_PITCH") {
      // The fused gate|up GEMV and the GEMV pair read two planes of one pitch.
      for (const char* w : {pair ? "w0" : "wg", pair ? "w1" : "wu"}) {
        const KernelArgDesc* a = arg(w);
        REQUIRE_MESSAGE((a && a->kind == fb::ArgKind::Weight), img.key << ": no weight argument '" << w << "'");
        CHECK_MESSAGE(std::to_string(a->plane.row_pitch) == v, img.key << " " << w);
      }
      continue;
    }
    const KernelArgDesc* a = arg(name);
    REQUIRE_MESSAGE(a, img.key << ": no argument '" << name << "' for " << define);
    if (v == "0") {
      CHECK_MESSAGE(a->kind == fb::ArgKind::Null, img.key << " " << define);
    } else {
      REQUIRE_MESSAGE(a->kind == fb::ArgKind::Weight, img.key << " " << define);
      CHECK_MESSAGE(std::to_string(a->plane.row_pitch) == v, img.key << " " << define);
    }
  }
  for (const auto& [define, name] : kExpertPitchArgs) {
    const std::string v = optionValue(img, define);
    if (v.empty()) continue;
    const KernelArgDesc* a = arg(name);
    REQUIRE_MESSAGE(a, img.key << ": no argument '" << name << "' for " << define);
    if (a->kind == fb::ArgKind::Null) CHECK_MESSAGE(v == "0", img.key << " " << define);
    else CHECK_MESSAGE(std::to_string(a->plane.expert_pitch) == v, img.key << " " << define);
  }
  // Column views (format 1.4): an activation row-pitch constant is the width of the argument it
  // addresses (the buffer's width, which the verifier checks at load), and the view lies in the row.
  static const std::pair<const char*, const char*> kActivationPitchArgs[] = {
      {"ROPE_Q_PITCH", "q"}, {"ROPE_K_PITCH", "k"}, {"ATT_Q_PITCH", "q"},   {"ATT_K_PITCH", "k"},
      {"ATT_V_PITCH", "v"},  {"EW_A_PITCH", "a"},   {"EW_B_PITCH", "b"},    {"EW_OUT_PITCH", "out"},
      {"PA_Q_PITCH", "q"},   {"PA_K_PITCH", "k"}};
  for (const auto& [define, name] : kActivationPitchArgs) {
    const std::string v = optionValue(img, define);
    if (v.empty()) continue;
    const KernelArgDesc* a = arg(name);
    REQUIRE_MESSAGE(a, img.key << ": no argument '" << name << "' for " << define);
    CHECK_MESSAGE(a->kind == fb::ArgKind::Activation, img.key << " " << define);
    CHECK_MESSAGE(std::to_string(a->width) == v, img.key << " " << define);
  }
  for (const KernelArgDesc& a : r.args)
    CHECK_MESSAGE((a.view_width == 0 ? a.view_offset == 0 : a.view_offset + a.view_width <= a.width),
                  img.key << " " << a.name);
  const bool reads_weights = img.entry != "minfer_quantize_act" && img.entry.find("moe_") == std::string::npos &&
                             img.entry.find("attn") == std::string::npos &&
                             img.entry.find("kv_store") == std::string::npos && img.entry.find("rope") == std::string::npos &&
                             img.entry != "minfer_swiglu" && img.entry != "minfer_add" &&
                             img.entry != "minfer_argmax" && img.entry != "minfer_topk" &&
                             img.entry.find("norm") == std::string::npos;
  if (reads_weights) CHECK_MESSAGE(pitches > 0, img.key);
  for (const KernelArgDesc& a : r.args) {
    if (a.kind == fb::ArgKind::Weight) {
      REQUIRE(a.tensor < l.layouts.size());
      const int p = l.layouts[a.tensor].find(a.plane.kind);
      REQUIRE_MESSAGE(p >= 0, img.key << " " << a.name);
      const StrideTable& t = l.layouts[a.tensor].planes[static_cast<size_t>(p)];
      CHECK(t.row_pitch == a.plane.row_pitch);
      CHECK(t.rows == a.plane.rows);
      CHECK(t.cols == a.plane.cols);
      CHECK(t.group_size == a.plane.group_size);
      CHECK(t.bits == a.plane.bits);
      CHECK(t.q_offset == a.plane.q_offset);
      CHECK(t.experts == a.plane.experts);
      CHECK(t.expert_pitch == a.plane.expert_pitch);
    }
    if (a.kind == fb::ArgKind::Activation || a.kind == fb::ArgKind::Q8Values || a.kind == fb::ArgKind::Q8Meta) {
      REQUIRE(a.buffer < l.desc.plan.buffers.size());
      CHECK_MESSAGE(a.width == l.desc.plan.buffers[a.buffer].width, img.key << " " << a.name);
      CHECK((a.kind == fb::ArgKind::Activation) == (l.desc.plan.buffers[a.buffer].type != fb::BufferType::I8));
    }
  }
}

// Every field of the launch records of a plan, as text (determinism checks).
std::string describe(const std::vector<std::vector<LaunchRecord>>& plan) {
  std::string out;
  for (const auto& step : plan) {
    for (const LaunchRecord& r : step) {
      for (uint32_t i : r.images) out += std::to_string(i) + ",";
      for (const KernelArgDesc& a : r.args)
        out += a.name + ":" + std::to_string(static_cast<int>(a.kind)) + "/" + std::to_string(a.buffer) + "/" +
               std::to_string(a.width) + "/" + std::to_string(a.tensor) + "/" + std::to_string(a.plane.row_pitch) +
               "/" + std::to_string(a.layer) + "/" + std::to_string(a.bytes) + " ";
      for (const auto& g : r.rule.grid) out += std::to_string(g.per_token) + "." + std::to_string(g.divisor) + " ";
      out += std::to_string(r.rule.block.x) + " " + std::to_string(r.rule.smem) + ";";
    }
    out += "\n";
  }
  return out;
}

void checkSet(const Loaded& l, const KernelSet& set, const std::vector<std::string>& targets) {
  const std::regex key_re("[a-z0-9_.-]+_sm[0-9]+a?");
  std::set<std::string> keys;
  for (const KernelImageData& img : set.images) {
    CHECK_MESSAGE(std::regex_match(img.key, key_re), img.key);
    CHECK_MESSAGE(keys.insert(img.key).second, "duplicate key " << img.key);
    CHECK(img.key.size() > img.arch.size());
    REQUIRE(img.cubin.size() > 64);
    CHECK(std::string(img.cubin.begin(), img.cubin.begin() + 4) == "\x7f" "ELF");
    CHECK_MESSAGE(img.ptx.find(".entry " + img.entry) != std::string::npos, img.key);
    CHECK_MESSAGE(img.ptx.find(".target " + img.arch) != std::string::npos, img.key << " " << img.arch);
    CHECK(img.nvrtc_version == nvrtcVersionString());
    CHECK(std::find(img.options.begin(), img.options.end(), "--gpu-architecture=" + img.arch) != img.options.end());
    // Every launch record says the kernel may overlap its predecessor (schema Launch.overlap), so every
    // sm_90 image must wait for it (kernels/common.cuh overlapPrologue).
    if (img.arch == "sm_90") CHECK_MESSAGE(img.ptx.find("griddepcontrol.wait") != std::string::npos, img.key);
  }
  CHECK(set.images.size() == set.stats.unique_specs * targets.size());
  // Every tensor with derived planes has its expansion in the load plan.
  size_t with_derived = 0;
  for (const planes::TensorLayout& w : l.layouts)
    with_derived += std::find(w.derived.begin(), w.derived.end(), true) != w.derived.end();
  CHECK(l.desc.plan.load.size() == with_derived);
  for (PlanVariant v : {PlanVariant::kPrefill, PlanVariant::kDecode, PlanVariant::kLoad}) {
    const bool prefill = v == PlanVariant::kPrefill;
    const auto& steps = planSteps(l.desc.plan, v);
    const auto& lists = prefill ? set.prefill : v == PlanVariant::kDecode ? set.decode : set.load;
    REQUIRE(lists.size() == steps.size());
    const std::vector<uint8_t>* fused = prefill ? &set.prefill_fused : v == PlanVariant::kDecode ? &set.decode_fused : nullptr;
    for (size_t i = 0; i < steps.size(); ++i) {
      // A fused step's work is in the previous step's launch (the fusion case below checks which).
      const bool is_fused = fused && (*fused)[i] != 0;
      std::vector<std::string> want = is_fused ? std::vector<std::string>{} : expectedEntries(l, steps[i], prefill);
      // A residual Add with the RmsNorm after it fused in runs the norm's kernel (RMS_ADD).
      if (!is_fused && steps[i].op == fb::OpKind::Add && fused && i + 1 < steps.size() && (*fused)[i + 1])
        want = {"minfer_rms_norm"};
      const bool mm_leads = !is_fused && steps[i].op == fb::OpKind::MatMul && fused && i + 1 < steps.size() && (*fused)[i + 1];
      // A gate MatMul with the up MatMul, the GLU and its quantization fused in runs the gate|up GEMV; with the
      // up MatMul alone (the default), the GEMV pair; a q MatMul with the k and v MatMuls (and no Rope after
      // them: a q/k HeadRmsNorm between), the GEMV triple.
      const bool fused2 = fused && i + 2 < steps.size() && (*fused)[i + 2];
      if (mm_leads && steps[i + 1].op == fb::OpKind::MatMul)
        want = {!fused2 ? "minfer_gemv_pair"
                : steps[i + 2].op == fb::OpKind::MatMul ? "minfer_gemv_triple" : "minfer_gemv_glu"};
      // A q HeadRmsNorm with the k HeadRmsNorm and the Rope fused in runs the head-norm RoPE kernel; in decode
      // with the Attention fused in too, its KV-storing form, then the attention without kv_store.
      if (!is_fused && steps[i].op == fb::OpKind::HeadRmsNorm && fused && i + 1 < steps.size() && (*fused)[i + 1])
        want = {"minfer_head_norm_rope"};
      if (!is_fused && steps[i].op == fb::OpKind::HeadRmsNorm && fused && i + 3 < steps.size() && (*fused)[i + 3] &&
          steps[i + 3].op == fb::OpKind::Attention) {
        CHECK(!prefill);
        want = {"minfer_head_norm_rope_kv", "minfer_attn_decode", "minfer_attn_combine"};
      }
      // A decode router MatMul with the MoeRoute and MoeFfn fused in runs the MoeFfn's launches, the first computing
      // the logits, routing and sorting.
      if (mm_leads && steps[i + 1].op == fb::OpKind::MoeRoute) {
        CHECK(!prefill);
        CHECK((*fused)[i + 2]);
        want = decodeExpertEntries(l, steps[i + 2]);
        want.insert(want.begin(), "minfer_moe_router_sort");
      }
      // A decode MoeRoute with its MoeFfn fused in runs the MoeFfn's launches, the sort launch routing too.
      if (!is_fused && steps[i].op == fb::OpKind::MoeRoute && fused && i + 1 < steps.size() && (*fused)[i + 1]) {
        CHECK(!prefill);
        CHECK(steps[i + 1].op == fb::OpKind::MoeFfn);
        want = decodeExpertEntries(l, steps[i + 1]);
        want.insert(want.begin(), "minfer_moe_route_sort");
      }
      // A decode o / down MatMul with the residual Add, the RmsNorm and its QuantizeAct fused in (the default GEMV +
      // Add + deferred RMSNorm; test_codegen_fusion.cpp checks where) runs the GEMV + Add + norm kernel.
      if (mm_leads && steps[i + 1].op == fb::OpKind::Add) {
        CHECK(!prefill);
        want = {"minfer_gemv_add_norm"};
      }
      // A q MatMul with k, v, the Rope and the Attention fused in runs the QKV GEMV, then the attention.
      if (mm_leads && i + 4 < steps.size() && (*fused)[i + 4] && steps[i + 3].op == fb::OpKind::Rope)
        want = {"minfer_gemv_qkv", "minfer_attn_decode", "minfer_attn_combine"};
      REQUIRE_MESSAGE(lists[i].size() == want.size(), steps[i].name);
      for (size_t k = 0; k < want.size(); ++k) {
        REQUIRE(lists[i][k].images.size() == targets.size());
        for (size_t a = 0; a < targets.size(); ++a) {
          const uint32_t idx = lists[i][k].images[a];
          REQUIRE(idx < set.images.size());
          CHECK_MESSAGE(set.images[idx].entry == want[k], steps[i].name);
          CHECK(set.images[idx].arch == targets[a]);
        }
        checkRecord(l, lists[i][k], set.images[lists[i][k].images[0]]);
      }
      // A decode attention's combine computes the splits its attn_decode filled (decodeSplits), which
      // depend on the sliding window: both must be compiled with the same ATT_WINDOW.
      for (size_t k = 0; k + 1 < want.size(); ++k)
        if (want[k] == "minfer_attn_decode" && want[k + 1] == "minfer_attn_combine")
          CHECK_MESSAGE(optionValue(set.images[lists[i][k].images[0]], "ATT_WINDOW") ==
                            optionValue(set.images[lists[i][k + 1].images[0]], "ATT_WINDOW"),
                        steps[i].name);
      // Decode GEMV on a 4-bit-packable weight reads the packed plane.
      if (!prefill && steps[i].op == fb::OpKind::MatMul && isQuantizedMatMul(l, steps[i]) &&
          !readsBlocksInDecode(l, steps[i])) {
        const planes::TensorLayout& w = l.layouts[steps[i].weights[0]];
        const bool packed = w.find(PlaneKind::kPacked) >= 0;
        CHECK(optionValue(set.images[lists[i][0].images[0]], "GEMV_BITS") == (packed ? "4" : "8"));
      }
    }
  }
  // Paged launches (Step.paged_launches, 1.6): the Rope and Attention steps of both plans that are not fused
  // into another step's launch have them (a decode Attention with its QuantizeAct fused in, the q8 form too:
  // PA_Q8), with per-row positions and block tables and never Positions; and a decode q MatMul running the
  // fused QKV GEMV: the three GEMVs, then the paged RoPE and attention.
  for (const bool prefill : {true, false}) {
    const auto& steps = prefill ? l.desc.plan.prefill : l.desc.plan.decode;
    const auto& paged = prefill ? set.prefill_paged : set.decode_paged;
    const auto& fused = prefill ? set.prefill_fused : set.decode_fused;
    REQUIRE(paged.size() == steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const model::StepDesc& s = steps[i];
      const bool quant_follows = i + 1 < steps.size() && fused[i + 1] && steps[i + 1].op == fb::OpKind::QuantizeAct &&
                                 (i + 2 >= steps.size() || !fused[i + 2]);
      const bool follows = i + 1 < steps.size() && fused[i + 1];
      std::vector<std::string> want;
      if (!fused[i] && !follows && s.op == fb::OpKind::Rope) want = {"minfer_rope_paged"};
      // A q HeadRmsNorm running the k norm and the Rope: the same kernel at per-row positions (and with the decode
      // Attention fused in, its paged KV store and attention after it).
      const bool hnr_attention = !fused[i] && follows && s.op == fb::OpKind::HeadRmsNorm && i + 3 < steps.size() &&
                                 fused[i + 3] && steps[i + 3].op == fb::OpKind::Attention;
      if (!fused[i] && follows && s.op == fb::OpKind::HeadRmsNorm) want = {"minfer_head_norm_rope"};
      if (hnr_attention) want = {"minfer_head_norm_rope", "minfer_kv_store_paged", "minfer_attn_paged"};
      if (!fused[i] && (!follows || (quant_follows && s.head_dim % 32 == 0)) && s.op == fb::OpKind::Attention)
        want = {"minfer_kv_store_paged", "minfer_attn_paged"};
      const bool qkv = !fused[i] && follows && s.op == fb::OpKind::MatMul && i + 4 < steps.size() && fused[i + 4] &&
                       steps[i + 3].op == fb::OpKind::Rope;
      if (qkv) {
        want = {"minfer_gemv_blocks", "minfer_gemv_blocks", "minfer_gemv_blocks", "minfer_rope_paged",
                "minfer_kv_store_paged", "minfer_attn_paged"};
        CHECK(steps[i + 4].op == fb::OpKind::Attention);
      }
      REQUIRE_MESSAGE(paged[i].size() == want.size(), (prefill ? "prefill " : "decode ") << s.name);
      for (size_t k = 0; k < want.size(); ++k) {
        const LaunchRecord& r = paged[i][k];
        REQUIRE(r.images.size() == targets.size());
        const KernelImageData& img = set.images[r.images[0]];
        CHECK_MESSAGE(img.entry == want[k], s.name);
        checkRecord(l, r, img);
        if (img.entry == "minfer_head_norm_rope") CHECK(optionValue(img, "ROPE_ROW_POSITIONS") == "1");
        if (img.entry == "minfer_attn_paged")
          CHECK((optionValue(img, "PA_Q8") == "1") == (qkv             ? i + 5 < steps.size() && fused[i + 5]
                                                       : hnr_attention ? i + 4 < steps.size() && fused[i + 4]
                                                                       : follows));
        if (img.entry == "minfer_gemv_blocks") continue;  // a GEMV of one row: no positions
        bool rows = false;
        for (const KernelArgDesc& a : r.args) {
          CHECK_MESSAGE(a.kind != fb::ArgKind::Positions, s.name);
          rows |= a.kind == fb::ArgKind::RowPositions;
        }
        CHECK_MESSAGE(rows, s.name);
      }
    }
  }
  // Small-batch launches (Step.small_launches, 1.7): every prefill MatMul on a quantized weight (a kI8 plane, or
  // a kBlocks plane the decode GEMV reads) with a q8 input that is not fused has them: minfer_gemm_small on the
  // plane the decode GEMV reads where there is a kI8 plane (one launch), for up to min(64, or 16 beside a Hopper
  // kF16 plane, max_batch) rows, with the codegen's split count; else, on the GGUF blocks (Q4_K, Q6_K),
  // minfer_gemv_batch with the decode GEMV's constants for the calls below kMmqbFromRows rows and minfer_mmq_blocks
  // in tiles of 16 and 32 tokens from there, up to min(kMmqbMaxRows, max_batch) rows (row ranges, 1.10; with
  // max_batch below kMmqbFromRows or in a model with experts the batched GEMV alone, up to min(kGemvBatchMaxRows,
  // max_batch)). Every other step none.
  REQUIRE(set.prefill_small.size() == l.desc.plan.prefill.size());
  REQUIRE(set.prefill_small_rows.size() == l.desc.plan.prefill.size());
  size_t small_steps = 0;
  const size_t tail = lastTokenTailBegin(l.desc.plan.prefill, l.desc.plan.logits);
  const unsigned max_batch = l.desc.plan.max_batch;
  for (size_t i = 0; i < l.desc.plan.prefill.size(); ++i) {
    const model::StepDesc& s = l.desc.plan.prefill[i];
    const bool follows = i + 1 < l.desc.plan.prefill.size() && set.prefill_fused[i + 1];
    const bool blocks = s.op == fb::OpKind::MatMul && readsBlocksInDecode(l, s) &&
                        l.layouts[s.weights[0]].find(PlaneKind::kI8) < 0;
    const bool want = s.op == fb::OpKind::MatMul && !set.prefill_fused[i] && !follows &&
                      (isQuantizedMatMul(l, s) || blocks);
    // the batched GEMV, then mmq_blocks (not in models with experts)
    const bool mmq = blocks && max_batch >= kern::kMmqbFromRows && l.desc.config.n_expert == 0;
    const size_t mmq_launches = !mmq ? 0 : max_batch >= 17 ? 2 : 1;
    REQUIRE_MESSAGE(set.prefill_small[i].size() == (want ? 1 + mmq_launches : 0u), s.name);
    const bool f16 = want && l.layouts[s.weights[0]].find(PlaneKind::kF16) >= 0;
    const unsigned rows = mmq      ? std::min(kern::kMmqbMaxRows, max_batch)
                          : blocks ? std::min(kern::kGemvBatchMaxRows, max_batch)
                          : std::min(f16 ? kern::kGemmSmallRowsVsWgmma : kern::kGemmSmallRowsVsMmq, max_batch);
    CHECK(set.prefill_small_rows[i] == (want ? rows : 0u));
    if (!want) continue;
    ++small_steps;
    const LaunchRecord& r = set.prefill_small[i][0];
    const KernelImageData& img = set.images[r.images[0]];
    CHECK_MESSAGE(img.entry == (blocks ? "minfer_gemv_batch" : "minfer_gemm_small"), s.name);
    checkRecord(l, r, img);
    const planes::TensorLayout& w = l.layouts[s.weights[0]];
    const unsigned n = static_cast<unsigned>(w.desc.rows), k = static_cast<unsigned>(w.desc.cols);
    // A tail step takes no scratch (the verifier's rule for tail launches): one split there.
    unsigned splits = 1;
    if (blocks) {  // the decode GEMV's constants and work shape, GEMVB_BATCH rows at most, no split
      const StrideTable& b = w.planes[static_cast<size_t>(w.find(PlaneKind::kBlocks))];
      const kern::GemvBlocksShape shape = kern::gemvBlocksShape(n, k);
      CHECK(optionValue(img, "GEMVB_TYPE") == std::to_string(b.ggml_type));
      CHECK(optionValue(img, "GEMVB_PITCH") == std::to_string(b.row_pitch));
      CHECK(optionValue(img, "GEMVB_GROUP_PITCH") == std::to_string(b.group_pitch));
      CHECK(optionValue(img, "GEMVB_ROWS") == std::to_string(shape.rows));
      CHECK(optionValue(img, "GEMVB_BATCH") == std::to_string(kern::kGemvBatchMaxRows));
      CHECK(r.rule.at(kern::kGemvBatchMaxRows).grid.x == kern::gemvBlocksLaunch(n, shape).grid.x);
      CHECK(r.min_rows == 0);
      CHECK(r.max_rows == (mmq ? kern::kMmqbFromRows - 1 : 0u));
      // mmq_blocks: the blocks' constants, tiles of 16 then 32 tokens, the rows above the batched GEMV's without a
      // gap, split over K (mmqbSplits) except in the tail, its scratch and counters with more than one split.
      const unsigned mmq_splits = i < tail ? kern::mmqbSplits(n, k) : 1;
      for (size_t j = 1; j <= mmq_launches; ++j) {
        const LaunchRecord& mr = set.prefill_small[i][j];
        const KernelImageData& mi = set.images[mr.images[0]];
        CHECK_MESSAGE(mi.entry == "minfer_mmq_blocks", s.name);
        checkRecord(l, mr, mi);
        const unsigned tn = j == 1 ? 16 : 32;
        CHECK(optionValue(mi, "MMQB_TYPE") == std::to_string(b.ggml_type));
        CHECK(optionValue(mi, "MMQB_PITCH") == std::to_string(b.row_pitch));
        CHECK(optionValue(mi, "MMQB_GROUP_PITCH") == std::to_string(b.group_pitch));
        CHECK(optionValue(mi, "MMQB_TN") == std::to_string(tn));
        CHECK(optionValue(mi, "MMQB_SPLITS") == std::to_string(mmq_splits));
        CHECK(mr.min_rows == (j == 1 ? kern::kMmqbFromRows : 17u));
        CHECK(mr.max_rows == std::min({tn, max_batch, kern::kMmqbMaxRows}));
        CHECK(mr.rule.at(1).grid.y == mmq_splits);
        size_t scratch = 0;
        for (const KernelArgDesc& a : mr.args) scratch += a.kind == fb::ArgKind::Scratch || a.kind == fb::ArgKind::Counters;
        CHECK(scratch == (mmq_splits > 1 ? 2u : 0u));
      }
    } else {
      const bool packed = w.find(PlaneKind::kPacked) >= 0;
      CHECK(optionValue(img, "SB_BITS") == (packed ? "4" : "8"));
      if (i < tail) splits = kern::gemmSmallSplits(n, k);
      CHECK(optionValue(img, "SB_SPLITS") == std::to_string(splits));
    }
    bool scratch = false, counters = false, tokens = false;
    for (const KernelArgDesc& a : r.args) {
      scratch |= a.kind == fb::ArgKind::Scratch;
      counters |= a.kind == fb::ArgKind::Counters;
      tokens |= a.kind == fb::ArgKind::TokenCount;
    }
    CHECK(scratch == (splits > 1));
    CHECK(counters == (splits > 1));
    CHECK(tokens);
  }
  // Row ranges (schema Launch.min_rows / max_rows, 1.10): each small-batch record carries its KernelLaunch's, as
  // smallLaunchesForStep made it (no followers: a step with small launches has none); every other record none.
  for (size_t i = 0; i < set.prefill_small.size(); ++i) {
    if (set.prefill_small[i].empty()) continue;
    auto small = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, 0);
    REQUIRE_MESSAGE(static_cast<bool>(small), llvm::toString(small.takeError()));
    REQUIRE(small->launches.size() == set.prefill_small[i].size());
    for (size_t k = 0; k < small->launches.size(); ++k) {
      CHECK(set.prefill_small[i][k].min_rows == small->launches[k].min_rows);
      CHECK(set.prefill_small[i][k].max_rows == small->launches[k].max_rows);
    }
  }
  for (const auto* plan : {&set.prefill, &set.decode, &set.load, &set.prefill_paged, &set.decode_paged})
    for (const std::vector<LaunchRecord>& step : *plan)
      for (const LaunchRecord& r : step) CHECK((r.min_rows == 0 && r.max_rows == 0));
  CHECK((set.argmax.min_rows == 0 && set.argmax.max_rows == 0 && set.topk.min_rows == 0 && set.topk.max_rows == 0));
  bool quantized = false;
  for (const model::StepDesc& s : l.desc.plan.prefill)
    quantized |= isQuantizedMatMul(l, s) || (s.op == fb::OpKind::MatMul && readsBlocksInDecode(l, s));
  CHECK((small_steps > 0) == quantized);
  size_t argmax = 0;
  for (const KernelImageData& img : set.images) argmax += img.entry == "minfer_argmax";
  CHECK(argmax == targets.size());
  REQUIRE(set.argmax.images.size() == targets.size());
  CHECK(set.images[set.argmax.images[0]].entry == "minfer_argmax");
  checkRecord(l, set.argmax, set.images[set.argmax.images[0]]);
  // The device top-k (Artifact.topk, 1.9): one image per target, specialized for n_vocab, reading the logits
  // buffer, with the session's TopK slot of this build's layout, its per-block scratch and one counter word.
  size_t topk = 0;
  for (const KernelImageData& img : set.images) topk += img.entry == "minfer_topk";
  CHECK(topk == targets.size());
  REQUIRE(set.topk.images.size() == targets.size());
  const KernelImageData& topk_img = set.images[set.topk.images[0]];
  CHECK(topk_img.entry == "minfer_topk");
  checkRecord(l, set.topk, topk_img);
  const uint32_t n_vocab = l.desc.config.n_vocab;
  CHECK(optionValue(topk_img, "TK_N") == std::to_string(n_vocab));
  REQUIRE(set.topk.args.size() == 4);
  CHECK(set.topk.args[0].kind == fb::ArgKind::Activation);
  CHECK(set.topk.args[0].buffer == l.desc.plan.logits);
  CHECK(set.topk.args[1].kind == fb::ArgKind::TopK);
  CHECK(set.topk.args[1].bytes == sizeof(kern::TopKSlot));
  CHECK(set.topk.args[2].kind == fb::ArgKind::Scratch);
  CHECK(set.topk.args[2].bytes == kern::topkScratchBytes(n_vocab));
  CHECK(set.topk.args[3].kind == fb::ArgKind::Counters);
  CHECK(set.topk.rule.at(1).grid.x == kern::topkBlocks(n_vocab));
  CHECK(set.topk.rule.at(7).grid.x == kern::topkBlocks(n_vocab));  // one row whatever the call's tokens
}

TEST_CASE("every fixture model gets kernel images for sm_90") {
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED: built without NVRTC");
    return;
  }
  if (!test::haveFixtures()) return;
  for (const std::string& path : fixtureModels()) {
    CAPTURE(path);
    const Loaded l = load(path);
    const KernelSet set = generate(l, {"sm_90"}, MINFER_TEST_KERNEL_CACHE);
    checkSet(l, set, {"sm_90"});
    CHECK(set.stats.unique_specs < set.stats.kernel_uses);  // layers share shapes
  }
}

// The small-batch launches where the Hopper images plan their K-quant weights (layout_planner.h f16_prefill: kBlocks
// and kF16, no kI8): for every Q4_K and Q6_K matmul, minfer_gemv_batch on the GGUF blocks below kMmqbFromRows rows
// and minfer_mmq_blocks from there in tiles of 16 and 32 tokens, the row ranges adjoining, up to
// min(kMmqbMaxRows, max_batch) rows; in a model with experts the batched GEMV alone (checkSet covers the sm_90 planes);
// each step on its own (the plan fuses q, k, v: the next test case); specs only, no NVRTC.
TEST_CASE("small-batch launches of Q4_K and Q6_K matmuls read the GGUF blocks beside a Hopper kF16 plane") {
  if (!test::haveFixtures()) return;
  const Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true);
  const unsigned max_batch = l.desc.plan.max_batch;
  REQUIRE(max_batch >= 17);  // both mmq_blocks tiles
  std::set<uint32_t> types;
  for (size_t i = 0; i < l.desc.plan.prefill.size(); ++i) {
    const model::StepDesc& s = l.desc.plan.prefill[i];
    if (s.op != fb::OpKind::MatMul || !readsBlocksInDecode(l, s)) continue;
    CAPTURE(s.name);
    const planes::TensorLayout& w = l.layouts[s.weights[0]];
    REQUIRE(w.find(PlaneKind::kF16) >= 0);
    CHECK(w.find(PlaneKind::kI8) < 0);
    auto small = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, 0);
    REQUIRE_MESSAGE(static_cast<bool>(small), llvm::toString(small.takeError()));
    REQUIRE(small->launches.size() == 3);
    CHECK(small->rows == std::min(kern::kMmqbMaxRows, max_batch));
    const KernelLaunch& k = small->launches[0];
    CHECK(k.spec.entry == "minfer_gemv_batch");
    CHECK((k.min_rows == 0 && k.max_rows == kern::kMmqbFromRows - 1));
    const StrideTable& b = w.planes[static_cast<size_t>(w.find(PlaneKind::kBlocks))];
    types.insert(b.ggml_type);
    CHECK(k.spec.define("GEMVB_TYPE") == std::to_string(b.ggml_type));
    CHECK(k.spec.define("GEMVB_BATCH") == std::to_string(kern::kGemvBatchMaxRows));
    const unsigned n = static_cast<unsigned>(w.desc.rows), kc = static_cast<unsigned>(w.desc.cols);
    const kern::LaunchShape sh = k.rule.at(kern::kGemvBatchMaxRows);  // independent of the rows
    CHECK(sh.grid.x == kern::gemvBlocksLaunch(n, kern::gemvBlocksShape(n, kc)).grid.x);
    CHECK(sh.grid.x == k.rule.at(2).grid.x);
    unsigned next = kern::kMmqbFromRows;  // the first row count the next launch must take
    for (size_t j = 1; j < 3; ++j) {
      const KernelLaunch& m = small->launches[j];
      CHECK(m.spec.entry == "minfer_mmq_blocks");
      CHECK(m.spec.define("MMQB_TYPE") == std::to_string(b.ggml_type));
      CHECK(m.spec.define("MMQB_TN") == (j == 1 ? "16" : "32"));
      CHECK(m.min_rows == next);
      CHECK(m.max_rows == std::min(j == 1 ? 16u : 32u, max_batch));
      next = m.max_rows + 1;
      CHECK(m.rule.at(1).grid.x == (n + kern::kMmqbTM - 1) / kern::kMmqbTM);
      CHECK(m.rule.at(1).smem == kern::mmqbSmemBytes(b.ggml_type, j == 1 ? 16 : 32));
    }
  }
  CHECK(types == std::set<uint32_t>{static_cast<uint32_t>(GgmlType::Q4_K), static_cast<uint32_t>(GgmlType::Q6_K)});
  // A model with experts keeps the batched GEMV alone (mmq_blocks's f16 rounding moved a near-tie router row): its
  // attention's Q4_K / Q6_K matmuls get one launch, no row range, up to min(kGemvBatchMaxRows, max_batch) rows.
  const Loaded moe = load(test::fixturesDir() + "/arch/models/tiny-qwen3moe-Q4_K_M.gguf", true, true);
  REQUIRE(moe.desc.config.n_expert > 0);
  size_t moe_blocks = 0;
  for (size_t i = 0; i < moe.desc.plan.prefill.size(); ++i) {
    const model::StepDesc& s = moe.desc.plan.prefill[i];
    if (s.op != fb::OpKind::MatMul || s.weights.empty() || !readsBlocksInDecode(moe, s)) continue;
    CAPTURE(s.name);
    auto small = smallLaunchesForStep(moe.desc, moe.layouts, PlanVariant::kPrefill, i, 0);
    REQUIRE_MESSAGE(static_cast<bool>(small), llvm::toString(small.takeError()));
    REQUIRE(small->launches.size() == 1);
    CHECK(small->launches[0].spec.entry == "minfer_gemv_batch");
    CHECK((small->launches[0].min_rows == 0 && small->launches[0].max_rows == 0));
    CHECK(small->rows == std::min(kern::kGemvBatchMaxRows, moe.desc.plan.max_batch));
    ++moe_blocks;
  }
  CHECK(moe_blocks > 0);
  // Plans for smaller batches clip the ranges: max_batch 4 (below kMmqbFromRows) the batched GEMV alone; 12 one
  // mmq_blocks launch up to 12 rows; 20 the second tile up to 20 rows. small_rows is the last launch's bound.
  for (const uint32_t batch : {4u, 12u, 20u}) {
    CAPTURE(batch);
    const Loaded sl = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true, batch);
    REQUIRE(sl.desc.plan.max_batch == batch);
    size_t checked = 0;
    for (size_t i = 0; i < sl.desc.plan.prefill.size(); ++i) {
      const model::StepDesc& s = sl.desc.plan.prefill[i];
      if (s.op != fb::OpKind::MatMul || !readsBlocksInDecode(sl, s)) continue;
      CAPTURE(s.name);
      auto small = smallLaunchesForStep(sl.desc, sl.layouts, PlanVariant::kPrefill, i, 0);
      REQUIRE_MESSAGE(static_cast<bool>(small), llvm::toString(small.takeError()));
      const size_t want = batch < kern::kMmqbFromRows ? 1 : batch < 17 ? 2 : 3;
      REQUIRE(small->launches.size() == want);
      CHECK(small->launches[0].max_rows == (want == 1 ? 0u : kern::kMmqbFromRows - 1));
      if (want > 1) CHECK(small->launches[1].max_rows == std::min(16u, batch));
      if (want > 2) CHECK((small->launches[2].min_rows == 17 && small->launches[2].max_rows == batch));
      CHECK(small->rows == (want == 1 ? std::min(kern::kGemvBatchMaxRows, batch) : batch));
      ++checked;
    }
    CHECK(checked > 0);
  }
}

// `launch` compiled for sm_90a with NVRTC (where built with it): its entry's PTX parameters are the record's
// arguments, pointers but for the last, the 32-bit n_tokens.
void checkEntryParams(const KernelLaunch& launch) {
  if (!haveNvrtc()) return;
  auto compiled = compileKernel(launch.spec, "sm_90a");
  REQUIRE_MESSAGE(static_cast<bool>(compiled), llvm::toString(compiled.takeError()));
  const size_t at = compiled->ptx.find(".entry " + launch.spec.entry + "(");
  REQUIRE(at != std::string::npos);
  const std::string signature = compiled->ptx.substr(at, compiled->ptx.find(')', at) - at);
  std::vector<std::string> params;
  const std::regex param_re("\\.param \\.(u64|u32|b64|b32|s32)");
  for (auto it = std::sregex_iterator(signature.begin(), signature.end(), param_re); it != std::sregex_iterator(); ++it)
    params.push_back((*it)[1]);
  REQUIRE(params.size() == launch.args.size());
  for (size_t a = 0; a < params.size(); ++a) CHECK((params[a].substr(1) == "32") == (a + 1 == params.size()));
}

// One fused segment's constants and arguments in minfer_mmq_blocks<segs> launch `m`: segment g's weight, bias and
// output are step s's, its constants its kBlocks plane's (w0, bias0, …, xq, xmeta, out0 …: the output at out_at + g).
void checkMmqbSegment(const Loaded& l, const KernelLaunch& m, const model::StepDesc& s, size_t g, size_t out_at) {
  CAPTURE(g);
  const std::string x = g == 0 ? "" : std::to_string(g);
  const KernelArgDesc &w = m.args[2 * g], &b = m.args[2 * g + 1], &o = m.args[out_at + g];
  const planes::TensorLayout& wl = l.layouts[s.weights[0]];
  const StrideTable& plane = wl.planes[static_cast<size_t>(wl.find(PlaneKind::kBlocks))];
  CHECK(m.spec.define("MMQB_N" + x) == std::to_string(wl.desc.rows));
  CHECK(m.spec.define("MMQB_TYPE" + x) == std::to_string(plane.ggml_type));
  CHECK(w.name == "w" + std::to_string(g));
  CHECK((w.kind == fb::ArgKind::Weight && w.tensor == s.weights[0]));
  CHECK(w.plane.row_pitch == plane.row_pitch);
  CHECK(m.spec.define("MMQB_PITCH" + x) == std::to_string(w.plane.row_pitch));
  CHECK(m.spec.define("MMQB_GROUP_PITCH" + x) == std::to_string(w.plane.group_pitch));
  const bool has_bias = s.weights.size() > 1;
  CHECK(m.spec.define("MMQB_HAS_BIAS" + x) == (has_bias ? "1" : "0"));
  CHECK(b.name == "bias" + std::to_string(g));
  if (has_bias)
    CHECK((b.kind == fb::ArgKind::Weight && b.tensor == s.weights[1]));
  else
    CHECK(b.kind == fb::ArgKind::Null);
  CHECK((o.kind == fb::ArgKind::Activation && o.access == fb::Access::Write && o.buffer == s.outputs[0]));
  CHECK(o.name == "out" + std::to_string(g));
}

// The small-batch and own launches of prefill step i that planFusion fused with the `segs` − 1 MatMuls after it (q, k,
// v: 3; gate and up: 2): the batched GEMVs of each (below kMmqbFromRows rows, with its own weight and output), then
// minfer_mmq_blocks<segs> in tiles of 16, 32 and 64 tokens, each segment with its weight's kBlocks constants, split as
// mmqbSplits gives for the segments' row tiles together, grid over those tiles, the arguments in the kernel's order;
// its launches the steps' own in turn. With `compile`, the launches are compiled with NVRTC (where built with it)
// and the entry's PTX parameters checked against the record's arguments. Returns the segments' types.
std::vector<unsigned> checkMmqbSegmentsStep(const Loaded& l, size_t i, size_t segs, bool compile) {
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  const unsigned max_batch = l.desc.plan.max_batch;
  auto small = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1);
  REQUIRE_MESSAGE(static_cast<bool>(small), llvm::toString(small.takeError()));
  REQUIRE(max_batch >= 33);  // all three tiles
  REQUIRE(small->launches.size() == segs + 3);
  CHECK(small->rows == std::min(kern::kMmqbFusedMaxRows, max_batch));
  std::vector<unsigned> n(segs), type(segs);
  unsigned tiles = 0;
  uint64_t k = 0;
  for (size_t j = 0; j < segs; ++j) {
    const model::StepDesc& s = steps[i + j];
    const planes::TensorLayout& w = l.layouts[s.weights[0]];
    const StrideTable& b = w.planes[static_cast<size_t>(w.find(PlaneKind::kBlocks))];
    n[j] = static_cast<unsigned>(w.desc.rows);
    type[j] = b.ggml_type;
    k = w.desc.cols;
    tiles += (n[j] + kern::kMmqbTM - 1) / kern::kMmqbTM;
    const KernelLaunch& g = small->launches[j];
    CHECK(g.spec.entry == "minfer_gemv_batch");
    CHECK(g.spec.define("GEMVB_TYPE") == std::to_string(b.ggml_type));
    CHECK((g.min_rows == 0 && g.max_rows == kern::kMmqbFromRows - 1));
    const KernelArgDesc* out = nullptr;
    for (const KernelArgDesc& a : g.args)
      if (a.kind == fb::ArgKind::Activation && a.access == fb::Access::Write) out = &a;
    REQUIRE(out != nullptr);
    CHECK(out->buffer == s.outputs[0]);
  }
  const unsigned splits = kern::mmqbSplits(tiles * kern::kMmqbTM, static_cast<unsigned>(k));
  const std::string entry = "minfer_mmq_blocks" + std::to_string(segs);  // minfer_mmq_blocks2 or 3
  // w0, bias0, …, xq, xmeta, out0 …, partial, counters, n_tokens
  const size_t xq_at = 2 * segs, out_at = xq_at + 2, partial_at = out_at + segs;
  unsigned next = kern::kMmqbFromRows;
  for (size_t j = segs; j < segs + 3; ++j) {
    const KernelLaunch& m = small->launches[j];
    const unsigned tn = 16u << (j - segs);
    CAPTURE(tn);
    CHECK(m.spec.entry == entry);
    CHECK(m.spec.define("MMQB_SEGMENTS") == std::to_string(segs));
    CHECK(m.spec.define("MMQB_TN") == std::to_string(tn));
    CHECK(m.spec.define("MMQB_SPLITS") == std::to_string(splits));
    CHECK(m.spec.define("MMQB_N" + std::to_string(segs)).empty());  // no segment past the last
    CHECK(m.min_rows == next);
    CHECK(m.max_rows == std::min({tn, max_batch, kern::kMmqbFusedMaxRows}));
    next = m.max_rows + 1;
    CHECK(m.rule.at(1).grid.x == tiles);
    CHECK(m.rule.at(1).grid.y == splits);
    unsigned smem = 0;
    for (size_t g = 0; g < segs; ++g) smem = std::max(smem, kern::mmqbSmemBytes(type[g], tn));
    CHECK(m.rule.at(1).smem == smem);
    REQUIRE(m.args.size() == partial_at + 3);
    for (size_t g = 0; g < segs; ++g) checkMmqbSegment(l, m, steps[i + g], g, out_at);
    CHECK((m.args[xq_at].kind == fb::ArgKind::Q8Values && m.args[xq_at].buffer == steps[i].inputs[1]));
    CHECK((m.args[xq_at + 1].kind == fb::ArgKind::Q8Meta && m.args[xq_at + 1].buffer == steps[i].inputs[1]));
    const unsigned segs_u = static_cast<unsigned>(segs);
    if (splits > 1) {
      CHECK((m.args[partial_at].kind == fb::ArgKind::Scratch &&
             m.args[partial_at].bytes == kern::mmqbFusedPartialBytes(n.data(), segs_u, tn, splits)));
      CHECK((m.args[partial_at + 1].kind == fb::ArgKind::Counters &&
             m.args[partial_at + 1].bytes == kern::mmqbFusedCounterBytes(n.data(), segs_u)));
    } else {
      CHECK((m.args[partial_at].kind == fb::ArgKind::Null && m.args[partial_at + 1].kind == fb::ArgKind::Null));
    }
    CHECK(m.args[partial_at + 2].kind == fb::ArgKind::TokenCount);
    if (compile) checkEntryParams(m);
  }
  // The step's own launches: each fused step's in turn.
  auto fused = fusedLaunches(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1, std::nullopt);
  REQUIRE_MESSAGE(static_cast<bool>(fused), llvm::toString(fused.takeError()));
  std::vector<std::string> want;
  for (size_t j = 0; j < segs; ++j) {
    auto own = launchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i + j);
    REQUIRE_MESSAGE(static_cast<bool>(own), llvm::toString(own.takeError()));
    for (const KernelLaunch& x : *own) want.push_back(x.spec.key);
  }
  std::vector<std::string> got;
  for (const KernelLaunch& x : *fused) got.push_back(x.spec.key);
  CHECK(got == want);
  return type;
}

// The prefill steps of `loaded`'s MatMuls that planFusion with `fusions` gives followers (none expected).
void checkNoPrefillMatmulFusion(const Loaded& loaded, GemvFusions fusions) {
  const std::vector<model::StepDesc>& ps = loaded.desc.plan.prefill;
  auto f = planFusion(loaded.desc, loaded.layouts, PlanVariant::kPrefill, lastTokenTailBegin(ps, loaded.desc.plan.logits),
                      fusions, true);
  REQUIRE_MESSAGE(static_cast<bool>(f), llvm::toString(f.takeError()));
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i].op == fb::OpKind::MatMul) CHECK_MESSAGE(f->followers[i] == 0, ps[i].name);
}

// The prefill plan's fusion of `l` under minfer-compile's default GEMV fusions (q, k, v and gate and up fused where
// their small-batch launches can be one).
PlanFusion defaultPrefillFusion(const Loaded& l) {
  const GemvFusions gemv{.qkv = true, .glu = false, .pair = true, .norm = true, .prefill_pair = true};
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  auto fusion =
      planFusion(l.desc, l.layouts, PlanVariant::kPrefill, lastTokenTailBegin(steps, l.desc.plan.logits), gemv, true);
  REQUIRE_MESSAGE(static_cast<bool>(fusion), llvm::toString(fusion.takeError()));
  return std::move(*fusion);
}

// q, k and v of each layer beside a Hopper kF16 plane: the prefill plan fuses them (planFusion: the q step with 2
// followers) so that a batched step of kMmqbFromRows … kMmqbFusedMaxRows rows takes one minfer_mmq_blocks3 launch
// instead of three matmul launches (checkMmqbSegmentsStep; the first layer's compiled with NVRTC). Not with max_batch
// below kMmqbFromRows, nor with fusion off, nor in a model with experts.
TEST_CASE("prefill q, k, v beside a Hopper kF16 plane: their small-batch steps as one minfer_mmq_blocks3 launch") {
  if (!test::haveFixtures()) return;
  const GemvFusions gemv{.qkv = true, .glu = false, .pair = true, .norm = true};
  const Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true);
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  const size_t tail = lastTokenTailBegin(steps, l.desc.plan.logits);
  auto fusion = planFusion(l.desc, l.layouts, PlanVariant::kPrefill, tail, gemv, true);
  REQUIRE_MESSAGE(static_cast<bool>(fusion), llvm::toString(fusion.takeError()));
  size_t triples = 0;
  std::set<unsigned> v_types;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].op != fb::OpKind::MatMul) continue;
    CAPTURE(steps[i].name);
    if (steps[i].name.find("ffn_gate") != std::string::npos) CHECK(fusion->followers[i] == 0);  // fuse_prefill_pair off
    if (steps[i].name.find("attn_q") == std::string::npos) continue;
    REQUIRE(fusion->followers[i] == 2);
    CHECK((fusion->fused[i + 1] == 1 && fusion->fused[i + 2] == 1));
    v_types.insert(checkMmqbSegmentsStep(l, i, 3, triples == 0)[2]);
    ++triples;
  }
  CHECK(triples == l.desc.config.n_layer);
  // The Q4_K_M mix gives some layers a Q6_K v: the segments differ in type there.
  CHECK(v_types == std::set<unsigned>{static_cast<unsigned>(GgmlType::Q4_K), static_cast<unsigned>(GgmlType::Q6_K)});
  // No fusion where the triple would not run: max_batch 4, fuse_qkv off, experts (a MoE model whose q, k, v are all
  // Q4_K blocks: each alone would take mmq_blocks but for the experts).
  const Loaded small = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true, 4);
  const Loaded moe = load(synthQwen3MoeQ4KM(), true, true);
  size_t moe_triples = 0;
  for (size_t i = 0; i + 2 < moe.desc.plan.prefill.size(); ++i) {
    const model::StepDesc& q = moe.desc.plan.prefill[i];
    if (q.op != fb::OpKind::MatMul || q.name.find("attn_q") == std::string::npos) continue;
    bool blocks = true;
    for (size_t j = 0; j < 3; ++j)
      blocks = blocks && readsBlocksInDecode(moe, moe.desc.plan.prefill[i + j]) &&
               moe.layouts[moe.desc.plan.prefill[i + j].weights[0]].find(PlaneKind::kI8) < 0;
    moe_triples += blocks;
  }
  CHECK(moe_triples > 0);
  GemvFusions no_qkv = gemv;
  no_qkv.qkv = false;
  for (const auto& [what, loaded, fusions] : {std::tuple{"max_batch 4", &small, gemv}, std::tuple{"fuse_qkv off", &l, no_qkv},
                                             std::tuple{"experts", &moe, gemv}}) {
    CAPTURE(what);
    checkNoPrefillMatmulFusion(*loaded, fusions);
  }
}

// With mmqb_wgmma (CodegenOptions; sm_90a images) the small-batch launches are the default's but for the mmq_blocks
// tiles mmqbWarpgroupTile names (64 tokens: the fused q, k, v and gate and up launches, which serve 33 … 64 rows):
// their specs define MMQB_WGMMA 1 and their keys end in _wg; every other spec, row range, rule and argument the same.
// One such launch compiled with NVRTC for sm_90a (where built with it), its PTX parameters the record's arguments.
TEST_CASE("mmqb_wgmma: the 64-token mmq_blocks tiles in their warpgroup form, everything else the default's") {
  if (!test::haveFixtures()) return;
  const Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true);
  REQUIRE(l.desc.plan.max_batch >= 33);
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  const PlanFusion fusion = defaultPrefillFusion(l);
  size_t warpgroup = 0, mmqb = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].op != fb::OpKind::MatMul || fusion.fused[i]) continue;
    CAPTURE(steps[i].name);
    auto plain = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, fusion.followers[i]);
    auto wg =
        smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, fusion.followers[i], {.mmqb_wgmma = true});
    REQUIRE_MESSAGE(static_cast<bool>(plain), llvm::toString(plain.takeError()));
    REQUIRE_MESSAGE(static_cast<bool>(wg), llvm::toString(wg.takeError()));
    CHECK(wg->rows == plain->rows);
    REQUIRE(wg->launches.size() == plain->launches.size());
    for (size_t j = 0; j < wg->launches.size(); ++j) {
      const KernelLaunch &a = plain->launches[j], &b = wg->launches[j];
      const bool tile64 = a.spec.entry.rfind("minfer_mmq_blocks", 0) == 0 && a.spec.define("MMQB_TN") == "64";
      mmqb += a.spec.entry.rfind("minfer_mmq_blocks", 0) == 0;
      CAPTURE(a.spec.key);
      CHECK(b.spec.entry == a.spec.entry);
      CHECK(b.spec.key == (tile64 ? a.spec.key + "_wg" : a.spec.key));
      CHECK(b.spec.define("MMQB_WGMMA") == (tile64 ? "1" : ""));
      CHECK(b.spec.defines.size() == a.spec.defines.size() + (tile64 ? 1 : 0));
      CHECK((b.min_rows == a.min_rows && b.max_rows == a.max_rows));
      CHECK(b.rule.at(b.max_rows ? b.max_rows : 1).smem == a.rule.at(a.max_rows ? a.max_rows : 1).smem);
      CHECK(b.rule.at(1).grid.x == a.rule.at(1).grid.x);
      REQUIRE(b.args.size() == a.args.size());
      for (size_t x = 0; x < a.args.size(); ++x) CHECK((b.args[x].kind == a.args[x].kind && b.args[x].name == a.args[x].name));
      if (tile64 && warpgroup++ == 0) checkEntryParams(b);
    }
  }
  CHECK(mmqb > 0);
  CHECK(warpgroup == 2 * l.desc.config.n_layer - 1);  // q, k, v of each layer; gate and up of all but the last
}

// Every prefill MatMul step of `l` with mmqb_wgmma alone and with mmqb_f16act too (checks: the test case below);
// returns the warpgroup tiles, and counts in `split_tiles` those split over K. `compiled`: the specs compiled so far.
size_t checkMmqbF16ActLaunches(const Loaded& l, std::set<std::string>& compiled, size_t& split_tiles) {
  REQUIRE(l.desc.plan.max_batch >= 33);
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  const PlanFusion fusion = defaultPrefillFusion(l);
  size_t staged = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].op != fb::OpKind::MatMul || fusion.fused[i]) continue;
    CAPTURE(steps[i].name);
    const size_t segs = fusion.followers[i] + 1;
    auto wg = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1, {.mmqb_wgmma = true});
    auto f16 = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1,
                                    {.mmqb_wgmma = true, .mmqb_f16act = true});
    auto alone = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1, {.mmqb_f16act = true});
    auto plain = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1);
    REQUIRE_MESSAGE(static_cast<bool>(wg), llvm::toString(wg.takeError()));
    REQUIRE_MESSAGE(static_cast<bool>(f16), llvm::toString(f16.takeError()));
    REQUIRE_MESSAGE(static_cast<bool>(alone), llvm::toString(alone.takeError()));
    REQUIRE_MESSAGE(static_cast<bool>(plain), llvm::toString(plain.takeError()));
    REQUIRE(alone->launches.size() == plain->launches.size());
    for (size_t j = 0; j < plain->launches.size(); ++j)
      CHECK(alone->launches[j].spec.key == plain->launches[j].spec.key);
    CHECK(f16->rows == wg->rows);
    size_t j = 0;  // f16's launch matching wg's launch `a`
    for (const KernelLaunch& a : wg->launches) {
      REQUIRE(j < f16->launches.size());
      CAPTURE(a.spec.key);
      const bool tile = a.spec.define("MMQB_WGMMA") == "1";
      if (!tile) {
        const KernelLaunch& b = f16->launches[j++];
        CHECK((b.spec.key == a.spec.key && b.min_rows == a.min_rows && b.max_rows == a.max_rows));
        continue;
      }
      ++staged;
      REQUIRE(j + 1 < f16->launches.size());
      const KernelLaunch &act = f16->launches[j], &b = f16->launches[j + 1];
      j += 2;
      const unsigned k = static_cast<unsigned>(std::stoul(a.spec.define("MMQB_K")));
      const size_t xq = 2 * segs, partial = 3 * segs + 2;  // w, bias per segment; xq, xmeta; the outputs; partial
      REQUIRE(a.args.size() == 3 * segs + 5);
      const bool split = a.args[partial].kind == fb::ArgKind::Scratch;
      split_tiles += split;
      const uint64_t scratch = kern::mmqbF16ScratchBytes(64, k, split ? a.args[partial].bytes : 0);
      // The staging launch: the tile's q8 input into the scratch, for the tile's rows.
      CHECK(act.spec.entry == "minfer_mmqb_f16_act");
      CHECK(act.spec.define("MMQB_ACT_K") == std::to_string(k));
      CHECK((act.min_rows == a.min_rows && act.max_rows == a.max_rows && a.max_rows > 32));
      REQUIRE(act.args.size() == 4);
      for (size_t x = 0; x < 2; ++x)
        CHECK((act.args[x].kind == a.args[xq + x].kind && act.args[x].buffer == a.args[xq + x].buffer));
      CHECK((act.args[2].kind == fb::ArgKind::Scratch && act.args[2].bytes == scratch));
      CHECK(act.args[3].kind == fb::ArgKind::TokenCount);
      CHECK(act.rule.at(64).grid.x == 64 * k / 16 / kern::kMmqbActThreads);
      // The tile: MMQB_F16ACT, its activations from the scratch, its partials after them.
      CHECK(b.spec.entry == a.spec.entry);
      CHECK(b.spec.key == a.spec.key + "f16");
      CHECK(b.spec.define("MMQB_F16ACT") == "1");
      CHECK(b.spec.defines.size() == a.spec.defines.size() + 1);
      CHECK((b.min_rows == a.min_rows && b.max_rows == a.max_rows));
      unsigned smem = 0;
      for (const char* t : {"MMQB_TYPE", "MMQB_TYPE1", "MMQB_TYPE2"})
        if (!a.spec.define(t).empty())
          smem = std::max(smem, kern::mmqbF16SmemBytes(static_cast<unsigned>(std::stoul(a.spec.define(t))), 64));
      CHECK(b.rule.at(64).smem == smem);
      CHECK(b.rule.at(64).grid.x == a.rule.at(64).grid.x);
      CHECK(b.rule.at(64).grid.y == a.rule.at(64).grid.y);
      REQUIRE(b.args.size() == a.args.size());
      for (size_t x = 0; x < a.args.size(); ++x) {
        CAPTURE(x);
        CHECK(b.args[x].name == a.args[x].name);
        if (x == xq) CHECK((b.args[x].kind == fb::ArgKind::Scratch && b.args[x].bytes == scratch));
        else if (x == xq + 1) CHECK(b.args[x].kind == fb::ArgKind::Null);
        else if (x == partial && split) CHECK(b.args[x].bytes == scratch);
        if (x != xq && x != xq + 1) CHECK((b.args[x].kind == a.args[x].kind && b.args[x].buffer == a.args[x].buffer));
      }
      for (const KernelLaunch* c : {&act, &b})
        if (compiled.insert(c->spec.key).second) checkEntryParams(*c);
    }
    CHECK(j == f16->launches.size());
  }
  return staged;
}

// With mmqb_f16act too (CodegenOptions, the default; sm_90a images) each warpgroup tile (the fused q, k, v and gate and
// up launches' 64-token tiles) takes f16 activations: one minfer_mmqb_f16_act launch of the step's q8 input into the
// scratch serving the same rows, then the tile with MMQB_F16ACT 1 (key _wgf16), its xq the scratch (the activations at
// byte 0, mmqbF16ScratchBytes in all), its xmeta null, its partial the same scratch where it splits over K, its shared
// memory mmqbF16SmemBytes'; every other launch as mmqb_wgmma's alone. mmqb_f16act without mmqb_wgmma changes nothing.
// tiny-qwen2 (K 256: one split) and a cut-down qwen2 of width 1024 (its tiles split in 2). Each distinct new launch
// compiled with NVRTC for sm_90a (where built with it), its PTX parameters the record's arguments.
TEST_CASE("mmqb_f16act: the warpgroup tiles on f16 activations staged once per step, everything else mmqb_wgmma's") {
  if (!test::haveFixtures()) return;
  const std::string wide = test::writeSmallQwen2("qwen2-1024.gguf", 2, 1024, 1024, 64);
  std::set<std::string> compiled;
  for (const std::string& path : {test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", wide}) {
    CAPTURE(path);
    const Loaded l = load(path, true, true);
    size_t split_tiles = 0;
    // q, k, v of each layer; gate and up of all but the last (in the tail)
    CHECK(checkMmqbF16ActLaunches(l, compiled, split_tiles) == 2 * l.desc.config.n_layer - 1);
    CHECK((split_tiles > 0) == (path == wide));
  }
}

// With wgmma_split (CodegenOptions; sm_90a images) the plain prefill matmuls with small-batch launches on GGUF blocks
// beside a kF16 plane (o and down; q, k, v and gate and up are fused) keep the default's launches and add two for the
// calls of kMmqbMaxRows + 1 … min(64, max_batch) rows: minfer_q8_to_f16 of the step's q8 input into the scratch, then
// the Hopper matmul on the f16 tile of kWgmmaSplitTile, split over K as wgmmaSplits gives (minfer_wgmma_matmul_split:
// the partials after the activations in the scratch, one counter word per weight tile, grid (1, weight tiles,
// splits)) or, for one split, minfer_wgmma_matmul on that tile; none in the last-token tail or below 33 rows. With
// wgmma_split_fused (with or without wgmma_split) the fused q, k, v and gate and up lose their 64-token mmq_blocks
// tile for one minfer_q8_to_f16 and each matmul's Hopper launch in turn. tiny-qwen2 takes one split everywhere; a
// cut-down qwen2 of width 1024 (every K 1024: 16 stages, 2 splits at the test's 8 stages a split) splits every matmul;
// at the default min_stages none. Every distinct Hopper launch
// is compiled with NVRTC for sm_90a (where built with it), its PTX parameters the record's arguments.

// One Hopper matmul launch of the split form for step s, after a minfer_q8_to_f16 into `x16` scratch bytes, split as
// wgmmaSplits gives with `min_stages` stages of 64 per split.
void checkWgmmaSplitMatmul(const Loaded& l, const KernelLaunch& mm, const model::StepDesc& s, uint64_t x16,
                           unsigned min_stages, std::map<std::string, size_t>& keys) {
  CAPTURE(s.name);
  const planes::TensorLayout& w = l.layouts[s.weights[0]];
  const StrideTable& f16 = w.planes[static_cast<size_t>(w.find(PlaneKind::kF16))];
  const unsigned n = static_cast<unsigned>(w.desc.rows), k = static_cast<unsigned>(w.desc.cols);
  const unsigned splits = kern::wgmmaSplits(n, k, min_stages);
  const bool bias = s.weights.size() > 1;
  CHECK(mm.spec.define("WG_N") == std::to_string(n));
  CHECK(mm.spec.define("WG_K") == std::to_string(k));
  CHECK(mm.spec.define("WG_W_PITCH") == std::to_string(f16.row_pitch));
  CHECK((mm.spec.define("WG_BM") == "64" && mm.spec.define("WG_BN") == "64" && mm.spec.define("WG_STAGES") == "6"));
  CHECK(mm.spec.define("WG_ACT") == "0");
  CHECK(mm.spec.define("WG_HAS_BIAS") == (bias ? "1" : "0"));
  REQUIRE(mm.args.size() == 6);
  CHECK((mm.args[0].kind == fb::ArgKind::Weight && mm.args[0].tensor == s.weights[0] &&
         mm.args[0].plane.kind == PlaneKind::kF16));
  if (bias)
    CHECK((mm.args[1].kind == fb::ArgKind::Weight && mm.args[1].tensor == s.weights[1]));
  else
    CHECK(mm.args[1].kind == fb::ArgKind::Null);
  const kern::LaunchShape sh = mm.rule.at(mm.max_rows);
  CHECK(sh.smem == kern::wgmmaMatmulSmemBytes(64, 64, 6));
  CHECK((sh.grid.x == 1 && sh.grid.y == (n + 63) / 64));
  if (splits > 1) {
    CHECK(mm.spec.entry == "minfer_wgmma_matmul_split");
    CHECK(mm.spec.define("WG_SPLITS") == std::to_string(splits));
    CHECK(sh.grid.z == splits);
    CHECK((mm.args[2].kind == fb::ArgKind::Scratch &&
           mm.args[2].bytes == kern::wgmmaSplitPartialOffset(k) + 4ull * splits * 64 * n));
    CHECK((mm.args[3].kind == fb::ArgKind::Activation && mm.args[3].buffer == s.outputs[0]));
    CHECK((mm.args[4].kind == fb::ArgKind::Counters && mm.args[4].bytes == 4 * ((n + 63) / 64)));
  } else {
    CHECK(mm.spec.entry == "minfer_wgmma_matmul");
    CHECK(mm.spec.define("WG_SPLITS").empty());
    CHECK(sh.grid.z == 1);
    CHECK((mm.args[2].kind == fb::ArgKind::Scratch && mm.args[2].bytes == x16));
    CHECK(mm.args[3].kind == fb::ArgKind::Null);
    CHECK((mm.args[4].kind == fb::ArgKind::Activation && mm.args[4].buffer == s.outputs[0]));
  }
  CHECK(mm.args[5].kind == fb::ArgKind::TokenCount);
  if (keys[mm.spec.key]++ == 0) checkEntryParams(mm);
}

// Every prefill MatMul step of `l` with the default forms and with `on` (wgmma_split, wgmma_split_fused or both);
// returns how many steps took the Hopper launches. `keys` counts the Hopper launches' specs.
size_t checkWgmmaSplitLaunches(const Loaded& l, SmallBatchForms on, std::map<std::string, size_t>& keys) {
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  const size_t tail = lastTokenTailBegin(steps, l.desc.plan.logits);
  const PlanFusion fusion = defaultPrefillFusion(l);
  const unsigned max_batch = l.desc.plan.max_batch, last = std::min(64u, max_batch);
  on.mmqb_wgmma = true;
  size_t split_steps = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].op != fb::OpKind::MatMul || fusion.fused[i]) continue;
    CAPTURE(steps[i].name);
    const size_t segs = fusion.followers[i] + 1;
    auto plain = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1, {.mmqb_wgmma = true});
    auto split = smallLaunchesForStep(l.desc, l.layouts, PlanVariant::kPrefill, i, segs - 1, on);
    REQUIRE_MESSAGE(static_cast<bool>(plain), llvm::toString(plain.takeError()));
    REQUIRE_MESSAGE(static_cast<bool>(split), llvm::toString(split.takeError()));
    const size_t np = plain->launches.size();
    bool f16 = np > 0;
    for (size_t g = 0; g < segs; ++g) f16 = f16 && l.layouts[steps[i + g].weights[0]].find(PlaneKind::kF16) >= 0;
    const bool blocks = np > 0 && plain->launches.back().spec.entry.rfind("minfer_mmq_blocks", 0) == 0;
    const bool form = segs == 1 ? on.wgmma_split : on.wgmma_split_fused;
    const bool takes = form && i < tail && f16 && blocks && max_batch > kern::kMmqbMaxRows;
    // The default's launches kept: all of a plain step's; a fused step's but its 64-token tile (its last).
    const size_t kept = takes && segs > 1 ? np - 1 : np;
    for (size_t j = 0; j < std::min(kept, split->launches.size()); ++j) {
      const KernelLaunch &a = plain->launches[j], &b = split->launches[j];
      CHECK((b.spec.key == a.spec.key && b.min_rows == a.min_rows && b.max_rows == a.max_rows));
    }
    if (!takes) {
      CHECK(split->launches.size() == np);
      CHECK(split->rows == plain->rows);
      continue;
    }
    ++split_steps;
    const KernelLaunch& tile = plain->launches.back();
    if (segs > 1) CHECK((tile.spec.define("MMQB_TN") == "64" && tile.min_rows == 33));
    CHECK(plain->rows == (segs > 1 ? last : kern::kMmqbMaxRows));
    CHECK(split->rows == last);
    REQUIRE(split->launches.size() == kept + 1 + segs);
    for (size_t j = kept; j < split->launches.size(); ++j)
      CHECK((split->launches[j].min_rows == kern::kMmqbMaxRows + 1 && split->launches[j].max_rows == last));
    const KernelLaunch& deq = split->launches[kept];
    const uint64_t k = l.layouts[steps[i].weights[0]].desc.cols;
    CHECK(deq.spec.entry == "minfer_q8_to_f16");
    CHECK(deq.spec.define("Q8F16_K") == std::to_string(k));
    REQUIRE(deq.args.size() == 4);
    CHECK((deq.args[0].kind == fb::ArgKind::Q8Values && deq.args[0].buffer == steps[i].inputs[1]));
    CHECK((deq.args[1].kind == fb::ArgKind::Q8Meta && deq.args[1].buffer == steps[i].inputs[1]));
    CHECK(deq.args[2].kind == fb::ArgKind::Scratch);
    CHECK(deq.args[2].bytes == kern::q8ToF16Bytes(64, static_cast<unsigned>(k)));
    CHECK(deq.args[3].kind == fb::ArgKind::TokenCount);
    for (size_t g = 0; g < segs; ++g)
      checkWgmmaSplitMatmul(l, split->launches[kept + 1 + g], steps[i + g], deq.args[2].bytes,
                            on.wgmma_split_min_stages, keys);
  }
  return split_steps;
}

TEST_CASE("wgmma_split: 33 … 64-row calls on the Hopper matmul split over K, o and down or every matmul") {
  if (!test::haveFixtures()) return;
  const std::string wide = test::writeSmallQwen2("qwen2-1024.gguf", 2, 1024, 1024, 64);
  std::map<std::string, size_t> keys;
  // Splits of at least 8 stages, so that the 1024-wide model's matmuls (16 stages) split in 2; the default rule's
  // 96 splits only a K of 192 stages or more (below).
  const SmallBatchForms plain{.wgmma_split = true, .wgmma_split_min_stages = 8},
      fused{.wgmma_split_fused = true, .wgmma_split_min_stages = 8},
      both{.wgmma_split = true, .wgmma_split_fused = true, .wgmma_split_min_stages = 8};
  for (const std::string& path : {test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", wide}) {
    CAPTURE(path);
    for (const uint32_t max_batch : {512u, 40u}) {  // 40: the Hopper launches serve 33 … 40 rows
      CAPTURE(max_batch);
      const Loaded l = load(path, true, true, max_batch);
      const size_t layers = l.desc.config.n_layer;
      const size_t od = 2 * (layers - 1);                // o and down before the tail
      const size_t qkv_gu = layers + (layers - 1);       // q, k, v of every layer; gate and up of all but the last
      CHECK(checkWgmmaSplitLaunches(l, plain, keys) == od);
      CHECK(checkWgmmaSplitLaunches(l, fused, keys) == qkv_gu);
      CHECK(checkWgmmaSplitLaunches(l, both, keys) == od + qkv_gu);
    }
    // Plans of at most 32 rows have no call for it; the kI8 planes of other targets no kF16 plane.
    for (const SmallBatchForms& on : {plain, fused, both}) {
      CHECK(checkWgmmaSplitLaunches(load(path, true, true, 32), on, keys) == 0);
      CHECK(checkWgmmaSplitLaunches(load(path, true, false), on, keys) == 0);
    }
  }
  size_t split = 0, one = 0;
  for (const auto& [key, uses] : keys) (key.rfind("wgmma_split_", 0) == 0 ? split : one) += 1;
  CHECK(split > 0);
  CHECK(one > 0);
  // At the default min_stages (kWgmmaSplitMinStages) the 1024-wide model's o and down take the Hopper launches
  // unsplit: minfer_wgmma_matmul on the 64 × 64 tile.
  std::map<std::string, size_t> unsplit;
  CHECK(checkWgmmaSplitLaunches(load(wide, true, true, 512), {.wgmma_split = true}, unsplit) == 2);
  CHECK(!unsplit.empty());
  for (const auto& [key, uses] : unsplit) CHECK(key.rfind("wgmma_split_", 0) != 0);
  // The default rule on the 7B's shapes (kWgmmaSplitMinStages, measured on an H100): down (K 18944, 296 stages) in 3,
  // o, q, k and gate (K 3584, 56 stages) not at all; at 8 stages o would take 4 (264 slots over 56 weight tiles).
  CHECK(kern::wgmmaSplits(3584, 18944) == 3);
  CHECK(kern::wgmmaSplits(3584, 3584) == 1);
  CHECK(kern::wgmmaSplits(512, 3584) == 1);
  CHECK(kern::wgmmaSplits(18944, 3584) == 1);
  CHECK(kern::wgmmaSplits(3584, 3584, 8) == 4);
  CHECK(kern::wgmmaSplits(1024, 1024, 8) == 2);
  CHECK(kern::wgmmaSplits(1024, 1024) == 1);
  // On by default for the plain matmuls (BENCHMARKS.md, issue 14: +3.7% at 64 sequences), off for the fused ones.
  CHECK(CodegenOptions{}.wgmma_split);
  CHECK(minfer::CompileOptions{}.wgmma_split);
  CHECK_FALSE(CodegenOptions{}.wgmma_split_fused);
}

// With fuse_prefill_pair, gate and up of each layer beside a Hopper kF16 plane likewise: the gate step with 1 follower,
// its small-batch launches minfer_mmq_blocks2 (checkMmqbSegmentsStep; the first layer's compiled with NVRTC), q, k and
// v still the triple; the last layer's gate and up stay apart (the last-token tail, which runs one row, fuses none).
// Not with max_batch below kMmqbFromRows, nor in a model with experts (whose FFN is no MatMul pair), nor for q and k
// when fuse_qkv is off (the pair rule takes the gate and up of a GLU only); on in the default options.
TEST_CASE("prefill gate and up beside a Hopper kF16 plane: with fuse_prefill_pair one minfer_mmq_blocks2 launch") {
  if (!test::haveFixtures()) return;
  const GemvFusions gemv{.qkv = true, .glu = false, .pair = true, .norm = true, .prefill_pair = true};
  const Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true);
  const std::vector<model::StepDesc>& steps = l.desc.plan.prefill;
  const size_t tail = lastTokenTailBegin(steps, l.desc.plan.logits);
  auto fusion = planFusion(l.desc, l.layouts, PlanVariant::kPrefill, tail, gemv, true);
  REQUIRE_MESSAGE(static_cast<bool>(fusion), llvm::toString(fusion.takeError()));
  size_t pairs = 0, triples = 0, tail_pairs = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].op != fb::OpKind::MatMul || fusion->fused[i]) continue;
    CAPTURE(steps[i].name);
    if (steps[i].name.find("attn_q") != std::string::npos) {
      CHECK(fusion->followers[i] == 2);
      ++triples;
    } else if (steps[i].name.find("ffn_gate") != std::string::npos && i >= tail) {
      CHECK(fusion->followers[i] == 0);
      ++tail_pairs;
    } else if (steps[i].name.find("ffn_gate") != std::string::npos) {
      REQUIRE(fusion->followers[i] == 1);
      REQUIRE(steps[i + 1].name.find("ffn_up") != std::string::npos);
      CHECK(fusion->fused[i + 1] == 1);
      checkMmqbSegmentsStep(l, i, 2, pairs == 0);
      ++pairs;
    } else {
      CHECK(fusion->followers[i] == 0);  // o, down, the output head
    }
  }
  CHECK(pairs == l.desc.config.n_layer - 1);
  CHECK(tail_pairs == 1);
  CHECK(triples == l.desc.config.n_layer);
  const Loaded small = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf", true, true, 4);
  checkNoPrefillMatmulFusion(small, gemv);
  const Loaded moe = load(synthQwen3MoeQ4KM(), true, true);
  checkNoPrefillMatmulFusion(moe, gemv);
  // fuse_qkv off: q, k and v stay apart (two of them are MatMuls of one input, but no GLU's gate and up).
  GemvFusions no_qkv = gemv;
  no_qkv.qkv = false;
  auto f = planFusion(l.desc, l.layouts, PlanVariant::kPrefill, tail, no_qkv, true);
  REQUIRE_MESSAGE(static_cast<bool>(f), llvm::toString(f.takeError()));
  size_t gate_pairs = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].op != fb::OpKind::MatMul || f->fused[i]) continue;
    CAPTURE(steps[i].name);
    const bool gate = steps[i].name.find("ffn_gate") != std::string::npos && i < tail;
    CHECK(f->followers[i] == (gate ? 1u : 0u));
    gate_pairs += gate;
  }
  CHECK(gate_pairs == l.desc.config.n_layer - 1);
  CHECK(CodegenOptions{}.fuse_prefill_pair);
  CHECK(minfer::CompileOptions{}.fuse_prefill_pair);
}

TEST_CASE("phi3 fixtures: fused q|k|v and gate|up read through views, pitches equal to their buffers") {
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED: built without NVRTC");
    return;
  }
  if (!test::haveFixtures()) return;
  for (const char* model : {"tiny-phi3-F32.gguf", "tiny-phi3-Q4_K_M.gguf"}) {
    CAPTURE(model);
    const Loaded l = load(test::fixturesDir() + "/arch/models/" + model);
    const KernelSet set = generate(l, {"sm_90"}, MINFER_TEST_KERNEL_CACHE);
    checkSet(l, set, {"sm_90"});
    size_t views = 0;
    for (const KernelImageData& img : set.images)
      views += !optionValue(img, "ROPE_Q_PITCH").empty() + !optionValue(img, "ATT_K_PITCH").empty() +
               !optionValue(img, "ATT_Q_PITCH").empty() + !optionValue(img, "EW_A_PITCH").empty() +
               !optionValue(img, "PA_Q_PITCH").empty();
    // rope, kv_store, the prefill attention and swiglu, and the paged rope, kv store and attention (1.6; the
    // decode plan's are the same specializations: these heads are not whole blocks of 32, so no q8 form is
    // fused into the decode attention): one specialization each
    CHECK(views == 7);
  }
}

// In decode the MoeFfn and its MoeRoute run in the router MatMul's launches: router + route + sort, gate/up,
// down + combine.
TEST_CASE("qwen3moe fixtures get the MoE kernels for sm_90: router, sort, gate/up, down, combine on the expert axis") {
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED: built without NVRTC");
    return;
  }
  if (!test::haveFixtures()) return;
  for (const std::string name : {"tiny-qwen3moe-F32.gguf", "tiny-qwen3moe-Q8_0.gguf", "tiny-qwen3moe-Q4_K_M.gguf"}) {
    CAPTURE(name);
    const Loaded l = load(test::fixturesDir() + "/arch/models/" + name);
    const KernelSet set = generate(l, {"sm_90"}, MINFER_TEST_KERNEL_CACHE);
    checkSet(l, set, {"sm_90"});  // entries per step, every PITCH / EPITCH against its argument's table
    size_t moe_steps = 0;
    for (size_t i = 0; i < l.desc.plan.decode.size(); ++i) {
      const model::StepDesc& st = l.desc.plan.decode[i];
      if (st.op != fb::OpKind::MoeFfn) continue;
      ++moe_steps;
      // In decode the MoeFfn and the MoeRoute run in the router MatMul's launches (minfer_moe_router_sort first: the
      // router weight and x in; the logits, ids and weights out, as the MoeRoute and MoeFfn read them; the sort's
      // scratch, one counter word, and the token count, which the kernel requires to be 1).
      REQUIRE(i > 1);
      REQUIRE(set.decode_fused[i] != 0);
      REQUIRE(set.decode_fused[i - 1] != 0);
      const model::StepDesc &route = l.desc.plan.decode[i - 1], &router = l.desc.plan.decode[i - 2];
      REQUIRE(route.op == fb::OpKind::MoeRoute);
      REQUIRE(router.op == fb::OpKind::MatMul);
      const std::vector<LaunchRecord>& launches = set.decode[i - 2];
      REQUIRE(launches.size() == 3);
      const LaunchRecord& rs = launches[0];
      CHECK(set.images[rs.images[0]].entry == "minfer_moe_router_sort");
      REQUIRE(rs.args.size() == 9);
      CHECK(rs.args[0].kind == fb::ArgKind::Weight);
      CHECK(rs.args[0].tensor == router.weights[0]);
      CHECK(rs.args[2].buffer == st.inputs[0]);
      CHECK(rs.args[3].buffer == router.outputs[0]);
      CHECK(rs.args[3].buffer == route.inputs[0]);
      CHECK(rs.args[3].access == fb::Access::Write);
      CHECK(rs.args[4].buffer == st.inputs[1]);
      CHECK(rs.args[4].access == fb::Access::Write);
      CHECK(rs.args[5].buffer == st.inputs[2]);
      CHECK(rs.args[5].access == fb::Access::Write);
      CHECK(rs.args[6].kind == fb::ArgKind::Scratch);
      CHECK(rs.args[7].kind == fb::ArgKind::Counters);
      CHECK(rs.args[7].bytes == 4u);
      CHECK(rs.args[8].kind == fb::ArgKind::TokenCount);
      // gate/up and down read every expert weight through planes with the step's expert axis.
      for (size_t li = 1; li < launches.size(); ++li) {
        const LaunchRecord& r = launches[li];
        bool reads_experts = false;
        for (const KernelArgDesc& a : r.args)
          if (a.kind == fb::ArgKind::Weight) {
            reads_experts = true;
            CHECK(a.plane.experts == 8);
            CHECK(a.plane.expert_pitch == a.plane.rows / 8 * a.plane.row_pitch);
            // Q4_K / Q6_K experts are read from their GGUF blocks (their only plane), other quantized
            // types from kI8 + kScale, float ones from their dense plane.
            const auto type = static_cast<GgmlType>(a.plane.ggml_type);
            if (type == GgmlType::Q4_K || type == GgmlType::Q6_K) CHECK(a.plane.kind == PlaneKind::kBlocks);
            else CHECK(a.plane.kind != PlaneKind::kBlocks);
          }
        // gate/up and down launch only the chosen experts: n_tokens·K of the 8 (top-2) until all 8.
        if (reads_experts) {
          CHECK(r.rule.at(1).grid.y == 2);
          CHECK(r.rule.at(3).grid.y == 6);
          CHECK(r.rule.at(l.desc.plan.max_batch).grid.y == 8);
        }
      }
      // The decode down launch also combines (minfer_moe_down_combine): it reads the ids and weights, writes the
      // step's output, and counts its row tiles in ⌈E / rows⌉ counter words (moeDownRows of its plane set).
      const LaunchRecord& dc = launches[2];
      REQUIRE(dc.args.size() == 9);
      CHECK(dc.args[4].kind == fb::ArgKind::Activation);
      CHECK(dc.args[4].buffer == st.inputs[1]);
      CHECK(dc.args[5].buffer == st.inputs[2]);
      CHECK(dc.args[6].buffer == st.outputs[0]);
      CHECK(dc.args[6].access == fb::Access::Write);
      CHECK(dc.args[7].kind == fb::ArgKind::Counters);
      const bool down_blocks = dc.args[0].plane.kind == PlaneKind::kBlocks;
      CHECK(dc.args[7].bytes == uint64_t{kern::ceilDiv(st.cols, kern::moeDownRows(down_blocks, st.rows))} * 4);
      CHECK(dc.args[8].kind == fb::ArgKind::TokenCount);
    }
    CHECK(moe_steps == 2);
    // MoeFfn uses step scratch, so the last-token tail starts after the last one.
    const auto& steps = l.desc.plan.prefill;
    size_t after_moe = 0;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].op == fb::OpKind::MoeFfn) after_moe = i + 1;
    CHECK(lastTokenTailBegin(steps, l.desc.plan.logits) == after_moe);
  }
}

TEST_CASE("a multi-arch target list gives one image per arch, arch-major per kernel") {
  if (!haveNvrtc() || !test::haveFixtures()) return;
  const std::vector<std::string> targets = {"sm_80", "sm_86", "sm_89", "sm_90"};
  const Loaded l = load(test::fixturesDir() + "/models/stories260K-Q8_0.gguf");  // quantized + F16 matmuls
  const KernelSet set = generate(l, targets, MINFER_TEST_KERNEL_CACHE);
  checkSet(l, set, targets);
  // The same spec for different archs differs only in the arch suffix and machine code.
  for (size_t i = 0; i + 3 < set.images.size(); i += 4) {
    const std::string base = set.images[i].key.substr(0, set.images[i].key.rfind('_'));
    for (size_t a = 1; a < 4; ++a) {
      CHECK(set.images[i + a].key == base + "_" + archTag(targets[a]));
      CHECK(set.images[i + a].cubin != set.images[i].cubin);
    }
  }
}

TEST_CASE("keys are deterministic and the disk cache hits on the second compile") {
  if (!haveNvrtc() || !test::haveFixtures()) return;
  const std::string dir = test::scratchDir() + "/kernel-cache";
  std::filesystem::remove_all(dir);
  const Loaded l = load(test::fixturesDir() + "/models/stories260K-Q8_0.gguf");
  const KernelSet first = generate(l, {"sm_90"}, dir);
  CHECK(first.stats.cache_hits == 0);
  CHECK(first.stats.compiled == first.images.size());
  CHECK(first.stats.cache_write_failures == 0);
  size_t entries = 0, locks = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    CHECK_MESSAGE((ext == ".kimg" || ext == ".lock"), e.path());  // no temporary files left behind
    entries += ext == ".kimg";
    locks += ext == ".lock";
  }
  CHECK(entries == first.images.size());
  CHECK(locks == first.images.size());  // each compiled entry was compiled under its lock

  const KernelSet second = generate(l, {"sm_90"}, dir);
  CHECK(second.stats.cache_hits == second.images.size());
  CHECK(second.stats.compiled == 0);
  REQUIRE(second.images.size() == first.images.size());
  for (size_t i = 0; i < first.images.size(); ++i) {
    CHECK(second.images[i].key == first.images[i].key);
    CHECK(second.images[i].cubin == first.images[i].cubin);
    CHECK(second.images[i].ptx == first.images[i].ptx);
    CHECK(second.images[i].options == first.images[i].options);
  }
  CHECK(describe(second.prefill) == describe(first.prefill));
  CHECK(describe(second.decode) == describe(first.decode));

  // Corrupted entries (truncated, or their size fields wrong) read as misses and are recompiled,
  // giving the same bytes; the other entries still hit.
  size_t corrupted = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".kimg" && corrupted < 3) std::filesystem::resize_file(e.path(), 20 + 7 * corrupted++);
  const KernelSet third = generate(l, {"sm_90"}, dir);
  CHECK(third.stats.compiled == corrupted);
  CHECK(third.stats.cache_hits == third.images.size() - corrupted);
  for (size_t i = 0; i < first.images.size(); ++i) CHECK(third.images[i].cubin == first.images[i].cubin);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an NVRTC failure reports the key, the arch and the compiler log") {
  if (!haveNvrtc()) return;
  KernelSpec spec;
  spec.key = "broken_probe_n7";
  spec.source = "kernels/common.cuh";
  spec.entry = "minfer_broken";
  spec.inline_source =
      "#include \"kernels/common.cuh\"\nextern \"C\" __global__ void minfer_broken(int* p) { p[0] = undeclared_name_x; }\n";
  auto r = compileKernel(spec, "sm_90");
  REQUIRE_FALSE(static_cast<bool>(r));
  const std::string msg = llvm::toString(r.takeError());
  CHECK_MESSAGE(msg.find("broken_probe_n7_sm90") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("undeclared_name_x") != std::string::npos, msg);  // from NVRTC's log
  CHECK_MESSAGE(msg.find("error") != std::string::npos, msg);

  spec.inline_source = "#include \"kernels/common.cuh\"\nextern \"C\" __global__ void minfer_broken(int* p) { p[0] = 1; }\n";
  auto ok = compileKernel(spec, "sm_90");
  CHECK_MESSAGE(static_cast<bool>(ok), (ok ? "" : llvm::toString(ok.takeError())));

  llvm::Error old = checkArch("sm_75");
  REQUIRE(static_cast<bool>(old));
  CHECK(llvm::toString(std::move(old)).find("sm_80") != std::string::npos);
  llvm::Error bad = checkArch("gfx90a");
  CHECK(static_cast<bool>(bad));
  llvm::consumeError(std::move(bad));
}

// The prefill attention takes the tensor-core form for every head size the supported models use (64 … 128;
// 256: gemma2, gemma3) and the SIMT form for head sizes that are not multiples of 16; the large-head form's
// shared memory lets two blocks share an SM (228 KiB, 1 KiB reserved per block). Each tensor-core form
// compiles for sm_90, and heads 128 and 256 without a register spill (ptxas --warn-on-spills as an error):
// plain, with gemma2's scale, cap, window and ring, and (256) through a query column view. (Heads 64, 96 and 112
// do spill 4–20 bytes under NVRTC 13.0, ptxas holding them to 128 and 168 registers: measured, not asserted.)
TEST_CASE("attention prefill: tensor cores for head sizes 64 to 128 and 256 (heads 128 and 256 without spills)") {
  for (unsigned d : {64u, 80u, 96u, 112u, 128u, 144u, 192u, 256u}) {
    CAPTURE(d);
    CHECK(kern::attnPrefillUsesMma(d));
    CHECK(kern::attnMmaQInSmem(d) == (d > 128));
    CHECK(2 * (kern::attnPrefillSmemBytes(d) + 1024) <= 228u * 1024u);
  }
  for (unsigned d : {8u, 36u, 72u, 100u, 200u}) CHECK_FALSE(kern::attnPrefillUsesMma(d));
  // 2 stages × (K, V) × 32 keys × (256 + 8) halves, then 64 Q rows of (256 + 8) halves.
  CHECK(kern::attnPrefillSmemBytes(256) == 2 * 2 * 32 * 264 * 2 + 64 * 264 * 2);
  CHECK(kern::attnPrefillSmemBytes(128) == 2 * 2 * 64 * 136 * 2);
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED (compilation): built without NVRTC");
    return;
  }
  struct Variant {
    unsigned d;
    std::vector<std::pair<std::string, std::string>> extra;
  };
  const std::vector<std::pair<std::string, std::string>> gemma2 = {
      {"ATT_SCALE", "0.0625f"}, {"ATT_SOFTCAP", "50.0f"}, {"ATT_WINDOW", "4096"}, {"ATT_KV_RING", "4607"}};
  std::vector<Variant> variants;
  for (unsigned d : {64u, 80u, 96u, 112u, 128u, 256u}) variants.push_back({d, {}});
  variants.push_back({128, gemma2});
  variants.push_back({256, gemma2});
  variants.push_back({256, {{"ATT_Q_PITCH", "4102"}}});
  for (const Variant& v : variants) {
    const bool no_spills = v.d == 128 || v.d == 256;
    KernelSpec spec;
    spec.key = "attn_prefill_spill_probe_d" + std::to_string(v.d) + (v.extra.empty() ? "" : "_" + v.extra[0].first);
    spec.source = "kernels/attention.cuh";
    spec.entry = "minfer_attn_prefill";
    spec.defines = {
        {"ATT_NHEAD", "16"}, {"ATT_NHEAD_KV", "8"}, {"ATT_HEAD_DIM", std::to_string(v.d)}, {"ATT_PREFILL", "1"}};
    spec.defines.insert(spec.defines.end(), v.extra.begin(), v.extra.end());
    if (no_spills) spec.flags = {"-Xptxas", "--warn-on-spills", "-Xptxas", "--warning-as-error"};
    CAPTURE(spec.key);
    auto r = compileKernel(spec, "sm_90");
    CHECK_MESSAGE(static_cast<bool>(r), (r ? "" : llvm::toString(r.takeError())));
  }
}

// A Q4_K or Q6_K matmul weight given a kBlocks plane with 16-byte aligned blocks (the table the planner
// is to write: group pitch alignUp(block bytes, 16), row pitch blocks · group pitch) is read from it by the
// decode GEMV: minfer_gemv_blocks, whose Weight argument is that plane and whose -D constants are its
// table's; prefill keeps MMQ on the kI8 plane. A kBlocks plane with 210-byte Q6_K blocks (unaligned) keeps
// the packed/i8 GEMV.
TEST_CASE("decode matmul on a Q4_K/Q6_K weight with an aligned kBlocks plane uses gemv_blocks") {
  if (!test::haveFixtures()) return;
  Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf");
  auto addBlocks = [&](bool aligned) {
    for (planes::TensorLayout& w : l.layouts) {
      const GgmlType t = w.desc.type;
      if (w.desc.role != planes::TensorRole::kMatMul || (t != GgmlType::Q4_K && t != GgmlType::Q6_K)) continue;
      const int old = w.find(PlaneKind::kBlocks);
      if (old >= 0) w.planes.erase(w.planes.begin() + old);
      StrideTable b;
      b.kind = PlaneKind::kBlocks;
      b.elem = ElemType::kU8;
      b.rows = w.desc.rows;
      b.cols = w.desc.cols;
      b.group_size = 256;
      const uint32_t bytes = ggmlTypeTraits(t).type_size;
      b.group_pitch = aligned ? static_cast<uint32_t>(alignUp(bytes, 16)) : bytes;
      b.row_pitch = w.desc.cols / 256 * b.group_pitch;
      b.ggml_type = static_cast<uint32_t>(t);
      w.planes.push_back(b);
    }
  };
  for (bool aligned : {true, false}) {
    CAPTURE(aligned);
    addBlocks(aligned);
    std::set<GgmlType> seen;
    for (PlanVariant v : {PlanVariant::kPrefill, PlanVariant::kDecode}) {
      const auto& steps = v == PlanVariant::kPrefill ? l.desc.plan.prefill : l.desc.plan.decode;
      for (size_t i = 0; i < steps.size(); ++i) {
        if (steps[i].op != fb::OpKind::MatMul) continue;
        const planes::TensorLayout& w = l.layouts[steps[i].weights[0]];
        if (w.desc.role != planes::TensorRole::kMatMul) continue;
        CAPTURE(steps[i].name);
        auto launches = launchesForStep(l.desc, l.layouts, v, i);
        REQUIRE_MESSAGE(static_cast<bool>(launches), llvm::toString(launches.takeError()));
        REQUIRE(launches->size() == 1);
        const KernelLaunch& k = (*launches)[0];
        const int b = w.find(PlaneKind::kBlocks);
        if (v == PlanVariant::kPrefill || b < 0) {
          CHECK(k.spec.entry == (v == PlanVariant::kPrefill ? "minfer_mmq" : "minfer_gemv"));
          continue;
        }
        const StrideTable& t = w.planes[static_cast<size_t>(b)];
        if (!aligned && w.desc.type == GgmlType::Q6_K) {
          CHECK(k.spec.entry == "minfer_gemv");
          continue;
        }
        seen.insert(w.desc.type);  // (unaligned Q4_K blocks are 144 bytes: aligned anyway)
        CHECK(k.spec.entry == "minfer_gemv_blocks");
        CHECK(k.spec.source == "kernels/gemv_blocks.cuh");
        REQUIRE(!k.args.empty());
        CHECK(k.args[0].name == "w");
        CHECK(k.args[0].kind == fb::ArgKind::Weight);
        CHECK(k.args[0].plane.kind == PlaneKind::kBlocks);
        CHECK(k.args[0].plane.row_pitch == t.row_pitch);
        CHECK(k.args[0].plane.group_pitch == t.group_pitch);
        CHECK(k.spec.define("GEMVB_PITCH") == std::to_string(t.row_pitch));
        CHECK(k.spec.define("GEMVB_GROUP_PITCH") == std::to_string(t.group_pitch));
        CHECK(k.spec.define("GEMVB_TYPE") == std::to_string(t.ggml_type));
        CHECK(k.spec.define("GEMVB_N") == std::to_string(w.desc.rows));
        CHECK(k.spec.define("GEMVB_K") == std::to_string(w.desc.cols));
        const kern::GemvBlocksShape shape =
            kern::gemvBlocksShape(static_cast<unsigned>(w.desc.rows), static_cast<unsigned>(w.desc.cols));
        CHECK(k.spec.define("GEMVB_ROWS") == std::to_string(shape.rows));
        CHECK(k.spec.define("GEMVB_ROW_WARPS") == std::to_string(shape.warps));
        CHECK(k.spec.define("GEMVB_UNROLL") == std::to_string(shape.unroll));
        // w, bias, xq, xmeta, out; CTAs of 4 warps, each 4 / warps · rows rows.
        REQUIRE(k.args.size() == 5);
        CHECK(k.args[2].kind == fb::ArgKind::Q8Values);
        CHECK(k.args[3].kind == fb::ArgKind::Q8Meta);
        CHECK(k.args[4].kind == fb::ArgKind::Activation);
        const uint64_t per_cta = 4 / shape.warps * shape.rows;
        CHECK(k.rule.at(1).grid.x == (w.desc.rows + per_cta - 1) / per_cta);
        CHECK(k.rule.at(1).block.x == 128);
      }
    }
    CHECK(seen.count(GgmlType::Q4_K) == 1);
    if (aligned) CHECK(seen.count(GgmlType::Q6_K) == 1);
  }
}

// Removing the QuantizeAct steps and the extra MatMul inputs gives back the original plan, and every
// quantized MatMul reads a q8 buffer written from its own input with no write to that input between.
TEST_CASE("activation-quantization rewrite keeps the CPU plan and feeds every quantized matmul") {
  if (!test::haveFixtures()) return;
  for (const char* name : {"tiny-llama-Q4_K_M.gguf", "tiny-qwen2-Q8_0.gguf", "tiny-llama-F32.gguf",
                           "stories260K-Q8_0.gguf"}) {
    CAPTURE(name);
    const std::string path = test::fixturesDir() + "/models/" + name;
    const Loaded before = load(path, /*rewrite=*/false);
    const Loaded after = load(path, /*rewrite=*/true);
    for (bool prefill : {true, false}) {
      const auto& a = prefill ? after.desc.plan.prefill : after.desc.plan.decode;
      const auto& b = prefill ? before.desc.plan.prefill : before.desc.plan.decode;
      std::vector<model::StepDesc> stripped;
      size_t quantize_steps = 0, quantized_matmuls = 0;
      std::map<uint32_t, uint32_t> source_of_q8;  // q8 buffer → buffer it was quantized from, while valid
      for (const model::StepDesc& s : a) {
        if (s.op == fb::OpKind::QuantizeAct) {
          ++quantize_steps;
          REQUIRE(s.inputs.size() == 1);
          REQUIRE(s.outputs.size() == 1);
          CHECK(after.desc.plan.buffers[s.outputs[0]].type == fb::BufferType::I8);
          CHECK(after.desc.plan.buffers[s.outputs[0]].width == after.desc.plan.buffers[s.inputs[0]].width);
          source_of_q8[s.outputs[0]] = s.inputs[0];
          continue;
        }
        model::StepDesc copy = s;
        if (isQuantizedMatMul(after, s)) {
          ++quantized_matmuls;
          REQUIRE(s.inputs.size() == 2);
          REQUIRE(source_of_q8.count(s.inputs[1]));
          CHECK(source_of_q8[s.inputs[1]] == s.inputs[0]);
          copy.inputs.resize(1);
        } else if (s.op == fb::OpKind::MatMul) {
          CHECK(s.inputs.size() == 1);  // float weights read f32 activations only
        }
        for (uint32_t o : s.outputs)  // a write invalidates q8 copies of that buffer
          for (auto it = source_of_q8.begin(); it != source_of_q8.end();)
            it = it->second == o ? source_of_q8.erase(it) : std::next(it);
        stripped.push_back(std::move(copy));
      }
      REQUIRE(stripped.size() == b.size());
      for (size_t i = 0; i < b.size(); ++i) {
        CHECK(stripped[i].op == b[i].op);
        CHECK(stripped[i].inputs == b[i].inputs);
        CHECK(stripped[i].outputs == b[i].outputs);
        CHECK(stripped[i].weights == b[i].weights);
        CHECK(stripped[i].name == b[i].name);
      }
      if (quantized_matmuls == 0) CHECK(quantize_steps == 0);
      else CHECK(quantize_steps < quantized_matmuls);  // q/k/v and gate/up share one quantization
    }
    // Buffers are only appended.
    REQUIRE(after.desc.plan.buffers.size() >= before.desc.plan.buffers.size());
    for (size_t i = 0; i < before.desc.plan.buffers.size(); ++i)
      CHECK(after.desc.plan.buffers[i].name == before.desc.plan.buffers[i].name);
  }
}

}  // namespace
TEST_CASE("the last-token tail is everything after the last attention, for every fixture model") {
  for (const std::string& path : fixtureModels()) {
    CAPTURE(path);
    const Loaded l = load(path);
    const auto& steps = l.desc.plan.prefill;
    size_t after_attention = 0;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].op == fb::OpKind::Attention) after_attention = i + 1;
    REQUIRE(after_attention > 0);
    const size_t begin = lastTokenTailBegin(steps, l.desc.plan.logits);
    CHECK(begin == after_attention);
    CHECK(steps.back().outputs[0] == l.desc.plan.logits);
    // Without a logits-writing end there is no tail; a plan of row-wise steps only has none either.
    CHECK(lastTokenTailBegin(steps, l.desc.plan.logits + 1) == steps.size());
    const std::vector<model::StepDesc> tail_only(steps.begin() + static_cast<long>(begin), steps.end());
    CHECK(lastTokenTailBegin(tail_only, l.desc.plan.logits) == tail_only.size());
  }
}

TEST_CASE("launch fusion: QuantizeAct into its producer, RmsNorm into the residual Add before it, the decode GEMV chains; off, none is fused") {
  if (!test::haveFixtures()) return;
  const Loaded l = load(test::fixturesDir() + "/models/tiny-qwen2-Q4_K_M.gguf");
  const std::string cache = test::scratchDir() + "/kernel-cache-fusion";
  for (bool fuse : {true, false}) {
    CAPTURE(fuse);
    CodegenOptions o;
    o.targets = {"sm_90"};
    o.cache_dir = cache;
    o.fuse_launches = fuse;
    // Every decode GEMV fusion but GEMVB_NORM (test_codegen_fusion.cpp; the GLU's is off by default).
    o.fuse_qkv = o.fuse_glu = true;
    o.fuse_norm = false;
    auto set = generateKernels(l.desc, l.layouts, o);
    REQUIRE_MESSAGE(static_cast<bool>(set), llvm::toString(set.takeError()));
    for (bool prefill : {true, false}) {
      CAPTURE(prefill);
      const auto& steps = prefill ? l.desc.plan.prefill : l.desc.plan.decode;
      const auto& launches = prefill ? set->prefill : set->decode;
      const auto& fused = prefill ? set->prefill_fused : set->decode_fused;
      REQUIRE(launches.size() == steps.size());
      REQUIRE(fused.size() == steps.size());
      const size_t tail = prefill ? lastTokenTailBegin(steps, l.desc.plan.logits) : steps.size();
      // The rule, restated: step i fuses into step i − 1 when i − 1 produces what i reads and the pair is
      // (RmsNorm | SwiGlu | decode Attention, QuantizeAct) or (Add, RmsNorm), never at the tail's first step.
      // A QuantizeAct after a fused RmsNorm rides along into the Add's launch. In decode, MatMul gate,
      // MatMul up (same inputs, Q4_K / Q6_K kBlocks planes of one type), SwiGlu of the two and its
      // QuantizeAct run as the gate MatMul's one launch.
      // And MatMul q, k, v (same inputs, Q4_K / Q6_K kBlocks planes), the Rope of q and k and the Attention
      // of the three run as the q MatMul's launches.
      size_t quant_pairs = 0, add_norms = 0, glu_chains = 0, qkv_chains = 0;
      std::vector<bool> in_glu(steps.size(), false), in_qkv(steps.size(), false);
      for (size_t i = 0; !prefill && i + 4 < steps.size(); ++i) {
        const model::StepDesc &q = steps[i], &k = steps[i + 1], &v = steps[i + 2], &rope = steps[i + 3], &att = steps[i + 4];
        const bool mats = q.op == fb::OpKind::MatMul && k.op == fb::OpKind::MatMul && v.op == fb::OpKind::MatMul &&
                          q.inputs == k.inputs && q.inputs == v.inputs && readsBlocksInDecode(l, q) &&
                          readsBlocksInDecode(l, k) && readsBlocksInDecode(l, v);
        const bool chain = mats && rope.op == fb::OpKind::Rope && att.op == fb::OpKind::Attention &&
                           rope.inputs == std::vector<uint32_t>{q.outputs[0], k.outputs[0]} &&
                           att.inputs == std::vector<uint32_t>{q.outputs[0], k.outputs[0], v.outputs[0]};
        if (chain) in_qkv[i + 1] = in_qkv[i + 2] = in_qkv[i + 3] = in_qkv[i + 4] = true, ++qkv_chains;
      }
      for (size_t i = 0; !prefill && i + 3 < steps.size(); ++i) {
        const model::StepDesc &g = steps[i], &u = steps[i + 1], &glu = steps[i + 2];
        const bool chain = g.op == fb::OpKind::MatMul && u.op == fb::OpKind::MatMul && glu.op == fb::OpKind::SwiGlu &&
                           g.inputs == u.inputs && glu.inputs == std::vector<uint32_t>{g.outputs[0], u.outputs[0]} &&
                           steps[i + 3].op == fb::OpKind::QuantizeAct && steps[i + 3].inputs[0] == glu.outputs[0] &&
                           readsBlocksInDecode(l, g) && readsBlocksInDecode(l, u) &&
                           l.layouts[g.weights[0]].desc.type == l.layouts[u.weights[0]].desc.type;
        if (chain) in_glu[i + 1] = in_glu[i + 2] = in_glu[i + 3] = true, ++glu_chains;
      }
      size_t owner = 0;  // the step whose launches run step i
      for (size_t i = 0; i < steps.size(); ++i) {
        CAPTURE(steps[i].name);
        const bool reads_prev = i > 0 && i != tail && !steps[i].inputs.empty() &&
                                steps[i].inputs[0] == steps[i - 1].outputs[0];
        const fb::OpKind prev = i > 0 ? steps[i - 1].op : fb::OpKind::Embed;
        const bool quant_pair = reads_prev && steps[i].op == fb::OpKind::QuantizeAct &&
                                (prev == fb::OpKind::RmsNorm || prev == fb::OpKind::SwiGlu ||
                                 (prev == fb::OpKind::Attention && !prefill && steps[i - 1].head_dim % 32 == 0));
        const bool add_norm = reads_prev && steps[i].op == fb::OpKind::RmsNorm && prev == fb::OpKind::Add;
        const bool is_fused = fuse && (quant_pair || add_norm || in_glu[i] || in_qkv[i]);
        quant_pairs += quant_pair;
        add_norms += add_norm;
        CHECK((fused[i] != 0) == is_fused);
        CHECK(launches[i].empty() == is_fused);
        if (!is_fused) {
          owner = i;
          continue;
        }
        REQUIRE(!launches[owner].empty());
        const LaunchRecord& r = launches[owner].back();
        const std::string& key = set->images[r.images[0]].key;
        if (in_qkv[i]) {
          // gemv_blocks.cuh GEMVB_QKV, then attn_decode and attn_combine: together they write the step's
          // outputs, the QKV GEMV also the layer's K and V cache (no kv_store launch).
          REQUIRE(launches[owner].size() == 3);
          CHECK(set->images[launches[owner][0].images[0]].key.find("gemv_qkv") == 0);
          for (uint32_t out : steps[i].outputs) {
            bool writes = false;
            for (const LaunchRecord& lr : launches[owner])
              for (const KernelArgDesc& a : lr.args)
                writes |= a.kind == fb::ArgKind::Activation && a.access == fb::Access::Write && a.buffer == out;
            CHECK(writes);
          }
          int cache_writes = 0;
          for (const KernelArgDesc& a : launches[owner][0].args)
            cache_writes += (a.kind == fb::ArgKind::KCache || a.kind == fb::ArgKind::VCache) && a.access == fb::Access::Write;
          CHECK(cache_writes == 2);
          continue;
        }
        if (in_glu[i]) {
          // gemv_blocks.cuh GEMVB_GLU: writes the step's outputs, and counts in N / 32 words.
          CHECK(key.find("gemv_swiglu") == 0);
          bool writes = false;
          for (const KernelArgDesc& a : r.args)
            writes |= a.kind != fb::ArgKind::Weight && a.access == fb::Access::Write && a.buffer == steps[i].outputs[0];
          CHECK(writes);
          CHECK(r.args.back().kind == fb::ArgKind::Counters);
          CHECK(r.args.back().bytes == l.layouts[steps[owner].weights[0]].desc.rows / 32 * 4);
          continue;
        }
        if (add_norm) {
          // rms_norm.cuh RMS_ADD: the Add's two operands and its sum, then the norm's weight and output.
          CHECK(key.find("rms_norm") == 0);
          CHECK(key.find("_add") != std::string::npos);
          REQUIRE(r.args.size() >= 6);
          CHECK(r.args[0].buffer == steps[owner].inputs[0]);
          CHECK(r.args[1].buffer == steps[owner].inputs[1]);
          CHECK(r.args[2].buffer == steps[owner].outputs[0]);
          CHECK(r.args[2].access == fb::Access::Write);
          CHECK(r.args[3].kind == fb::ArgKind::Weight);
          CHECK(r.args[4].buffer == steps[i].outputs[0]);
          continue;
        }
        // The owner's last launch writes the QuantizeAct's q8 buffer (values, then meta): a _q8 kernel.
        int q8_args = 0;
        for (size_t a = 0; a + 1 < r.args.size(); ++a)
          if (r.args[a].kind == fb::ArgKind::Q8Values) {
            CHECK(r.args[a + 1].kind == fb::ArgKind::Q8Meta);
            CHECK(r.args[a].buffer == steps[i].outputs[0]);
            CHECK(r.args[a + 1].buffer == steps[i].outputs[0]);
            CHECK(r.args[a].access == fb::Access::Write);
            ++q8_args;
          }
        CHECK(q8_args == 1);
        CHECK(key.find("_q8") != std::string::npos);
      }
      // attn_norm, ffn_norm and the SwiGLU of every layer (decode: the attention output too); the residual
      // Adds before ffn_norm and before the next layer's attn_norm (or the output norm).
      CHECK(quant_pairs >= (prefill ? 3 : 4) * l.desc.config.n_layer);
      CHECK(glu_chains == (prefill ? 0 : l.desc.config.n_layer));
      CHECK(qkv_chains == (prefill ? 0 : l.desc.config.n_layer));
      CHECK(add_norms == 2 * l.desc.config.n_layer);
    }
  }
}

// The decode GEMV triple (gemv_blocks.cuh GEMVB_TRIPLE, under the QKV GEMV's option fuse_qkv): on a qwen3moe
// whose q, k and v are Q4_K / Q6_K — a two-layer minfer-synth qwen3-30b-a3b at 256 wide in llama.cpp's Q4_K_M mix
// (v Q4_K in layer 0, Q6_K in layer 1) — every layer's q MatMul runs one minfer_gemv_triple that writes q, k and v
// (the k and v MatMuls fused), each segment compiled with the constants of the minfer_gemv_blocks its weight runs
// alone (as the unfused plan launches it); the rest of the layer as checkSet expects. (tiny-qwen3moe-Q4_K_M's
// k and v are Q8_0, llama-quantize's choice for its 64-row matrices: no kBlocks plane, no triple there.)
TEST_CASE("decode GEMV triple: q, k, v of a q/k-norm model in one launch, each segment as its own minfer_gemv_blocks") {
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED: built without NVRTC");
    return;
  }
  const Loaded l = load(synthQwen3MoeQ4KM());
  std::optional<KernelSet> sets[2];  // fused (the defaults), every step its own launches
  for (int off = 0; off < 2; ++off) {
    CodegenOptions o;
    o.targets = {"sm_90"};
    o.cache_dir = MINFER_TEST_KERNEL_CACHE;
    o.fuse_launches = off == 0;
    auto set = generateKernels(l.desc, l.layouts, o);
    REQUIRE_MESSAGE(static_cast<bool>(set), llvm::toString(set.takeError()));
    sets[off] = std::move(*set);
  }
  checkSet(l, *sets[0], {"sm_90"});
  const auto& steps = l.desc.plan.decode;
  const KernelSet &on = *sets[0], &off = *sets[1];
  const auto image = [](const KernelSet& set, const LaunchRecord& r) -> const KernelImageData& {
    return set.images[r.images[0]];
  };
  size_t triples = 0;
  std::set<uint32_t> v_types;
  for (size_t i = 0; i + 2 < steps.size(); ++i) {
    if (on.decode[i].size() != 1 || image(on, on.decode[i][0]).entry != "minfer_gemv_triple") continue;
    CAPTURE(steps[i].name);
    ++triples;
    CHECK(steps[i].name.find("attn_q") != std::string::npos);
    CHECK(steps[i + 3].op == fb::OpKind::HeadRmsNorm);
    const LaunchRecord& r = on.decode[i][0];
    const KernelImageData& img = image(on, r);
    for (size_t s = 0; s < 3; ++s) {
      CAPTURE(s);
      const model::StepDesc& mm = steps[i + s];
      CHECK(mm.op == fb::OpKind::MatMul);
      if (s > 0) {
        CHECK(on.decode_fused[i + s] != 0);
        CHECK(on.decode[i + s].empty());
      }
      // Its output written, and its own launch (fuse_qkv off) a minfer_gemv_blocks of the segment's constants.
      bool writes = false;
      for (const KernelArgDesc& a : r.args)
        writes |= a.kind == fb::ArgKind::Activation && a.access == fb::Access::Write && a.buffer == mm.outputs[0];
      CHECK(writes);
      REQUIRE(off.decode[i + s].size() == 1);
      const KernelImageData& plain = image(off, off.decode[i + s][0]);
      CHECK(plain.entry == "minfer_gemv_blocks");
      for (const char* c : {"GEMVB_N", "GEMVB_TYPE", "GEMVB_PITCH", "GEMVB_GROUP_PITCH", "GEMVB_ROWS", "GEMVB_HAS_BIAS"})
        CHECK_MESSAGE(optionValue(img, c + std::to_string(s)) == optionValue(plain, c), c);
      for (const char* c : {"GEMVB_K", "GEMVB_ROW_WARPS", "GEMVB_UNROLL"})
        CHECK_MESSAGE(optionValue(img, c) == optionValue(plain, c), c);
      if (s == 2) v_types.insert(l.layouts[mm.weights[0]].desc.type == GgmlType::Q6_K ? 14u : 12u);
    }
    CHECK(r.rule.at(1).grid.x == kern::gemvBlocksLaunchRule(256, {2, 2, 1}).at(1).grid.x +
                                     2 * kern::gemvBlocksLaunchRule(64, {2, 2, 1}).at(1).grid.x);
    CHECK(on.decode_paged[i].empty());  // a GEMV of one row: no positions
  }
  CHECK(triples == l.desc.config.n_layer);
  CHECK(v_types == std::set<uint32_t>{12u, 14u});  // Q4_K and Q6_K segments both covered
}

// The q/k head-norm RoPE fusion (kernels/rope.cuh minfer_head_norm_rope, ops/fusion.cpp), restated: in both
// plans, wherever a HeadRmsNorm of q, a HeadRmsNorm of k (one epsilon, the Rope's heads) and the Rope of the two
// follow each other, the first step runs one minfer_head_norm_rope launch that reads and writes q and k and
// takes both norm weights, the other two are fused, and its paged launch is the same kernel at per-row positions.
// In decode the Attention after the Rope (and its QuantizeAct) is fused too: the launch is
// minfer_head_norm_rope_kv, which also reads v and writes the layer's K and V caches (ring slots where the layer
// has a ring), followed by the attention's attn_decode and attn_combine (no kv_store); the paged launches are
// minfer_head_norm_rope at per-row positions, minfer_kv_store_paged and minfer_attn_paged. Every layer of
// tiny-qwen3moe and tiny-gemma3 has the chain. With fusion off, or with the k norm's epsilon changed (the rule's
// negative case), each of the three steps keeps its own kernel and the attention its kv_store.
// The decode expert GEMVs (ops/moe.cpp decodeExpertLaunches) on the same qwen3moe, whose experts are all Q4_K /
// Q6_K blocks: each layer's router MatMul runs the router launch without the slot sort (MOE_SORT_SLOTS 0), then
// minfer_moe_gate_up_dec (the ids, the three expert weights' blocks, the scratch, K·F/32 counter words; two gate|up
// outputs per warp at n_embd 256) and minfer_moe_down_dec (ids, weights, down's blocks, the scratch, the step's
// output; two rows per warp), with, in every layer but the last, the residual Add, the next layer's attn_norm and its
// QuantizeAct as the down launch's epilogue (MOE_ADD_NORM: the norm's arguments after the output; the q, k, v GEMV
// triple after it applies the deferred 1/rms); the prefill plan keeps the sorted kernels.
TEST_CASE("decode MoE experts on the GGUF blocks: router without the sort, then the gate|up and down GEMVs") {
  if (!haveNvrtc()) {
    MESSAGE("SKIPPED: built without NVRTC");
    return;
  }
  const Loaded l = load(synthQwen3MoeQ4KM());
  const KernelSet set = generate(l, {"sm_90"}, MINFER_TEST_KERNEL_CACHE);
  checkSet(l, set, {"sm_90"});
  size_t moe = 0;
  for (size_t i = 2; i < l.desc.plan.decode.size(); ++i) {
    const model::StepDesc& st = l.desc.plan.decode[i];
    if (st.op != fb::OpKind::MoeFfn) continue;
    ++moe;
    CAPTURE(st.name);
    REQUIRE(decodeExpertsOnBlocks(l, st));
    const std::vector<LaunchRecord>& launches = set.decode[i - 2];
    REQUIRE(launches.size() == 3);
    const KernelImageData& router = set.images[launches[0].images[0]];
    CHECK(router.entry == "minfer_moe_router_sort");
    CHECK(optionValue(router, "MOE_SORT_SLOTS") == "0");
    const LaunchRecord &gu = launches[1], &dn = launches[2];
    CHECK(set.images[gu.images[0]].entry == "minfer_moe_gate_up_dec");
    CHECK(set.images[dn.images[0]].entry == "minfer_moe_down_dec");
    const uint32_t k = st.n_expert_used, f = st.rows, e = st.cols;
    REQUIRE(gu.args.size() == 6);
    CHECK(gu.args[0].buffer == st.inputs[1]);
    for (size_t w = 0; w < 3; ++w) {
      CHECK(gu.args[1 + w].kind == fb::ArgKind::Weight);
      CHECK(gu.args[1 + w].tensor == st.weights[w]);
      CHECK(gu.args[1 + w].plane.kind == PlaneKind::kBlocks);
    }
    CHECK(gu.args[4].kind == fb::ArgKind::Scratch);
    CHECK(gu.args[5].kind == fb::ArgKind::Counters);
    CHECK(gu.args[5].bytes == uint64_t{k} * f / 32 * 4);
    CHECK(gu.rule.at(1).grid.x == k * f / kern::moeGateUpDecOutputs(e));
    CHECK(gu.rule.at(1).block.x == 32 * kern::kGemvBlocksWarps);
    // The residual Add, the next layer's attn_norm and its QuantizeAct in the down launch, the norm deferred to the
    // q, k, v GEMV triple after them; the last layer's output_norm feeds the output GEMV alone, so it stays apart.
    const bool last = moe == l.desc.config.n_layer;
    REQUIRE(i + 4 < l.desc.plan.decode.size());
    const model::StepDesc &add = l.desc.plan.decode[i + 1], &norm = l.desc.plan.decode[i + 2],
                          &quant = l.desc.plan.decode[i + 3];
    REQUIRE((add.op == fb::OpKind::Add && norm.op == fb::OpKind::RmsNorm && quant.op == fb::OpKind::QuantizeAct));
    CHECK(set.decode_fused[i + 1] == !last);  // the last Add runs the output_norm's launch (RMS_ADD)
    CHECK(optionValue(set.images[dn.images[0]], "MOE_ADD_NORM") == (last ? "" : "1"));
    REQUIRE(dn.args.size() == (last ? 5u : 12u));
    CHECK(dn.args[0].buffer == st.inputs[1]);
    CHECK(dn.args[1].buffer == st.inputs[2]);
    CHECK(dn.args[2].tensor == st.weights[2]);
    CHECK(dn.args[3].kind == fb::ArgKind::Scratch);
    CHECK(dn.args[4].buffer == st.outputs[0]);
    CHECK(dn.args[4].access == fb::Access::Write);
    CHECK(dn.rule.at(1).grid.x == kern::ceilDiv(e, kern::kGemvBlocksWarps * kern::kMoeDownDecRows));
    if (last) continue;
    const uint32_t res = add.inputs[0] == st.outputs[0] ? add.inputs[1] : add.inputs[0];
    CHECK(dn.args[5].buffer == res);
    CHECK(dn.args[6].buffer == add.outputs[0]);
    CHECK(dn.args[6].access == fb::Access::Write);
    CHECK(dn.args[7].tensor == norm.weights[0]);
    CHECK(dn.args[8].buffer == quant.outputs[0]);
    CHECK(dn.args[8].kind == fb::ArgKind::Q8Values);
    CHECK(dn.args[9].buffer == quant.outputs[0]);
    CHECK(dn.args[9].kind == fb::ArgKind::Q8Meta);
    CHECK(dn.args[10].buffer == norm.outputs[0]);  // the partial sums of squares
    CHECK(dn.args[11].kind == fb::ArgKind::Counters);
    CHECK(dn.args[11].bytes == uint64_t{e} / 32 * 4);
    // The triple applies the 1/rms: GEMVB_RMS_EPS with the norm's epsilon, the partials as its last argument.
    const std::vector<LaunchRecord>& triple = set.decode[i + 4];
    REQUIRE(triple.size() == 1);
    CHECK(set.images[triple[0].images[0]].entry == "minfer_gemv_triple");
    CHECK(!optionValue(set.images[triple[0].images[0]], "GEMVB_RMS_EPS").empty());
    CHECK(triple[0].args.back().buffer == norm.outputs[0]);
  }
  CHECK(moe == l.desc.config.n_layer);
  for (const std::vector<LaunchRecord>& step : set.prefill)
    for (const LaunchRecord& r : step) CHECK(set.images[r.images[0]].entry.find("_dec") == std::string::npos);
  // Without the deferred norms (fuse_norm off: --fuse-gemv=pair) every Add after a MoeFfn keeps its own launch and
  // the down launch its five arguments.
  CodegenOptions o;
  o.targets = {"sm_90"};
  o.cache_dir = MINFER_TEST_KERNEL_CACHE;
  o.fuse_norm = false;
  auto plain = generateKernels(l.desc, l.layouts, o);
  REQUIRE_MESSAGE(static_cast<bool>(plain), llvm::toString(plain.takeError()));
  checkSet(l, *plain, {"sm_90"});
  size_t plain_moe = 0;
  for (size_t i = 2; i + 1 < l.desc.plan.decode.size(); ++i) {
    if (l.desc.plan.decode[i].op != fb::OpKind::MoeFfn) continue;
    ++plain_moe;
    CHECK(!plain->decode_fused[i + 1]);
    const LaunchRecord& dn = plain->decode[i - 2].back();
    CHECK(plain->images[dn.images[0]].entry == "minfer_moe_down_dec");
    CHECK(optionValue(plain->images[dn.images[0]], "MOE_ADD_NORM").empty());
    CHECK(dn.args.size() == 5);
  }
  CHECK(plain_moe == l.desc.config.n_layer);
}

TEST_CASE("launch fusion: HeadRmsNorm q, HeadRmsNorm k and Rope as one minfer_head_norm_rope launch (qwen3moe, gemma3)") {
  if (!test::haveFixtures()) return;
  for (const char* model : {"tiny-qwen3moe-Q4_K_M.gguf", "tiny-gemma3-Q8_0.gguf"})
    for (int variant = 0; variant < 3; ++variant) {  // fused, fusion off, k norm epsilon changed
      CAPTURE(model);
      CAPTURE(variant);
      Loaded l = load(test::fixturesDir() + "/arch/models/" + model);
      if (variant == 2)
        for (auto* plan : {&l.desc.plan.prefill, &l.desc.plan.decode})
          for (model::StepDesc& s : *plan)
            if (s.op == fb::OpKind::HeadRmsNorm && s.name.find("attn_k_norm") != std::string::npos) s.eps *= 2;
      CodegenOptions o;
      o.targets = {"sm_90"};
      o.cache_dir = test::scratchDir() + "/kernel-cache-fusion";
      o.fuse_launches = variant != 1;
      auto set = generateKernels(l.desc, l.layouts, o);
      REQUIRE_MESSAGE(static_cast<bool>(set), llvm::toString(set.takeError()));
      const bool expect = variant == 0;
      for (bool prefill : {true, false}) {
        CAPTURE(prefill);
        const auto& steps = prefill ? l.desc.plan.prefill : l.desc.plan.decode;
        const auto& launches = prefill ? set->prefill : set->decode;
        const auto& paged = prefill ? set->prefill_paged : set->decode_paged;
        const auto& fused = prefill ? set->prefill_fused : set->decode_fused;
        const auto entry = [&](const LaunchRecord& r) { return set->images[r.images[0]].entry; };
        const std::string fused_entry = prefill ? "minfer_head_norm_rope" : "minfer_head_norm_rope_kv";
        size_t chains = 0, fused_entries = 0, stores = 0;
        for (size_t i = 0; i < steps.size(); ++i)
          for (const LaunchRecord& r : launches[i]) {
            fused_entries += entry(r) == fused_entry;
            stores += entry(r) == "minfer_kv_store";
          }
        for (size_t i = 0; i + 3 < steps.size(); ++i) {
          const model::StepDesc &qn = steps[i], &kn = steps[i + 1], &rope = steps[i + 2], &att = steps[i + 3];
          if (qn.op != fb::OpKind::HeadRmsNorm || kn.op != fb::OpKind::HeadRmsNorm || rope.op != fb::OpKind::Rope) continue;
          CAPTURE(qn.name);
          REQUIRE(rope.inputs == std::vector<uint32_t>{qn.inputs[0], kn.inputs[0]});
          REQUIRE(att.op == fb::OpKind::Attention);
          REQUIRE(att.inputs.size() == 3);
          ++chains;
          CHECK((fused[i + 1] != 0) == expect);
          CHECK((fused[i + 2] != 0) == expect);
          CHECK((fused[i + 3] != 0) == (expect && !prefill));
          CHECK(fused[i] == 0);
          if (!expect) {
            REQUIRE(launches[i].size() == 1);
            CHECK(entry(launches[i][0]) == "minfer_head_rms_norm");
            CHECK(entry(launches[i + 1][0]) == "minfer_head_rms_norm");
            CHECK(entry(launches[i + 2][0]) == "minfer_rope");
            CHECK(entry(launches[i + 3][0]) == "minfer_kv_store");
            CHECK(paged[i].empty());
            REQUIRE(paged[i + 2].size() == 1);
            CHECK(entry(paged[i + 2][0]) == "minfer_rope_paged");
            continue;
          }
          CHECK(launches[i + 1].empty());
          CHECK(launches[i + 2].empty());
          REQUIRE(launches[i].size() == (prefill ? 1u : 3u));
          REQUIRE(paged[i].size() == (prefill ? 1u : 3u));
          if (!prefill) {
            CHECK(launches[i + 3].empty());
            CHECK(entry(launches[i][1]) == "minfer_attn_decode");
            CHECK(entry(launches[i][2]) == "minfer_attn_combine");
            CHECK(entry(paged[i][1]) == "minfer_kv_store_paged");
            CHECK(entry(paged[i][2]) == "minfer_attn_paged");
            CHECK(paged[i + 3].empty());
          }
          for (bool page : {false, true}) {
            CAPTURE(page);
            const LaunchRecord& r = page ? paged[i][0] : launches[i][0];
            const bool store = !prefill && !page;
            CHECK(entry(r) == (store ? "minfer_head_norm_rope_kv" : "minfer_head_norm_rope"));
            REQUIRE(r.args.size() == (store ? 10u : 7u));
            CHECK(r.args[0].buffer == qn.inputs[0]);
            CHECK(r.args[0].access == fb::Access::ReadWrite);
            CHECK(r.args[1].buffer == kn.inputs[0]);
            CHECK(r.args[1].access == fb::Access::ReadWrite);
            const size_t w = store ? 3 : 2;  // wq, wk after q, k (and v)
            if (store) {
              CHECK(r.args[2].kind == fb::ArgKind::Activation);
              CHECK(r.args[2].buffer == att.inputs[2]);
              CHECK(r.args[2].access == fb::Access::Read);
            }
            CHECK(r.args[w].kind == fb::ArgKind::Weight);
            CHECK(r.args[w].tensor == qn.weights[0]);
            CHECK(r.args[w + 1].kind == fb::ArgKind::Weight);
            CHECK(r.args[w + 1].tensor == kn.weights[0]);
            if (store) {
              // The layer's caches, written (ROPE_KV_RING where the attention has a ring).
              CHECK(r.args[6].kind == fb::ArgKind::KCache);
              CHECK(r.args[7].kind == fb::ArgKind::VCache);
              for (size_t a : {size_t{6}, size_t{7}}) {
                CHECK(r.args[a].access == fb::Access::Write);
                CHECK(r.args[a].layer == static_cast<uint32_t>(att.layer));
                CHECK(r.args[a].width == att.n_head_kv * att.head_dim);
              }
              const std::string ring = optionValue(set->images[r.images[0]], "ROPE_KV_RING");
              CHECK(ring == (att.kv_ring != 0 ? std::to_string(att.kv_ring) : ""));
            }
            CHECK(r.args[r.args.size() - 2].kind == (page ? fb::ArgKind::RowPositions : fb::ArgKind::Positions));
            CHECK(r.args.back().kind == fb::ArgKind::TokenCount);
          }
          CHECK(paged[i + 2].empty());
        }
        CHECK(chains == l.desc.config.n_layer);
        CHECK(fused_entries == (expect ? chains : 0u));
        CHECK(stores == (expect && !prefill ? 0u : chains));
      }
    }
}

}  // namespace minfer::codegen
