// GGUF reader: header, metadata, tensor infos and data-section validation (see gguf_reader.h).
//
// Checks, each with its own message naming file, field, offset and numbers:
//   magic; version (2, 3; v1 and byte-swapped big-endian versions named as such); tensor/kv counts
//   against the bytes left and the per-file caps (keys, inner arrays); key and string lengths; value types; array counts and nesting depth;
//   bool values; duplicate keys; well-known key types (general.alignment a power of two, tokenizer
//   arrays, per-architecture hyperparameters); tensor names (length, duplicates); n_dims in 1..4; dims
//   ≥ 1 with no u64 overflow of their product; known tensor types; row length a multiple of the block
//   size; data offsets aligned, inside the file and not overlapping.
#include "compiler/gguf/gguf_reader.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "compiler/gguf/byte_cursor.h"
#include "llvm/Support/FormatVariadic.h"
#include "runtime/util/terminal_text.h"

namespace minfer::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kMaxTensorName = 64;  // GGUF spec: tensor names are at most 64 bytes

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

// A key or tensor name from the file as a message quotes it: control characters and ill-formed UTF-8
// escaped, at most 256 bytes (a crafted name must not drive the terminal that shows the error).
std::string shown(llvm::StringRef s) { return util::escapeForTerminal(std::string_view(s.data(), s.size()), 256); }

