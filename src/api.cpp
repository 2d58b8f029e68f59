// The C API: argument checks that need no context, then a guarded call into
// the C++ core. Every function body runs inside pq::guarded, so no exception
// crosses the ABI.
#include <cstring>
#include <string>

#include "config.h"
#include "context.h"
#include "dtype.h"
#include "error.h"
#include "state_file.h"
#include "tensor.h"

struct pq_context {
  pq_context(const pq_config& c, const char* plugin_path, const pq::Hooks& hooks,
             std::shared_ptr<pq::ThreadPool> pool)
      : impl(c, plugin_path, hooks, std::move(pool)) {}
  pq::Context impl;
};

// The caller's reference to a pool; contexts made with it hold their own.
struct pq_pool {
  std::shared_ptr<pq::ThreadPool> pool;
};

namespace pq {
const char* last_error();
}

namespace {

pq::Context& ctx_of(pq_context* ctx) {
  if (ctx == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
  return ctx->impl;
}
const pq::Context& ctx_of(const pq_context* ctx) {
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
  if (h->pool != nullptr) *pool = h->pool->pool;
  return out;
}

// The steps of a restore in pieces: NeedMore becomes PQ_ERR_BUFFER_TOO_SMALL
// with the size needed.
template <typename Step>
void restore_step(uint64_t size, uint64_t* out_consumed, Step&& step) {
  require_out(out_consumed, "out_consumed");
  try {
    *out_consumed = step();
  } catch (const pq::NeedMore& more) {
    *out_consumed = more.needed;
    pq::fail(PQ_ERR_BUFFER_TOO_SMALL, "size is " + std::to_string(size) +
                                          " bytes; the next part of the state needs " +
                                          std::to_string(more.needed) +
                                          " (written to *out_consumed)");
  }
}

// pq_create and pq_create_with_hooks; `function` begins the messages.
pq_status create(const char* function, const pq_config* config, const pq_hooks* hooks,
                 pq_context** out) {
  pq::Hooks checked;
  const pq_status status = pq::guarded(function, [&] {
    require_out(out, "out");
    std::shared_ptr<pq::ThreadPool> pool;
    checked = checked_hooks(hooks, &pool);
    pq_config resolved = pq::resolve_config(config);
    if (pool) resolved.worker_threads = pool->size();
    const char* plugin_path =
        config->struct_size >= offsetof(pq_config, cuda_plugin_path) + sizeof(const char*)
            ? config->cuda_plugin_path
            : nullptr;
    *out = new pq_context(resolved, plugin_path, checked, std::move(pool));
  });
  if (status != PQ_OK) checked.emit(PQ_LOG_ERROR, std::string(pq::last_error()));
  return status;
}
}  // namespace

extern "C" {

int pq_version_number(void) { return PQ_VERSION_NUMBER; }
const char* pq_version_string(void) { return PQ_VERSION_STRING; }

const char* pq_status_string(int32_t status) {
  switch (status) {
    case PQ_OK: return "PQ_OK: success";
    case PQ_ERR_INVALID_ARGUMENT: return "PQ_ERR_INVALID_ARGUMENT: an argument is invalid";
    case PQ_ERR_OUT_OF_MEMORY: return "PQ_ERR_OUT_OF_MEMORY: out of memory or over the limit";
    case PQ_ERR_BAD_STATE: return "PQ_ERR_BAD_STATE: call not valid in the current state";
    case PQ_ERR_NOT_FOUND: return "PQ_ERR_NOT_FOUND: no such sequence, plug-in or device";
    case PQ_ERR_UNSUPPORTED: return "PQ_ERR_UNSUPPORTED: not supported by this build or backend";
    case PQ_ERR_BACKEND: return "PQ_ERR_BACKEND: the compute backend failed";
    case PQ_ERR_INTERNAL: return "PQ_ERR_INTERNAL: internal error in libpqcache";
    case PQ_ERR_BUFFER_TOO_SMALL:
      return "PQ_ERR_BUFFER_TOO_SMALL: an output buffer is too small (its needed size was written)";
    case PQ_ERR_CORRUPT: return "PQ_ERR_CORRUPT: saved state is truncated or corrupted";
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
      pq::fail(PQ_ERR_INVALID_ARGUMENT, "dtype is " + std::to_string(dtype) + "; expected 0..2");
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

void pq_destroy(pq_context* ctx) { delete ctx; }

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

pq_status pq_prefill_layer(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* keys,
                           const pq_tensor* values) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).prefill(seq_id, layer, keys, values); });
}

