// Fuzz harness: the GGUF reader and the compiler front end on arbitrary bytes (see fuzz_harness.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/model/model_desc.h"
#include "compiler/planes/layout_planner.h"
#include "compiler/planes/plane_transforms.h"
#include "compiler/planes/plane_workers.h"
#include "llvm/Support/MemoryBuffer.h"
#include "tests/fuzz/fuzz_harness.h"

namespace minfer::fuzz {
namespace {

using gguf::GgufFile;
using gguf::Value;
using gguf::ValueType;

// Tensors whose source bytes are at most this size are expanded into planes: the transforms are
// arithmetic over the bytes (the shapes, which is what a hostile file controls, go through the
// planner for every tensor), and larger ones would dominate the time per input.
constexpr uint64_t kMaxTransformBytes = 4096;

volatile uint64_t g_sink = 0;  // keeps reads from being optimized away
void sink(uint64_t v) { g_sink = g_sink + v; }

void consume(llvm::Error e) { llvm::consumeError(std::move(e)); }
template <typename T>
void consume(llvm::Expected<T> e) {
  if (!e) llvm::consumeError(e.takeError());
}

bool inside(const GgufFile& f, const void* p, uint64_t n) {
  const auto* b = f.bytes().data();
  const auto* q = static_cast<const uint8_t*>(p);
  return q >= b && static_cast<uint64_t>(q - b) <= f.fileSize() && n <= f.fileSize() - static_cast<uint64_t>(q - b);
}

// Touches every byte a value refers to, and checks each view lies inside the file.
void walkValue(const GgufFile& f, const Value& v, int depth) {
  if (depth > static_cast<int>(gguf::kMaxArrayNesting) + 1) fuzzFail("array nesting deeper than kMaxArrayNesting");
  if (v.offset > f.fileSize()) fuzzFail("value offset past the end of the file");
  switch (v.type) {
    case ValueType::STRING:
      if (!v.str.empty() && !inside(f, v.str.data(), v.str.size())) fuzzFail("string view outside the file");
      for (char c : v.str) sink(static_cast<uint8_t>(c));
      return;
    case ValueType::ARRAY:
      if (v.elem_type == ValueType::STRING) {
        if (v.strings.size() != v.count) fuzzFail("string array size differs from its count");
        for (std::string_view s : v.strings) {
          if (!s.empty() && !inside(f, s.data(), s.size())) fuzzFail("array string outside the file");
          for (char c : s) sink(static_cast<uint8_t>(c));
        }
      } else if (v.elem_type == ValueType::ARRAY) {
        if (v.arrays.size() != v.count) fuzzFail("nested array size differs from its count");
        for (const Value& e : v.arrays) walkValue(f, e, depth + 1);
      } else {
        const uint64_t n = v.count * gguf::scalarSize(v.elem_type);
        if (v.count > 0 && (v.raw == nullptr || !inside(f, v.raw, n))) fuzzFail("scalar array outside the file");
        for (uint64_t k = 0; k < v.count; ++k) {
          sink(static_cast<uint64_t>(v.integerAt(k)));
          const double d = v.numberAt(k);
          sink(d == d ? 1 : 0);
        }
      }
      return;
    default: {
      uint64_t u = 0;
      int64_t i = 0;
      if (v.isInteger()) {
        sink(v.asU64(&u) ? u : 0);
        sink(v.asI64(&i) ? static_cast<uint64_t>(i) : 0);
      }
      return;
    }
  }
}

void callAccessor(const GgufFile& f, llvm::StringRef key, unsigned which) {
  switch (which % 12) {
    case 0: consume(f.getU32(key)); break;
    case 1: consume(f.getU64(key)); break;
    case 2: consume(f.getI64(key)); break;
    case 3: consume(f.getF32(key)); break;
    case 4: consume(f.getBool(key)); break;
    case 5: consume(f.getString(key)); break;
    case 6: consume(f.getStringArray(key)); break;
    case 7: consume(f.getF32Array(key)); break;
    case 8: consume(f.getI32Array(key)); break;
    case 9: consume(f.getU32Or(key, 7)); break;
    case 10: consume(f.getF32Or(key, 0.5f)); break;
    default: consume(f.getBoolOr(key, true)); break;
  }
}

// The accessors that can succeed for the value's type, plus two others rotating with the key's
// index: across keys and inputs every accessor meets every type, without formatting eleven error
// messages per key (which dominated the time per input).
void walkAccessors(const GgufFile& f, llvm::StringRef key, const Value& v, unsigned index) {
  if (v.isInteger()) {
    consume(f.getU32(key));
    consume(f.getI64(key));
  } else if (v.type == ValueType::FLOAT32 || v.type == ValueType::FLOAT64) {
    consume(f.getF32(key));
  } else if (v.type == ValueType::BOOL) {
    consume(f.getBool(key));
  } else if (v.type == ValueType::STRING) {
    consume(f.getString(key));
  } else if (v.elem_type == ValueType::STRING) {
    consume(f.getStringArray(key));
  } else if (v.elem_type != ValueType::ARRAY) {
    consume(f.getF32Array(key));
    consume(f.getI32Array(key));
  }
  callAccessor(f, key, index);
  callAccessor(f, key, index * 5 + 7);
}

void walkFile(const GgufFile& f) {
  if (f.version() != 2 && f.version() != 3) fuzzFail("accepted an unsupported version");
  if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0) fuzzFail("alignment not a power of two");
  unsigned index = 0;
  for (const gguf::KeyValue& kv : f.metadata()) {
    if (f.find(llvm::StringRef(kv.key.data(), kv.key.size())) != &kv) fuzzFail("find(key) is not the key's entry");
    if (!inside(f, kv.key.data(), kv.key.size())) fuzzFail("key outside the file");
    walkValue(f, kv.value, 0);
    walkAccessors(f, llvm::StringRef(kv.key.data(), kv.key.size()), kv.value, index++);
  }
  callAccessor(f, "no.such.key", index);
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (f.findTensor(llvm::StringRef(t.name.data(), t.name.size())) != &t) fuzzFail("findTensor is not the tensor");
    if (t.n_dims < 1 || t.n_dims > gguf::kMaxDims) fuzzFail("n_dims out of range");
    const llvm::ArrayRef<uint8_t> data = f.tensorData(t);
    if (data.size() != t.size) fuzzFail("tensorData size differs from the tensor's size");
    if (t.size > 0 && !inside(f, data.data(), data.size())) fuzzFail("tensor data outside the file");
    if (t.offset % f.alignment() != 0) fuzzFail("tensor offset not aligned");
    const GgmlTypeTraits traits = ggmlTypeTraits(t.type);
    if (!traits.known || t.ne[0] % traits.block_size != 0) fuzzFail("unknown type or partial block accepted");
    if (t.elements() / traits.block_size * traits.type_size != t.size) fuzzFail("tensor size differs from its shape");
    for (uint64_t k = 0; k < data.size(); k += 61) sink(data[k]);
  }
}

