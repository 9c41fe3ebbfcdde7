// Kernel codegen: dedupe, cache, parallel NVRTC (see codegen.h).
#include "compiler/codegen/codegen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "compiler/codegen/kernel_cache.h"
#include "compiler/codegen/nvrtc_compiler.h"
#include "compiler/codegen/ops/op_family.h"
#include "compiler/codegen/plan_rewrite.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::codegen {
namespace {

// Unique specs in first-use order; identical identities share one entry. Keys stay unique: a spec
// whose readable key is taken by a different identity gets a numbered suffix (cannot happen with the
// current key scheme, which spells out every constant that varies; guarded anyway).
class SpecTable {
 public:
  uint32_t add(const KernelSpec& spec) {
    const std::string id = spec.identity();
    if (auto it = by_identity_.find(id); it != by_identity_.end()) return it->second;
    KernelSpec s = spec;
    for (unsigned n = 2; keys_.count(s.key); ++n) s.key = spec.key + "_v" + std::to_string(n);
    keys_.insert({s.key, 0});
    const uint32_t index = static_cast<uint32_t>(specs_.size());
    specs_.push_back(std::move(s));
    by_identity_.emplace(id, index);
    return index;
  }
  const std::vector<KernelSpec>& specs() const { return specs_; }

 private:
  std::vector<KernelSpec> specs_;
  std::map<std::string, uint32_t> by_identity_;
  std::map<std::string, int> keys_;
};

}  // namespace

bool sm90aTargetsOnly(const std::vector<std::string>& targets) {
  return !targets.empty() && std::all_of(targets.begin(), targets.end(), [](const std::string& t) { return t == "sm_90a"; });
}

