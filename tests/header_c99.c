/*
 * header_c99.c - the public header must stay plain C99: this file is
 * compiled with -std=c99 -pedantic -Wall -Wextra -Werror (see
 * tests/public_header.cmake), so a header regression breaks the build.
 * As a test it also checks, through the C ABI only, that the library loaded
 * at run time matches the header and that the error conventions hold.
 */
#include "pqcache.h" /* first: the header must be self-contained */

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "header_c99: line %d: %s\n", __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

/* Compile-time checks of the ABI promises the header makes. */
typedef char pq_check_version[(PQ_VERSION_NUMBER == PQ_VERSION_MAJOR * 10000 +
                               PQ_VERSION_MINOR * 100 + PQ_VERSION_PATCH)
                                  ? 1
                                  : -1];
typedef char pq_check_ok_is_zero[(PQ_OK == 0) ? 1 : -1];
typedef char pq_check_struct_size_first[(offsetof(pq_config, struct_size) == 0) ? 1 : -1];
typedef char pq_check_stats_size_first[(offsetof(pq_stats, struct_size) == 0) ? 1 : -1];
typedef char pq_check_info_size_first[(offsetof(pq_layer_info, struct_size) == 0) ? 1 : -1];

int main(void) {
  pq_config cfg;
  pq_context* ctx = NULL;
  pq_tensor t;
  pq_status st;
  float buf[2 * 3 * 4];
  const char* s;

  /* The library loaded at run time is the one this header describes. */
  EXPECT(pq_version_number() == PQ_VERSION_NUMBER);
  EXPECT(strcmp(pq_version_string(), PQ_VERSION_STRING) == 0);

  /* Status strings are static and named. */
  s = pq_status_string(PQ_OK);
  EXPECT(s != NULL && strstr(s, "PQ_OK") != NULL);
  s = pq_status_string(PQ_ERR_INVALID_ARGUMENT);
  EXPECT(s != NULL && strstr(s, "PQ_ERR_INVALID_ARGUMENT") != NULL);
  s = pq_status_string((pq_status)12345);
  EXPECT(s != NULL && strcmp(s, "unknown pq_status") == 0);

  /* Defaults: struct_size is set, geometry is left to the caller. */
  memset(&cfg, 0xAB, sizeof cfg);
  pq_config_default(&cfg);
  EXPECT(cfg.struct_size == sizeof(pq_config));
  EXPECT(cfg.num_layers == 0 && cfg.head_dim == 0);
  EXPECT(cfg.pq_subspaces == 0 && cfg.pq_bits == 0); /* chosen from head_dim */
  EXPECT(cfg.key_rotary == PQ_ROTARY_NONE && cfg.pq_rerank == 0.0f && cfg.pooling == PQ_POOLING_MAX);
  EXPECT(cfg.history_window == 400);
  EXPECT(cfg.keyformer_tau == 1.0f);
  EXPECT(cfg.keyformer_tau_step == 0.0078125f);
  EXPECT(cfg.cluster_count == 400);
  EXPECT(cfg.adakv_safeguard == 0.2f);
  EXPECT(cfg.zigzag_mass == 0.9f);
  EXPECT(cfg.zigzag_floor == 0.2f);
  EXPECT(cfg.pyramidinfer_decay == 0.9f);
  EXPECT(cfg.fastgen_recovery == 0.9f);
  EXPECT(cfg.infinigen_partial_ratio == 0.2f);
  EXPECT(cfg.infinigen_alpha == 4.0f);
  pq_config_default(NULL); /* NULL is ignored */

  /* Without geometry pq_create fails, names the problem, and leaves *out. */
  st = pq_create(&cfg, &ctx);
  EXPECT(st == PQ_ERR_INVALID_ARGUMENT);
  EXPECT(ctx == NULL);
  EXPECT(strlen(pq_last_error()) > 0);

  /* A small valid context works from C. */
  cfg.num_layers = 1;
  cfg.num_q_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 4;
  cfg.dtype = PQ_DTYPE_F32;
  cfg.worker_threads = 1;
  st = pq_create(&cfg, &ctx);
  EXPECT(st == PQ_OK && ctx != NULL);
  if (st == PQ_OK) {
    int64_t n = -1;
    EXPECT(pq_sequence_add(ctx, 7) == PQ_OK);
    EXPECT(pq_sequence_count(ctx, &n) == PQ_OK && n == 1);
    EXPECT(pq_sequence_add(ctx, 7) == PQ_ERR_INVALID_ARGUMENT);
    EXPECT(pq_sequence_remove(ctx, 7) == PQ_OK);
    EXPECT(pq_sequence_remove(ctx, 7) == PQ_ERR_NOT_FOUND);
    pq_destroy(ctx);
  } else {
    fprintf(stderr, "header_c99: pq_create: %s: %s\n", pq_status_string(st), pq_last_error());
  }
  pq_destroy(NULL); /* a no-op */

  /* Tensor descriptors from C. */
  memset(buf, 0, sizeof buf);
  EXPECT(pq_tensor_init(&t, buf, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 2, 3, 4) == PQ_OK);
  EXPECT(t.tokens == 2 && t.heads == 3 && t.head_dim == 4 && t.memory == PQ_MEMORY_HOST);
  EXPECT(t.token_stride == 12 && t.head_stride == 4);
  EXPECT(pq_tensor_init(&t, buf, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 2, 3, 4) == PQ_OK);
  EXPECT(t.token_stride == 4 && t.head_stride == 8);
  EXPECT(pq_tensor_init(NULL, buf, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 2, 3, 4) ==
         PQ_ERR_INVALID_ARGUMENT);

  if (failures) {
    fprintf(stderr, "header_c99: %d check(s) failed\n", failures);
    return 1;
  }
  printf("header_c99: all checks passed (libpqcache %s)\n", pq_version_string());
  return 0;
}