bool isIntegerType(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

bool isSignedType(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}

bool isFloatType(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// Decodes one little-endian scalar of type t at p into the matching field of v.
void decodeScalar(ValueType t, const uint8_t* p, Value* v) {
  switch (t) {
    case ValueType::UINT8: v->u = p[0]; break;
    case ValueType::INT8: v->i = static_cast<int8_t>(p[0]); break;
    case ValueType::UINT16: { uint16_t x; std::memcpy(&x, p, 2); v->u = x; break; }
    case ValueType::INT16: { int16_t x; std::memcpy(&x, p, 2); v->i = x; break; }
    case ValueType::UINT32: { uint32_t x; std::memcpy(&x, p, 4); v->u = x; break; }
    case ValueType::INT32: { int32_t x; std::memcpy(&x, p, 4); v->i = x; break; }
    case ValueType::UINT64: { uint64_t x; std::memcpy(&x, p, 8); v->u = x; break; }
    case ValueType::INT64: { int64_t x; std::memcpy(&x, p, 8); v->i = x; break; }
    case ValueType::FLOAT32: { float x; std::memcpy(&x, p, 4); v->f = x; break; }
    case ValueType::FLOAT64: { double x; std::memcpy(&x, p, 8); v->f = x; break; }
    case ValueType::BOOL: v->u = p[0]; break;
    default: break;
  }
}

// Declared counts are only checked against the bytes left, and one element in memory is larger than
// its smallest encoding (a Value is ~10x a 12-byte array header), so reservations are capped: memory
// then grows with the elements actually parsed, never with what a forged count claims.
size_t reserveBound(uint64_t count) { return static_cast<size_t>(std::min<uint64_t>(count, 4096)); }

class Parser {
 public:
  explicit Parser(ByteCursor& cur) : cur_(cur) {}

  llvm::Expected<std::string_view> readString(const llvm::Twine& field) {
    const uint64_t at = cur_.offset();
    auto len = cur_.read<uint64_t>(field + " length");
    if (!len) return len.takeError();
    if (*len > cur_.remaining())
      return cur_.failAt(at, field + " length",
                         llvm::formatv("string length {0} is past the end of the file ({1} bytes remain)", *len,
                                       cur_.remaining()));
    return cur_.readBytes(*len, field);
  }

  llvm::Expected<ValueType> readValueType(const llvm::Twine& field) {
    const uint64_t at = cur_.offset();
    auto raw = cur_.read<uint32_t>(field);
    if (!raw) return raw.takeError();
    if (*raw > static_cast<uint32_t>(ValueType::FLOAT64))
      return cur_.failAt(at, field, llvm::formatv("unknown metadata value type {0} (known: 0..12)", *raw));
    return static_cast<ValueType>(*raw);
  }

  llvm::Error readValue(ValueType type, const std::string& field, uint32_t depth, Value* v) {
    v->type = type;
    v->offset = cur_.offset();
    if (type == ValueType::STRING) {
      auto s = readString(field);
      if (!s) return s.takeError();
      v->str = *s;
      return llvm::Error::success();
    }
    if (type != ValueType::ARRAY) {
      const uint32_t n = scalarSize(type);
      auto bytes = cur_.readBytes(n, field);
      if (!bytes) return bytes.takeError();
      decodeScalar(type, reinterpret_cast<const uint8_t*>(bytes->data()), v);
      if (type == ValueType::BOOL && v->u > 1)
        return cur_.failAt(v->offset, field, llvm::formatv("bool value {0} is neither 0 nor 1", v->u));
      return llvm::Error::success();
    }
    if (depth >= kMaxArrayNesting)
      return cur_.fail(field, llvm::formatv("arrays nested deeper than {0} levels", kMaxArrayNesting));
    auto elem = readValueType(field + " element type");
    if (!elem) return elem.takeError();
    v->elem_type = *elem;
    const uint64_t count_at = cur_.offset();
    auto count = cur_.read<uint64_t>(field + " count");
    if (!count) return count.takeError();
    v->count = *count;
    // Smallest encoding of one element: the scalar size, 8 bytes for a string length, 12 for an
    // array header. The whole array must fit in what remains before anything is allocated.
    const uint64_t min_elem = *elem == ValueType::STRING ? 8 : *elem == ValueType::ARRAY ? 12 : scalarSize(*elem);
    uint64_t min_bytes = 0;
    if (mulOverflows(*count, min_elem, &min_bytes) || min_bytes > cur_.remaining())
      return cur_.failAt(count_at, field + " count",
                         llvm::formatv("array of {0} {1} elements needs at least {2} bytes but only {3} remain",
                                       *count, valueTypeName(*elem),
                                       min_bytes == 0 && *count ? std::string("2^64+") : std::to_string(min_bytes),
                                       cur_.remaining()));
    if (*elem == ValueType::STRING) {
      v->strings.reserve(reserveBound(*count));
      for (uint64_t k = 0; k < *count; ++k) {
        auto s = readString(llvm::formatv("{0}[{1}]", field, k));
        if (!s) return s.takeError();
        v->strings.push_back(*s);
      }
    } else if (*elem == ValueType::ARRAY) {
      if (*count > kMaxInnerArrays - inner_arrays_)
        return cur_.failAt(count_at, field + " count",
                           llvm::formatv("{0} inner arrays on top of the {1} already read exceed the limit of {2} "
                                         "arrays inside arrays per file",
                                         *count, inner_arrays_, kMaxInnerArrays));
      inner_arrays_ += *count;
      // GGUF spec: each element of an array of arrays is itself encoded as an array (element type,
      // count, elements) with no value-type tag of its own.
      v->arrays.reserve(reserveBound(*count));
      for (uint64_t k = 0; k < *count; ++k) {
        Value element;
        if (auto err = readValue(ValueType::ARRAY, llvm::formatv("{0}[{1}]", field, k), depth + 1, &element))
          return err;
        v->arrays.push_back(std::move(element));
      }
    } else {
      v->raw = cur_.data() + cur_.offset();
      if (auto err = cur_.skip(min_bytes, field)) return err;
      if (*elem == ValueType::BOOL)
        for (uint64_t k = 0; k < *count; ++k)
          if (v->raw[k] > 1)
            return cur_.failAt(v->offset + 12 + k, llvm::formatv("{0}[{1}]", field, k),
                               llvm::formatv("bool value {0} is neither 0 nor 1", v->raw[k]));
    }
    return llvm::Error::success();
  }

 private:
  ByteCursor& cur_;
  uint64_t inner_arrays_ = 0;  // arrays inside arrays read so far in this file (<= kMaxInnerArrays)
};

// Expected types of well-known keys. Integer keys accept any integer type; float keys FLOAT32/64.
enum class Want { kInteger, kFloat, kString, kBool, kStringArray, kFloatArray, kIntArray, kIntegerOrArray };

struct KnownKey {
  const char* name;  // full key, or a suffix after "<arch>." when `per_arch`
  Want want;
  bool per_arch;
};

constexpr KnownKey kKnownKeys[] = {
    {"general.architecture", Want::kString, false},
    {"general.name", Want::kString, false},
    {"general.alignment", Want::kInteger, false},
    {"general.file_type", Want::kInteger, false},
    {"general.quantization_version", Want::kInteger, false},
    {"tokenizer.ggml.model", Want::kString, false},
    {"tokenizer.ggml.pre", Want::kString, false},
    {"tokenizer.ggml.tokens", Want::kStringArray, false},
    {"tokenizer.ggml.scores", Want::kFloatArray, false},
    {"tokenizer.ggml.token_type", Want::kIntArray, false},
    {"tokenizer.ggml.merges", Want::kStringArray, false},
    {"tokenizer.ggml.bos_token_id", Want::kInteger, false},
    {"tokenizer.ggml.eos_token_id", Want::kInteger, false},
    {"tokenizer.ggml.unknown_token_id", Want::kInteger, false},
    {"tokenizer.ggml.padding_token_id", Want::kInteger, false},
    {"tokenizer.ggml.add_bos_token", Want::kBool, false},
    {"tokenizer.ggml.add_eos_token", Want::kBool, false},
    {"tokenizer.ggml.add_space_prefix", Want::kBool, false},
    {"tokenizer.chat_template", Want::kString, false},
    {"context_length", Want::kInteger, true},
    {"embedding_length", Want::kInteger, true},
    {"block_count", Want::kInteger, true},
    {"feed_forward_length", Want::kIntegerOrArray, true},
    {"attention.head_count", Want::kIntegerOrArray, true},
    {"attention.head_count_kv", Want::kIntegerOrArray, true},
    {"attention.key_length", Want::kInteger, true},
    {"attention.value_length", Want::kInteger, true},
    {"attention.layer_norm_rms_epsilon", Want::kFloat, true},
    {"attention.layer_norm_epsilon", Want::kFloat, true},
    {"rope.dimension_count", Want::kInteger, true},
    {"rope.freq_base", Want::kFloat, true},
    {"rope.scaling.type", Want::kString, true},
    {"rope.scaling.factor", Want::kFloat, true},
    {"rope.scaling.original_context_length", Want::kInteger, true},
    {"vocab_size", Want::kInteger, true},
};

const char* wantName(Want w) {
  switch (w) {
    case Want::kInteger: return "an integer";
    case Want::kFloat: return "FLOAT32 or FLOAT64";
    case Want::kString: return "STRING";
    case Want::kBool: return "BOOL";
    case Want::kStringArray: return "ARRAY of STRING";
    case Want::kFloatArray: return "ARRAY of FLOAT32";
    case Want::kIntArray: return "ARRAY of INT32";
    case Want::kIntegerOrArray: return "an integer or an ARRAY of integers";
  }
  return "?";
}

bool matches(Want w, const Value& v) {
  const bool is_array = v.type == ValueType::ARRAY;
  switch (w) {
    case Want::kInteger: return isIntegerType(v.type);
    case Want::kFloat: return isFloatType(v.type);
    case Want::kString: return v.type == ValueType::STRING;
    case Want::kBool: return v.type == ValueType::BOOL;
    case Want::kStringArray: return is_array && v.elem_type == ValueType::STRING;
    case Want::kFloatArray: return is_array && v.elem_type == ValueType::FLOAT32;
    case Want::kIntArray: return is_array && v.elem_type == ValueType::INT32;
    case Want::kIntegerOrArray: return isIntegerType(v.type) || (is_array && isIntegerType(v.elem_type));
  }
  return false;
}

std::string describeType(const Value& v) {
  if (v.type != ValueType::ARRAY) return valueTypeName(v.type);
  return std::string("ARRAY of ") + valueTypeName(v.elem_type);
}

}  // namespace

const char* valueTypeName(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "UINT8";
    case ValueType::INT8: return "INT8";
    case ValueType::UINT16: return "UINT16";
    case ValueType::INT16: return "INT16";
    case ValueType::UINT32: return "UINT32";
    case ValueType::INT32: return "INT32";
    case ValueType::FLOAT32: return "FLOAT32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::UINT64: return "UINT64";
    case ValueType::INT64: return "INT64";
    case ValueType::FLOAT64: return "FLOAT64";
  }
  return "UNKNOWN";
}

