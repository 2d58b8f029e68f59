/* A server's use of the integration hooks (docs/hooks.md): two contexts on
 * one worker pool, a log written to stderr, the host K/V store in memory of
 * the server's own allocator, and index builds that signal the server's
 * thread instead of being waited for. C99 plus POSIX threads.
 *
 * Exit status 0 when every build was reported, the allocator saw every K/V
 * byte the contexts hold and got all of it back; 1 otherwise. */
#define _POSIX_C_SOURCE 200112L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqcache.h"

enum { kLayers = 4, kKvHeads = 2, kQHeads = 4, kHeadDim = 32, kTokens = 1000, kContexts = 2 };

/* --- log: one line per message on stderr --------------------------------- */

static void log_to_stderr(void* user, int32_t level, const char* message) {
  static const char* const names[] = {"error", "warn", "info", "debug"};
  fprintf(stderr, "[pqcache %s] %s: %s\n", names[level], (const char*)user, message);
}

/* --- allocator: counts what the host store holds ------------------------- */

typedef struct {
  pthread_mutex_t mutex;
  unsigned long long live_bytes, allocations;
} counting_allocator;

static void* counted_alloc(void* user, size_t bytes, size_t alignment) {
  counting_allocator* a = (counting_allocator*)user;
  void* p = NULL;
  if (posix_memalign(&p, alignment, bytes) != 0) return NULL;
  pthread_mutex_lock(&a->mutex);
  a->live_bytes += bytes;
  a->allocations += 1;
  pthread_mutex_unlock(&a->mutex);
  return p;
}

static void counted_free(void* user, void* p, size_t bytes) {
  counting_allocator* a = (counting_allocator*)user;
  pthread_mutex_lock(&a->mutex);
  a->live_bytes -= bytes;
  pthread_mutex_unlock(&a->mutex);
  free(p);
}

/* --- build notification: the hook only signals the server's thread ------- */

typedef struct {
  pthread_mutex_t mutex;
  pthread_cond_t changed;
  int built, failed;
} build_board;

static void on_build_done(void* user, uint64_t seq_id, int32_t layer, pq_status status) {
  build_board* b = (build_board*)user;
  (void)seq_id;
  (void)layer;
  pthread_mutex_lock(&b->mutex);
  if (status == PQ_OK)
    b->built += 1;
  else
    b->failed += 1;
  pthread_cond_signal(&b->changed);
  pthread_mutex_unlock(&b->mutex);
}

static int check(pq_status s, const char* what) {
  if (s == PQ_OK) return 1;
  fprintf(stderr, "%s failed: %s\n", what, pq_last_error());
  return 0;
}

int main(void) {
  static counting_allocator allocator = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
  static build_board board = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  static const char* const names[kContexts] = {"ctx-a", "ctx-b"};
  pq_context* ctx[kContexts] = {NULL, NULL};
  pq_pool* pool = NULL;
  float* rows = NULL;
  int ok = 1, c, l;
  unsigned long long held = 0;
  size_t i, n = (size_t)kTokens * kKvHeads * kHeadDim;

  if (!check(pq_pool_create(2, &pool), "pq_pool_create")) return 1;
  for (c = 0; c < kContexts && ok; ++c) {
    pq_config config;
    pq_hooks hooks;
    pq_config_default(&config);
    config.num_layers = kLayers;
    config.num_q_heads = kQHeads;
    config.num_kv_heads = kKvHeads;
    config.head_dim = kHeadDim;
    config.dtype = PQ_DTYPE_F32;
    config.kmeans_iterations = 4;
    pq_hooks_default(&hooks);
    hooks.log = log_to_stderr;
    hooks.log_user = (void*)names[c];
    hooks.log_level = PQ_LOG_INFO;
    hooks.host_alloc = counted_alloc;
    hooks.host_free = counted_free;
    hooks.alloc_user = &allocator;
    hooks.build_done = on_build_done;
    hooks.build_done_user = &board;
    hooks.pool = pool;
    ok = check(pq_create_with_hooks(&config, &hooks, &ctx[c]), "pq_create_with_hooks");
  }
  pq_pool_destroy(pool); /* the contexts hold the pool from here on */

  rows = (float*)malloc(n * sizeof(float));
  for (i = 0; rows != NULL && i < n; ++i) rows[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  ok = ok && rows != NULL;
  for (c = 0; c < kContexts && ok; ++c) {
    pq_tensor kv;
    ok = check(pq_tensor_init(&kv, rows, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, kTokens, kKvHeads,
                              kHeadDim), "pq_tensor_init") &&
         check(pq_sequence_add(ctx[c], 1), "pq_sequence_add");
    for (l = 0; l < kLayers && ok; ++l)
      ok = check(pq_prefill_layer(ctx[c], 1, l, &kv, &kv), "pq_prefill_layer");
  }

  /* The server's thread sleeps until every layer's index is built. */
  pthread_mutex_lock(&board.mutex);
  while (ok && board.built + board.failed < kContexts * kLayers)
    pthread_cond_wait(&board.changed, &board.mutex);
  printf("builds reported: %d built, %d failed\n", board.built, board.failed);
  ok = ok && board.failed == 0;
  pthread_mutex_unlock(&board.mutex);

  for (c = 0; c < kContexts && ok; ++c) {
    pq_stats stats;
    stats.struct_size = sizeof stats;
    ok = check(pq_stats_get(ctx[c], &stats), "pq_stats_get");
    held += stats.kv_bytes;
  }
  pthread_mutex_lock(&allocator.mutex);
  printf("host K/V: %llu bytes held, %llu from the allocator in %llu blocks\n", held,
         allocator.live_bytes, allocator.allocations);
  ok = ok && held == allocator.live_bytes && held > 0;
  pthread_mutex_unlock(&allocator.mutex);

  for (c = 0; c < kContexts; ++c) pq_destroy(ctx[c]);
  printf("after pq_destroy: %llu bytes still allocated\n", allocator.live_bytes);
  ok = ok && allocator.live_bytes == 0;
  free(rows);
  return ok ? 0 : 1;
}
