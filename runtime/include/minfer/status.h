// Status and Result<T>: the runtime's error type (the runtime links no LLVM).
//
// A Status is either OK or carries a message that names the file, the field, the offset and the
// numbers involved (same convention as the compiler's llvm::Error messages). Result<T> holds a T or
// a failed Status. Thread-safety: plain values; no shared state.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace minfer {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.failed_ = true;
    return s;
  }

  bool isOk() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("while loading x.mfb: ") to a failed status.
  Status withContext(const std::string& context) && {
    if (failed_) message_ = context + message_;
    return std::move(*this);
  }

 private:
  std::string message_;
  bool failed_ = false;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design, like llvm::Expected
  Result(Status status) : status_(std::move(status)) { assert(!status_.isOk()); }  // NOLINT

  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const { return status_; }
  Status takeStatus() { return std::move(status_); }

  T& value() & { assert(isOk()); return *value_; }
  const T& value() const& { assert(isOk()); return *value_; }
  T&& value() && { assert(isOk()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

// Returns early from a function returning Status or Result<...> when `expr` (a Status) failed.
#define MINFER_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::minfer::Status minfer_status_ = (expr);   \
    if (!minfer_status_.isOk()) return minfer_status_; \
  } while (0)

}  // namespace minfer
