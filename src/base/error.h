// Internal error handling: code inside the library throws pq::Error; the C
// API boundary (api.cpp) turns every exception into a pq_status and the
// thread-local message, so no exception crosses the ABI.
#pragma once

#include <stdexcept>
#include <string>

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

// Throws Error(status, message) built from the streamed arguments.
[[noreturn]] void fail(pq_status status, const std::string& message);

// A number for messages: the shortest text that reads back as the same
// value of its type ("1e+308", "0.1" for 0.1f, "nan", "-inf").
std::string number_text(double value);
std::string number_text(float value);

// Records the calling thread's last error message. Never throws: without
// memory for the message, pq_last_error() says that instead.
void set_last_error(const std::string& message) noexcept;
// set_last_error("<function>: <prefix><what>"), as noexcept.
void report_error(const char* function, const char* what, const char* prefix = "") noexcept;

// Runs body() and converts any exception into a status plus message.
template <typename Body>
pq_status guarded(const char* function, Body&& body) noexcept;

}  // namespace pq

#include "base/error_inl.h"