// The compiler's front end on the parsed file: model description, layouts, and the plane transforms
// of small tensors (all of them read the GGUF's metadata and tensor bytes).
void walkCompiler(const GgufFile& f) {
  constexpr planes::TensorRole kRoles[] = {planes::TensorRole::kMatMul, planes::TensorRole::kEmbeddingMatMul,
                                           planes::TensorRole::kVector};
  static planes::PlaneWorkers workers(1);
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    // One role per tensor, varying with its index: the planner and transforms of every role get
    // exercised across inputs without tripling the cost of each input.
    const planes::TensorDesc td{std::string(t.name), t.type, t.rows(), t.cols(), kRoles[i % 3]};
    auto layout = planes::planLayout(td);
    if (!layout) {
      consume(layout.takeError());
      continue;
    }
    if (t.size > kMaxTransformBytes || layout->planeBytes() > 16 * kMaxTransformBytes) continue;
    if (layout->source_bytes != t.size) fuzzFail("layout source_bytes differs from the GGUF tensor size");
    auto out = planes::transformTensor(*layout, f.tensorData(t), workers);
    if (!out) {
      consume(out.takeError());
      continue;
    }
    if (out->size() != layout->planes.size()) fuzzFail("transformTensor plane count");
    for (size_t p = 0; p < out->size(); ++p)
      if ((*out)[p].size() != layout->planes[p].bytes()) fuzzFail("plane size differs from its stride table");
  }
  consume(model::describeModel(f, 16));
}

}  // namespace

int runGgufReader(const uint8_t* data, size_t size) {
  auto buffer = llvm::MemoryBuffer::getMemBuffer(
      llvm::StringRef(reinterpret_cast<const char*>(data), size), "fuzz.gguf", /*RequiresNullTerminator=*/false);
  auto file = GgufFile::parse(std::move(buffer), "fuzz.gguf");
  if (!file) {
    const std::string message = llvm::toString(file.takeError());
    if (message.rfind("fuzz.gguf: ", 0) != 0) fuzzFail("error message does not start with the file name: " + message);
    return 0;
  }
  walkFile(**file);
  walkCompiler(**file);
  return 0;
}

}  // namespace minfer::fuzz

#ifdef MINFER_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return minfer::fuzz::runGgufReader(data, size);
}
#endif
