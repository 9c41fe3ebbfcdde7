// GGUF reader: parses and validates a GGUF v2/v3 file (llama.cpp's model format) over a memory mapping.
//
// Format: ggml/docs/gguf.md (GGUF specification). Layout: magic "GGUF", u32 version, u64 tensor
// count, u64 metadata count, metadata key/values, tensor infos, padding to `general.alignment`
// (default 32), tensor data. All integers little-endian.
//
// The file is untrusted: every count, length, offset and size is checked (overflow-safe) against the
// bytes that remain before it is used, through ByteCursor. Errors name the file, the field, its byte
// offset and the numbers involved. Strings and tensor data are views into the mapping, valid as long
// as the GgufFile lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/block_formats.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

namespace minfer::gguf {

// GGUF metadata value types (GGUF spec, enum gguf_metadata_value_type).
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

const char* valueTypeName(ValueType t);
// Bytes of one scalar of type t; 0 for STRING and ARRAY.
uint32_t scalarSize(ValueType t);

inline constexpr uint32_t kMaxDims = 4;
inline constexpr uint64_t kDefaultAlignment = 32;
// Limits that reject absurd files before any allocation proportional to a declared count.
inline constexpr uint64_t kMaxArrayNesting = 8;
inline constexpr uint64_t kMaxKeyLength = 64 * 1024;
// Items that cost far more memory than their bytes in the file (a key/value ~11x, an inner array
// ~16x; TESTING.md §4) are capped per file, so that what a hostile file can make the reader hold is
// ~2.6x its size (arrays of strings) plus a constant. Real models have tens of keys; llama.cpp's
// reader refuses arrays of arrays altogether.
inline constexpr uint64_t kMaxMetadataKeys = 65536;
inline constexpr uint64_t kMaxInnerArrays = 65536;  // arrays inside arrays, summed over the file

// One metadata value. Scalars are held by value; strings are views into the mapping; arrays of
// scalars are a view of their raw little-endian elements; arrays of strings and nested arrays are
// materialized (bounded by the file size, since every element takes at least one byte in the file).
struct Value {
  ValueType type = ValueType::UINT8;
  uint64_t offset = 0;            // byte offset of the value in the file
  uint64_t u = 0;                 // UINT*, BOOL
  int64_t i = 0;                  // INT*
  double f = 0;                   // FLOAT32, FLOAT64
  std::string_view str;           // STRING
  ValueType elem_type = ValueType::UINT8;  // ARRAY: element type
  uint64_t count = 0;             // ARRAY: number of elements
  const uint8_t* raw = nullptr;   // ARRAY of scalars: count * scalarSize(elem_type) bytes
  std::vector<std::string_view> strings;   // ARRAY of STRING
  std::vector<Value> arrays;      // ARRAY of ARRAY

  bool isInteger() const;
  // Integer scalars widened; valid when isInteger().
  bool asU64(uint64_t* out) const;
  bool asI64(int64_t* out) const;
  // Element k of an array of scalars, converted (requires elem_type to be a numeric type).
  // integerAt of a float element truncates toward zero, saturates outside the int64 range and gives 0 for NaN.
  double numberAt(uint64_t k) const;
  int64_t integerAt(uint64_t k) const;
};

struct KeyValue {
  std::string_view key;
  Value value;
  uint64_t offset = 0;  // byte offset of the key
};

struct TensorInfo {
  std::string_view name;
  uint32_t n_dims = 0;
  uint64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] = contiguous (row) length; ggml order
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to the start of the data section, as stored
  uint64_t size = 0;         // bytes of data
  uint64_t info_offset = 0;  // byte offset of this tensor info in the file

  uint64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // Matrix view: rows = product of ne[1..], cols = ne[0].
  uint64_t cols() const { return ne[0]; }
  uint64_t rows() const { return ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
 public:
  // Maps `path` and parses it. Errors: I/O, and every validation failure listed in gguf_reader.cpp.
  static llvm::Expected<std::unique_ptr<GgufFile>> open(llvm::StringRef path);
  // Parses an in-memory buffer (tests, fuzzing); `name` is used in error messages.
  static llvm::Expected<std::unique_ptr<GgufFile>> parse(std::unique_ptr<llvm::MemoryBuffer> buffer,
                                                         llvm::StringRef name);

  llvm::StringRef fileName() const { return file_name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t dataOffset() const { return data_offset_; }  // absolute offset of the data section
  uint64_t fileSize() const { return buffer_->getBufferSize(); }
  llvm::ArrayRef<uint8_t> bytes() const;

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const KeyValue* find(llvm::StringRef key) const;
  const TensorInfo* findTensor(llvm::StringRef name) const;
  // The tensor's bytes in the mapping (checked at parse time to lie inside the file).
  llvm::ArrayRef<uint8_t> tensorData(const TensorInfo& t) const;

  // Typed accessors. Integers accept any integer type whose value fits the requested type; floats
  // accept FLOAT32 and FLOAT64. Errors say which key was missing or which type it had.
  llvm::Expected<uint32_t> getU32(llvm::StringRef key) const;
  llvm::Expected<uint64_t> getU64(llvm::StringRef key) const;
  llvm::Expected<int64_t> getI64(llvm::StringRef key) const;
  llvm::Expected<float> getF32(llvm::StringRef key) const;
  llvm::Expected<bool> getBool(llvm::StringRef key) const;
  llvm::Expected<std::string_view> getString(llvm::StringRef key) const;
  llvm::Expected<std::vector<std::string_view>> getStringArray(llvm::StringRef key) const;
  llvm::Expected<std::vector<float>> getF32Array(llvm::StringRef key) const;
  llvm::Expected<std::vector<int32_t>> getI32Array(llvm::StringRef key) const;
  // Optional variants: the default when the key is absent, an error when it has the wrong type.
  llvm::Expected<uint32_t> getU32Or(llvm::StringRef key, uint32_t def) const;
  llvm::Expected<float> getF32Or(llvm::StringRef key, float def) const;
  llvm::Expected<bool> getBoolOr(llvm::StringRef key, bool def) const;

 private:
  GgufFile() = default;
  llvm::Error parseAll();
  llvm::Error keyError(llvm::StringRef key, const llvm::Twine& what) const;
  template <typename T>
  llvm::Expected<T> getInteger(llvm::StringRef key, const char* type_name) const;

  std::string file_name_;
  std::unique_ptr<llvm::MemoryBuffer> buffer_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> key_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace minfer::gguf
