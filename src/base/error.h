// Internal error handling: code inside the library throws pq::Error; the C
// API boundary (api.cpp) turns every exception into a pq_status and the
// thread-local message, so no exception crosses the ABI.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "pqcache.h"

namespace pq {

class Error : public std::runtime_error {
 public:
  Error(pq_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  pq_status status() const { return status_; }

 private:
  pq_status status_;
};

// Throws Error(status, message).
[[noreturn]] void fail(pq_status status, const std::string& message);

// The kit of argument checks: fail(PQ_ERR_INVALID_ARGUMENT, message), and
// an integer for the message (which argument, which value).
[[noreturn]] inline void invalid(const std::string& message) {
  fail(PQ_ERR_INVALID_ARGUMENT, message);
}
inline std::string str(int64_t v) { return std::to_string(v); }

// A number for messages: the shortest text that reads back as the same
// value of its type ("1e+308", "0.1" for 0.1f, "nan", "-inf").
std::string number_text(double value);
std::string number_text(float value);

// Records the calling thread's last error message. Never throws: without
// memory for the message, pq_last_error() says that instead.
void set_last_error(const std::string& message) noexcept;
// set_last_error("<function>: <prefix><what>"), as noexcept.
void report_error(const char* function, const char* what, const char* prefix = "") noexcept;

// Runs body() and turns any exception into its status, handing
// report(what, prefix) the message ("internal error: " prefixes what was
// not a pq::Error). report must not throw.
template <typename Body, typename Report>
pq_status catch_status(Body&& body, Report&& report) noexcept;

// catch_status at the C API boundary: the message becomes the calling
// thread's last error, "<function>: <prefix><what>".
template <typename Body>
pq_status guarded(const char* function, Body&& body) noexcept;

}  // namespace pq

#include "base/error_inl.h"
