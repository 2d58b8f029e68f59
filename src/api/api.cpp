// The C API: argument checks that need no context, then a guarded call into
// the C++ core. Every function body runs inside pq::guarded, so no exception
// crosses the ABI.
#include <cstring>
#include <string>

#include "api/handles.h"
#include "base/dtype.h"
#include "base/cpu_dispatch.h"
#include "base/error.h"
#include "base/tensor.h"
#include "config/config.h"

namespace {

using namespace pq::api;

// The hooks of pq_create_with_hooks, checked; NULL means none.
pq::Hooks checked_hooks(const pq_hooks* h, std::shared_ptr<pq::ThreadPool>* pool) {
  pq::Hooks out;
  if (h == nullptr) return out;
  if (h->struct_size < offsetof(pq_hooks, pool) + sizeof(pq_pool*) ||
      h->struct_size > sizeof(pq_hooks))
    pq::fail(PQ_ERR_INVALID_ARGUMENT, "hooks->struct_size is " + std::to_string(h->struct_size) +
                                          "; set it with pq_hooks_default");
  if (h->log_level < PQ_LOG_ERROR || h->log_level > PQ_LOG_DEBUG)
    pq::fail(PQ_ERR_INVALID_ARGUMENT, "hooks->log_level is " + std::to_string(h->log_level) +
                                          "; expected PQ_LOG_ERROR (0) .. PQ_LOG_DEBUG (3)");
  if ((h->host_alloc == nullptr) != (h->host_free == nullptr))
    pq::fail(PQ_ERR_INVALID_ARGUMENT,
             std::string("hooks->host_alloc is ") + (h->host_alloc ? "set" : "NULL") +
                 " and hooks->host_free is " + (h->host_free ? "set" : "NULL") +
                 "; give both or neither");
  out.log = h->log;
  out.log_user = h->log_user;
  out.log_level = h->log_level;
  out.allocator = {h->host_alloc, h->host_free, h->alloc_user};
  out.build_done = h->build_done;
  out.build_done_user = h->build_done_user;
  if (h->struct_size >= offsetof(pq_hooks, disk_user) + sizeof(void*))
    out.disk_io = {h->disk_read, h->disk_write, h->disk_user};
  if (h->struct_size >= offsetof(pq_hooks, build_progress_user) + sizeof(void*)) {
    out.build_progress = h->build_progress;
    out.build_progress_user = h->build_progress_user;
  }
  if (h->pool != nullptr) *pool = h->pool->pool;
  return out;
}

// pq_create and pq_create_with_hooks; `function` begins the messages.
pq_status create(const char* function, const pq_config* config, const pq_hooks* hooks,
                 pq_context** out) {
  pq::Hooks checked;
  const pq_status status = pq::guarded(function, [&] {
    require_out(out, "out");
    std::shared_ptr<pq::ThreadPool> pool;
    checked = checked_hooks(hooks, &pool);
    std::vector<float> kv_scales;
    pq_config resolved = pq::resolve_config(config, &kv_scales);
    pq::CallerPaths paths = pq::caller_paths(config);
    paths.kv_scales = std::move(kv_scales);
    if (pool) resolved.worker_threads = pool->size();
    *out = new pq_context(resolved, paths, checked, std::move(pool));
  });
  if (status != PQ_OK) checked.emit(PQ_LOG_ERROR, std::string(pq::last_error()));
  return status;
}
}  // namespace