uint32_t scalarSize(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool Value::isInteger() const { return isIntegerType(type); }

bool Value::asU64(uint64_t* out) const {
  if (!isIntegerType(type)) return false;
  if (isSignedType(type)) {
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
  } else {
    *out = u;
  }
  return true;
}

bool Value::asI64(int64_t* out) const {
  if (!isIntegerType(type)) return false;
  if (isSignedType(type)) {
    *out = i;
  } else {
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
  }
  return true;
}

double Value::numberAt(uint64_t k) const {
  Value v;
  decodeScalar(elem_type, raw + k * scalarSize(elem_type), &v);
  if (isFloatType(elem_type)) return v.f;
  return isSignedType(elem_type) ? static_cast<double>(v.i) : static_cast<double>(v.u);
}

int64_t Value::integerAt(uint64_t k) const {
  Value v;
  decodeScalar(elem_type, raw + k * scalarSize(elem_type), &v);
  if (isFloatType(elem_type)) {
    // Saturating: a plain cast of NaN or of a value outside the int64 range is undefined behaviour.
    if (!(v.f == v.f)) return 0;
    if (v.f >= 9223372036854775808.0) return INT64_MAX;
    if (v.f <= -9223372036854775808.0) return INT64_MIN;
    return static_cast<int64_t>(v.f);
  }
  return isSignedType(elem_type) ? v.i : static_cast<int64_t>(v.u);
}

llvm::Expected<std::unique_ptr<GgufFile>> GgufFile::open(llvm::StringRef path) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false,
                                            /*IsVolatile=*/false);
  if (!buffer)
    return makeError(llvm::formatv("{0}: cannot open: {1}", path, buffer.getError().message()));
  return parse(std::move(*buffer), path);
}

