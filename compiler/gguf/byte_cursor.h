// ByteCursor: bounds-checked little-endian reads over an untrusted byte range.
//
// Every count, length and offset read from a GGUF passes through here: a read that needs more bytes
// than remain fails with an error naming the file, the field, its byte offset and both numbers.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::gguf {

class ByteCursor {
 public:
  ByteCursor(std::string_view file_name, const uint8_t* data, uint64_t size)
      : file_name_(file_name), data_(data), size_(size) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }
  std::string_view fileName() const { return file_name_; }

  // An error at the current offset: "<file>: <field> at offset 0x..: <what>".
  llvm::Error fail(const llvm::Twine& field, const llvm::Twine& what) const { return failAt(pos_, field, what); }
  llvm::Error failAt(uint64_t offset, const llvm::Twine& field, const llvm::Twine& what) const {
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("{0}: {1} at offset {2:x}: {3}", file_name_, field.str(), offset, what.str()).str());
  }

  // Fails unless `n` more bytes remain.
  llvm::Error need(uint64_t n, const llvm::Twine& field) const {
    if (n > remaining())
      return fail(field, llvm::formatv("needs {0} bytes but only {1} remain in the file (size {2})", n,
                                       remaining(), size_));
    return llvm::Error::success();
  }

  template <typename T>
  llvm::Expected<T> read(const llvm::Twine& field) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (auto err = need(sizeof(T), field)) return err;
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));  // host is little-endian (checked at build time)
    pos_ += sizeof(T);
    return value;
  }

  // Returns a view of the next `n` bytes and advances past them.
  llvm::Expected<std::string_view> readBytes(uint64_t n, const llvm::Twine& field) {
    if (auto err = need(n, field)) return err;
    std::string_view view(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return view;
  }

  llvm::Error skip(uint64_t n, const llvm::Twine& field) {
    if (auto err = need(n, field)) return err;
    pos_ += n;
    return llvm::Error::success();
  }

  llvm::Error seek(uint64_t offset, const llvm::Twine& field) {
    if (offset > size_)
      return fail(field, llvm::formatv("offset {0} is past the end of the file (size {1})", offset, size_));
    pos_ = offset;
    return llvm::Error::success();
  }

 private:
  std::string file_name_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

static_assert(std::endian::native == std::endian::little, "minfer reads little-endian files on little-endian hosts");

// Overflow-checked arithmetic for sizes computed from file fields.
inline bool mulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
inline bool addOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

}  // namespace minfer::gguf
