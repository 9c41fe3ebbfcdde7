// minfer-bench-gemv: memory bandwidth of the decode GEMVs on a 7B's (Qwen2-7B) matmul shapes. Not a test:
// run it on a GPU machine (needs the NVIDIA driver and NVRTC); H200 numbers are in BENCHMARKS.md.
//
// Usage: minfer-bench-gemv [--reps R] [--variants] [--batch T,…]
//                          [--mmq-blocks T,… [--mmqb-splits S,…]
//                           [--mmqb-wgmma [--mmqb-f16act]]]
//                          [--wgmma-rows T,… [--wgmma-splits S,…]]
//                          [--min-blocks N,…] [--l2-fetch 128,256] [--shapes …]
// For each shape: random GGUF blocks (random bits, finite f16 d and dmin as in tests/runtime/weight_builder),
// laid out
//   blocks: as a kBlocks plane with 16-byte aligned blocks (Q4_K 144 B, Q6_K 224 B), read by
//           kernels/gemv_blocks.cuh;
//   planes: by the layout planner and plane transforms as today's decode planes (Q4_K: kPacked + kScale +
//           kMin; Q6_K: kI8 + kScale), read by kernels/gemv.cuh.
// Both kernels are compiled by NVRTC from the same -D constants as the codegen gives them. One CUDA graph
// of L launches rotates over enough copies of the weights (≥ 512 MB) that every launch streams from HBM,
// not L2; R timed replays (CUDA events, after one warm-up replay) give mean ± sd of GB/s = plane bytes
// read per launch / time per launch. The ceiling printed first is a device-to-device copy of 1 GiB
// (bytes read + written). --variants also times a grid of gemv_blocks work shapes (rows per warp, warps
// per row, unroll). The two
// kernels' outputs on the same weights are compared (max |a − b| / max |b|) as a sanity check. --batch also times
// the batched GEMV (gemv_blocks.cuh GEMVB_BATCH) and --mmq-blocks minfer_mmq_blocks (mmq_blocks.cuh, f16 tensor
// cores) on that many q8 rows, the weights GB/s of each launch (--mmqb-wgmma its warpgroup form too, --mmqb-f16act
// that form on f16 activations: mmq_blocks.cuh MMQB_F16ACT);
// --wgmma-rows the Hopper f16 matmul, one split and split over K (kernels/wgmma_matmul.cuh), on a random f16 plane of
// the shape.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "compiler/codegen/kernel_spec.h"
#include "compiler/codegen/nvrtc_compiler.h"
#include "compiler/planes/layout_planner.h"
#include "compiler/planes/plane_transforms.h"
#include "compiler/planes/plane_workers.h"
#include "kernels/gemv.cuh"
#include "kernels/gemv_blocks.cuh"
#include "kernels/mmq_blocks.cuh"
#include "kernels/wgmma_matmul.cuh"
#include "llvm/Support/CommandLine.h"
#include "runtime/cuda/cuda_device.h"