llvm::Expected<std::unique_ptr<GgufFile>> GgufFile::parse(std::unique_ptr<llvm::MemoryBuffer> buffer,
                                                          llvm::StringRef name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->file_name_ = name.str();
  file->buffer_ = std::move(buffer);
  if (auto err = file->parseAll()) return err;
  return file;
}

llvm::ArrayRef<uint8_t> GgufFile::bytes() const {
  return {reinterpret_cast<const uint8_t*>(buffer_->getBufferStart()), buffer_->getBufferSize()};
}

llvm::Error GgufFile::parseAll() {
  ByteCursor cur(file_name_, bytes().data(), bytes().size());
  Parser parser(cur);

  // Header.
  auto magic = cur.read<uint32_t>("magic");
  if (!magic) return magic.takeError();
  if (*magic != kMagic) {
    const uint8_t* m = bytes().data();
    return cur.failAt(0, "magic",
                      llvm::formatv("not a GGUF file: expected \"GGUF\" (47 47 55 46), found {0:x-2} {1:x-2} "
                                    "{2:x-2} {3:x-2}",
                                    unsigned(m[0]), unsigned(m[1]), unsigned(m[2]), unsigned(m[3])));
  }
  auto version = cur.read<uint32_t>("version");
  if (!version) return version.takeError();
  if (*version != 2 && *version != 3) {
    const uint32_t swapped = __builtin_bswap32(*version);
    if (swapped == 2 || swapped == 3)
      return cur.failAt(4, "version",
                        llvm::formatv("big-endian GGUF file (version reads {0:x} = {1} byte-swapped); only "
                                      "little-endian files are supported",
                                      *version, swapped));
    if (*version == 1)
      return cur.failAt(4, "version", "GGUF version 1 is not supported (supported: 2, 3)");
    return cur.failAt(4, "version", llvm::formatv("unknown GGUF version {0} (supported: 2, 3)", *version));
  }
  version_ = *version;

  const uint64_t n_tensors_at = cur.offset();
  auto n_tensors = cur.read<uint64_t>("tensor count");
  if (!n_tensors) return n_tensors.takeError();
  const uint64_t n_kv_at = cur.offset();
  auto n_kv = cur.read<uint64_t>("metadata kv count");
  if (!n_kv) return n_kv.takeError();
  // A kv takes at least 13 bytes (key length, value type, 1-byte value); a tensor info at least 32.
  uint64_t need = 0;
  if (mulOverflows(*n_kv, 13, &need) || need > cur.remaining())
    return cur.failAt(n_kv_at, "metadata kv count",
                      llvm::formatv("{0} key/value pairs cannot fit in the {1} bytes that remain", *n_kv,
                                    cur.remaining()));
  if (*n_kv > kMaxMetadataKeys)
    return cur.failAt(n_kv_at, "metadata kv count",
                      llvm::formatv("{0} key/value pairs exceed the limit of {1} per file", *n_kv, kMaxMetadataKeys));
  if (mulOverflows(*n_tensors, 32, &need) || need > cur.remaining())
    return cur.failAt(n_tensors_at, "tensor count",
                      llvm::formatv("{0} tensor infos cannot fit in the {1} bytes that remain", *n_tensors,
                                    cur.remaining()));

  // Metadata.
  metadata_.reserve(reserveBound(*n_kv));
  for (uint64_t k = 0; k < *n_kv; ++k) {
    KeyValue kv;
    kv.offset = cur.offset();
    const std::string field = llvm::formatv("metadata kv #{0}", k);
    auto key = parser.readString(field + " key");
    if (!key) return key.takeError();
    if (key->empty()) return cur.failAt(kv.offset, field + " key", "empty key");
    if (key->size() > kMaxKeyLength)
      return cur.failAt(kv.offset, field + " key",
                        llvm::formatv("key length {0} exceeds {1}", key->size(), kMaxKeyLength));
    kv.key = *key;
    const std::string vfield = llvm::formatv("metadata '{0}'", shown(*key));
    if (key_index_.count(kv.key))
      return cur.failAt(kv.offset, vfield,
                        llvm::formatv("duplicate key (first defined at offset {0:x})",
                                      metadata_[key_index_[kv.key]].offset));
    auto type = parser.readValueType(vfield + " value type");
    if (!type) return type.takeError();
    if (auto err = parser.readValue(*type, vfield, 0, &kv.value)) return err;
    key_index_.emplace(kv.key, metadata_.size());
    metadata_.push_back(std::move(kv));
  }

  // Well-known keys must have their documented types.
  std::string arch;
  if (const KeyValue* a = find("general.architecture"); a && a->value.type == ValueType::STRING)
    arch = std::string(a->value.str);
  for (const KnownKey& known : kKnownKeys) {
    const std::string key = known.per_arch ? (arch.empty() ? std::string() : arch + "." + known.name) : known.name;
    if (key.empty()) continue;
    const KeyValue* kv = find(key);
    if (!kv || matches(known.want, kv->value)) continue;
    return cur.failAt(kv->offset, llvm::formatv("metadata '{0}'", shown(key)),
                      llvm::formatv("has type {0}, expected {1}", describeType(kv->value), wantName(known.want)));
  }
  if (const KeyValue* a = find("general.alignment")) {
    uint64_t alignment = 0;
    if (!a->value.asU64(&alignment) || alignment == 0 || (alignment & (alignment - 1)) != 0 ||
        alignment > (1u << 30))
      return cur.failAt(a->offset, "metadata 'general.alignment'",
                        llvm::formatv("alignment {0} is not a power of two in [1, 2^30]",
                                      a->value.isInteger() && isSignedType(a->value.type)
                                          ? std::to_string(a->value.i)
                                          : std::to_string(a->value.u)));
    alignment_ = alignment;
  }

  // Tensor infos.
  tensors_.reserve(reserveBound(*n_tensors));
  for (uint64_t k = 0; k < *n_tensors; ++k) {
    TensorInfo t;
    t.info_offset = cur.offset();
    const std::string field = llvm::formatv("tensor info #{0}", k);
    auto name = parser.readString(field + " name");
    if (!name) return name.takeError();
    if (name->empty()) return cur.failAt(t.info_offset, field + " name", "empty tensor name");
    if (name->size() > kMaxTensorName)
      return cur.failAt(t.info_offset, field + " name",
                        llvm::formatv("name length {0} exceeds the GGUF limit of {1}", name->size(),
                                      kMaxTensorName));
    t.name = *name;
    const std::string tfield = llvm::formatv("tensor '{0}'", shown(t.name));
    if (tensor_index_.count(t.name))
      return cur.failAt(t.info_offset, tfield + " name",
                        llvm::formatv("duplicate tensor name (first defined at offset {0:x})",
                                      tensors_[tensor_index_[t.name]].info_offset));
    const uint64_t dims_at = cur.offset();
    auto n_dims = cur.read<uint32_t>(tfield + " n_dims");
    if (!n_dims) return n_dims.takeError();
    if (*n_dims < 1 || *n_dims > kMaxDims)
      return cur.failAt(dims_at, tfield + " n_dims",
                        llvm::formatv("n_dims = {0}, must be 1..{1}", *n_dims, kMaxDims));
    t.n_dims = *n_dims;
    uint64_t elements = 1, span = 1;  // span: product of the non-zero dims, bounded like a count
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = cur.offset();
      const std::string nfield = llvm::formatv("{0} ne[{1}]", tfield, d);
      auto ne = cur.read<uint64_t>(nfield);
      if (!ne) return ne.takeError();
      // ne = 0 is valid (an empty tensor, as in ggml's gguf.cpp): the model code refuses it where a
      // block would compute with it.
      if (*ne > static_cast<uint64_t>(INT64_MAX))
        return cur.failAt(ne_at, nfield, llvm::formatv("dimension {0} exceeds 2^63 - 1", *ne));
      if (*ne != 0 && (mulOverflows(span, *ne, &span) || span > static_cast<uint64_t>(INT64_MAX)))
        return cur.failAt(ne_at, nfield, llvm::formatv("element count overflows with ne[{0}] = {1}", d, *ne));
      elements *= *ne;  // ≤ span, or 0
      t.ne[d] = *ne;
    }
    const uint64_t type_at = cur.offset();
    auto type = cur.read<uint32_t>(tfield + " type");
    if (!type) return type.takeError();
    const GgmlTypeTraits traits = ggmlTypeTraits(*type);
    if (!traits.known)
      return cur.failAt(type_at, tfield + " type", llvm::formatv("unknown tensor type {0}", *type));
    t.type = static_cast<GgmlType>(*type);
    if (t.ne[0] % traits.block_size != 0)
      return cur.failAt(type_at, tfield + " type",
                        llvm::formatv("row length ne[0] = {0} is not a multiple of the {1} block size {2}",
                                      t.ne[0], traits.name, traits.block_size));
    if (mulOverflows(elements / traits.block_size, traits.type_size, &t.size))
      return cur.failAt(type_at, tfield + " type", "data size overflows");
    const uint64_t off_at = cur.offset();
    auto offset = cur.read<uint64_t>(tfield + " offset");
    if (!offset) return offset.takeError();
    if (*offset % alignment_ != 0)
      return cur.failAt(off_at, tfield + " offset",
                        llvm::formatv("data offset {0} is not a multiple of general.alignment {1}", *offset,
                                      alignment_));
    t.offset = *offset;
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(t);
  }

  // Data section: aligned start, every tensor inside the file, no overlaps.
  const uint64_t end_of_infos = cur.offset();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t file_size = bytes().size();
  if (!tensors_.empty() && data_offset_ > file_size)
    return cur.failAt(end_of_infos, "data section",
                      llvm::formatv("starts at {0} (after alignment to {1}) past the end of the file (size {2})",
                                    data_offset_, alignment_, file_size));
  for (const TensorInfo& t : tensors_) {
    uint64_t begin = 0, end = 0;
    if (addOverflows(data_offset_, t.offset, &begin) || addOverflows(begin, t.size, &end) || end > file_size)
      return cur.failAt(t.info_offset, llvm::formatv("tensor '{0}' data", shown(t.name)),
                        llvm::formatv("[{0}, {0} + {1}) lies outside the file (size {2}); data section starts at {3}, "
                                      "tensor offset {4}",
                                      begin, t.size, file_size, data_offset_, t.offset));
  }
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  // Empty tensors occupy no bytes and overlap nothing.
  order.erase(std::remove_if(order.begin(), order.end(), [&](size_t i) { return tensors_[i].size == 0; }), order.end());
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors_[order[k - 1]];
    const TensorInfo& next = tensors_[order[k]];
    if (prev.offset + prev.size > next.offset)
      return cur.failAt(next.info_offset, llvm::formatv("tensor '{0}' data", shown(next.name)),
                        llvm::formatv("[{0}, {1}) overlaps tensor '{2}' at [{3}, {4}) (offsets within the data section)",
                                      next.offset, next.offset + next.size, shown(prev.name), prev.offset,
                                      prev.offset + prev.size));
  }
  return llvm::Error::success();
}