pq_status pq_decode_append(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* keys,
                           const pq_tensor* values) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).decode_append(seq_id, layer, keys, values); });
}

pq_status pq_selection_capacity(const pq_context* ctx, uint64_t seq_id, int32_t layer,
                                int64_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    require_out(out, "out_capacity");
    *out = c.selection_capacity(seq_id, layer);
  });
}

pq_status pq_selection_capacity_for(const pq_context* ctx, int32_t layer, int64_t tokens,
                                    int64_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    require_out(out, "out_capacity");
    *out = c.selection_capacity_for(layer, tokens);
  });
}

pq_status pq_decode_attend(pq_context* ctx, uint64_t seq_id, int32_t layer,
                           const pq_tensor* query, const pq_selection* selection, float scale,
                           float* out, float* out_lse) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).decode_attend(seq_id, layer, query, selection, scale, out, out_lse);
  });
}

pq_status pq_decode_select_batch(pq_context* ctx, int32_t layer, pq_select_item* items,
                                 int64_t count) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).decode_select_batch(layer, items, count); });
}

pq_status pq_fetch_kv_batch(pq_context* ctx, int32_t layer, pq_fetch_item* items,
                            int64_t count) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).fetch_batch(layer, items, count); });
}

pq_status pq_decode_select_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                  const pq_tensor* query, pq_selection* out) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).decode_select_device(seq_id, layer, query, out); });
}

pq_status pq_fetch_kv_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                             const pq_selection* selection, const pq_tensor* out_keys,
                             const pq_tensor* out_values) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).fetch_kv_device(seq_id, layer, selection, out_keys, out_values);
  });
}

pq_status pq_decode_select(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* query,
                           pq_selection* out) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).decode_select(seq_id, layer, query, out); });
}

pq_status pq_fetch_kv(pq_context* ctx, uint64_t seq_id, int32_t layer,
                      const pq_selection* selection, const pq_tensor* out_keys,
                      const pq_tensor* out_values) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).fetch(seq_id, layer, selection, out_keys, out_values);
  });
}

pq_status pq_prefill_queries(pq_context* ctx, uint64_t seq_id, int32_t layer,
                             const pq_tensor* queries) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).prefill_queries(seq_id, layer, queries); });
}

pq_status pq_observe_attention(pq_context* ctx, uint64_t seq_id, int32_t layer,
                               const pq_selection* selection, const float* probs) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).observe_attention(seq_id, layer, selection, probs);
  });
}

pq_status pq_layer_info_get(const pq_context* ctx, uint64_t seq_id, int32_t layer,
                            pq_layer_info* out) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).layer_info(seq_id, layer, out); });
}

pq_status pq_index_codes(pq_context* ctx, uint64_t seq_id, int32_t layer, int32_t kv_head,
                         int64_t first, int64_t count, uint8_t* out) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).index_codes(seq_id, layer, kv_head, first, count, out);
  });
}

pq_status pq_index_centroids(pq_context* ctx, uint64_t seq_id, int32_t layer, int32_t kv_head,
                             float* out, int64_t out_floats) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).index_centroids(seq_id, layer, kv_head, out, out_floats);
  });
}

// --- sequence state ----------------------------------------------------------

pq_status pq_sequence_truncate(pq_context* ctx, uint64_t seq_id, int64_t tokens) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_truncate(seq_id, tokens); });
}

