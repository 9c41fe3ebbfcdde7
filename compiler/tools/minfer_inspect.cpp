// minfer-inspect: shows what a GGUF file (or a .mfb artifact) holds: metadata, tensors, totals.
// Text output escapes control characters and ill-formed UTF-8 in every string from the file
// (runtime/util/terminal_text.h); JSON output escapes them as JSON does.
#include <cstdio>
#include <map>
#include <string>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/tools/inspect_artifact.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include "runtime/include/minfer/version.h"
#include "runtime/util/terminal_text.h"

using namespace minfer;
using namespace minfer::gguf;

namespace {

llvm::cl::OptionCategory kCategory("minfer-inspect options");
llvm::cl::opt<std::string> kInput(llvm::cl::Positional, llvm::cl::desc("<model.gguf | model.mfb>"), llvm::cl::Required,
                                  llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kJson("json", llvm::cl::desc("Print machine-readable JSON"), llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kVerify("verify", llvm::cl::desc("Artifacts: check every data segment's checksum"),
                            llvm::cl::cat(kCategory));
llvm::cl::opt<unsigned> kArrayItems("array-items", llvm::cl::desc("Array elements shown before summarizing (default 8)"),
                                    llvm::cl::init(8), llvm::cl::cat(kCategory));

std::string numberText(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// For JSON values: llvm::json requires UTF-8 (ill-formed bytes become U+FFFD), and GGUF strings are bytes.
std::string utf8(std::string_view v) {
  std::string s(v);
  return llvm::json::isUTF8(s) ? s : llvm::json::fixUTF8(s);
}

bool isFloat(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

std::string scalarText(const Value& v) {
  switch (v.type) {
    case ValueType::STRING:
      return "\"" + util::escapeForTerminal(v.str, 200) + "\"" +
             (v.str.size() > 200 ? " (" + std::to_string(v.str.size()) + " bytes)" : "");
    case ValueType::BOOL: return v.u ? "true" : "false";
    case ValueType::FLOAT32: case ValueType::FLOAT64: return numberText(v.f);
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      return std::to_string(v.i);
    default: return std::to_string(v.u);
  }
}

std::string valueText(const Value& v, unsigned items) {
  if (v.type != ValueType::ARRAY) return scalarText(v);
  std::string out = llvm::formatv("[{0} × {1}] ", v.count, valueTypeName(v.elem_type)).str();
  const uint64_t shown = std::min<uint64_t>(v.count, items);
  out += "[";
  for (uint64_t k = 0; k < shown; ++k) {
    if (k) out += ", ";
    if (v.elem_type == ValueType::STRING) {
      Value s;
      s.type = ValueType::STRING;
      s.str = v.strings[k];
      out += scalarText(s);
    } else if (v.elem_type == ValueType::ARRAY) {
      out += valueText(v.arrays[k], items);
    } else {
      out += isFloat(v.elem_type) ? numberText(v.numberAt(k)) : std::to_string(v.integerAt(k));
    }
  }
  if (shown < v.count) out += ", …";
  return out + "]";
}

llvm::json::Value valueJson(const Value& v, unsigned items) {
  switch (v.type) {
    case ValueType::STRING: return utf8(v.str);
    case ValueType::BOOL: return v.u != 0;
    case ValueType::FLOAT32: case ValueType::FLOAT64: return v.f;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64: return v.i;
    case ValueType::ARRAY: {
      llvm::json::Array arr;
      const uint64_t shown = std::min<uint64_t>(v.count, items);
      for (uint64_t k = 0; k < shown; ++k) {
        if (v.elem_type == ValueType::STRING) arr.push_back(utf8(v.strings[k]));
        else if (v.elem_type == ValueType::ARRAY) arr.push_back(valueJson(v.arrays[k], items));
        else if (isFloat(v.elem_type)) arr.push_back(v.numberAt(k));
        else arr.push_back(v.integerAt(k));
      }
      return llvm::json::Object{{"type", "ARRAY"}, {"element_type", valueTypeName(v.elem_type)},
                                {"count", static_cast<int64_t>(v.count)}, {"items", std::move(arr)},
                                {"truncated", shown < v.count}};
    }
    default: return static_cast<int64_t>(v.u);
  }
}

std::string shapeText(const TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

void printGguf(const GgufFile& f) {
  llvm::raw_ostream& os = llvm::outs();
  os << llvm::formatv("{0}: GGUF v{1}, {2} bytes, alignment {3}, data section at {4:x}\n", f.fileName(), f.version(),
                      f.fileSize(), f.alignment(), f.dataOffset());
  os << llvm::formatv("\nmetadata ({0} keys):\n", f.metadata().size());
  for (const KeyValue& kv : f.metadata())
    os << llvm::formatv("  {0,-44} {1,-8} {2}\n", util::escapeForTerminal(kv.key),
                        kv.value.type == ValueType::ARRAY ? "ARRAY" : valueTypeName(kv.value.type),
                        valueText(kv.value, kArrayItems));
  os << llvm::formatv("\ntensors ({0}):\n", f.tensors().size());
  os << llvm::formatv("  {0,-36} {1,-6} {2,-22} {3,12} {4,12}\n", "name", "type", "shape (ne)", "offset", "bytes");
  struct Total { uint64_t count = 0, bytes = 0, elements = 0; };
  std::map<std::string, Total> totals;
  uint64_t all_bytes = 0, all_elements = 0;
  for (const TensorInfo& t : f.tensors()) {
    const char* type = ggmlTypeTraits(t.type).name;
    os << llvm::formatv("  {0,-36} {1,-6} {2,-22} {3,12:x} {4,12}\n", util::escapeForTerminal(t.name), type, shapeText(t), t.offset, t.size);
    Total& tot = totals[type];
    tot.count++;
    tot.bytes += t.size;
    tot.elements += t.elements();
    all_bytes += t.size;
    all_elements += t.elements();
  }
  os << "\ntotals per type:\n";
  for (const auto& [type, tot] : totals)
    os << llvm::formatv("  {0,-6} {1,5} tensors {2,14} elements {3,14} bytes  {4,6:f2} bits/weight\n", type,
                        tot.count, tot.elements, tot.bytes, 8.0 * tot.bytes / tot.elements);
  os << llvm::formatv("  {0,-6} {1,5} tensors {2,14} elements {3,14} bytes\n", "all", f.tensors().size(),
                      all_elements, all_bytes);
}

void printGgufJson(const GgufFile& f) {
  llvm::json::Object meta;
  for (const KeyValue& kv : f.metadata()) meta[utf8(kv.key)] = valueJson(kv.value, kArrayItems);
  llvm::json::Array tensors;
  std::map<std::string, std::pair<uint64_t, uint64_t>> totals;  // type → (tensors, bytes)
  for (const TensorInfo& t : f.tensors()) {
    auto& tot = totals[ggmlTypeTraits(t.type).name];
    tot.first++;
    tot.second += t.size;
    llvm::json::Array ne;
    for (uint32_t d = 0; d < t.n_dims; ++d) ne.push_back(static_cast<int64_t>(t.ne[d]));
    tensors.push_back(llvm::json::Object{{"name", utf8(t.name)},
                                         {"type", ggmlTypeTraits(t.type).name},
                                         {"ne", std::move(ne)},
                                         {"offset", static_cast<int64_t>(t.offset)},
                                         {"bytes", static_cast<int64_t>(t.size)}});
  }
  llvm::json::Object root{{"file", f.fileName().str()},
                          {"format", "gguf"},
                          {"version", static_cast<int64_t>(f.version())},
                          {"size", static_cast<int64_t>(f.fileSize())},
                          {"alignment", static_cast<int64_t>(f.alignment())},
                          {"data_offset", static_cast<int64_t>(f.dataOffset())},
                          {"metadata", std::move(meta)},
                          {"tensors", std::move(tensors)}};
  llvm::json::Object per_type;
  for (const auto& [type, tot] : totals)
    per_type[type] = llvm::json::Object{{"tensors", static_cast<int64_t>(tot.first)},
                                        {"bytes", static_cast<int64_t>(tot.second)}};
  root["totals"] = std::move(per_type);
  llvm::outs() << util::escapeJsonForTerminal(llvm::formatv("{0:2}", llvm::json::Value(std::move(root))).str()) << "\n";
}

// Reads the first 12 bytes to tell a GGUF ("GGUF" at 0) from an artifact ("MFB1" at 8).
bool looksLikeArtifact(const std::string& path) {
  auto buf = llvm::MemoryBuffer::getFileSlice(path, 12, 0);
  return buf && (*buf)->getBufferSize() == 12 && (*buf)->getBuffer().substr(8, 4) == "MFB1";
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "minfer-inspect (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv,
                                    "minfer-inspect: show the contents of a GGUF model or a minfer artifact\n");
  if (looksLikeArtifact(kInput)) return inspectArtifact(kInput, kJson, kVerify);
  if (kVerify)
    llvm::errs() << "minfer-inspect: note: --verify checks artifact checksums; a GGUF has none (its structure is "
                    "always validated)\n";
  auto file = GgufFile::open(kInput);
  if (!file) {
    // The reader's messages quote the file (keys, names): shown with control characters escaped.
    llvm::errs() << "minfer-inspect: "
                 << util::escapeForTerminal(llvm::toString(file.takeError()), std::string::npos, /*keep_newlines=*/true)
                 << "\n";
    return 1;
  }
  if (kJson)
    printGgufJson(**file);
  else
    printGguf(**file);
  return 0;
}
