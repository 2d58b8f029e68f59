/* plugin_probe: asks libpqcache for the CUDA backend and reports whether the
 * plug-in was found, which tells the packaging tests that the library finds
 * libpqcache_cuda.so in its own pqcache/ directory (or does not, when the
 * plug-in package is not installed).
 *
 *   plugin_probe present|absent
 *
 * present: pq_create succeeds (a GPU) or fails with "loaded but found no
 *          usable CUDA device" (no GPU or driver): the plug-in was loaded.
 * absent:  pq_create fails with PQ_ERR_NOT_FOUND, "could not be loaded".
 * Exit 0 when the expectation holds, 1 otherwise. */
#include <stdio.h>
#include <string.h>

#include "pqcache.h"

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "present") != 0 && strcmp(argv[1], "absent") != 0)) {
    fprintf(stderr, "usage: %s present|absent\n", argv[0]);
    return 2;
  }
  int expect_present = strcmp(argv[1], "present") == 0;

  pq_config config;
  pq_config_default(&config);
  config.num_layers = 1;
  config.num_q_heads = 1;
  config.num_kv_heads = 1;
  config.head_dim = 64;
  config.backend = PQ_BACKEND_CUDA;

  pq_context* ctx = NULL;
  pq_status st = pq_create(&config, &ctx);
  const char* message = st == PQ_OK ? "" : pq_last_error();
  int loaded = st == PQ_OK || strstr(message, "loaded but found no usable CUDA device") != NULL;
  int not_found = st == PQ_ERR_NOT_FOUND && strstr(message, "could not be loaded") != NULL;
  printf("plugin_probe: pq_create(CUDA) -> %s%s%s\n", pq_status_string(st),
         st == PQ_OK ? "" : ": ", message);
  pq_destroy(ctx);

  if (expect_present ? loaded : not_found) {
    printf("plugin_probe: OK, the plug-in is %s\n", expect_present ? "found" : "absent");
    return 0;
  }
  fprintf(stderr, "plugin_probe: FAIL, expected the plug-in to be %s\n", argv[1]);
  return 1;
}
