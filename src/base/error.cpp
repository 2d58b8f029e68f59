#include "base/error.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace pq {

namespace {
// The one piece of thread-local state: each thread sees its own message.
thread_local std::string t_last_error;
// What pq_last_error says when the message itself could not be stored.
thread_local const char* t_fallback = nullptr;
}  // namespace

void fail(pq_status status, const std::string& message) { throw Error(status, message); }

namespace {
template <typename Real>
std::string shortest_text(Real value, Real (*parse)(const char*, char**)) {
  char text[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(value));
    if (std::isnan(value) || parse(text, nullptr) == value) break;
  }
  return text;
}
}  // namespace

std::string number_text(double value) { return shortest_text<double>(value, std::strtod); }
std::string number_text(float value) { return shortest_text<float>(value, std::strtof); }

void set_last_error(const std::string& message) noexcept {
  try {
    t_last_error = message;
    t_fallback = nullptr;
  } catch (...) {  // out of memory for the message: say so without allocating
    t_fallback = "out of host memory (the message could not be stored)";
  }
}

void report_error(const char* function, const char* what, const char* prefix) noexcept {
  try {
    set_last_error(std::string(function) + ": " + prefix + what);
  } catch (...) {
    t_fallback = "out of host memory (the message could not be stored)";
  }
}

const char* last_error() { return t_fallback != nullptr ? t_fallback : t_last_error.c_str(); }

}  // namespace pq
