// GGUF writer: encodes metadata and tensor infos, lays out aligned tensor data, streams to a file.
#include "compiler/gguf/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>
#include <unordered_set>

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

namespace minfer::gguf {
namespace {

llvm::Error writerError(const llvm::Twine& what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "GGUF writer: " + what.str());
}

uint64_t alignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Little-endian encoder that appends to a byte vector.
class Encoder {
 public:
  explicit Encoder(std::vector<uint8_t>* out) : out_(out) {}
  uint64_t pos() const { return out_->size(); }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void u32(uint32_t v) { bytes(&v, 4); }  // host is little-endian (byte_cursor.h asserts it)
  void u64(uint64_t v) { bytes(&v, 8); }
  void str(llvm::StringRef s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  void zeros(uint64_t n) { out_->insert(out_->end(), n, 0); }

 private:
  std::vector<uint8_t>* out_;
};

bool isNumeric(ValueType t) { return t != ValueType::STRING && t != ValueType::ARRAY && scalarSize(t) != 0; }

// Encodes the value after its type field. Records array offsets for top-level values in `kv`.
void encodeValue(Encoder& e, const MetaValue& v, KvOffsets* kv) {
  switch (v.type) {
    case ValueType::STRING:
      e.str(v.str);
      return;
    case ValueType::ARRAY: {
      e.u32(static_cast<uint32_t>(v.elem_type));
      if (kv) kv->array_count = e.pos();
      e.u64(v.count);
      if (kv) kv->elements = e.pos();
      e.bytes(v.raw.data(), v.raw.size());
      for (const std::string& s : v.strings) e.str(s);
      for (const MetaValue& a : v.arrays) encodeValue(e, a, nullptr);
      return;
    }
    default:
      e.bytes(&v.bits, scalarSize(v.type));
      return;
  }
}

llvm::Error validateValue(llvm::StringRef key, const MetaValue& v, int depth) {
  if (v.type != ValueType::ARRAY) {
    if (v.type != ValueType::STRING && scalarSize(v.type) == 0)
      return writerError(llvm::formatv("key '{0}': unknown value type {1}", key, static_cast<uint32_t>(v.type)));
    return llvm::Error::success();
  }
  if (depth >= static_cast<int>(kMaxArrayNesting))
    return writerError(llvm::formatv("key '{0}': arrays nested deeper than {1}", key, kMaxArrayNesting));
  uint64_t have = 0;
  if (v.elem_type == ValueType::STRING) {
    have = v.strings.size();
  } else if (v.elem_type == ValueType::ARRAY) {
    have = v.arrays.size();
    for (const MetaValue& a : v.arrays) {
      if (a.type != ValueType::ARRAY)
        return writerError(llvm::formatv("key '{0}': element of an array of arrays is not an array", key));
      if (auto err = validateValue(key, a, depth + 1)) return err;
    }
  } else if (isNumeric(v.elem_type)) {
    const uint64_t size = scalarSize(v.elem_type);
    if (v.raw.size() % size != 0)
      return writerError(llvm::formatv("key '{0}': {1} raw bytes are not whole {2} elements", key, v.raw.size(),
                                       valueTypeName(v.elem_type)));
    have = v.raw.size() / size;
  } else {
    return writerError(llvm::formatv("key '{0}': unknown array element type {1}", key,
                                     static_cast<uint32_t>(v.elem_type)));
  }
  const size_t others = (v.elem_type == ValueType::STRING ? 0 : v.strings.size()) +
                        (v.elem_type == ValueType::ARRAY ? 0 : v.arrays.size()) +
                        (isNumeric(v.elem_type) ? 0 : v.raw.size());
  if (have != v.count || others != 0)
    return writerError(llvm::formatv("key '{0}': array count {1} does not match its {2} {3} elements", key, v.count,
                                     have, valueTypeName(v.elem_type)));
  return llvm::Error::success();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MetaValue

static MetaValue scalar(ValueType t, uint64_t bits) {
  MetaValue v;
  v.type = t;
  v.bits = bits;
  return v;
}

MetaValue MetaValue::u8(uint8_t v) { return scalar(ValueType::UINT8, v); }
MetaValue MetaValue::i8(int8_t v) { return scalar(ValueType::INT8, static_cast<uint8_t>(v)); }
MetaValue MetaValue::u16(uint16_t v) { return scalar(ValueType::UINT16, v); }
MetaValue MetaValue::i16(int16_t v) { return scalar(ValueType::INT16, static_cast<uint16_t>(v)); }
MetaValue MetaValue::u32(uint32_t v) { return scalar(ValueType::UINT32, v); }
MetaValue MetaValue::i32(int32_t v) { return scalar(ValueType::INT32, static_cast<uint32_t>(v)); }
MetaValue MetaValue::u64(uint64_t v) { return scalar(ValueType::UINT64, v); }
MetaValue MetaValue::i64(int64_t v) { return scalar(ValueType::INT64, static_cast<uint64_t>(v)); }
MetaValue MetaValue::f32(float v) { return scalar(ValueType::FLOAT32, std::bit_cast<uint32_t>(v)); }
MetaValue MetaValue::f64(double v) { return scalar(ValueType::FLOAT64, std::bit_cast<uint64_t>(v)); }
MetaValue MetaValue::boolean(bool v) { return scalar(ValueType::BOOL, v ? 1 : 0); }

MetaValue MetaValue::string(std::string s) {
  MetaValue v;
  v.type = ValueType::STRING;
  v.str = std::move(s);
  return v;
}

MetaValue MetaValue::scalarArray(ValueType elem, std::vector<uint8_t> raw) {
  MetaValue v;
  v.type = ValueType::ARRAY;
  v.elem_type = elem;
  const uint32_t size = scalarSize(elem);
  v.count = size ? raw.size() / size : 0;
  v.raw = std::move(raw);
  return v;
}

template <typename T>
static MetaValue arrayOf(ValueType elem, llvm::ArrayRef<T> values) {
  std::vector<uint8_t> raw(values.size() * sizeof(T));
  if (!raw.empty()) std::memcpy(raw.data(), values.data(), raw.size());
  return MetaValue::scalarArray(elem, std::move(raw));
}

MetaValue MetaValue::f32Array(llvm::ArrayRef<float> v) { return arrayOf(ValueType::FLOAT32, v); }
MetaValue MetaValue::i32Array(llvm::ArrayRef<int32_t> v) { return arrayOf(ValueType::INT32, v); }
MetaValue MetaValue::u32Array(llvm::ArrayRef<uint32_t> v) { return arrayOf(ValueType::UINT32, v); }

MetaValue MetaValue::stringArray(std::vector<std::string> s) {
  MetaValue v;
  v.type = ValueType::ARRAY;
  v.elem_type = ValueType::STRING;
  v.count = s.size();
  v.strings = std::move(s);
  return v;
}

MetaValue MetaValue::arrayOfArrays(std::vector<MetaValue> a) {
  MetaValue v;
  v.type = ValueType::ARRAY;
  v.elem_type = ValueType::ARRAY;
  v.count = a.size();
  v.arrays = std::move(a);
  return v;
}

MetaValue MetaValue::fromParsed(const Value& p) {
  MetaValue v;
  v.type = p.type;
  switch (p.type) {
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64:
    case ValueType::BOOL:
      v.bits = p.u;
      break;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      v.bits = static_cast<uint64_t>(p.i);
      break;
    case ValueType::FLOAT32:
      v.bits = std::bit_cast<uint32_t>(static_cast<float>(p.f));
      break;
    case ValueType::FLOAT64:
      v.bits = std::bit_cast<uint64_t>(p.f);
      break;
    case ValueType::STRING:
      v.str = std::string(p.str);
      break;
    case ValueType::ARRAY:
      v.elem_type = p.elem_type;
      v.count = p.count;
      if (p.elem_type == ValueType::STRING) {
        v.strings.assign(p.strings.begin(), p.strings.end());
      } else if (p.elem_type == ValueType::ARRAY) {
        for (const Value& a : p.arrays) v.arrays.push_back(fromParsed(a));
      } else if (p.raw) {
        v.raw.assign(p.raw, p.raw + p.count * scalarSize(p.elem_type));
      }
      break;
  }
  return v;
}

uint64_t MetaValue::encodedSize() const {
  switch (type) {
    case ValueType::STRING:
      return 8 + str.size();
    case ValueType::ARRAY: {
      uint64_t n = 4 + 8 + raw.size();
      for (const std::string& s : strings) n += 8 + s.size();
      for (const MetaValue& a : arrays) n += a.encodedSize();
      return n;
    }
    default:
      return scalarSize(type);
  }
}

// ---------------------------------------------------------------------------------------------
// GgufLayout

const KvOffsets* GgufLayout::kv(llvm::StringRef key) const {
  for (const KvOffsets& k : kvs)
    if (k.key == key) return &k;
  return nullptr;
}

const TensorInfoOffsets* GgufLayout::tensor(llvm::StringRef name) const {
  for (const TensorInfoOffsets& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// GgufWriter

void GgufWriter::set(llvm::StringRef key, MetaValue v) {
  for (Kv& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(v);
      return;
    }
  }
  append(key, std::move(v));
}

void GgufWriter::append(llvm::StringRef key, MetaValue v) { kvs_.push_back(Kv{key.str(), std::move(v)}); }

const MetaValue* GgufWriter::get(llvm::StringRef key) const {
  for (const Kv& kv : kvs_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

void GgufWriter::addTensor(llvm::StringRef name, GgmlType type, std::vector<uint64_t> ne,
                           std::vector<uint8_t> bytes) {
  const uint64_t size = bytes.size();
  tensors_.push_back(Tensor{name.str(), type, std::move(ne), size, std::move(bytes), nullptr});
}

void GgufWriter::addTensor(llvm::StringRef name, GgmlType type, std::vector<uint64_t> ne, uint64_t size,
                           TensorProducer producer) {
  tensors_.push_back(Tensor{name.str(), type, std::move(ne), size, {}, std::move(producer)});
}

// Data size of a tensor, or the GGUF rule its type and shape break (message without a prefix).
static llvm::Expected<uint64_t> shapeDataSize(GgmlType type, llvm::ArrayRef<uint64_t> ne) {
  const auto fail = [](const llvm::Twine& what) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), what.str());
  };
  const GgmlTypeTraits traits = ggmlTypeTraits(type);
  if (!traits.known) return fail(llvm::formatv("unknown ggml type {0}", static_cast<uint32_t>(type)));
  if (ne.empty() || ne.size() > kMaxDims)
    return fail(llvm::formatv("{0} dims (must be 1..{1})", ne.size(), kMaxDims));
  uint64_t elements = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] == 0) return fail(llvm::formatv("ne[{0}] is 0", i));
    if (__builtin_mul_overflow(elements, ne[i], &elements))
      return fail("the element count overflows 64 bits");
  }
  if (ne[0] % traits.block_size != 0)
    return fail(llvm::formatv("row length ne[0] = {0} is not a multiple of the {1} block size {2}", ne[0],
                                     traits.name, traits.block_size));
  uint64_t size = 0;
  if (__builtin_mul_overflow(elements / traits.block_size, static_cast<uint64_t>(traits.type_size), &size))
    return fail("the data size overflows 64 bits");
  return size;
}

