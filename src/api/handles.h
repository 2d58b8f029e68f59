// What the C API's files share: the handles behind the opaque pq_context and
// pq_pool, and the guarded call of a function on a context.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "api/destroy_watches.h"
#include "base/error.h"
#include "sequence/context.h"

struct pq_context {
  pq_context(const pq_config& c, const pq::CallerPaths& paths, const pq::Hooks& hooks,
             std::shared_ptr<pq::ThreadPool> pool)
      : impl(c, paths, hooks, std::move(pool)) {}
  pq::Context impl;
  pq::api::DestroyWatches destroy_watches;  // pq_watch_destroy
};

// The caller's reference to a pool; contexts made with it hold their own.
struct pq_pool {
  std::shared_ptr<pq::ThreadPool> pool;
};

namespace pq {
const char* last_error();
}

namespace pq::api {

inline pq::Context& ctx_of(pq_context* ctx) {
  if (ctx == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
  return ctx->impl;
}
inline const pq::Context& ctx_of(const pq_context* ctx) {
  if (ctx == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
  return ctx->impl;
}
template <typename T>
T* require_out(T* p, const char* name) {
  if (p == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL");
  return p;
}

// pq::guarded for a call on a context: a failure also goes to the
// context's log hook (PQ_LOG_ERROR), with the message pq_last_error gives.
template <typename Ctx, typename Body>
pq_status guarded_on(Ctx* ctx, const char* function, Body&& body) noexcept {
  const pq_status status = pq::guarded(function, std::forward<Body>(body));
  if (status != PQ_OK && ctx != nullptr) ctx->impl.log_failure(pq::last_error());
  return status;
}

}  // namespace pq::api
