// Template part of error.h.
#pragma once

#include <new>

namespace pq {

template <typename Body>
pq_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return PQ_OK;
  } catch (const Error& e) {
    set_last_error(std::string(function) + ": " + e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(function) + ": out of host memory (allocation failed)");
    return PQ_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string(function) + ": internal error: " + e.what());
    return PQ_ERR_INTERNAL;
  } catch (...) {
    set_last_error(std::string(function) + ": internal error: unknown exception");
    return PQ_ERR_INTERNAL;
  }
}

}  // namespace pq
