// Reads <arch>.attention.sliding_window_pattern in either of llama.cpp's forms: a period or a per-layer array.
#include "compiler/model/swa_pattern.h"

#include "llvm/Support/FormatVariadic.h"

namespace minfer::model {
namespace {

llvm::Error patternError(const gguf::GgufFile& file, const std::string& key, const std::string& what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s: metadata '%s': %s",
                                 file.fileName().str().c_str(), key.c_str(), what.c_str());
}

// The array form: one flag per layer; `v` is an ARRAY.
llvm::Expected<std::vector<bool>> layersFromArray(const gguf::GgufFile& file, const std::string& key,
                                                  const gguf::Value& v, uint32_t n_layer) {
  using gguf::ValueType;
  const ValueType t = v.elem_type;
  if (t != ValueType::BOOL && t != ValueType::INT32 && t != ValueType::UINT32)
    return patternError(file, key,
                        llvm::formatv("has type ARRAY of {0}, expected an integer period or an ARRAY of BOOL, "
                                      "INT32 or UINT32 with one element per layer",
                                      gguf::valueTypeName(t)));
  if (v.count != n_layer)
    return patternError(file, key,
                        llvm::formatv("ARRAY of {0} {1} elements, expected one per layer: block_count = {2}",
                                      v.count, gguf::valueTypeName(t), n_layer));
  std::vector<bool> local(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) {
    const int64_t x = v.integerAt(l);
    if (x != 0 && x != 1)
      return patternError(file, key,
                          llvm::formatv("element {0} = {1}, expected 0 (global) or 1 (sliding window)", l, x));
    local[l] = x == 1;
  }
  return local;
}

}  // namespace

std::vector<bool> swaLayersFromPeriod(uint32_t period, uint32_t n_layer) {
  std::vector<bool> local(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) local[l] = period == 0 || l % period < period - 1;
  return local;
}

llvm::Expected<std::vector<bool>> readSwaLayers(const gguf::GgufFile& file, const std::string& key,
                                                uint32_t n_layer, uint32_t default_period) {
  const gguf::KeyValue* kv = file.find(key);
  if (!kv) return swaLayersFromPeriod(default_period, n_layer);
  if (kv->value.type == gguf::ValueType::ARRAY) return layersFromArray(file, key, kv->value, n_layer);
  auto period = file.getU32(key);  // its errors: not an integer, does not fit UINT32
  if (!period) return period.takeError();
  return swaLayersFromPeriod(*period, n_layer);
}

}  // namespace minfer::model