llvm::Expected<uint64_t> GgufWriter::tensorDataSize(GgmlType type, llvm::ArrayRef<uint64_t> ne) {
  auto size = shapeDataSize(type, ne);
  if (!size) return writerError(llvm::toString(size.takeError()));
  return size;
}

uint64_t GgufWriter::alignment() const {
  const MetaValue* a = get("general.alignment");
  if (!a || a->type == ValueType::STRING || a->type == ValueType::ARRAY || a->type == ValueType::FLOAT32 ||
      a->type == ValueType::FLOAT64 || a->type == ValueType::BOOL)
    return kDefaultAlignment;
  const uint64_t v = a->bits;
  if (v == 0 || (v & (v - 1)) != 0) return kDefaultAlignment;
  return v;
}

llvm::Error GgufWriter::validate() const {
  if (version_ != 2 && version_ != 3) return writerError(llvm::formatv("version {0} (must be 2 or 3)", version_));
  std::unordered_set<std::string> keys;
  for (const Kv& kv : kvs_) {
    if (!keys.insert(kv.key).second) return writerError(llvm::formatv("duplicate key '{0}'", kv.key));
    if (auto err = validateValue(kv.key, kv.value, 0)) return err;
  }
  if (const MetaValue* a = get("general.alignment")) {
    if (a->type != ValueType::UINT32 || a->bits == 0 || (a->bits & (a->bits - 1)) != 0)
      return writerError("general.alignment must be a UINT32 power of two");
  }
  std::unordered_set<std::string> names;
  for (const Tensor& t : tensors_) {
    if (!names.insert(t.name).second) return writerError(llvm::formatv("duplicate tensor name '{0}'", t.name));
    auto size = shapeDataSize(t.type, t.ne);
    if (!size) return writerError(llvm::formatv("tensor '{0}': {1}", t.name, llvm::toString(size.takeError())));
    if (*size != t.size)
      return writerError(llvm::formatv("tensor '{0}': {1} data bytes given, its type and shape need {2}", t.name,
                                       t.size, *size));
    if (!t.producer && t.bytes.size() != t.size)
      return writerError(llvm::formatv("tensor '{0}': no producer and {1} owned bytes", t.name, t.bytes.size()));
  }
  return llvm::Error::success();
}