pq_status pq_sequence_fork(pq_context* ctx, uint64_t parent_id, uint64_t child_id) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_fork(parent_id, child_id); });
}

pq_status pq_sequence_save(pq_context* ctx, uint64_t seq_id, pq_write_fn write, void* user) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    if (write == nullptr) pq::fail(PQ_ERR_INVALID_ARGUMENT, "write is NULL");
    c.sequence_save(seq_id, write, user);
  });
}

pq_status pq_sequence_state_size(pq_context* ctx, uint64_t seq_id, uint64_t* out_bytes) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    require_out(out_bytes, "out_bytes");
    *out_bytes = c.sequence_save(seq_id, nullptr, nullptr);
  });
}

namespace {
struct BufferSink {
  uint8_t* data;
  uint64_t capacity;
  uint64_t used = 0;
  bool overflow = false;
};
int write_to_buffer(void* user, const void* data, size_t size) {
  auto* b = static_cast<BufferSink*>(user);
  if (size > b->capacity - b->used) {
    b->overflow = true;
    return 1;
  }
  std::memcpy(b->data + b->used, data, size);
  b->used += size;
  return 0;
}
}  // namespace

pq_status pq_sequence_save_buffer(pq_context* ctx, uint64_t seq_id, void* buffer,
                                  uint64_t capacity, uint64_t* out_written) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    require_out(out_written, "out_written");
    if (buffer == nullptr && capacity > 0) pq::fail(PQ_ERR_INVALID_ARGUMENT, "buffer is NULL");
    // Measured first, so that a buffer too small is reported before
    // anything is written into it.
    const uint64_t needed = c.sequence_save(seq_id, nullptr, nullptr);
    if (needed > capacity) {
      *out_written = needed;
      pq::fail(PQ_ERR_BUFFER_TOO_SMALL, "capacity is " + std::to_string(capacity) +
                                            " bytes; the state of seq_id " +
                                            std::to_string(seq_id) + " needs " +
                                            std::to_string(needed));
    }
    BufferSink sink{static_cast<uint8_t*>(buffer), capacity};
    try {
      c.sequence_save(seq_id, &write_to_buffer, &sink);
    } catch (const pq::Error&) {
      if (!sink.overflow) throw;
      pq::fail(PQ_ERR_BAD_STATE, "seq_id " + std::to_string(seq_id) +
                                     " grew while it was saved; pq_sequence_save_buffer must "
                                     "not race with calls that change the sequence");
    }
    *out_written = sink.used;
  });
}

pq_status pq_sequence_save_file(pq_context* ctx, uint64_t seq_id, const char* path) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    pq::write_file_atomically(path, [&](pq_write_fn write, void* user) {
      c.sequence_save(seq_id, write, user);
    });
  });
}

pq_status pq_sequence_restore(pq_context* ctx, uint64_t seq_id, const void* data,
                              uint64_t size) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).sequence_restore(seq_id, static_cast<const uint8_t*>(data), size);
  });
}

pq_status pq_sequence_restore_file(pq_context* ctx, uint64_t seq_id, const char* path) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    pq::with_mapped_file(path, [&](const uint8_t* data, uint64_t size) {
      c.sequence_restore(seq_id, data, size);
    });
  });
}


pq_status pq_sequence_restore_begin(pq_context* ctx, uint64_t seq_id, const void* data,
                                    uint64_t size, uint64_t* out_consumed) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    restore_step(size, out_consumed, [&] {
      return c.sequence_restore_begin(seq_id, static_cast<const uint8_t*>(data), size);
    });
  });
}

pq_status pq_sequence_restore_kv(pq_context* ctx, uint64_t seq_id, const void* data, uint64_t size,
                                 uint64_t* out_consumed) {
  return guarded_on(ctx, __func__, [&] {
    pq::Context& c = ctx_of(ctx);
    restore_step(size, out_consumed, [&] {
      return c.sequence_restore_kv(seq_id, static_cast<const uint8_t*>(data), size);
    });
  });
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
