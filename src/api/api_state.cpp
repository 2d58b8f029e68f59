// The C API of sequence state: truncate, fork, save and restore.
#include <string>

#include "api/handles.h"
#include "format/state_file.h"

namespace {

using namespace pq::api;

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

}  // namespace

using namespace pq::api;

extern "C" {

pq_status pq_sequence_truncate(pq_context* ctx, uint64_t seq_id, int64_t tokens) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_truncate(seq_id, tokens); });
}

pq_status pq_sequence_reserve(pq_context* ctx, uint64_t seq_id, int64_t tokens) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).sequence_reserve(seq_id, tokens); });
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

}  // extern "C"