// Header bytes (everything before the data section, padding included) and the layout of the file.
static void buildHeader(uint32_t version, uint64_t alignment, const auto& kvs, const auto& tensors,
                        GgufLayout* layout, std::vector<uint8_t>* out) {
  Encoder e(out);
  layout->magic = e.pos();
  e.bytes("GGUF", 4);
  layout->version = e.pos();
  e.u32(version);
  layout->tensor_count = e.pos();
  e.u64(tensors.size());
  layout->kv_count = e.pos();
  e.u64(kvs.size());
  for (const auto& kv : kvs) {
    KvOffsets o;
    o.key = kv.key;
    o.key_length = e.pos();
    o.key_bytes = o.key_length + 8;
    e.str(kv.key);
    o.type = e.pos();
    e.u32(static_cast<uint32_t>(kv.value.type));
    o.value = e.pos();
    encodeValue(e, kv.value, &o);
    o.end = e.pos();
    layout->kvs.push_back(std::move(o));
  }
  uint64_t rel = 0;
  for (const auto& t : tensors) {
    TensorInfoOffsets o;
    o.name = t.name;
    o.name_length = e.pos();
    o.name_bytes = o.name_length + 8;
    e.str(t.name);
    o.n_dims = e.pos();
    e.u32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) {
      o.ne.push_back(e.pos());
      e.u64(d);
    }
    o.type = e.pos();
    e.u32(static_cast<uint32_t>(t.type));
    o.offset = e.pos();
    e.u64(rel);
    o.end = e.pos();
    o.data = rel;  // made absolute below
    o.data_size = t.size;
    rel = alignUp(rel + t.size, alignment);
    layout->tensors.push_back(std::move(o));
  }
  layout->infos_end = e.pos();
  layout->data_start = alignUp(e.pos(), alignment);
  e.zeros(layout->data_start - e.pos());
  for (TensorInfoOffsets& o : layout->tensors) o.data += layout->data_start;
  layout->file_size = layout->data_start + rel;
}

