/*
 * pqcache_redis.h - a shared tier for libpqcache's sequence state on Redis.
 *
 * libpqcache_redis.so is an optional component beside libpqcache.so (which
 * does not depend on it, nor on hiredis). It moves a sequence's saved state
 * (pq_sequence_save, docs/state-format.md) to and from a Redis server, in
 * blocks, so that a second context, in another process or on another
 * machine, restores a sequence the first one saved: session migration,
 * prefill/decode disaggregation, a shared prefix store. docs/redis.md says
 * what is stored under which key and how errors behave.
 *
 * Conventions: those of pqcache.h. Every function but pq_redis_close and
 * pq_redis_last_error returns a pq_status; on error, pq_redis_last_error()
 * returns a message for the calling thread (the library's own
 * pq_last_error() cannot be set from outside it; when the library itself
 * failed, for example pq_sequence_restore with PQ_ERR_CORRUPT, its status
 * is returned unchanged and pq_redis_last_error() repeats its message with
 * the key). Output parameters are written only on success. Plain C99.
 *
 * Threading: a pq_redis connection may be shared by threads; its calls are
 * serialised (one network conversation at a time). Use one connection per
 * thread for concurrent transfers. The pq_context rules are those of
 * pqcache.h for pq_sequence_save (put) and pq_sequence_restore (get).
 */
#ifndef PQCACHE_REDIS_H
#define PQCACHE_REDIS_H

#include <stdint.h>

#include "pqcache.h"

#if defined(SWIG)
#define PQ_REDIS_API
#elif defined(__GNUC__) || defined(__clang__)
#define PQ_REDIS_API __attribute__((visibility("default")))
#else
#define PQ_REDIS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the manifest format this library writes and reads
 * (docs/redis.md). */
#define PQ_REDIS_MANIFEST_VERSION 1

/* The largest block: Redis's default proto-max-bulk-len (512 MiB). */
#define PQ_REDIS_MAX_BLOCK_BYTES (512ull * 1024 * 1024)

/* A connection to one Redis server. */
typedef struct pq_redis pq_redis;

/* Connects to the Redis server at host:port (host: a name or an address;
 * port 1..65535). timeout_ms bounds the connect and every network read or
 * write after it (not a whole transfer); 0 means no limit.
 * Errors: PQ_ERR_INVALID_ARGUMENT (NULL host or out, bad port or timeout),
 * PQ_ERR_BACKEND (connection refused, unknown host, timeout, or the server
 * does not answer PING; the message has host:port and hiredis's text),
 * PQ_ERR_OUT_OF_MEMORY. *out is set only on success. Thread-safe. */
PQ_REDIS_API pq_status pq_redis_connect(const char* host, int32_t port,
                                        int32_t timeout_ms, pq_redis** out);

/* Closes the connection and frees it. NULL is a no-op. Must not race with
 * other calls on conn. */
PQ_REDIS_API void pq_redis_close(pq_redis* conn);

/* Saves seq_id of ctx under `key`: pq_sequence_save's stream is cut into
 * blocks of block_bytes bytes (the last one shorter), stored as
 * "<key>:blk:0", "<key>:blk:1", ..., each with its own CRC-32C, and then,
 * last, the manifest "<key>:manifest" (format version, total bytes, block
 * size and count, every block's CRC-32C). The old manifest of the key is
 * deleted first, so a reader sees either no state (PQ_ERR_NOT_FOUND) or a
 * whole one, never half a new one; blocks left over from a larger earlier
 * state are deleted after the new manifest is written. The sequence is not
 * changed. block_bytes: 1 .. PQ_REDIS_MAX_BLOCK_BYTES.
 * Errors: PQ_ERR_INVALID_ARGUMENT (NULL, empty key, block_bytes 0 or too
 * large), PQ_ERR_NOT_FOUND (seq_id), PQ_ERR_BACKEND (the connection: refused,
 * lost or timed out, or an error reply such as Redis's OOM; the message has
 * host:port and the server's or hiredis's text), the library's errors from
 * pq_sequence_save. After a failure the key has no manifest (blocks written
 * before it are deleted when the server still answers). */
PQ_REDIS_API pq_status pq_redis_put(pq_redis* conn, pq_context* ctx,
                                    uint64_t seq_id, const char* key,
                                    uint64_t block_bytes);

/* Restores the state stored under `key` as seq_id of ctx (which must not
 * exist): reads the manifest, fetches every block in one pipeline, checks
 * each block's size and CRC-32C against the manifest, then calls
 * pq_sequence_restore, which checks the state itself and adds the whole
 * sequence or nothing.
 * Errors: PQ_ERR_INVALID_ARGUMENT (NULL, empty key, seq_id exists),
 * PQ_ERR_NOT_FOUND (no manifest under key), PQ_ERR_CORRUPT (a manifest that
 * does not parse or whose own CRC fails, a block missing, of the wrong
 * size or whose CRC-32C does not match: the message names the block key),
 * PQ_ERR_INCOMPATIBLE (a manifest version this library does not read),
 * PQ_ERR_BACKEND (the connection), PQ_ERR_OUT_OF_MEMORY, and the library's
 * errors from pq_sequence_restore (PQ_ERR_CORRUPT, PQ_ERR_INCOMPATIBLE,
 * PQ_ERR_OUT_OF_MEMORY). On any error no sequence was added. */
PQ_REDIS_API pq_status pq_redis_get(pq_redis* conn, pq_context* ctx,
                                    uint64_t seq_id, const char* key);

/* Reads the manifest under `key` and writes the state's size, the block
 * size and the block count (any output may be NULL). Does not read the
 * blocks. Errors: as pq_redis_get's for the manifest. */
PQ_REDIS_API pq_status pq_redis_info(pq_redis* conn, const char* key,
                                     uint64_t* out_state_bytes,
                                     uint64_t* out_block_bytes,
                                     uint64_t* out_block_count);

/* Deletes the manifest under `key` first, then its blocks (those the
 * manifest lists). Errors: PQ_ERR_INVALID_ARGUMENT, PQ_ERR_NOT_FOUND (no
 * manifest; nothing deleted), PQ_ERR_BACKEND. A manifest that does not
 * parse is deleted, with the blocks found by their names. */
PQ_REDIS_API pq_status pq_redis_delete(pq_redis* conn, const char* key);

/* The message of the last failed pq_redis_* call made by the calling
 * thread, or "" if none failed yet. Valid until the next failing pq_redis_*
 * call on the same thread. Thread-safe (thread-local). */
PQ_REDIS_API const char* pq_redis_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PQCACHE_REDIS_H */
