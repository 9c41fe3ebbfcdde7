// GGUF writer: builds GGUF v2/v3 files (metadata, tensor infos, aligned tensor data) for minfer-synth
// and for tests, and reports the byte offset of every field it wrote so tests can corrupt exact bytes.
//
// Format: ggml/docs/gguf.md (GGUF specification). v2 and v3 share one layout (v3 only allows
// big-endian files, which this writer never produces); the version number is the only difference.
// Layout written: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, key/values in the
// order they were first set, tensor infos in the order they were added, zero padding to
// `general.alignment` (default 32), then each tensor's data at an aligned offset, each followed by zero
// padding to the alignment.
//
// By default the writer refuses to write a file the GGUF rules forbid (unknown tensor type, 0 or > 4
// dims, a zero dim, a row length not a multiple of the block size, data size not equal to what the
// shape implies, duplicate tensor names, a bad general.alignment). `setValidate(false)` writes whatever
// it was given, for corruption tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "kernels/block_formats.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace minfer::gguf {

// One metadata value to write; mirrors gguf::Value. Build with the static constructors.
struct MetaValue {
  ValueType type = ValueType::UINT8;
  uint64_t bits = 0;                  // numeric scalar or BOOL: little-endian bit pattern (low bytes)
  std::string str;                    // STRING
  ValueType elem_type = ValueType::UINT8;  // ARRAY: element type
  uint64_t count = 0;                 // ARRAY: element count as written (may be forged when not validating)
  std::vector<uint8_t> raw;           // ARRAY of numeric scalars: count * scalarSize(elem_type) bytes
  std::vector<std::string> strings;   // ARRAY of STRING
  std::vector<MetaValue> arrays;      // ARRAY of ARRAY (each element an ARRAY MetaValue)

  static MetaValue u8(uint8_t v);
  static MetaValue i8(int8_t v);
  static MetaValue u16(uint16_t v);
  static MetaValue i16(int16_t v);
  static MetaValue u32(uint32_t v);
  static MetaValue i32(int32_t v);
  static MetaValue u64(uint64_t v);
  static MetaValue i64(int64_t v);
  static MetaValue f32(float v);
  static MetaValue f64(double v);
  static MetaValue boolean(bool v);
  static MetaValue string(std::string v);
  // Array of numeric scalars from raw little-endian elements (raw.size() must be n * scalarSize).
  static MetaValue scalarArray(ValueType elem, std::vector<uint8_t> raw);
  static MetaValue f32Array(llvm::ArrayRef<float> v);
  static MetaValue i32Array(llvm::ArrayRef<int32_t> v);
  static MetaValue u32Array(llvm::ArrayRef<uint32_t> v);
  static MetaValue stringArray(std::vector<std::string> v);
  // Array whose elements are arrays (any element types; GGUF allows heterogeneous inner arrays).
  static MetaValue arrayOfArrays(std::vector<MetaValue> v);
  // Deep copy of a value read by GgufFile (e.g. to copy tokenizer.* keys from another file).
  static MetaValue fromParsed(const Value& v);

  // Bytes this value occupies in the file after its u32 type field.
  uint64_t encodedSize() const;
};

// Where each field landed in the written file (absolute byte offsets). For arrays, `array_count` is
// the offset of the u64 count and `value` the offset of the u32 element type; `elements` is the
// offset of the first element.
struct KvOffsets {
  std::string key;
  uint64_t key_length = 0;  // u64 key length
  uint64_t key_bytes = 0;   // first byte of the key string
  uint64_t type = 0;        // u32 value type
  uint64_t value = 0;       // the value (scalar; u64 length of a STRING; u32 element type of an ARRAY)
  uint64_t array_count = 0; // ARRAY: u64 element count
  uint64_t elements = 0;    // ARRAY: first element
  uint64_t end = 0;         // one past the last byte of this key/value
};

struct TensorInfoOffsets {
  std::string name;
  uint64_t name_length = 0;  // u64 name length
  uint64_t name_bytes = 0;   // first byte of the name
  uint64_t n_dims = 0;       // u32
  std::vector<uint64_t> ne;  // u64 per dim
  uint64_t type = 0;         // u32 ggml type
  uint64_t offset = 0;       // u64 data offset field
  uint64_t data = 0;         // absolute offset of the tensor's first data byte
  uint64_t data_size = 0;    // bytes of data
  uint64_t end = 0;          // one past the last byte of this tensor info
};

struct GgufLayout {
  uint64_t magic = 0, version = 4, tensor_count = 8, kv_count = 16;
  std::vector<KvOffsets> kvs;
  std::vector<TensorInfoOffsets> tensors;
  uint64_t infos_end = 0;   // one past the last tensor info (start of the padding before the data)
  uint64_t data_start = 0;  // start of the data section (aligned)
  uint64_t file_size = 0;

  const KvOffsets* kv(llvm::StringRef key) const;
  const TensorInfoOffsets* tensor(llvm::StringRef name) const;
};

