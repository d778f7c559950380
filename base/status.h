// Status and Result<T>: the error model of every fallible Baton operation.
//
// A Status is either OK or carries a code and a human-readable message that names what
// failed and why (a file, a tensor, a rule, a peer). Result<T> holds a T or a non-OK Status.
// Both are [[nodiscard]] so that a dropped error is a compile-time warning (and with
// -Werror, an error). No exception crosses a module boundary: adapters around throwing
// libraries (cereal, Asio, nlohmann::json) catch and convert to Status.
// Thread-compatible: plain values, no shared state.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace baton {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // caller passed something malformed (bad file, bad frame, bad flag)
  kNotFound,         // a named thing does not exist
  kAlreadyExists,
  kFailedPrecondition,  // the operation is refused in the current state (stale epoch, ...)
  kResourceExhausted,   // a limit was hit (frame size, queue, memory)
  kUnavailable,         // a peer or facility is not there (io_uring disabled, peer gone)
  kDataLoss,            // integrity check failed (CRC, hash)
  kDeadlineExceeded,
  kUnimplemented,
  kInternal,
  kIoError,  // an OS call failed; the message carries errno's text
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status FailedPrecondition(std::string message);
Status ResourceExhausted(std::string message);
Status Unavailable(std::string message);
Status DataLoss(std::string message);
Status Internal(std::string message);
Status Unimplemented(std::string message);
Status DeadlineExceeded(std::string message);
// An OS error: `what` failed with errno `err`; the message ends with strerror(err).
Status ErrnoStatus(std::string_view what, int err);

namespace internal {
// Reports `value()` (or `*`, `->`) taken of a Result that holds `status`, and aborts.
[[noreturn]] void DieOfValueOnError(const Status& status);
}  // namespace internal

// Holds either a value or a non-OK Status. Constructing from an OK Status is a bug and
// yields an Internal error instead. Taking the value of an error is a bug too: it aborts,
// naming the error (check ok() first, or use BATON_ASSIGN_OR_RETURN).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Internal("Result constructed from OK status without value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return Checked(); }
  const T& value() const& { return Checked(); }
  T&& value() && { return std::move(Checked()); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &Checked(); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return Checked(); }

 private:
  T& Checked() {
    if (!value_.has_value()) [[unlikely]]
      internal::DieOfValueOnError(status_);
    return *value_;
  }
  const T& Checked() const {
    if (!value_.has_value()) [[unlikely]]
      internal::DieOfValueOnError(status_);
    return *value_;
  }

  std::optional<T> value_;
  Status status_;
};

}  // namespace baton

#define BATON_STATUS_CONCAT_INNER(a, b) a##b
#define BATON_STATUS_CONCAT(a, b) BATON_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define BATON_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::baton::Status baton_status_ = (expr);        \
    if (!baton_status_.ok()) return baton_status_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status from the enclosing function.
#define BATON_ASSIGN_OR_RETURN(lhs, expr) \
  BATON_ASSIGN_OR_RETURN_IMPL(BATON_STATUS_CONCAT(baton_result_, __LINE__), lhs, expr)
#define BATON_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