const KeyValue* GgufFile::find(llvm::StringRef key) const {
  auto it = key_index_.find(std::string_view(key.data(), key.size()));
  return it == key_index_.end() ? nullptr : &metadata_[it->second];
}

const TensorInfo* GgufFile::findTensor(llvm::StringRef name) const {
  auto it = tensor_index_.find(std::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

llvm::ArrayRef<uint8_t> GgufFile::tensorData(const TensorInfo& t) const {
  return bytes().slice(data_offset_ + t.offset, t.size);
}

llvm::Error GgufFile::keyError(llvm::StringRef key, const llvm::Twine& what) const {
  return makeError(llvm::formatv("{0}: metadata '{1}': {2}", file_name_, shown(key), what.str()));
}

template <typename T>
llvm::Expected<T> GgufFile::getInteger(llvm::StringRef key, const char* type_name) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (!kv->value.isInteger())
    return keyError(key, llvm::formatv("has type {0}, expected an integer", describeType(kv->value)));
  const std::string shown =
      isSignedType(kv->value.type) ? std::to_string(kv->value.i) : std::to_string(kv->value.u);
  if constexpr (std::is_signed_v<T>) {
    int64_t v = 0;
    if (!kv->value.asI64(&v) || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      return keyError(key, llvm::formatv("value {0} does not fit {1}", shown, type_name));
    return static_cast<T>(v);
  } else {
    uint64_t v = 0;
    if (!kv->value.asU64(&v) || v > std::numeric_limits<T>::max())
      return keyError(key, llvm::formatv("value {0} does not fit {1}", shown, type_name));
    return static_cast<T>(v);
  }
}

llvm::Expected<uint32_t> GgufFile::getU32(llvm::StringRef key) const { return getInteger<uint32_t>(key, "UINT32"); }
llvm::Expected<uint64_t> GgufFile::getU64(llvm::StringRef key) const { return getInteger<uint64_t>(key, "UINT64"); }
llvm::Expected<int64_t> GgufFile::getI64(llvm::StringRef key) const { return getInteger<int64_t>(key, "INT64"); }

llvm::Expected<float> GgufFile::getF32(llvm::StringRef key) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (!isFloatType(kv->value.type))
    return keyError(key, llvm::formatv("has type {0}, expected FLOAT32", describeType(kv->value)));
  return static_cast<float>(kv->value.f);
}

llvm::Expected<bool> GgufFile::getBool(llvm::StringRef key) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (kv->value.type != ValueType::BOOL)
    return keyError(key, llvm::formatv("has type {0}, expected BOOL", describeType(kv->value)));
  return kv->value.u != 0;
}

