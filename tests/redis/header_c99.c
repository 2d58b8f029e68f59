/* pqcache_redis.h is plain C99: this file includes it under -std=c99
 * -pedantic -Wall -Wextra -Werror (tests/redis/CMakeLists.txt), links
 * libpqcache_redis.so and checks what needs no server. */
#include <stdio.h>
#include <string.h>

#include "pqcache_redis.h"

int main(void) {
  pq_redis* conn = NULL;
  pq_status st = pq_redis_connect(NULL, 6379, 0, &conn);
  if (st != PQ_ERR_INVALID_ARGUMENT || conn != NULL) {
    fprintf(stderr, "FAIL: pq_redis_connect(NULL host) returned %d\n", (int)st);
    return 1;
  }
  if (strstr(pq_redis_last_error(), "host") == NULL) {
    fprintf(stderr, "FAIL: message \"%s\" does not name the host\n", pq_redis_last_error());
    return 1;
  }
  st = pq_redis_connect_cluster("127.0.0.1", 0, 0, &conn);
  if (st != PQ_ERR_INVALID_ARGUMENT || conn != NULL ||
      strstr(pq_redis_last_error(), "port") == NULL) {
    fprintf(stderr, "FAIL: pq_redis_connect_cluster(port 0) returned %d: %s\n", (int)st,
            pq_redis_last_error());
    return 1;
  }
  pq_redis_close(NULL);
  printf("OK: pq_redis_connect(NULL, ...) -> %s: %s\n", pq_status_string(st),
         pq_redis_last_error());
  printf("OK: manifest version %d, largest block %llu bytes\n", PQ_REDIS_MANIFEST_VERSION,
         (unsigned long long)PQ_REDIS_MAX_BLOCK_BYTES);
  if (pq_redis_get_continue(NULL, 1, NULL) != PQ_ERR_INVALID_ARGUMENT) {
    fprintf(stderr, "FAIL: pq_redis_get_continue(NULL transfer) was accepted\n");
    return 1;
  }
  pq_redis_transfer_free(NULL);
  return 0;
}
