#include "error.h"

namespace pq {

namespace {
// The one piece of thread-local state: each thread sees its own message.
thread_local std::string t_last_error;
}  // namespace

void fail(pq_status status, const std::string& message) { throw Error(status, message); }

void set_last_error(const std::string& message) { t_last_error = message; }

const char* last_error() { return t_last_error.c_str(); }

}  // namespace pq
