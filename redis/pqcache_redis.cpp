// libpqcache_redis: a sequence's saved state (pq_sequence_save) in blocks on
// a Redis server, through hiredis. docs/redis.md describes the key layout,
// the manifest and the error behaviour; include/pqcache_redis.h is the
// contract.
//
// This file holds the C entry points. The inside, one concern a file:
// connection.h/.cpp (the handle, commands, pipelining), cluster.h/.cpp
// (Redis Cluster: slots, routing, redirects), store.h/.cpp (the
// manifest and blocks on the server, the put and the whole get),
// transfer.h/.cpp (the streaming get), manifest.cpp (the manifest's bytes)
// and internal.h (what they share).
//
// Inside: every C entry point runs in pq::guarded (src/base/error.h; error.cpp is
// compiled into this library), which turns a pq::Error (or bad_alloc) into a
// pq_status and this library's thread-local message. A network error
// drops the hiredis context (its protocol state is unknown after a partial
// read or write); the next call on the connection reconnects first.
#include "pqcache_redis.h"

#include <memory>
#include <mutex>
#include <string>

#include "cluster.h"
#include "connection.h"
#include "internal.h"
#include "store.h"
#include "transfer.h"

namespace pqr {

namespace {

void check_key(const char* key) {
  if (key == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "key is NULL");
  if (key[0] == '\0') fail(PQ_ERR_INVALID_ARGUMENT, "key is empty");
}

void check_conn(const pq_redis* conn) {
  if (conn == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "conn is NULL");
}

// A connection not yet connected, its arguments checked (pq_redis_connect and
// pq_redis_connect_cluster take the same).
std::unique_ptr<pq_redis> new_connection(const char* host, int32_t port, int32_t timeout_ms,
                                         pq_redis** out) {
  if (host == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "host is NULL");
  if (host[0] == '\0') fail(PQ_ERR_INVALID_ARGUMENT, "host is empty");
  if (out == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "out is NULL");
  if (port < 1 || port > 65535)
    fail(PQ_ERR_INVALID_ARGUMENT, "port " + std::to_string(port) + " is not in 1..65535");
  if (timeout_ms < 0)
    fail(PQ_ERR_INVALID_ARGUMENT,
         "timeout_ms " + std::to_string(timeout_ms) + " is negative (0: no limit)");
  auto conn = std::make_unique<pq_redis>();
  conn->server.host = host;
  conn->server.port = port;
  conn->timeout_ms = timeout_ms;
  return conn;
}

}  // namespace

}  // namespace pqr

using pqr::fail;

namespace pq {
const char* last_error();  // src/base/error.cpp, compiled into this library
}  // namespace pq

extern "C" {

PQ_REDIS_API pq_status pq_redis_connect(const char* host, int32_t port, int32_t timeout_ms,
                                        pq_redis** out) {
  return pq::guarded(__func__, [&] {
    auto conn = pqr::new_connection(host, port, timeout_ms, out);
    pqr::SigpipeGuard sigpipe;
    pqr::connect(*conn, conn->server);
    *out = conn.release();
  });
}

PQ_REDIS_API pq_status pq_redis_connect_cluster(const char* host, int32_t port,
                                                int32_t timeout_ms, pq_redis** out) {
  return pq::guarded(__func__, [&] {
    auto conn = pqr::new_connection(host, port, timeout_ms, out);
    conn->cluster = std::make_unique<pqr::Cluster>();
    conn->node = &conn->cluster->node(host, port);
    pqr::SigpipeGuard sigpipe;
    pqr::connect(*conn, *conn->node);
    pqr::refresh_slots(*conn);
    *out = conn.release();
  });
}

PQ_REDIS_API void pq_redis_close(pq_redis* conn) {
  if (conn == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    for (pq_redis_transfer* t : conn->transfers) t->conn.store(nullptr);
  }
  delete conn;  // its nodes' connections close with it
}

PQ_REDIS_API pq_status pq_redis_put(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                    const char* key, uint64_t block_bytes) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    if (ctx == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    pqr::check_key(key);
    if (block_bytes == 0 || block_bytes > PQ_REDIS_MAX_BLOCK_BYTES)
      fail(PQ_ERR_INVALID_ARGUMENT, "block_bytes " + std::to_string(block_bytes) +
                                        " is not in 1.." +
                                        std::to_string(PQ_REDIS_MAX_BLOCK_BYTES));
    pqr::put(*conn, ctx, seq_id, pqr::stored_name(*conn, key), block_bytes);
  });
}

PQ_REDIS_API pq_status pq_redis_get(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                    const char* key) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    if (ctx == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    pqr::check_key(key);
    pqr::get(*conn, ctx, seq_id, pqr::stored_name(*conn, key));
  });
}