llvm::Expected<KernelSet> generateKernels(const model::ModelDescription& desc,
                                          llvm::ArrayRef<planes::TensorLayout> layouts, const CodegenOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.targets.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "kernel codegen: no target architecture given");
  for (const std::string& arch : options.targets)
    if (auto e = checkArch(arch)) return e;

  KernelSet set;
  SpecTable table;
  // A launch's images: spec index × n_arch + arch index (filled in below, once the specs are numbered).
  const size_t n_arch = options.targets.size();
  // The warpgroup form of mmq_blocks and the split Hopper matmul need sm_90a images (wgmma), so every target must be one.
  const bool sm90a = sm90aTargetsOnly(options.targets);
  const SmallBatchForms forms{.mmqb_wgmma = options.mmqb_wgmma && sm90a,
                              .mmqb_f16act = options.mmqb_wgmma && options.mmqb_f16act && sm90a,
                              .wgmma_split = options.wgmma_split && sm90a,
                              .wgmma_split_fused = options.wgmma_split_fused && sm90a,
                              .wgmma_split_min_stages = options.wgmma_split_min_stages
                                                            ? options.wgmma_split_min_stages
                                                            : kern::kWgmmaSplitMinStages};
  auto record = [&](KernelLaunch&& launch) {
    const uint32_t spec = table.add(launch.spec);
    LaunchRecord r{std::move(launch.args), launch.rule, {}};
    r.min_rows = launch.min_rows;
    r.max_rows = launch.max_rows;
    for (size_t a = 0; a < n_arch; ++a) r.images.push_back(static_cast<uint32_t>(spec * n_arch + a));
    ++set.stats.kernel_uses;
    return r;
  };
  for (PlanVariant v : {PlanVariant::kPrefill, PlanVariant::kDecode, PlanVariant::kLoad}) {
    const std::vector<model::StepDesc>& steps = planSteps(desc.plan, v);
    const size_t n = steps.size();
    auto& out = v == PlanVariant::kPrefill ? set.prefill : v == PlanVariant::kDecode ? set.decode : set.load;
    // Fused steps stay on one side of the last-token tail (the tail runs whole launches on one row).
    const size_t tail = v == PlanVariant::kPrefill ? lastTokenTailBegin(steps, desc.plan.logits) : n;
    const GemvFusions gemv{options.fuse_qkv, options.fuse_glu, options.fuse_pair, options.fuse_norm,
                           options.fuse_prefill_pair};
    auto fusion = planFusion(desc, layouts, v, tail, gemv, options.fuse_launches);
    if (!fusion) return fusion.takeError();
    auto* paged = v == PlanVariant::kPrefill  ? &set.prefill_paged
                  : v == PlanVariant::kDecode ? &set.decode_paged
                                              : nullptr;
    for (size_t i = 0; i < n; ++i) {
      if (fusion->fused[i]) {  // done by an earlier step's launches
        out.emplace_back();
        if (paged) paged->emplace_back();
        if (v == PlanVariant::kPrefill) {
          set.prefill_small.emplace_back();
          set.prefill_small_rows.push_back(0);
        }
        continue;
      }
      const size_t followers = fusion->followers[i];
      auto launches = followers ? fusedLaunches(desc, layouts, v, i, followers, fusion->input_norm[i])
                                : launchesForStep(desc, layouts, v, i);
      if (!launches) return launches.takeError();
      std::vector<LaunchRecord> records;
      for (KernelLaunch& l : *launches) records.push_back(record(std::move(l)));
      out.push_back(std::move(records));
      if (paged) {
        auto launches = pagedLaunchesForStep(desc, layouts, v, i, followers, fusion->input_norm[i]);
        if (!launches) return launches.takeError();
        paged->emplace_back();
        for (KernelLaunch& l : *launches) paged->back().push_back(record(std::move(l)));
      }
      if (v == PlanVariant::kPrefill) {
        auto small = smallLaunchesForStep(desc, layouts, v, i, followers, forms);
        if (!small) return small.takeError();
        set.prefill_small.emplace_back();
        for (KernelLaunch& l : small->launches) set.prefill_small.back().push_back(record(std::move(l)));
        set.prefill_small_rows.push_back(small->rows);
      }
    }
    if (v == PlanVariant::kPrefill) set.prefill_fused = std::move(fusion->fused);
    if (v == PlanVariant::kDecode) set.decode_fused = std::move(fusion->fused);
  }
  set.argmax = record(argmaxLaunch(desc.plan, desc.config.n_vocab));
  set.topk = record(topkLaunch(desc.plan, desc.config.n_vocab));

  const std::vector<KernelSpec>& specs = table.specs();
  set.stats.unique_specs = specs.size();
  set.stats.images = specs.size() * n_arch;

  // Image i = spec i / n_arch, arch i % n_arch.
  const std::string cache_dir = options.cache_dir == "off" ? ""
                                : options.cache_dir.empty() ? KernelCache::defaultDirectory()
                                                            : options.cache_dir;
  KernelCache cache(cache_dir);
  const std::string version = nvrtcVersionString();
  struct Work {
    std::optional<CompiledKernel> kernel;
    std::optional<std::string> error;
    bool hit = false;
  };
  std::vector<Work> work(set.stats.images);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < work.size(); i = next++) {
      const KernelSpec& spec = specs[i / n_arch];
      const std::string& arch = options.targets[i % n_arch];
      const std::string entry = KernelCache::entryName(spec, arch, nvrtcOptions(spec, arch));
      if (auto hit = cache.lookup(entry)) {
        work[i].kernel = std::move(*hit);
        work[i].hit = true;
        continue;
      }
      KernelCache::EntryLock lock(cache, entry);
      if (auto hit = cache.lookup(entry)) {  // another compiler filled it while this one waited
        work[i].kernel = std::move(*hit);
        work[i].hit = true;
        continue;
      }
      auto compiled = compileKernel(spec, arch);
      if (!compiled) {
        work[i].error = llvm::toString(compiled.takeError());
        continue;
      }
      cache.store(entry, *compiled);
      work[i].kernel = std::move(*compiled);
    }
  };
  unsigned jobs = options.jobs ? options.jobs : std::max(1u, std::thread::hardware_concurrency());
  jobs = static_cast<unsigned>(std::min<size_t>(jobs, work.size()));
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < jobs; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();

  for (size_t i = 0; i < work.size(); ++i) {
    if (work[i].error) return llvm::createStringError(llvm::inconvertibleErrorCode(), *work[i].error);
    const KernelSpec& spec = specs[i / n_arch];
    const std::string& arch = options.targets[i % n_arch];
    KernelImageData img;
    img.key = spec.key + "_" + archTag(arch);
    img.entry = spec.entry;
    img.arch = arch;
    img.cubin = std::move(work[i].kernel->cubin);
    img.ptx = std::move(work[i].kernel->ptx);
    img.nvrtc_version = version;
    img.options = nvrtcOptions(spec, arch);
    set.images.push_back(std::move(img));
    (work[i].hit ? set.stats.cache_hits : set.stats.compiled)++;
  }
  set.stats.cache_write_failures = cache.writeFailures();
  set.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return set;
}

}  // namespace minfer::codegen
