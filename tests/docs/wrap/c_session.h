/* A short C session for README.md's snippets that continue the
 * walkthrough (c_attend.c, c_state.c): a context with sequence 1 prefilled
 * (f32, 8192 tokens) on every layer, and the selection of a query on layer
 * 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "pqcache.h"

enum { LAYERS = 2, PROMPT = 8192, KV = 8, QH = 32, DIM = 128 };

static void check(pq_status s) {
  if (s != PQ_OK) {
    fprintf(stderr, "%s\n", pq_last_error());  /* names the call */
    exit(1);
  }
}

static float keys[PROMPT * KV * DIM], values[PROMPT * KV * DIM], query[QH * DIM];
static int32_t positions[KV * PROMPT];
static int32_t counts[KV];

/* The context, the query tensor *q and the selection *sel of layer l. */
static pq_context* session(int32_t l, pq_tensor* q, pq_selection* sel) {
  pq_config cfg;
  pq_context* ctx;
  pq_tensor k, v;
  int64_t cap;
  size_t i;
  for (i = 0; i < sizeof keys / sizeof keys[0]; ++i) {
    keys[i] = (float)sin(0.37 * (double)i);
    values[i] = (float)cos(0.11 * (double)i);
  }
  for (i = 0; i < sizeof query / sizeof query[0]; ++i) query[i] = (float)sin(0.53 * (double)i);
  pq_config_default(&cfg);
  cfg.num_layers = LAYERS; cfg.num_q_heads = QH; cfg.num_kv_heads = KV; cfg.head_dim = DIM;
  cfg.dtype = PQ_DTYPE_F32;
  check(pq_create(&cfg, &ctx));
  check(pq_sequence_add(ctx, 1));
  pq_tensor_init(&k, keys, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, PROMPT, KV, DIM);
  pq_tensor_init(&v, values, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, PROMPT, KV, DIM);
  for (i = 0; i < LAYERS; ++i) check(pq_prefill_layer(ctx, 1, (int32_t)i, &k, &v));
  check(pq_selection_capacity(ctx, 1, l, &cap));
  sel->positions = positions;
  sel->counts = counts;
  sel->capacity = cap;
  pq_tensor_init(q, query, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, QH, DIM);
  check(pq_decode_select(ctx, 1, l, q, sel));
  return ctx;
}
