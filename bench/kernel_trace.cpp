// libminfer-kernel-trace.so: a CUPTI injection library that records the start and end of every kernel a
// process runs (CUDA graph nodes included, overlapped launches as they really overlap) and writes them as
// CSV when the process exits. Not part of minfer: a measuring tool for the GPU machine, used as
//
//   CUDA_INJECTION64_PATH=/path/libminfer-kernel-trace.so MINFER_KERNEL_TRACE=trace.csv minfer-bench …
//
// The driver loads the library and calls InitializeInjection() at CUDA initialisation (CUPTI
// documentation, "Injection"); the activity API (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) hands over filled
// record buffers, whose kernel records are kept in memory until exit. CSV columns: start_ns, end_ns
// (GPU timestamps), graph_id, graph_node_id (0 outside graphs), grid_x, block_x, registers, name (quoted).
// The records are read as CUpti_ActivityKernel10, the layout of the CUPTI it is built against (CUDA 13):
// build it with the toolkit of the machine it runs on.
// scripts/kernel-trace-summary.py attributes a decode step's time to its kernels from this file.
// Errors (CUPTI calls failing, the file not writable) are printed to stderr; the traced process goes on.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end, graph_node;
  uint32_t graph;
  int32_t grid_x, block_x;
  uint16_t registers;
  std::string name;
};

// A kernel name as the body of a quoted CSV field (RFC 4180: quotes doubled).
std::string csvText(const char* s) {
  std::string out;
  for (; *s; ++s) out += *s == '"' ? std::string("\"\"") : std::string(1, *s);
  return out;
}

std::mutex g_mutex;
std::vector<KernelRecord>* g_records = nullptr;  // leaked on purpose: written from an atexit handler
constexpr size_t kBufferBytes = 8u << 20;

bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "minfer-kernel-trace: %s: %s\n", what, msg ? msg : "unknown CUPTI error");
  return false;
}

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI bufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records->push_back({k->start, k->end, k->graphNodeId, k->graphId, k->gridX, k->blockX, k->registersPerThread,
                          csvText(k->name ? k->name : "?")});
  }
  std::free(buffer);
}

void writeTrace() {
  ok(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  const char* path = std::getenv("MINFER_KERNEL_TRACE");
  std::FILE* f = path ? std::fopen(path, "w") : stderr;
  if (!f) {
    std::fprintf(stderr, "minfer-kernel-trace: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node_id,grid_x,block_x,registers,name\n");
  for (const KernelRecord& r : *g_records)
    std::fprintf(f, "%llu,%llu,%u,%llu,%d,%d,%u,\"%s\"\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.graph, static_cast<unsigned long long>(r.graph_node), r.grid_x,
                 r.block_x, static_cast<unsigned>(r.registers), r.name.c_str());
  if (f != stderr) std::fclose(f);
  std::fprintf(stderr, "minfer-kernel-trace: %zu kernels%s%s\n", g_records->size(), path ? " written to " : "",
               path ? path : "");
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  g_records = new std::vector<KernelRecord>();
  g_records->reserve(1u << 20);
  if (!ok(cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted), "cuptiActivityRegisterCallbacks") ||
      !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable"))
    return 0;
  std::atexit(writeTrace);
  return 1;
}
