/* The reference prefill / decode select / fetch cycle that every binding's
 * tests repeat in their own language and compare with this program's output.
 *
 * Data come from a generator any language reproduces bit for bit with 32-bit
 * unsigned arithmetic (no libm, no language RNG):
 *
 *   value(stream, i):  h = (i * 2654435761 + stream * 97531) mod 2^32
 *                      h ^= h >> 15;  h = (h * 2246822519) mod 2^32;  h ^= h >> 13
 *                      return (float)(h >> 8) / 16777216.0f - 0.5f   (exact in f32)
 *
 * where i is the flat index of a dense token-major [tokens][heads][head_dim]
 * f32 tensor. The cycle, with the configuration below (f32, 1 layer, 4 query
 * heads, 2 kv heads, head_dim 16, m 2, b 4, 8 K-Means iterations, sinks 4,
 * local 16, top-k 16 tokens, seed 7, 1 worker thread):
 *   1. sequence 1: prefill 256 tokens, keys stream 1, values stream 2;
 *   2. decode_append 1 token, keys stream 3, values stream 4;
 *   3. decode_select with a query of 1 token x 4 heads, stream 5;
 *   4. fetch into dense head-major [2][capacity][16] f32 buffers.
 * Output, one line each:
 *   capacity C
 *   head H count N positions P0 P1 ...      (for H = 0, 1)
 *   keys_fnv1a 0x%016llx                    (FNV-1a 64 of the fetched rows
 *   values_fnv1a 0x%016llx                   i < count of each head, in
 *                                            head order, as f32 bytes)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqcache.h"

enum { TOKENS = 256, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 16 };

static float value(uint32_t stream, uint32_t i) {
  uint32_t h = i * 2654435761u + stream * 97531u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (float)(h >> 8) / 16777216.0f - 0.5f;
}

static float* generate(uint32_t stream, size_t n) {
  float* p = malloc(n * sizeof *p);
  if (p == NULL) return NULL;
  for (size_t i = 0; i < n; ++i) p[i] = value(stream, (uint32_t)i);
  return p;
}

static uint64_t fnv1a(uint64_t h, const void* data, size_t bytes) {
  const unsigned char* p = data;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

#define CHECK(call)                                                       \
  do {                                                                    \
    pq_status s_ = (call);                                                \
    if (s_ != PQ_OK) {                                                    \
      fprintf(stderr, "%s failed: %s\n", #call, pq_last_error());         \
      return 1;                                                           \
    }                                                                     \
  } while (0)

int main(void) {
  pq_config c;
  pq_config_default(&c);
  c.dtype = PQ_DTYPE_F32;
  c.num_layers = 1;
  c.num_q_heads = Q_HEADS;
  c.num_kv_heads = KV_HEADS;
  c.head_dim = HEAD_DIM;
  c.pq_subspaces = 2;
  c.pq_bits = 4;
  c.kmeans_iterations = 8;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 16;
  c.seed = 7;
  c.worker_threads = 1;

  pq_context* ctx = NULL;
  CHECK(pq_create(&c, &ctx));
  CHECK(pq_sequence_add(ctx, 1));

  float* k = generate(1, (size_t)TOKENS * KV_HEADS * HEAD_DIM);
  float* v = generate(2, (size_t)TOKENS * KV_HEADS * HEAD_DIM);
  float* k1 = generate(3, (size_t)KV_HEADS * HEAD_DIM);
  float* v1 = generate(4, (size_t)KV_HEADS * HEAD_DIM);
  float* q = generate(5, (size_t)Q_HEADS * HEAD_DIM);
  if (!k || !v || !k1 || !v1 || !q) return 1;

  pq_tensor tk, tv;
  CHECK(pq_tensor_init(&tk, k, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, TOKENS, KV_HEADS, HEAD_DIM));
  CHECK(pq_tensor_init(&tv, v, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, TOKENS, KV_HEADS, HEAD_DIM));
  CHECK(pq_prefill_layer(ctx, 1, 0, &tk, &tv));
  CHECK(pq_tensor_init(&tk, k1, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, KV_HEADS, HEAD_DIM));
  CHECK(pq_tensor_init(&tv, v1, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, KV_HEADS, HEAD_DIM));
  CHECK(pq_decode_append(ctx, 1, 0, &tk, &tv));

  int64_t capacity = 0;
  CHECK(pq_selection_capacity(ctx, 1, 0, &capacity));
  int32_t* positions = malloc((size_t)(KV_HEADS * capacity) * sizeof *positions);
  int32_t counts[KV_HEADS];
  float* out_k = calloc((size_t)(KV_HEADS * capacity * HEAD_DIM), sizeof(float));
  float* out_v = calloc((size_t)(KV_HEADS * capacity * HEAD_DIM), sizeof(float));
  if (!positions || !out_k || !out_v) return 1;
  pq_selection sel = {positions, counts, capacity};
  pq_tensor tq;
  CHECK(pq_tensor_init(&tq, q, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, Q_HEADS, HEAD_DIM));
  CHECK(pq_decode_select(ctx, 1, 0, &tq, &sel));
  CHECK(pq_tensor_init(&tk, out_k, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, capacity, KV_HEADS,
                       HEAD_DIM));
  CHECK(pq_tensor_init(&tv, out_v, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, capacity, KV_HEADS,
                       HEAD_DIM));
  CHECK(pq_fetch_kv(ctx, 1, 0, &sel, &tk, &tv));

  printf("capacity %lld\n", (long long)capacity);
  uint64_t hk = 0xcbf29ce484222325ull, hv = hk;
  for (int h = 0; h < KV_HEADS; ++h) {
    printf("head %d count %d positions", h, counts[h]);
    for (int i = 0; i < counts[h]; ++i) printf(" %d", positions[h * capacity + i]);
    printf("\n");
    size_t row0 = (size_t)(h * capacity) * HEAD_DIM;
    hk = fnv1a(hk, out_k + row0, (size_t)counts[h] * HEAD_DIM * sizeof(float));
    hv = fnv1a(hv, out_v + row0, (size_t)counts[h] * HEAD_DIM * sizeof(float));
  }
  printf("keys_fnv1a 0x%016llx\nvalues_fnv1a 0x%016llx\n", (unsigned long long)hk,
         (unsigned long long)hv);

  pq_destroy(ctx);
  free(k); free(v); free(k1); free(v1); free(q);
  free(positions); free(out_k); free(out_v);
  return 0;
}