extern "C" {

int pq_version_number(void) { return PQ_VERSION_NUMBER; }
const char* pq_version_string(void) { return PQ_VERSION_STRING; }

const char* pq_cpu_level(void) {
  if (pq::cpu_has_avx512_bf16()) return "avx512+bf16";
  return pq::cpu_level_name(pq::cpu_level());
}

const char* pq_status_string(int32_t status) {
  switch (status) {
    case PQ_OK: return "PQ_OK: success";
    case PQ_ERR_INVALID_ARGUMENT: return "PQ_ERR_INVALID_ARGUMENT: an argument is invalid";
    case PQ_ERR_OUT_OF_MEMORY: return "PQ_ERR_OUT_OF_MEMORY: out of memory or over the limit";
    case PQ_ERR_BAD_STATE: return "PQ_ERR_BAD_STATE: call not valid in the current state";
    case PQ_ERR_NOT_FOUND:
      return "PQ_ERR_NOT_FOUND: what the call names does not exist (a sequence, file, Redis key, "
             "plug-in or device)";
    case PQ_ERR_UNSUPPORTED: return "PQ_ERR_UNSUPPORTED: not supported by this build or backend";
    case PQ_ERR_BACKEND:
      return "PQ_ERR_BACKEND: something outside the library failed (the CUDA device, a file, "
             "the Redis server or a callback)";
    case PQ_ERR_INTERNAL: return "PQ_ERR_INTERNAL: internal error in libpqcache";
    case PQ_ERR_BUFFER_TOO_SMALL:
      return "PQ_ERR_BUFFER_TOO_SMALL: an output buffer is too small (its needed size was written)";
    case PQ_ERR_CORRUPT:
      return "PQ_ERR_CORRUPT: saved state (a buffer, file or Redis block) is truncated or "
             "corrupted";
    case PQ_ERR_INCOMPATIBLE:
      return "PQ_ERR_INCOMPATIBLE: saved state of another format version or geometry";
  }
  return "unknown pq_status";
}

const char* pq_last_error(void) { return pq::last_error(); }

pq_status pq_tensor_init(pq_tensor* t, void* data, int32_t dtype, int32_t layout,
                         int64_t tokens, int32_t heads, int32_t head_dim) {
  return pq::guarded(__func__, [&] {
    require_out(t, "tensor");
    if (!pq::dtype_valid(dtype))
      pq::fail(PQ_ERR_INVALID_ARGUMENT, "dtype is " + pq::dtype_text(dtype));
    if (layout != PQ_LAYOUT_TOKEN_MAJOR && layout != PQ_LAYOUT_HEAD_MAJOR)
      pq::fail(PQ_ERR_INVALID_ARGUMENT, "layout is " + std::to_string(layout) + "; expected 0..1");
    if (tokens < 0 || heads < 0 || head_dim < 0)
      pq::fail(PQ_ERR_INVALID_ARGUMENT, "tokens/heads/head_dim are " + std::to_string(tokens) +
                                            "/" + std::to_string(heads) + "/" +
                                            std::to_string(head_dim) + "; expected >= 0");
    if (data == nullptr && tokens > 0)
      pq::fail(PQ_ERR_INVALID_ARGUMENT, "data is NULL with " + std::to_string(tokens) + " tokens");
    pq_tensor v{};
    v.data = data;
    v.dtype = dtype;
    v.memory = PQ_MEMORY_HOST;
    v.tokens = tokens;
    v.heads = heads;
    v.head_dim = head_dim;
    bool overflow = false;
    if (layout == PQ_LAYOUT_TOKEN_MAJOR) {
      v.token_stride = static_cast<int64_t>(heads) * head_dim;
      v.head_stride = head_dim;
    } else {
      v.token_stride = head_dim;
      overflow = __builtin_mul_overflow(tokens, static_cast<int64_t>(head_dim), &v.head_stride);
    }
    int64_t bytes = 0;
    if (overflow || !pq::tensor_span_bytes(v, &bytes))
      pq::fail(PQ_ERR_INVALID_ARGUMENT,
               "tokens " + std::to_string(tokens) + " x heads " + std::to_string(heads) +
                   " x head_dim " + std::to_string(head_dim) + " of " +
                   std::to_string(pq::dtype_size(dtype)) +
                   "-byte elements overflows (the tensor must fit in int64 bytes and in the "
                   "address space after data)");
    *t = v;
  });
}

void pq_config_default(pq_config* c) {
  if (c != nullptr) pq::fill_config_defaults(c);
}


void pq_hooks_default(pq_hooks* h) {
  if (h == nullptr) return;
  *h = pq_hooks{};
  h->struct_size = sizeof(pq_hooks);
  h->log_level = PQ_LOG_WARN;
}

pq_status pq_create(const pq_config* config, pq_context** out) {
  return create(__func__, config, nullptr, out);
}

pq_status pq_create_with_hooks(const pq_config* config, const pq_hooks* hooks, pq_context** out) {
  return create(__func__, config, hooks, out);
}

pq_status pq_pool_create(int32_t threads, pq_pool** out) {
  return pq::guarded(__func__, [&] {
    require_out(out, "out");
    if (threads < 0 || threads > 1024)
      pq::fail(PQ_ERR_INVALID_ARGUMENT,
               "threads is " + std::to_string(threads) + "; expected 1..1024, or 0 for the "
                                                         "hardware threads");
    const int32_t n = threads > 0 ? threads : pq::hardware_threads();
    *out = new pq_pool{std::make_shared<pq::ThreadPool>(n)};
  });
}

pq_status pq_pool_threads(const pq_pool* pool, int32_t* out) {
  return pq::guarded(__func__, [&] {
    if (pool == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "pool is NULL");
    *require_out(out, "out_threads") = pool->pool->size();
  });
}

void pq_pool_destroy(pq_pool* pool) { delete pool; }

void pq_destroy(pq_context* ctx) {
  if (ctx == nullptr) return;
  ctx->destroy_watches.notify();
  delete ctx;
}

pq_status pq_watch_destroy(pq_context* ctx, pq_destroy_fn fn, void* user, uint64_t* out_watch) {
  return pq::guarded(__func__, [&] {
    if (ctx == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    if (fn == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "fn is NULL");
    require_out(out_watch, "out_watch");
    *out_watch = ctx->destroy_watches.add(fn, user);
  });
}

pq_status pq_unwatch_destroy(pq_context* ctx, uint64_t watch) {
  return pq::guarded(__func__, [&] {
    if (ctx == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    ctx->destroy_watches.remove(watch);
  });
}

pq_status pq_get_config(const pq_context* ctx, pq_config* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    require_out(out, "out");
    if (out->struct_size < offsetof(pq_config, pq_subspaces) || out->struct_size > sizeof(pq_config))
      pq::fail(PQ_ERR_INVALID_ARGUMENT, "out->struct_size is " + std::to_string(out->struct_size) +
                                            "; set it with pq_config_default");
    uint32_t size = out->struct_size;
    pq_config copy = c.config();
    copy.struct_size = size;
    std::memcpy(out, &copy, size);
  });
}

pq_status pq_get_backend(const pq_context* ctx, int32_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    *require_out(out, "out_backend") = c.backend().kind();
  });
}

pq_status pq_sequence_add(pq_context* ctx, uint64_t seq_id) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_add(seq_id); });
}

pq_status pq_sequence_remove(pq_context* ctx, uint64_t seq_id) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_remove(seq_id); });
}

pq_status pq_sequence_length(const pq_context* ctx, uint64_t seq_id, int32_t layer,
                             int64_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    require_out(out, "out_tokens");
    *out = c.sequence_length(seq_id, layer);
  });
}

pq_status pq_sequence_count(const pq_context* ctx, int64_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    *require_out(out, "out_count") = c.sequence_count();
  });
}

pq_status pq_sequence_set_stream(pq_context* ctx, uint64_t seq_id, void* cuda_stream) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_set_stream(seq_id, cuda_stream); });
}

pq_status pq_stats_get(const pq_context* ctx, pq_stats* out) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).stats(out); });
}

pq_status pq_sequence_stats_get(const pq_context* ctx, uint64_t seq_id, pq_stats* out) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_stats(seq_id, out); });
}

pq_status pq_wait_builds(pq_context* ctx) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).wait_builds(); });
}

}  // extern "C"
