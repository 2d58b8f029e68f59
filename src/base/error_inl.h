// Template part of error.h.
#pragma once

#include <new>

namespace pq {

template <typename Body, typename Report>
pq_status catch_status(Body&& body, Report&& report) noexcept {
  // The handlers build no strings themselves: an allocation failing again
  // while reporting one must not escape (report must not throw either).
  try {
    body();
    return PQ_OK;
  } catch (const Error& e) {
    report(e.what(), "");
    return e.status();
  } catch (const std::bad_alloc&) {
    report("out of host memory (allocation failed)", "");
    return PQ_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    report(e.what(), "internal error: ");
    return PQ_ERR_INTERNAL;
  } catch (...) {
    report("unknown exception", "internal error: ");
    return PQ_ERR_INTERNAL;
  }
}

template <typename Body>
pq_status guarded(const char* function, Body&& body) noexcept {
  return catch_status(std::forward<Body>(body), [function](const char* what, const char* prefix) {
    report_error(function, what, prefix);
  });
}

}  // namespace pq
