// minfer-bench-planes: throughput of the plane transforms on synthetic K-quant tensors (MB/s of GGUF input).
//
// Usage: minfer-bench-planes [-j N] [--rows R] [--cols C] [--reps K] [--all-types]
// For each of Q4_K and Q6_K, fills an R × C tensor (default 4096 × 4096) with random blocks (finite
// half scales), plans it as a matmul weight and transforms all its planes with 1 thread and with N
// threads (default: all cores), printing the best of K repetitions as MB/s of GGUF input in total and
// per thread (1 MB = 10^6 bytes), and checks that both runs give identical planes. --all-types adds
// the other quantized types. Build in Release for meaningful numbers.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compiler/planes/plane_transforms.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/WithColor.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-bench-planes options");
llvm::cl::opt<unsigned> kThreads("j", llvm::cl::desc("threads for the parallel run (0 = all cores)"),
                                 llvm::cl::init(0), llvm::cl::cat(kCategory));
llvm::cl::opt<uint64_t> kRows("rows", llvm::cl::desc("rows (out_features)"), llvm::cl::init(4096),
                              llvm::cl::cat(kCategory));
llvm::cl::opt<uint64_t> kCols("cols", llvm::cl::desc("cols (in_features, multiple of 256)"),
                              llvm::cl::init(4096), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kAllTypes("all-types", llvm::cl::desc("also measure the other quantized types"),
                              llvm::cl::init(false), llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kReps("reps", llvm::cl::desc("repetitions (best is reported)"), llvm::cl::init(5),
                              llvm::cl::cat(kCategory));

// Random block bytes with every half-precision field (d, dmin) set to a finite value.
std::vector<uint8_t> syntheticTensor(minfer::GgmlType type, uint64_t blocks) {
  const minfer::GgmlTypeTraits tr = minfer::ggmlTypeTraits(type);
  std::vector<uint8_t> data(blocks * tr.type_size);
  std::mt19937_64 rng(12345);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = data.data() + b * tr.type_size;
    const auto finiteHalf = [&](uint8_t* p) {
      const uint16_t h = static_cast<uint16_t>((rng() & 0x83FF) | ((rng() % 31) << 10));
      p[0] = static_cast<uint8_t>(h);
      p[1] = static_cast<uint8_t>(h >> 8);
    };
    switch (type) {
      case minfer::GgmlType::Q2_K: finiteHalf(blk + 80); finiteHalf(blk + 82); break;
      case minfer::GgmlType::Q3_K: finiteHalf(blk + 108); break;
      case minfer::GgmlType::Q6_K: finiteHalf(blk + 208); break;
      case minfer::GgmlType::Q4_0: case minfer::GgmlType::Q5_0: case minfer::GgmlType::Q8_0: finiteHalf(blk); break;
      default: finiteHalf(blk); finiteHalf(blk + 2); break;  // Q4_1, Q5_1, Q4_K, Q5_K: d and m / dmin
    }
  }
  return data;
}

double bestSeconds(const minfer::planes::TensorLayout& layout, llvm::ArrayRef<uint8_t> src,
                   std::vector<std::vector<uint8_t>>& planes, unsigned threads) {
  minfer::planes::PlaneWorkers workers(threads);
  std::vector<llvm::MutableArrayRef<uint8_t>> views(planes.begin(), planes.end());
  double best = 1e30;
  for (unsigned rep = 0; rep < kReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    llvm::cantFail(minfer::planes::transformTensor(layout, src, views, workers));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer plane-transform throughput benchmark\n");
  llvm::ExitOnError exit_on_error("minfer-bench-planes: ");
  const unsigned parallel = kThreads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : kThreads;
  std::printf("%ux%u tensors, best of %u, threads for the parallel run: %u\n", unsigned(kRows), unsigned(kCols),
              unsigned(kReps), parallel);
  std::printf("%-5s %10s %10s %8s %12s %14s\n", "type", "input MB", "planes MB", "threads", "MB/s", "MB/s/thread");
  std::vector<minfer::GgmlType> types = {minfer::GgmlType::Q4_K, minfer::GgmlType::Q6_K};
  if (kAllTypes)
    types.insert(types.end(), {minfer::GgmlType::Q2_K, minfer::GgmlType::Q3_K, minfer::GgmlType::Q5_K,
                               minfer::GgmlType::Q4_0, minfer::GgmlType::Q4_1, minfer::GgmlType::Q5_0,
                               minfer::GgmlType::Q5_1, minfer::GgmlType::Q8_0});
  for (minfer::GgmlType type : types) {
    const minfer::planes::TensorLayout layout = exit_on_error(
        minfer::planes::planLayout({"bench", type, kRows, kCols, minfer::planes::TensorRole::kMatMul}));
    const std::vector<uint8_t> src = syntheticTensor(type, layout.source_bytes / minfer::ggmlTypeTraits(type).type_size);
    std::vector<std::vector<uint8_t>> planes, first;
    for (const minfer::StrideTable& t : layout.planes) planes.emplace_back(t.bytes(), 0xA5);
    for (unsigned threads : {1u, parallel}) {
      const double s = bestSeconds(layout, src, planes, threads);
      if (first.empty()) {
        first = planes;
      } else if (planes != first) {  // determinism: -j 1 and -j N must give the same bytes
        llvm::WithColor::error() << "planes differ between -j 1 and -j " << threads << "\n";
        return 1;
      }
      const double mbps = static_cast<double>(src.size()) / s / 1e6;
      std::printf("%-5s %10.1f %10.1f %8u %12.0f %14.0f\n", minfer::ggmlTypeTraits(type).name, src.size() / 1e6,
                  layout.planeBytes() / 1e6, threads, mbps, mbps / threads);
      if (parallel == 1) break;
    }
  }
  return 0;
}