namespace {

using namespace minfer;

llvm::cl::OptionCategory kCategory("minfer-bench-gemv options");
llvm::cl::opt<unsigned> kReps("reps", llvm::cl::desc("timed graph replays per kernel"), llvm::cl::init(10),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kVariants("variants", llvm::cl::desc("also time every unroll × warps-per-row of gemv_blocks"),
                              llvm::cl::init(false), llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kMinBlocks("min-blocks", llvm::cl::CommaSeparated,
                                    llvm::cl::desc("also time the codegen's gemv_blocks shape compiled for at least N "
                                                   "blocks per SM (GEMVB_MIN_BLOCKS), for each N given"),
                                    llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kL2Fetch("l2-fetch", llvm::cl::CommaSeparated,
                                  llvm::cl::desc("also time the codegen's gemv_blocks shape loading its weights with "
                                                 "this L2 fetch granule in bytes (128 or 256; GEMVB_L2_FETCH)"),
                                  llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kBatch("batch", llvm::cl::CommaSeparated,
                                llvm::cl::desc("also time the batched GEMV (minfer_gemv_batch with the codegen's GEMVB_BATCH "
                                               "and work shape) on this many q8 rows, for each count given"),
                                llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kMmqBlocks("mmq-blocks", llvm::cl::CommaSeparated,
                                    llvm::cl::desc("also time minfer_mmq_blocks (f16 tensor cores on the blocks, tiles of 16, 32 "
                                                   "and 64 tokens) on this many q8 rows (≤ 64), for each count given"),
                                    llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kMmqbSplits("mmqb-splits", llvm::cl::CommaSeparated,
                                     llvm::cl::desc("with --mmq-blocks: splits of K to time besides the codegen's mmqbSplits"),
                                     llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kMmqbWgmma("mmqb-wgmma",
                                llvm::cl::desc("with --mmq-blocks: also time its warpgroup form (MMQB_WGMMA, sm_90a images; "
                                               "Hopper only) and compare its outputs with the mma.sync form's"),
                                llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kMmqbF16Act("mmqb-f16act",
                                 llvm::cl::desc("with --mmqb-wgmma: also time the warpgroup form on f16 activations staged "
                                                "once (MMQB_F16ACT; minfer_mmqb_f16_act stages the same q8 rows into the "
                                                "scratch once, checked against the host's conversion; the staging launch is "
                                                "not timed)"),
                                 llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kWgmmaRows(
    "wgmma-rows", llvm::cl::CommaSeparated,
    llvm::cl::desc("also time the Hopper f16 matmul (kernels/wgmma_matmul.cuh, sm_90a) on a random f16 plane of the "
                   "shape, on this many f16 activation rows (≤ 64), for each count given: the prefill plan's tile, the "
                   "split form's tile with one split and split over K (wgmmaSplits' count and --wgmma-splits')"),
    llvm::cl::cat(kCategory));
llvm::cl::list<unsigned> kWgmmaSplitCounts(
    "wgmma-splits", llvm::cl::CommaSeparated,
    llvm::cl::desc("with --wgmma-rows: splits of K to time besides wgmmaSplits' (2 … 16)"), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kShapes("shapes", llvm::cl::desc("comma-separated subset of q,k,gate,down,output (k: not "
                                                            "in the default set)"),
                                   llvm::cl::init("q,gate,down,output"), llvm::cl::cat(kCategory));

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "minfer-bench-gemv: %s\n", what.c_str());
  std::exit(1);
}
void ok(const Status& s) {
  if (!s.isOk()) die(s.message());
}
template <typename T>
T take(Result<T> r) {
  if (!r.isOk()) die(r.status().message());
  return std::move(*r);
}

struct Shape {
  const char* name;
  GgmlType type;
  uint64_t n, k;
};
const Shape kAllShapes[] = {{"q", GgmlType::Q4_K, 3584, 3584},
                            {"k", GgmlType::Q4_K, 512, 3584},
                            {"gate", GgmlType::Q4_K, 18944, 3584},
                            {"down", GgmlType::Q6_K, 3584, 18944},
                            {"output", GgmlType::Q6_K, 152064, 3584}};

std::vector<uint8_t> randomBlocks(GgmlType type, uint64_t rows, uint64_t cols, std::mt19937_64& rng) {
  const GgmlTypeTraits tr = ggmlTypeTraits(type);
  const uint64_t blocks = rows * cols / tr.block_size;
  std::vector<uint8_t> data(blocks * tr.type_size);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  std::uniform_real_distribution<float> mag(0.3f, 1.0f), mn(-0.5f, 0.5f);
  auto put = [](uint8_t* p, float v) {
    const uint16_t h = floatToHalf(v);
    std::memcpy(p, &h, 2);
  };
  for (uint64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = data.data() + b * tr.type_size;
    const float d = mag(rng) * 0.5f / (63.0f * 16.0f) * (rng() % 2 ? 1.0f : -1.0f);
    if (type == GgmlType::Q4_K) {
      put(blk, d);
      put(blk + 2, mn(rng) * 0.5f / 63.0f);
    } else {
      put(blk + 208, d);
    }
  }
  return data;
}

// The kBlocks table of the planner's decode layout: group pitch alignUp(block bytes, 16), row pitch
// blocks · group pitch.
StrideTable blocksTable(GgmlType type, uint64_t rows, uint64_t cols) {
  StrideTable t;
  t.kind = PlaneKind::kBlocks;
  t.elem = ElemType::kU8;
  t.rows = rows;
  t.cols = cols;
  t.group_size = kQK_K;
  t.group_pitch = static_cast<uint32_t>(alignUp(ggmlTypeTraits(type).type_size, 16));
  t.row_pitch = cols / kQK_K * t.group_pitch;
  t.ggml_type = static_cast<uint32_t>(type);
  return t;
}

struct Gpu {
  std::shared_ptr<cuda::CudaDevice> dev;
  cuda::Stream stream;
  const cuda::CudaDriver& cu() const { return dev->cu(); }
  void sync() const { ok(dev->check(cu().cuStreamSynchronize(stream.get()), "synchronize")); }
};

struct Kernel {
  cuda::Module module;
  CUfunction fn = nullptr;
  std::string key;
};

Kernel compile(const Gpu& g, const std::string& key, const char* source, const char* entry,
               std::vector<std::pair<std::string, std::string>> defines, const std::string& arch = "") {
  codegen::KernelSpec spec;
  spec.key = key;
  spec.source = source;
  spec.entry = entry;
  spec.defines = std::move(defines);
  auto compiled = codegen::compileKernel(spec, arch.empty() ? g.dev->info().arch() : arch);
  if (!compiled) die(llvm::toString(compiled.takeError()));
  Kernel k;
  k.module = take(g.dev->loadModule(compiled->cubin.data(), key));
  k.key = key;
  ok(g.dev->check(g.cu().cuModuleGetFunction(&k.fn, k.module.get(), entry), "cuModuleGetFunction " + key));
  return k;
}

// Device copies of a set of planes (one buffer per plane per copy).
struct Copies {
  std::vector<std::vector<cuda::DeviceBuffer>> sets;  // [copy][plane]
  uint64_t bytes = 0;                                 // per copy
};
Copies upload(const Gpu& g, const std::vector<const std::vector<uint8_t>*>& planes, uint64_t min_total) {
  Copies c;
  for (const auto* p : planes) c.bytes += p->size();
  const uint64_t n = std::max<uint64_t>(2, (min_total + c.bytes - 1) / c.bytes);
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<cuda::DeviceBuffer> set;
    for (size_t j = 0; j < planes.size(); ++j) {
      set.push_back(take(g.dev->alloc(planes[j]->size(), "weights")));
      if (i == 0)
        ok(g.dev->check(g.cu().cuMemcpyHtoDAsync(set[j].ptr(), planes[j]->data(), planes[j]->size(), g.stream.get()),
                        "upload"));
      else
        ok(g.dev->check(
            g.cu().cuMemcpyDtoDAsync(set[j].ptr(), c.sets[0][j].ptr(), planes[j]->size(), g.stream.get()), "copy"));
    }
    c.sets.push_back(std::move(set));
  }
  g.sync();
  return c;
}

struct Timing {
  double mean_gbs = 0, sd_gbs = 0, us = 0;
};

// Times `launches` launches of k (argument list per launch from args(i)), captured in one graph.
template <typename ArgsFn>
Timing timeGraph(const Gpu& g, const Kernel& k, const kern::LaunchShape& sh, unsigned launches, uint64_t bytes,
                 ArgsFn args) {
  const cuda::CudaDriver& cu = g.cu();
  ok(g.dev->check(cu.cuStreamBeginCapture(g.stream.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture"));
  for (unsigned i = 0; i < launches; ++i) {
    std::vector<void*> a = args(i);
    ok(g.dev->check(cu.cuLaunchKernel(k.fn, sh.grid.x, sh.grid.y, sh.grid.z, sh.block.x, sh.block.y, sh.block.z,
                                      sh.smem, g.stream.get(), a.data(), nullptr),
                    "launch " + k.key));
  }
  CUgraph graph = nullptr;
  ok(g.dev->check(cu.cuStreamEndCapture(g.stream.get(), &graph), "end capture"));
  CUgraphExec exec = nullptr;
  ok(g.dev->check(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate"));
  cuda::Event e0 = take(g.dev->createEvent(true)), e1 = take(g.dev->createEvent(true));
  ok(g.dev->check(cu.cuGraphLaunch(exec, g.stream.get()), "warm-up " + k.key));
  g.sync();
  std::vector<double> gbs;
  double total_ms = 0;
  for (unsigned r = 0; r < kReps; ++r) {
    ok(g.dev->check(cu.cuEventRecord(e0.get(), g.stream.get()), "event"));
    ok(g.dev->check(cu.cuGraphLaunch(exec, g.stream.get()), "replay " + k.key));
    ok(g.dev->check(cu.cuEventRecord(e1.get(), g.stream.get()), "event"));
    ok(g.dev->check(cu.cuEventSynchronize(e1.get()), "run " + k.key));
    float ms = 0;
    ok(g.dev->check(cu.cuEventElapsedTime(&ms, e0.get(), e1.get()), "elapsed"));
    total_ms += ms;
    gbs.push_back(static_cast<double>(bytes) * launches / (ms * 1e-3) / 1e9);
  }
  cu.cuGraphExecDestroy(exec);
  cu.cuGraphDestroy(graph);
  Timing t;
  for (double v : gbs) t.mean_gbs += v / gbs.size();
  for (double v : gbs) t.sd_gbs += (v - t.mean_gbs) * (v - t.mean_gbs) / std::max<size_t>(1, gbs.size() - 1);
  t.sd_gbs = std::sqrt(t.sd_gbs);
  t.us = total_ms * 1e3 / kReps / launches;
  return t;
}

double copyCeiling(const Gpu& g) {
  const uint64_t bytes = uint64_t{1} << 30;
  cuda::DeviceBuffer a = take(g.dev->alloc(bytes, "copy source")), b = take(g.dev->alloc(bytes, "copy target"));
  ok(g.dev->check(g.cu().cuMemsetD8Async(a.ptr(), 0x5A, bytes, g.stream.get()), "memset"));
  cuda::Event e0 = take(g.dev->createEvent(true)), e1 = take(g.dev->createEvent(true));
  ok(g.dev->check(g.cu().cuMemcpyDtoDAsync(b.ptr(), a.ptr(), bytes, g.stream.get()), "copy"));
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    ok(g.dev->check(g.cu().cuEventRecord(e0.get(), g.stream.get()), "event"));
    ok(g.dev->check(g.cu().cuMemcpyDtoDAsync(b.ptr(), a.ptr(), bytes, g.stream.get()), "copy"));
    ok(g.dev->check(g.cu().cuEventRecord(e1.get(), g.stream.get()), "event"));
    ok(g.dev->check(g.cu().cuEventSynchronize(e1.get()), "copy"));
    float ms = 0;
    ok(g.dev->check(g.cu().cuEventElapsedTime(&ms, e0.get(), e1.get()), "elapsed"));
    best = std::max(best, 2.0 * bytes / (ms * 1e-3) / 1e9);
  }
  return best;
}

// max |a − b| / max |b|; infinity where an element of a or b is not finite (a NaN would drop out of std::max).
double maxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

std::string str(uint64_t v) { return std::to_string(v); }

// Launches per timed graph: a multiple of the copies, ≥ 2 GiB of weights read, at most 2,000.
unsigned launchesFor(const Copies& c) {
  const uint64_t want = std::max<uint64_t>(c.sets.size(), (uint64_t{2} << 30) / c.bytes);
  return static_cast<unsigned>(std::min<uint64_t>(2000, (want + c.sets.size() - 1) / c.sets.size() * c.sets.size()));
}

using RowPrinter = std::function<void(const std::string& kernel, uint64_t bytes, const Timing& t)>;

// --wgmma-rows: the Hopper f16 matmul on a random f16 plane of shape s (values of a Q4_K-like grid, rows 16-byte
// aligned), f16 activations staged at the start of the split form's scratch as minfer_q8_to_f16 leaves them: the
// prefill plan's tile (wgmmaMatmulTile), the split form's tile (kWgmmaSplitTile) with one split, and split over K
// (minfer_wgmma_matmul_split) with wgmmaSplits' count and those of --wgmma-splits; each split's outputs compared with
// the one split's (max |a − b| / max |b|: f32 sums in another order).
void benchWgmma(const Gpu& g, const Shape& s, std::mt19937_64& rng, const RowPrinter& row) {
  if (g.dev->info().arch() != "sm_90") die("--wgmma-rows: the Hopper matmul runs on sm_90 (Hopper) only");
  const unsigned n = static_cast<unsigned>(s.n), k = static_cast<unsigned>(s.k);
  const uint64_t pitch = alignUp(s.k * 2, 16);
  std::vector<uint8_t> plane(s.n * pitch, 0);
  for (uint64_t r = 0; r < s.n; ++r)
    for (uint64_t c = 0; c < s.k; ++c) {
      const uint16_t h = floatToHalf(0.002f * static_cast<float>(rng() % 16) - 0.01f);
      std::memcpy(&plane[r * pitch + c * 2], &h, 2);
    }
  const Copies cw = upload(g, {&plane}, uint64_t{512} << 20);
  const kern::WgmmaTile split_tile = kern::kWgmmaSplitTile;
  std::vector<unsigned> splits = {kern::wgmmaSplits(n, k)};
  for (unsigned sp : kWgmmaSplitCounts)
    if (sp >= 2 && sp <= kern::kWgmmaSplitMaxSplits && sp <= kern::ceilDiv(k, kern::kWgmmaBK) &&
        std::find(splits.begin(), splits.end(), sp) == splits.end())
      splits.push_back(sp);
  unsigned most = 1;
  for (unsigned sp : splits) most = std::max(most, sp);
  std::vector<uint16_t> x(split_tile.bm * s.k);
  for (uint16_t& v : x) v = floatToHalf(static_cast<float>(static_cast<int>(rng() % 255) - 127) * 0.01f);
  cuda::DeviceBuffer scratch = take(g.dev->alloc(kern::wgmmaSplitScratchBytes(n, k, most), "scratch"));
  cuda::DeviceBuffer counters = take(g.dev->alloc(kern::wgmmaSplitCounterBytes(n), "counters"));
  cuda::DeviceBuffer out = take(g.dev->alloc(uint64_t{split_tile.bm} * s.n * 4, "out"));
  ok(g.dev->check(g.cu().cuMemcpyHtoDAsync(scratch.ptr(), x.data(), x.size() * 2, g.stream.get()), "upload"));
  ok(g.dev->check(g.cu().cuMemsetD8Async(counters.ptr(), 0, kern::wgmmaSplitCounterBytes(n), g.stream.get()),
                  "memset"));
  std::vector<CUdeviceptr> w(cw.sets.size());
  for (size_t i = 0; i < cw.sets.size(); ++i) w[i] = cw.sets[i][0].ptr();
  CUdeviceptr null_ptr = 0, ps = scratch.ptr(), pc = counters.ptr(), po = out.ptr();
  auto defines = [&](kern::WgmmaTile t) {
    return std::vector<std::pair<std::string, std::string>>{
        {"WG_N", str(n)}, {"WG_K", str(k)}, {"WG_W_PITCH", str(pitch)}, {"WG_BM", str(t.bm)}, {"WG_BN", str(t.bn)},
        {"WG_STAGES", str(t.stages)}, {"WG_ACT", "0"}, {"WG_HAS_BIAS", "0"}};
  };
  auto allowSmem = [&](const Kernel& kf, unsigned bytes) {
    ok(g.dev->check(g.cu().cuFuncSetAttribute(kf.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)),
                    "smem attribute"));
  };
  auto download = [&](unsigned tokens) {
    std::vector<float> v(static_cast<size_t>(tokens) * n);
    ok(g.dev->check(g.cu().cuMemcpyDtoHAsync(v.data(), po, v.size() * 4, g.stream.get()), "download"));
    g.sync();
    return v;
  };
  const std::string base = "wgmma_f16_n" + str(n) + "_k" + str(k);
  std::vector<kern::WgmmaTile> tiles = {split_tile};
  const kern::WgmmaTile plan_tile = kern::wgmmaMatmulTile(n);
  if (plan_tile.bm != split_tile.bm || plan_tile.bn != split_tile.bn || plan_tile.stages != split_tile.stages)
    tiles.push_back(plan_tile);
  for (unsigned tokens : kWgmmaRows) {
    if (tokens < 1 || tokens > split_tile.bm) die("--wgmma-rows: token counts 1 … " + str(split_tile.bm));
    int nt = static_cast<int>(tokens);
    std::vector<float> one;  // the split tile's one-split outputs
    for (size_t ti = 0; ti < tiles.size(); ++ti) {
      const kern::WgmmaTile t = tiles[ti];
      const std::string tile = str(t.bm) + "x" + str(t.bn) + " s" + str(t.stages);
      const Kernel km = compile(g, base + "_bm" + str(t.bm) + "_bn" + str(t.bn) + "_s" + str(t.stages),
                                "kernels/wgmma_matmul.cuh", "minfer_wgmma_matmul", defines(t), "sm_90a");
      const kern::LaunchShape sh = kern::wgmmaMatmulLaunch(n, tokens, t.bm, t.bn, t.stages);
      allowSmem(km, sh.smem);
      const Timing tm = timeGraph(g, km, sh, launchesFor(cw), cw.bytes, [&](unsigned i) {
        return std::vector<void*>{&w[i % w.size()], &null_ptr, &ps, &null_ptr, &po, &nt};
      });
      row("wgmma " + tile + " " + str(tokens) + " rows" + (ti == 0 ? "" : " (prefill tile)"), cw.bytes, tm);
      if (ti == 0) one = download(tokens);  // the last launch read the last copy: same values as every copy
    }
    for (unsigned sp : splits) {
      if (sp == 1) continue;  // the split tile's one-split launch above
      std::vector<std::pair<std::string, std::string>> defs = defines(split_tile);
      defs.push_back({"WG_SPLITS", str(sp)});
      const Kernel ks = compile(g, base + "_split" + str(sp), "kernels/wgmma_matmul.cuh", "minfer_wgmma_matmul_split",
                                defs, "sm_90a");
      const kern::LaunchShape sh = kern::wgmmaSplitLaunchRule(n, sp).at(tokens);
      allowSmem(ks, sh.smem);
      const Timing tm = timeGraph(g, ks, sh, launchesFor(cw), cw.bytes, [&](unsigned i) {
        return std::vector<void*>{&w[i % w.size()], &null_ptr, &ps, &po, &pc, &nt};
      });
      row("wgmma split " + str(sp) + " " + str(tokens) + " rows" + (sp == splits[0] ? " (codegen)" : ""), cw.bytes, tm);
      std::printf("        wgmma split %u, %u rows vs one split: max |a - b| / max |b| = %.2e\n", sp, tokens,
                  maxRelDiff(download(tokens), one));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::ParseCommandLineOptions(argc, argv, "decode GEMV bandwidth on 7B shapes\n");
  if (kMmqbF16Act && (!kMmqbWgmma || kMmqBlocks.empty())) die("--mmqb-f16act needs --mmq-blocks and --mmqb-wgmma");
  Gpu g;
  g.dev = take(cuda::CudaDevice::open());
  g.stream = take(g.dev->createStream());
  const double ceiling = copyCeiling(g);
  std::printf("%s (%s), device-to-device copy of 1 GiB: %.0f GB/s (read + write, best of 5)\n",
              g.dev->info().name.c_str(), g.dev->info().arch().c_str(), ceiling);
  std::printf("%-7s %-5s %7s %6s  %-34s %9s %8s %9s %18s %7s\n", "shape", "type", "N", "K", "kernel", "MB/launch",
              "B/weight", "us/launch", "GB/s (mean ± sd)", "% copy");
  std::mt19937_64 rng(20261130);
  planes::PlaneWorkers workers(0);
  for (const Shape& s : kAllShapes) {
    if (("," + kShapes + ",").find(std::string(",") + s.name + ",") == std::string::npos) continue;
    const std::string tag = codegen::typeTag(static_cast<uint32_t>(s.type));
    const std::vector<uint8_t> source = randomBlocks(s.type, s.n, s.k, rng);
    // (a) the kBlocks plane.
    const StrideTable bt = blocksTable(s.type, s.n, s.k);
    std::vector<uint8_t> blocks(bt.bytes(), 0);
    const uint32_t type_size = ggmlTypeTraits(s.type).type_size;
    for (uint64_t b = 0; b < s.n * s.k / kQK_K; ++b)
      std::memcpy(blocks.data() + b * bt.group_pitch, source.data() + b * type_size, type_size);
    // (b) today's decode planes, by the planner and the transforms.
    auto layout = planes::planLayout({std::string("bench.") + s.name, s.type, s.n, s.k, planes::TensorRole::kMatMul});
    if (!layout) die(llvm::toString(layout.takeError()));
    auto planes_bytes = planes::transformTensor(*layout, source, workers);
    if (!planes_bytes) die(llvm::toString(planes_bytes.takeError()));
    const int qi = layout->find(PlaneKind::kI8), si = layout->find(PlaneKind::kScale), mi = layout->find(PlaneKind::kMin),
              pi = layout->find(PlaneKind::kPacked);
    const bool four = pi >= 0;
    const int wi = four ? pi : qi;
    const StrideTable& wt = layout->planes[wi];
    const StrideTable& st = layout->planes[si];
    std::vector<const std::vector<uint8_t>*> gemv_planes = {&(*planes_bytes)[wi], &(*planes_bytes)[si]};
    if (mi >= 0) gemv_planes.push_back(&(*planes_bytes)[mi]);

    // q8 activations (random q, per-block d, consistent half sums), one copy: decode reads them from L2.
    constexpr uint64_t kMaxBatch = kern::kGemvBatchMaxRows;  // the batched GEMV's most rows
    constexpr uint64_t kActRows = 64;                        // rows of activations (row 0 for the one-row kernels)
    std::vector<int8_t> xq(kActRows * s.k);
    std::vector<kern::Q8Meta> xm(kActRows * s.k / 32);
    for (uint64_t b = 0; b < kActRows * s.k / 32; ++b) {
      int lo = 0, hi = 0;
      for (int i = 0; i < 32; ++i) {
        xq[b * 32 + i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
        (i < 16 ? lo : hi) += xq[b * 32 + i];
      }
      xm[b] = {0.01f + static_cast<float>(rng() % 100) * 1e-4f, static_cast<short>(lo), static_cast<short>(hi)};
    }
    // The same rows as f16 d·q, each group of 16 in the MMA's k order (mmq_blocks.cuh MMQB_F16ACT, mmqbF16ActOrder): d
    // rounded to f16, the exact product rounded once, as the q8 form converts them per stage: what minfer_mmqb_f16_act
    // must stage.
    std::vector<uint16_t> x16(kActRows * s.k);
    for (uint64_t i = 0; i < x16.size(); ++i) {
      const uint64_t k = i / 16 * 16 + kern::mmqbF16ActOrder(static_cast<unsigned>(i % 16));
      x16[i] = minfer::floatToHalf(static_cast<float>(xq[k]) * minfer::halfToFloat(minfer::floatToHalf(xm[k / 32].d)));
    }
    cuda::DeviceBuffer d_xq = take(g.dev->alloc(xq.size(), "xq")), d_xm = take(g.dev->alloc(xm.size() * 8, "xmeta"));
    cuda::DeviceBuffer d_out_a = take(g.dev->alloc(kActRows * s.n * 4, "out")), d_out_b = take(g.dev->alloc(s.n * 4, "out"));
    ok(g.dev->check(g.cu().cuMemcpyHtoDAsync(d_xq.ptr(), xq.data(), xq.size(), g.stream.get()), "upload"));
    ok(g.dev->check(g.cu().cuMemcpyHtoDAsync(d_xm.ptr(), xm.data(), xm.size() * 8, g.stream.get()), "upload"));

    const uint64_t kMinTotal = uint64_t{512} << 20;
    Copies cb = upload(g, {&blocks}, kMinTotal);
    Copies cg = upload(g, gemv_planes, kMinTotal);
    const double weights = static_cast<double>(s.n) * s.k;
    // Row 0 of the two output buffers (the kernel under test's, the reference's), after the stream's work.
    auto outputs = [&] {
      std::pair<std::vector<float>, std::vector<float>> r{std::vector<float>(s.n), std::vector<float>(s.n)};
      ok(g.dev->check(g.cu().cuMemcpyDtoHAsync(r.first.data(), d_out_a.ptr(), s.n * 4, g.stream.get()), "download"));
      ok(g.dev->check(g.cu().cuMemcpyDtoHAsync(r.second.data(), d_out_b.ptr(), s.n * 4, g.stream.get()), "download"));
      g.sync();
      return r;
    };
    auto row = [&](const std::string& name, uint64_t bytes, const Timing& t) {
      std::printf("%-7s %-5s %7llu %6llu  %-34s %9.1f %8.3f %9.2f %10.0f ± %-5.0f %6.1f%%\n", s.name,
                  ggmlTypeTraits(s.type).name, static_cast<unsigned long long>(s.n), static_cast<unsigned long long>(s.k),
                  name.c_str(), bytes / 1e6, bytes / weights, t.us, t.mean_gbs, t.sd_gbs, 100.0 * t.mean_gbs / ceiling);
      std::fflush(stdout);
    };

    // Today's GEMV (the codegen's defines for this layout).
    const std::string gkey = std::string("gemv_") + (four ? "packed4_" : "i8_") + tag + "_n" + str(s.n) + "_k" + str(s.k);
    const Kernel kg = compile(g, gkey, "kernels/gemv.cuh", "minfer_gemv",
                              {{"GEMV_N", str(s.n)}, {"GEMV_K", str(s.k)}, {"GEMV_BITS", four ? "4" : "8"},
                               {"GEMV_PITCH", str(wt.row_pitch)},
                               {"GEMV_Q_OFFSET", std::to_string(four ? wt.q_offset : 0)},
                               {"GEMV_GROUP", str(st.group_size)}, {"GEMV_S_PITCH", str(st.row_pitch)},
                               {"GEMV_HAS_MIN", mi >= 0 ? "1" : "0"},
                               {"GEMV_M_PITCH", mi >= 0 ? str(layout->planes[mi].row_pitch) : "0"},
                               {"GEMV_HAS_BIAS", "0"}});
    CUdeviceptr null_ptr = 0, xqp = d_xq.ptr(), xmp = d_xm.ptr(), outb = d_out_b.ptr();
    std::vector<CUdeviceptr> gw(cg.sets.size()), gs(cg.sets.size()), gm(cg.sets.size());
    for (size_t i = 0; i < cg.sets.size(); ++i) {
      gw[i] = cg.sets[i][0].ptr();
      gs[i] = cg.sets[i][1].ptr();
      gm[i] = mi >= 0 ? cg.sets[i][2].ptr() : 0;
    }
    const Timing tg = timeGraph(g, kg, kern::gemvLaunch(static_cast<unsigned>(s.n)), launchesFor(cg), cg.bytes, [&](unsigned i) {
      const size_t c = i % cg.sets.size();
      return std::vector<void*>{&gw[c], &gs[c], &gm[c], &null_ptr, &xqp, &xmp, &outb};
    });
    row(four ? "gemv (packed4+scale+min)" : "gemv (i8+scale)", cg.bytes, tg);

    // gemv_blocks: the codegen's shape, then (--variants) the grid of rows per warp × warps per row ×
    // unroll, compiled in parallel.
    struct Config {
      kern::GemvBlocksShape shape;
      unsigned min_blocks = 0;  // GEMVB_MIN_BLOCKS; 0: none
      unsigned l2_fetch = 0;    // GEMVB_L2_FETCH; 0: none
    };
    const kern::GemvBlocksShape codegen_shape = kern::gemvBlocksShape(static_cast<unsigned>(s.n), static_cast<unsigned>(s.k));
    std::vector<Config> configs = {{codegen_shape}};
    for (unsigned mb : kMinBlocks) configs.push_back({codegen_shape, mb});
    for (unsigned f : kL2Fetch) configs.push_back({codegen_shape, 0, f});
    if (kVariants)
      for (unsigned r : {1u, 2u, 4u})
        for (unsigned wp : {1u, 2u})
          for (unsigned u : {1u, 2u}) configs.push_back({{r, wp, u}});
    auto name = [](const Config& c) {
      return "r" + str(c.shape.rows) + " w" + str(c.shape.warps) + " u" + str(c.shape.unroll) +
             (c.min_blocks ? " min" + str(c.min_blocks) : "") + (c.l2_fetch ? " L2::" + str(c.l2_fetch) + "B" : "");
    };
    std::vector<Kernel> kernels(configs.size());
    {
      std::vector<std::thread> threads;
      std::atomic<size_t> next{0};
      for (unsigned th = 0; th < std::max(1u, std::thread::hardware_concurrency()); ++th)
        threads.emplace_back([&] {
          for (size_t ci = next++; ci < configs.size(); ci = next++) {
            const Config& c = configs[ci];
            const std::string key = "gemv_blocks_" + tag + "_n" + str(s.n) + "_k" + str(s.k) + "_r" + str(c.shape.rows) +
                                    "w" + str(c.shape.warps) + "u" + str(c.shape.unroll) + "m" + str(c.min_blocks) + "f" + str(c.l2_fetch);
            std::vector<std::pair<std::string, std::string>> defs = {
                {"GEMVB_N", str(s.n)}, {"GEMVB_K", str(s.k)}, {"GEMVB_TYPE", str(static_cast<unsigned>(s.type))},
                {"GEMVB_PITCH", str(bt.row_pitch)}, {"GEMVB_GROUP_PITCH", str(bt.group_pitch)},
                {"GEMVB_ROWS", str(c.shape.rows)}, {"GEMVB_ROW_WARPS", str(c.shape.warps)},
                {"GEMVB_UNROLL", str(c.shape.unroll)}, {"GEMVB_HAS_BIAS", "0"}};
            if (c.min_blocks) defs.push_back({"GEMVB_MIN_BLOCKS", str(c.min_blocks)});
            if (c.l2_fetch) defs.push_back({"GEMVB_L2_FETCH", str(c.l2_fetch)});
            kernels[ci] = compile(g, key, "kernels/gemv_blocks.cuh", "minfer_gemv_blocks", defs);
          }
        });
      for (std::thread& th : threads) th.join();
    }
    std::vector<CUdeviceptr> bw(cb.sets.size());
    for (size_t i = 0; i < cb.sets.size(); ++i) bw[i] = cb.sets[i][0].ptr();
    CUdeviceptr outa = d_out_a.ptr();
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Kernel& kb = kernels[ci];
      const kern::LaunchShape sh = kern::gemvBlocksLaunch(static_cast<unsigned>(s.n), configs[ci].shape);
      const Timing tb = timeGraph(g, kb, sh, launchesFor(cb), cb.bytes, [&](unsigned i) {
        return std::vector<void*>{&bw[i % cb.sets.size()], &null_ptr, &xqp, &xmp, &outa};
      });
      row("gemv_blocks " + name(configs[ci]) + (ci == 0 ? " (codegen)" : ""), cb.bytes, tb);
      if (ci == 0) {  // sanity: both kernels on copy 0 of the same weights (the graphs' last launches differ)
        std::vector<void*> a = {&bw[0], &null_ptr, &xqp, &xmp, &outa};
        ok(g.dev->check(g.cu().cuLaunchKernel(kb.fn, sh.grid.x, 1, 1, sh.block.x, 1, 1, 0, g.stream.get(), a.data(), nullptr),
                        "launch"));
        const kern::LaunchShape gsh = kern::gemvLaunch(static_cast<unsigned>(s.n));
        std::vector<void*> b = {&gw[0], &gs[0], &gm[0], &null_ptr, &xqp, &xmp, &outb};
        ok(g.dev->check(g.cu().cuLaunchKernel(kg.fn, gsh.grid.x, 1, 1, gsh.block.x, 1, 1, 0, g.stream.get(), b.data(), nullptr),
                        "launch"));
        const auto [ra, rb] = outputs();
        std::printf("        gemv_blocks vs gemv on the same weights: max |a - b| / max |b| = %.2e\n", maxRelDiff(ra, rb));
      }
    }
    if (!kBatch.empty()) {
      // The batched GEMV: one instantiation (the codegen's GEMVB_BATCH) launched for each token count; row 0 of its output
      // must be the one-row gemv_blocks' output bit for bit (same shape and sums).
      const kern::GemvBlocksShape sh = kern::gemvBlocksShape(static_cast<unsigned>(s.n), static_cast<unsigned>(s.k));
      const Kernel kb = compile(g, "gemv_batch_" + tag + "_n" + str(s.n) + "_k" + str(s.k), "kernels/gemv_blocks.cuh",
                                "minfer_gemv_batch",
                                {{"GEMVB_N", str(s.n)}, {"GEMVB_K", str(s.k)}, {"GEMVB_TYPE", str(static_cast<unsigned>(s.type))},
                                 {"GEMVB_PITCH", str(bt.row_pitch)}, {"GEMVB_GROUP_PITCH", str(bt.group_pitch)},
                                 {"GEMVB_ROWS", str(sh.rows)}, {"GEMVB_ROW_WARPS", str(sh.warps)},
                                 {"GEMVB_UNROLL", str(sh.unroll)}, {"GEMVB_HAS_BIAS", "0"},
                                 {"GEMVB_BATCH", str(kMaxBatch)}});
      const kern::LaunchShape bsh = kern::gemvBlocksLaunch(static_cast<unsigned>(s.n), sh);
      for (unsigned tokens : kBatch) {
        if (tokens < 1 || tokens > kMaxBatch) die("--batch: token counts 1 … " + str(kMaxBatch));
        int nt = static_cast<int>(tokens);
        const Timing tb = timeGraph(g, kb, bsh, launchesFor(cb), cb.bytes, [&](unsigned i) {
          return std::vector<void*>{&bw[i % cb.sets.size()], &null_ptr, &xqp, &xmp, &outa, &nt};
        });
        row("gemv_batch " + str(tokens) + " rows (weights GB/s)", cb.bytes, tb);
      }
      // Sanity: token 0 of a 3-token call against the one-row kernel on copy 0.
      const Kernel& k1 = kernels[0];
      const kern::LaunchShape sh1 = kern::gemvBlocksLaunch(static_cast<unsigned>(s.n), configs[0].shape);
      int three = 3;
      std::vector<void*> a = {&bw[0], &null_ptr, &xqp, &xmp, &outa, &three};
      ok(g.dev->check(g.cu().cuLaunchKernel(kb.fn, bsh.grid.x, 1, 1, bsh.block.x, 1, 1, 0, g.stream.get(), a.data(), nullptr),
                      "launch"));
      std::vector<void*> b = {&bw[0], &null_ptr, &xqp, &xmp, &outb};
      ok(g.dev->check(g.cu().cuLaunchKernel(k1.fn, sh1.grid.x, 1, 1, sh1.block.x, 1, 1, 0, g.stream.get(), b.data(), nullptr),
                      "launch"));
      const auto [ra, rb] = outputs();
      std::printf("        gemv_batch token 0 vs gemv_blocks: %s\n",
                  std::memcmp(ra.data(), rb.data(), s.n * 4) == 0 ? "bit-identical" : "DIFFERENT");
    }
    if (!kMmqBlocks.empty()) {
      // minfer_mmq_blocks: tiles of 16, 32 and 64 tokens, the codegen's splits and those of --mmqb-splits; each token
      // count on the smallest tile that holds it. Token 0 is checked against the one-row gemv_blocks (a different
      // summation order: relative difference printed).
      const unsigned n = static_cast<unsigned>(s.n), k = static_cast<unsigned>(s.k), type = static_cast<unsigned>(s.type);
      cuda::DeviceBuffer counters = take(g.dev->alloc(kern::mmqbCounterBytes(n), "counters"));
      ok(g.dev->check(g.cu().cuMemsetD8Async(counters.ptr(), 0, kern::mmqbCounterBytes(n), g.stream.get()), "memset"));
      std::vector<unsigned> splits = {kern::mmqbSplits(n, k)};
      for (unsigned sp : kMmqbSplits)
        if (sp >= 1 && sp <= k / 256 && std::find(splits.begin(), splits.end(), sp) == splits.end()) splits.push_back(sp);
      // The forms timed: mma.sync, then (--mmqb-wgmma) the warpgroup form and (--mmqb-f16act) that form with
      // MMQB_F16ACT (the activations staged on the device, checked against x16).
      struct Form {
        bool wgmma = false;
        bool f16act = false;
      };
      std::vector<Form> forms = {{}};
      if (kMmqbWgmma) {
        if (g.dev->info().arch() != "sm_90") die("--mmqb-wgmma: the warpgroup form runs on sm_90 (Hopper) only");
        forms.push_back({true, false});
        if (kMmqbF16Act) forms.push_back({true, true});
      }
      // The tile of a token count: the smallest that holds it.
      auto tileOf = [](unsigned tokens) { return tokens <= 16 ? 16u : tokens <= 32 ? 32u : 64u; };
      for (unsigned tn : {16u, 32u, 64u})
        for (unsigned sp : splits) {
          if (std::none_of(kMmqBlocks.begin(), kMmqBlocks.end(), [&](unsigned t) { return tileOf(t) == tn; })) continue;
          std::vector<float> full_sync;  // the mma.sync form's outputs of a full tile, for the warpgroup form's comparison
          for (const Form& form : forms) {
            const bool wgmma = form.wgmma;
            const std::string variant = form.f16act ? " f16act" : "";
            CUdeviceptr xin = xqp;  // the kernel's xq argument (MMQB_F16ACT: the scratch, below)
            std::vector<std::pair<std::string, std::string>> defines = {
                {"MMQB_N", str(n)}, {"MMQB_K", str(k)}, {"MMQB_TYPE", str(type)}, {"MMQB_PITCH", str(bt.row_pitch)},
                {"MMQB_GROUP_PITCH", str(bt.group_pitch)}, {"MMQB_TN", str(tn)}, {"MMQB_SPLITS", str(sp)},
                {"MMQB_HAS_BIAS", "0"}, {"MMQB_WGMMA", wgmma ? "1" : "0"}};
            if (form.f16act) defines.emplace_back("MMQB_F16ACT", "1");
            const Kernel km = compile(g,
                                      "mmq_blocks_" + tag + "_n" + str(n) + "_k" + str(k) + "_tn" + str(tn) + "_s" + str(sp) +
                                          (wgmma ? "_wg" : "") + (form.f16act ? "_f16" : ""),
                                      "kernels/mmq_blocks.cuh", "minfer_mmq_blocks", std::move(defines),
                                      wgmma ? "sm_90a" : "");
            const kern::LaunchShape msh = kern::mmqbLaunchRule(n, type, tn, sp, form.f16act).at(1);
            ok(g.dev->check(g.cu().cuFuncSetAttribute(km.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                      static_cast<int>(msh.smem)),
                            "smem attribute"));
            // MMQB_F16ACT: the scratch holds the activations (staged by minfer_mmqb_f16_act, as in a step, and checked
            // against the host's x16) and then the partials.
            const uint64_t partial_bytes = kern::mmqbPartialBytes(n, tn, sp);
            cuda::DeviceBuffer partial = take(g.dev->alloc(
                std::max<uint64_t>(16, form.f16act ? kern::mmqbF16ScratchBytes(tn, k, partial_bytes) : partial_bytes),
                "partial"));
            CUdeviceptr pp = partial.ptr(), pc = counters.ptr();
            if (form.f16act) {
              const Kernel kc = compile(g, "mmqb_f16_act_k" + str(k), "kernels/mmq_blocks.cuh", "minfer_mmqb_f16_act",
                                        {{"MMQB_ACT_K", str(k)}}, "");
              int rows = static_cast<int>(tn);
              const kern::LaunchShape csh = kern::mmqbF16ActLaunchRule(k).at(tn);
              std::vector<void*> ca = {&xqp, &xmp, &pp, &rows};
              ok(g.dev->check(g.cu().cuLaunchKernel(kc.fn, csh.grid.x, 1, 1, csh.block.x, 1, 1, 0, g.stream.get(),
                                                    ca.data(), nullptr),
                              "launch"));
              std::vector<uint16_t> staged(static_cast<size_t>(tn) * k);
              ok(g.dev->check(g.cu().cuMemcpyDtoHAsync(staged.data(), pp, staged.size() * 2, g.stream.get()),
                              "download"));
              g.sync();
              if (std::memcmp(staged.data(), x16.data(), staged.size() * 2) != 0)
                die("mmqb_f16_act: the staged f16 activations differ from the host's conversion");
              std::printf("        mmqb_f16_act, %u tokens vs the host's f16 activations: bit-identical\n", tn);
              xin = pp;
            }
            for (unsigned tokens : kMmqBlocks) {
              if (tokens < 1 || tokens > kActRows) die("--mmq-blocks: token counts 1 … " + str(kActRows));
              if (tileOf(tokens) != tn) continue;  // each count on the smallest tile that holds it
              int nt = static_cast<int>(tokens);
              const Timing tmg = timeGraph(g, km, msh, launchesFor(cb), cb.bytes, [&](unsigned i) {
                return std::vector<void*>{&bw[i % cb.sets.size()], &null_ptr, &xin, &xmp, &outa, &pp, &pc, &nt};
              });
              row("mmq_blocks" + std::string(wgmma ? " wgmma" : "") + variant + " " + str(tokens) + " rows tn" + str(tn) +
                      " s" + str(sp) + (sp == splits[0] && variant.empty() ? " (codegen)" : ""),
                  cb.bytes, tmg);
            }
            int one = 1;
            std::vector<void*> a = {&bw[0], &null_ptr, &xin, &xmp, &outa, &pp, &pc, &one};
            ok(g.dev->check(g.cu().cuLaunchKernel(km.fn, msh.grid.x, msh.grid.y, 1, msh.block.x, 1, 1, msh.smem, g.stream.get(),
                                                  a.data(), nullptr),
                            "launch"));
            const kern::LaunchShape sh1 = kern::gemvBlocksLaunch(n, configs[0].shape);
            std::vector<void*> b = {&bw[0], &null_ptr, &xqp, &xmp, &outb};
            ok(g.dev->check(g.cu().cuLaunchKernel(kernels[0].fn, sh1.grid.x, 1, 1, sh1.block.x, 1, 1, 0, g.stream.get(),
                                                  b.data(), nullptr),
                            "launch"));
            const auto [ra, rb] = outputs();
            std::printf("        mmq_blocks%s%s tn%u s%u token 0 vs gemv_blocks: max |a - b| / max |b| = %.2e\n",
                        wgmma ? " wgmma" : "", variant.c_str(), tn, sp, maxRelDiff(ra, rb));
            // A full tile of tokens: the warpgroup form against the mma.sync form (the same f16 products in f32; the
            // difference printed, 0 where the tensor cores add them in the same order, and the words that differ). The
            // output is filled with NaN first, so an element the launch does not write cannot match.
            int full = static_cast<int>(tn);
            ok(g.dev->check(g.cu().cuMemsetD8Async(outa, 0xFF, static_cast<size_t>(tn) * n * 4, g.stream.get()), "memset"));
            std::vector<void*> fa = {&bw[0], &null_ptr, &xin, &xmp, &outa, &pp, &pc, &full};
            ok(g.dev->check(g.cu().cuLaunchKernel(km.fn, msh.grid.x, msh.grid.y, 1, msh.block.x, 1, 1, msh.smem, g.stream.get(),
                                                  fa.data(), nullptr),
                            "launch"));
            std::vector<float> all(static_cast<size_t>(tn) * n);
            ok(g.dev->check(g.cu().cuMemcpyDtoHAsync(all.data(), outa, all.size() * 4, g.stream.get()), "download"));
            g.sync();
            if (!wgmma) {
              full_sync = std::move(all);
            } else {
              size_t differ = 0;
              for (size_t i = 0; i < all.size(); ++i) differ += std::memcmp(&all[i], &full_sync[i], 4) != 0;
              std::printf("        mmq_blocks wgmma%s tn%u s%u, %u tokens vs mma.sync: max |a - b| / max |b| = %.2e, "
                          "%zu of %zu words differ\n",
                          variant.c_str(), tn, sp, tn, maxRelDiff(all, full_sync), differ, all.size());
            }
          }
        }
    }
    if (!kWgmmaRows.empty()) benchWgmma(g, s, rng, row);
  }
  return 0;
}
