// Template part of error.h.
#pragma once

#include <new>

namespace pq {

template <typename Body>
pq_status guarded(const char* function, Body&& body) noexcept {
  // The handlers build no strings themselves (report_error cannot throw):
  // an allocation failing again while reporting one must not escape.
  try {
    body();
    return PQ_OK;
  } catch (const Error& e) {
    report_error(function, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    report_error(function, "out of host memory (allocation failed)");
    return PQ_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    report_error(function, e.what(), "internal error: ");
    return PQ_ERR_INTERNAL;
  } catch (...) {
    report_error(function, "internal error: unknown exception");
    return PQ_ERR_INTERNAL;
  }
}

}  // namespace pq