PQ_REDIS_API pq_status pq_redis_get_begin(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                          const char* key, pq_redis_transfer** out) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    if (ctx == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    pqr::check_key(key);
    if (out == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "out is NULL");
    pqr::require_absent(ctx, seq_id);
    auto t = std::make_unique<pq_redis_transfer>();  // before the sequence exists
    t->seq_id = seq_id;
    t->key = pqr::stored_name(*conn, key);
    t->attach(conn, ctx);
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      pqr::SigpipeGuard sigpipe;
      pqr::route(*conn, pqr::manifest_key(t->key));
      t->m = pqr::require_manifest(*conn, t->key);
      t->description_bytes = pqr::begin_restore(*conn, ctx, seq_id, t->key, t->m, t->prefix);
    }
    // Nothing below can fail: the sequence exists from here on.
    t->fetched_bytes.store(t->prefix.size());
    t->next_block = (t->prefix.size() + t->m.block_bytes - 1) / t->m.block_bytes;
    t->prefix_at = static_cast<size_t>(t->description_bytes);
    t->fed = t->description_bytes;
    *out = t.release();
  });
}

PQ_REDIS_API pq_status pq_redis_get_continue(pq_redis_transfer* transfer, uint64_t max_blocks,
                                             int32_t* out_done) {
  return pq::guarded(__func__, [&] {
    if (transfer == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "transfer is NULL");
    pqr::transfer_step(*transfer, max_blocks);
    if (out_done) *out_done = transfer->done() ? 1 : 0;
  });
}

PQ_REDIS_API pq_status pq_redis_get_finish(pq_redis_transfer* transfer) {
  return pq::guarded(__func__, [&] {
    if (transfer == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "transfer is NULL");
    pqr::transfer_step(*transfer, 0);
  });
}

PQ_REDIS_API pq_status pq_redis_transfer_progress(const pq_redis_transfer* transfer,
                                                  uint64_t* out_fetched_bytes,
                                                  uint64_t* out_description_bytes,
                                                  uint64_t* out_state_bytes,
                                                  int32_t* out_layers_ready) {
  return pq::guarded(__func__, [&] {
    if (transfer == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "transfer is NULL");
    transfer->require_owners();
    if (out_fetched_bytes) *out_fetched_bytes = transfer->fetched_bytes.load();
    if (out_description_bytes) *out_description_bytes = transfer->description_bytes;
    if (out_state_bytes) *out_state_bytes = transfer->m.state_bytes;
    if (out_layers_ready) *out_layers_ready = transfer->layers_ready.load();
  });
}

PQ_REDIS_API void pq_redis_transfer_free(pq_redis_transfer* transfer) {
  if (transfer == nullptr) return;
  if (!transfer->done()) transfer->abandon("freed before it was done");
  delete transfer;
}

PQ_REDIS_API pq_status pq_redis_info(pq_redis* conn, const char* key, uint64_t* out_state_bytes,
                                     uint64_t* out_block_bytes, uint64_t* out_block_count) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    pqr::check_key(key);
    pqr::Manifest m;
    const std::string name = pqr::stored_name(*conn, key);
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      pqr::SigpipeGuard sigpipe;
      pqr::route(*conn, pqr::manifest_key(name));
      if (!pqr::read_manifest(*conn, name, &m))
        fail(PQ_ERR_NOT_FOUND, "no state under key \"" + name + "\"");
    }
    if (out_state_bytes) *out_state_bytes = m.state_bytes;
    if (out_block_bytes) *out_block_bytes = m.block_bytes;
    if (out_block_count) *out_block_count = m.block_count;
  });
}

PQ_REDIS_API pq_status pq_redis_delete(pq_redis* conn, const char* key) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    pqr::check_key(key);
    const std::string name = pqr::stored_name(*conn, key);
    std::lock_guard<std::mutex> lock(conn->mu);
    pqr::SigpipeGuard sigpipe;
    pqr::route(*conn, pqr::manifest_key(name));
    uint64_t end = 0;
    try {
      pqr::Manifest m;
      if (!pqr::read_manifest(*conn, name, &m))
        fail(PQ_ERR_NOT_FOUND, "no state under key \"" + name + "\"");
      end = m.block_count;
    } catch (const pqr::Error& f) {
      if (f.status() != PQ_ERR_CORRUPT && f.status() != PQ_ERR_INCOMPATIBLE) throw;
      end = pqr::kUnknownEnd;
    }
    const std::string mkey = pqr::manifest_key(name);
    pqr::command(*conn, {"DEL", mkey}, "DEL " + mkey);
    pqr::delete_blocks(*conn, name, 0, end);
  });
}

PQ_REDIS_API const char* pq_redis_last_error(void) { return pq::last_error(); }

}  // extern "C"