// Fills `out` with the tensor's bytes [offset, offset + out.size()). Called one or more times per
// tensor, in order, with chunks whose offset is a multiple of the type's bytes per block (any
// multiple of 1 for unknown types). Must be deterministic if the output must be.
using TensorProducer = std::function<llvm::Error(uint64_t offset, llvm::MutableArrayRef<uint8_t> out)>;

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  void setVersion(uint32_t v) { version_ = v; }
  // false: write forbidden files (corruption tests). Default true.
  void setValidate(bool v) { validate_ = v; }
  // Chunk size handed to producers when streaming (rounded down to whole blocks). Default 64 MiB.
  void setChunkBytes(uint64_t n) { chunk_bytes_ = n; }

  // Sets `key`; replaces the value (keeping its position) if the key was already set.
  void set(llvm::StringRef key, MetaValue v);
  // Appends a key/value even if the key exists (duplicate-key files; only with setValidate(false)).
  void append(llvm::StringRef key, MetaValue v);
  void setU8(llvm::StringRef key, uint8_t v) { set(key, MetaValue::u8(v)); }
  void setI8(llvm::StringRef key, int8_t v) { set(key, MetaValue::i8(v)); }
  void setU16(llvm::StringRef key, uint16_t v) { set(key, MetaValue::u16(v)); }
  void setI16(llvm::StringRef key, int16_t v) { set(key, MetaValue::i16(v)); }
  void setU32(llvm::StringRef key, uint32_t v) { set(key, MetaValue::u32(v)); }
  void setI32(llvm::StringRef key, int32_t v) { set(key, MetaValue::i32(v)); }
  void setU64(llvm::StringRef key, uint64_t v) { set(key, MetaValue::u64(v)); }
  void setI64(llvm::StringRef key, int64_t v) { set(key, MetaValue::i64(v)); }
  void setF32(llvm::StringRef key, float v) { set(key, MetaValue::f32(v)); }
  void setF64(llvm::StringRef key, double v) { set(key, MetaValue::f64(v)); }
  void setBool(llvm::StringRef key, bool v) { set(key, MetaValue::boolean(v)); }
  void setString(llvm::StringRef key, std::string v) { set(key, MetaValue::string(std::move(v))); }
  void setStringArray(llvm::StringRef key, std::vector<std::string> v) {
    set(key, MetaValue::stringArray(std::move(v)));
  }
  void setF32Array(llvm::StringRef key, llvm::ArrayRef<float> v) { set(key, MetaValue::f32Array(v)); }
  void setI32Array(llvm::StringRef key, llvm::ArrayRef<int32_t> v) { set(key, MetaValue::i32Array(v)); }
  void setArrayOfArrays(llvm::StringRef key, std::vector<MetaValue> v) {
    set(key, MetaValue::arrayOfArrays(std::move(v)));
  }
  const MetaValue* get(llvm::StringRef key) const;
  size_t kvCount() const { return kvs_.size(); }

  // Adds a tensor. `ne` in ggml order (ne[0] = row length); data size = rows * ne[0] / block_size *
  // bytes_per_block for the type (ggmlTypeTraits). The bytes are owned by the writer.
  void addTensor(llvm::StringRef name, GgmlType type, std::vector<uint64_t> ne, std::vector<uint8_t> bytes);
  // Adds a tensor whose `size` bytes are produced at write time by `producer` (streaming).
  void addTensor(llvm::StringRef name, GgmlType type, std::vector<uint64_t> ne, uint64_t size,
                 TensorProducer producer);
  size_t tensorCount() const { return tensors_.size(); }

  // Bytes of data a tensor of this type and shape takes; an error names the rule it breaks (unknown
  // type, dims count, zero dim, overflow, row length not a multiple of the block size).
  static llvm::Expected<uint64_t> tensorDataSize(GgmlType type, llvm::ArrayRef<uint64_t> ne);

  // The layout write() / toBytes() will produce (offsets of every field). Errors: validation.
  llvm::Expected<GgufLayout> layout() const;
  // Writes the file: to a temporary file in the same directory, renamed over `path` on success;
  // on any failure (validation, producer error, I/O) the temporary is removed and `path` untouched.
  llvm::Error write(llvm::StringRef path) const;
  // The whole file in memory (tests).
  llvm::Expected<std::vector<uint8_t>> toBytes() const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t size;
    std::vector<uint8_t> bytes;  // owned data (when no producer)
    TensorProducer producer;
  };
  struct Kv {
    std::string key;
    MetaValue value;
  };

  llvm::Error validate() const;
  uint64_t alignment() const;
  // Streams the file to `sink(bytes)`.
  llvm::Error emit(const GgufLayout& layout, const std::function<llvm::Error(llvm::ArrayRef<uint8_t>)>& sink) const;

  uint32_t version_;
  bool validate_ = true;
  uint64_t chunk_bytes_ = 64ull << 20;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace minfer::gguf
