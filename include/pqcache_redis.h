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

/* A connection to one Redis server (pq_redis_connect) or to a Redis Cluster
 * (pq_redis_connect_cluster). */
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

/* Connects to a Redis Cluster (or a server compatible with its protocol)
 * through one of its nodes, the seed host:port, and returns a handle that
 * every other pq_redis_* call takes as it takes one of pq_redis_connect:
 * put, get, the streaming get, info and delete work unchanged. (Added in
 * 0.14.)
 *
 * Keys: a stored state's names start with "{key}" instead of "key"
 * ("{key}:manifest", "{key}:blk:0", ...): the hash tag puts all of one
 * key's names in one hash slot, so each put, get or transfer runs on the one
 * node that serves that slot, and different keys spread over the nodes.
 * States stored by a pq_redis_connect connection ("key:manifest") are not
 * seen under the same key here, and the other way round (docs/redis.md).
 *
 * The slot map is read with CLUSTER SLOTS from the seed now, and again from
 * any node it knows after a MOVED reply or a node's network error. A MOVED
 * reply (the slot has moved) is followed and updates the map; an ASK reply
 * (the slot is being migrated) sends that one command, preceded by ASKING,
 * to the node it names. A command redirected more than 5 times, TRYAGAIN
 * and CLUSTERDOWN are PQ_ERR_BACKEND naming the node and the reply. A node
 * that goes away in the middle of a call is PQ_ERR_BACKEND naming its
 * host:port, with the guarantees of a server gone in single-server mode
 * (nothing added to the context, the source sequence untouched, a
 * streaming get's sequence removed); the next call reads the slot map again
 * and works once the cluster serves the key's slot.
 *
 * timeout_ms bounds each connect, read and write, on every node. Errors:
 * those of pq_redis_connect for the seed, and PQ_ERR_BACKEND when the seed
 * does not answer CLUSTER SLOTS (a server without cluster support says so).
 * *out is set only on success. Thread-safe; the handle's threading contract
 * is pq_redis_connect's (calls serialised, one network conversation at a
 * time, whichever node it is with). */
PQ_REDIS_API pq_status pq_redis_connect_cluster(const char* host, int32_t port,
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

/* A get in steps, so that a decode server selects before the K/V arrive
 * (docs/redis.md, "Streaming get"). A saved state holds every layer's
 * description (layer, PQ index and selector state sections, about 1% of the
 * bytes) before any K/V, so its first blocks are enough to add the sequence
 * (pq_sequence_restore_begin) and the K/V follow (pq_sequence_restore_kv).
 *
 *   pq_redis_transfer* t;
 *   pq_redis_get_begin(conn, ctx, seq, "session:42", &t);  // selectable now
 *   ... pq_decode_select on seq (other threads may, too) ...
 *   pq_redis_get_continue(t, 16, &done);   // 16 more blocks, or
 *   pq_redis_get_finish(t);                // all that is left
 *   pq_redis_transfer_free(t);
 *
 * While a transfer is open, pq_decode_select (PQ selector) works on every
 * layer of seq_id and equals the saved sequence's; a call that needs a
 * layer's K/V (pq_fetch_kv, attend, append, prefill) on a layer whose K/V
 * have not arrived returns PQ_ERR_BAD_STATE naming the layer: it reports,
 * it does not wait. Layers arrive in order; pq_redis_transfer_progress
 * says how many have. Calls that touch every layer (truncate, fork, save)
 * are PQ_ERR_BAD_STATE until the transfer is done; pq_sequence_remove must
 * not be called on seq_id while the transfer is open.
 *
 * On any error of begin, continue or finish, the sequence that begin added
 * is removed by this library (calls on it racing with the removal finish on
 * the data they hold or fail with PQ_ERR_NOT_FOUND), the transfer is failed
 * (later continue and finish return PQ_ERR_BAD_STATE; free it), and both
 * the context and the connection stay usable as after a failed
 * pq_redis_get.
 *
 * Threading: begin, continue, finish and free of one transfer may run on
 * any thread but not concurrently with each other; pq_redis_transfer_progress
 * may run on any thread at any time before free. Each continue or finish
 * holds conn for its own duration only (its replies are all read before it
 * returns), so conn may serve other calls between them.
 *
 * Owners that go first: pq_destroy of ctx or pq_redis_close of conn while
 * the transfer is open (not concurrently with its calls) leaves it
 * invalid: continue, finish and progress then return PQ_ERR_BAD_STATE
 * naming which went, and free only frees it (a destroyed context took the
 * sequence along; after a closed connection, free removes the unfinished
 * sequence). The transfer watches ctx with pq_watch_destroy. */
typedef struct pq_redis_transfer pq_redis_transfer;

/* Reads the manifest under `key`, fetches the state's first blocks (one,
 * then as many more as pq_sequence_restore_begin says it needs, until it
 * succeeds: the description plus less than one block), checks each
 * block's size and CRC-32C against the manifest, and adds seq_id to ctx
 * with pq_sequence_restore_begin. *out is set only on success; no K/V have
 * been restored yet (the bytes fetched beyond the description are kept for
 * the first continue). Errors: those of pq_redis_get (no sequence added),
 * and PQ_ERR_CORRUPT when the description does not end inside the state. */
PQ_REDIS_API pq_status pq_redis_get_begin(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                          const char* key, pq_redis_transfer** out);

/* Fetches up to max_blocks more blocks (0: all that are left) in one
 * pipeline, checks each against the manifest and hands each K/V section to
 * pq_sequence_restore_kv as soon as it is whole (a section spanning blocks
 * waits in a buffer of at most one section). *out_done (may be NULL)
 * receives 1 once the whole state is restored, else 0; calling again when
 * done does nothing. Errors: PQ_ERR_INVALID_ARGUMENT (NULL transfer),
 * PQ_ERR_BAD_STATE (an earlier call failed, or the context or the
 * connection went first), PQ_ERR_BACKEND,
 * PQ_ERR_CORRUPT (a block missing, of the wrong size or CRC; bad K/V),
 * the library's errors from pq_sequence_restore_kv. On error the sequence
 * is removed (see above). */
PQ_REDIS_API pq_status pq_redis_get_continue(pq_redis_transfer* transfer, uint64_t max_blocks,
                                             int32_t* out_done);

/* pq_redis_get_continue of every block left: on PQ_OK the sequence is
 * complete and behaves as one pq_redis_get restored. Errors: as
 * pq_redis_get_continue. */
PQ_REDIS_API pq_status pq_redis_get_finish(pq_redis_transfer* transfer);

/* Where a transfer stands (any output may be NULL): the bytes of the blocks
 * received so far, the bytes pq_sequence_restore_begin read (the
 * description), the state's size, and how many layers have their K/V
 * (layers 0 .. *out_layers_ready - 1). Errors: PQ_ERR_INVALID_ARGUMENT,
 * PQ_ERR_BAD_STATE (the context or the connection went first).
 * Thread-safe (it may run while another thread continues the transfer). */
PQ_REDIS_API pq_status pq_redis_transfer_progress(const pq_redis_transfer* transfer,
                                                  uint64_t* out_fetched_bytes,
                                                  uint64_t* out_description_bytes,
                                                  uint64_t* out_state_bytes,
                                                  int32_t* out_layers_ready);

/* Frees the transfer. One that is neither done nor failed is abandoned: its
 * sequence, whose K/V would never arrive, is removed. NULL is a no-op. */
PQ_REDIS_API void pq_redis_transfer_free(pq_redis_transfer* transfer);

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