llvm::Expected<GgufLayout> GgufWriter::layout() const {
  if (validate_)
    if (auto err = validate()) return err;
  GgufLayout layout;
  std::vector<uint8_t> header;
  buildHeader(version_, alignment(), kvs_, tensors_, &layout, &header);
  return layout;
}

llvm::Error GgufWriter::emit(const GgufLayout& layout,
                             const std::function<llvm::Error(llvm::ArrayRef<uint8_t>)>& sink) const {
  {
    GgufLayout again;
    std::vector<uint8_t> header;
    buildHeader(version_, alignment(), kvs_, tensors_, &again, &header);
    if (auto err = sink(header)) return err;
  }
  uint64_t pos = layout.data_start;
  std::vector<uint8_t> chunk;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    const TensorInfoOffsets& o = layout.tensors[i];
    if (pos < o.data) {
      std::vector<uint8_t> pad(o.data - pos, 0);
      if (auto err = sink(pad)) return err;
    }
    if (t.producer) {
      const GgmlTypeTraits traits = ggmlTypeTraits(t.type);
      const uint64_t granule = traits.known && traits.type_size ? traits.type_size : 1;
      const uint64_t step = std::max<uint64_t>(granule, chunk_bytes_ / granule * granule);
      for (uint64_t off = 0; off < t.size; off += step) {
        const uint64_t n = std::min(step, t.size - off);
        chunk.resize(n);
        if (auto err = t.producer(off, llvm::MutableArrayRef<uint8_t>(chunk.data(), n)))
          return writerError(llvm::formatv("tensor '{0}': {1}", t.name, llvm::toString(std::move(err))));
        if (auto err = sink(chunk)) return err;
      }
    } else {
      if (auto err = sink(t.bytes)) return err;
    }
    pos = o.data + t.size;
  }
  if (pos < layout.file_size) {
    std::vector<uint8_t> pad(layout.file_size - pos, 0);
    if (auto err = sink(pad)) return err;
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<uint8_t>> GgufWriter::toBytes() const {
  auto layout = this->layout();
  if (!layout) return layout.takeError();
  std::vector<uint8_t> out;
  out.reserve(layout->file_size);
  if (auto err = emit(*layout, [&](llvm::ArrayRef<uint8_t> b) {
        out.insert(out.end(), b.begin(), b.end());
        return llvm::Error::success();
      }))
    return err;
  return out;
}

// The stream's error with its reason ("No space left on device"), cleared: a raw_fd_ostream destroyed
// with an error still set aborts the process ("LLVM ERROR: IO failure on output stream").
static llvm::Error streamError(llvm::raw_fd_ostream& os, llvm::StringRef path, llvm::StringRef tmp) {
  if (!os.has_error()) return llvm::Error::success();
  const std::string reason = os.error().message();
  os.clear_error();
  os.SetUnbuffered();  // flushes (failing again) what is still buffered, so the destructor has nothing left
  os.clear_error();
  return writerError(llvm::formatv("{0}: write to temporary file {1} failed: {2}", path, tmp, reason));
}

llvm::Error GgufWriter::write(llvm::StringRef path) const {
  if (llvm::sys::fs::is_directory(path))
    return writerError(llvm::formatv("{0}: is a directory; give the GGUF's file name", path));
  auto layout = this->layout();
  if (!layout) return layout.takeError();
  int fd = -1;
  llvm::SmallString<256> tmp;
  if (std::error_code ec = llvm::sys::fs::createUniqueFile(path + ".tmp-%%%%%%", fd, tmp))
    return writerError(llvm::formatv("{0}: cannot create a temporary file: {1}", path, ec.message()));
  // Removed if a signal (Ctrl-C, SIGTERM, …) ends the process while writing; disarmed below.
  llvm::sys::RemoveFileOnSignal(tmp);
  llvm::Error result = [&]() -> llvm::Error {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    if (auto err = emit(*layout, [&](llvm::ArrayRef<uint8_t> b) -> llvm::Error {
          os.write(reinterpret_cast<const char*>(b.data()), b.size());
          return streamError(os, path, tmp);
        }))
      return err;
    os.close();
    if (auto err = streamError(os, path, tmp)) return err;
    if (std::error_code ec = llvm::sys::fs::rename(tmp, path))
      return writerError(llvm::formatv("cannot rename {0} to {1}: {2}", tmp, path, ec.message()));
    return llvm::Error::success();
  }();
  if (result) llvm::sys::fs::remove(tmp);
  llvm::sys::DontRemoveFileOnSignal(tmp);
  return result;
}

}  // namespace minfer::gguf
