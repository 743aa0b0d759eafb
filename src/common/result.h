#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

#include "common/error_code.h"

namespace moat {

// An error that carries what was attempted (context), the errno the kernel
// returned (0 when the failure is not a syscall) and a short stable code that
// callers and tests can match on.
struct Error {
  Code code = Code::kInternal;
  int sysErrno = 0;     // errno at the failure, 0 if none
  std::string context;  // what was being done, e.g. "mount overlay on /x"

  static Error fromErrno(std::string context, int err = errno) {
    return Error{Code::kSyscall, err, std::move(context)};
  }
  static Error make(Code code, std::string context) { return Error{code, 0, std::move(context)}; }
  // A request's field that cannot be taken: "field: problem".
  static Error invalidField(const std::string& field, const std::string& problem) {
    return make(Code::kInvalidRequest, field + ": " + problem);
  }
  // "context: strerror" or just "context".
  std::string message() const;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : data_(std::move(error)) {}  // NOLINT

  bool ok() const { return data_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(data_); }
  T&& value() && { return std::get<0>(std::move(data_)); }
  const T& value() const& { return std::get<0>(data_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(data_); }

 private:
  std::variant<T, Error> data_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

// Propagates an error from an expression returning Result<...>.
#define MOAT_TRY(expr)                 \
  do {                                 \
    auto moat_try_result_ = (expr);    \
    if (!moat_try_result_.ok()) {      \
      return moat_try_result_.error(); \
    }                                  \
  } while (0)

#define MOAT_CONCAT_INNER(a, b) a##b
#define MOAT_CONCAT(a, b) MOAT_CONCAT_INNER(a, b)
// Declares `lhs` from a Result<T>, returning the error if there is one.
#define MOAT_ASSIGN(lhs, expr) MOAT_ASSIGN_IMPL(MOAT_CONCAT(moat_assign_, __LINE__), lhs, expr)
#define MOAT_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                     \
  if (!tmp.ok()) return tmp.error();     \
  lhs = std::move(tmp.value())

}  // namespace moat
