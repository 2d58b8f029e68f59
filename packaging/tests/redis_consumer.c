/* A program built against the Redis tier's packages (pkg-config
 * pqcache-redis, or find_package(pqcache-redis)), run by the packaging tests:
 *   redis_consumer PORT   a redis-server on 127.0.0.1:PORT: put a prefilled
 *                         sequence, get it into a second context, compare
 *                         the two states byte for byte, delete the key;
 *   redis_consumer refused PORT   nobody listens on PORT: the connect must
 *                         fail with PQ_ERR_BACKEND naming 127.0.0.1:PORT.
 * Prints "redis_consumer: OK ..." and exits 0, or says what failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pqcache_redis.h>

#define CHECK(call)                                                              \
  do {                                                                           \
    pq_status s_ = (call);                                                       \
    if (s_ != PQ_OK) {                                                           \
      fprintf(stderr, "redis_consumer: %s: %s: %s | %s\n", #call,               \
              pq_status_string(s_), pq_last_error(), pq_redis_last_error());     \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

enum { TOKENS = 300, KV = 2, DIM = 16 };

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "refused") == 0) {
    pq_redis* conn = NULL;
    char where[64];
    pq_status s = pq_redis_connect("127.0.0.1", atoi(argv[2]), 2000, &conn);
    snprintf(where, sizeof where, "127.0.0.1:%s", argv[2]);
    if (s != PQ_ERR_BACKEND || conn != NULL || strstr(pq_redis_last_error(), where) == NULL) {
      fprintf(stderr, "redis_consumer: connect to a closed port gave %s, '%s'\n",
              pq_status_string(s), pq_redis_last_error());
      return 1;
    }
    printf("redis_consumer: OK: refused as expected: %s\n", pq_redis_last_error());
    return 0;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: redis_consumer PORT | redis_consumer refused PORT\n");
    return 2;
  }
  static float keys[TOKENS * KV * DIM], values[TOKENS * KV * DIM];
  for (int i = 0; i < TOKENS * KV * DIM; ++i) {
    keys[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    values[i] = (float)((i * 104729) % 1000) / 500.0f - 1.0f;
  }
  pq_config config;
  pq_config_default(&config);
  config.num_layers = 1;
  config.num_q_heads = 4;
  config.num_kv_heads = KV;
  config.head_dim = DIM;
  config.dtype = PQ_DTYPE_F32;
  pq_context *a = NULL, *b = NULL;
  CHECK(pq_create(&config, &a));
  CHECK(pq_create(&config, &b));
  pq_tensor k, v;
  CHECK(pq_tensor_init(&k, keys, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, TOKENS, KV, DIM));
  CHECK(pq_tensor_init(&v, values, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, TOKENS, KV, DIM));
  CHECK(pq_sequence_add(a, 7));
  CHECK(pq_prefill_layer(a, 7, 0, &k, &v));

  pq_redis* conn = NULL;
  CHECK(pq_redis_connect("127.0.0.1", atoi(argv[1]), 5000, &conn));
  CHECK(pq_redis_put(conn, a, 7, "packaging:redis_consumer", 4096));
  uint64_t state_bytes = 0, blocks = 0;
  CHECK(pq_redis_info(conn, "packaging:redis_consumer", &state_bytes, NULL, &blocks));
  CHECK(pq_redis_get(conn, b, 9, "packaging:redis_consumer"));
  uint64_t size_a = 0, size_b = 0;
  CHECK(pq_sequence_state_size(a, 7, &size_a));
  CHECK(pq_sequence_state_size(b, 9, &size_b));
  if (size_a != state_bytes || size_b != size_a) {
    fprintf(stderr, "redis_consumer: state sizes %llu (saved) %llu (manifest) %llu (restored)\n",
            (unsigned long long)size_a, (unsigned long long)state_bytes, (unsigned long long)size_b);
    return 1;
  }
  unsigned char* saved_a = malloc(size_a);
  unsigned char* saved_b = malloc(size_b);
  uint64_t written = 0;
  if (saved_a == NULL || saved_b == NULL) return 1;
  CHECK(pq_sequence_save_buffer(a, 7, saved_a, size_a, &written));
  CHECK(pq_sequence_save_buffer(b, 9, saved_b, size_b, &written));
  if (memcmp(saved_a, saved_b, size_a) != 0) {
    fprintf(stderr, "redis_consumer: the restored state differs from the saved one\n");
    return 1;
  }
  CHECK(pq_redis_delete(conn, "packaging:redis_consumer"));
  if (pq_redis_info(conn, "packaging:redis_consumer", NULL, NULL, NULL) != PQ_ERR_NOT_FOUND) {
    fprintf(stderr, "redis_consumer: the key is still there after pq_redis_delete\n");
    return 1;
  }
  printf("redis_consumer: OK: %llu state bytes in %llu blocks put, got back identical, deleted\n",
         (unsigned long long)state_bytes, (unsigned long long)blocks);
  free(saved_a);
  free(saved_b);
  pq_redis_close(conn);
  pq_destroy(a);
  pq_destroy(b);
  return 0;
}