llvm::Expected<std::string_view> GgufFile::getString(llvm::StringRef key) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (kv->value.type != ValueType::STRING)
    return keyError(key, llvm::formatv("has type {0}, expected STRING", describeType(kv->value)));
  return kv->value.str;
}

llvm::Expected<std::vector<std::string_view>> GgufFile::getStringArray(llvm::StringRef key) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (kv->value.type != ValueType::ARRAY || kv->value.elem_type != ValueType::STRING)
    return keyError(key, llvm::formatv("has type {0}, expected ARRAY of STRING", describeType(kv->value)));
  return kv->value.strings;
}

llvm::Expected<std::vector<float>> GgufFile::getF32Array(llvm::StringRef key) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (kv->value.type != ValueType::ARRAY || !isFloatType(kv->value.elem_type))
    return keyError(key, llvm::formatv("has type {0}, expected ARRAY of FLOAT32", describeType(kv->value)));
  std::vector<float> out(kv->value.count);
  for (uint64_t k = 0; k < kv->value.count; ++k) out[k] = static_cast<float>(kv->value.numberAt(k));
  return out;
}

llvm::Expected<std::vector<int32_t>> GgufFile::getI32Array(llvm::StringRef key) const {
  const KeyValue* kv = find(key);
  if (!kv) return keyError(key, "missing (required key)");
  if (kv->value.type != ValueType::ARRAY || !isIntegerType(kv->value.elem_type))
    return keyError(key, llvm::formatv("has type {0}, expected ARRAY of INT32", describeType(kv->value)));
  std::vector<int32_t> out(kv->value.count);
  for (uint64_t k = 0; k < kv->value.count; ++k) {
    const int64_t v = kv->value.integerAt(k);
    if (v < INT32_MIN || v > INT32_MAX)
      return keyError(key, llvm::formatv("element {0} = {1} does not fit INT32", k, v));
    out[k] = static_cast<int32_t>(v);
  }
  return out;
}

llvm::Expected<uint32_t> GgufFile::getU32Or(llvm::StringRef key, uint32_t def) const {
  return find(key) ? getU32(key) : llvm::Expected<uint32_t>(def);
}
llvm::Expected<float> GgufFile::getF32Or(llvm::StringRef key, float def) const {
  return find(key) ? getF32(key) : llvm::Expected<float>(def);
}
llvm::Expected<bool> GgufFile::getBoolOr(llvm::StringRef key, bool def) const {
  return find(key) ? getBool(key) : llvm::Expected<bool>(def);
}

}  // namespace minfer::gguf
