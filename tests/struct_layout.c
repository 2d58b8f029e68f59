/* Prints the size of every public struct and the offset of each field, one
 * "struct field offset" line each, so that bindings written by hand (the
 * Rust crate) can be checked against what the C compiler lays out.
 * A field added to a public struct must be added here too. */
#include <stddef.h>
#include <stdio.h>

#include "pqcache.h"

#define SIZE(s) printf("%s sizeof %zu\n", #s, sizeof(s))
#define FIELD(s, f) printf("%s %s %zu\n", #s, #f, offsetof(s, f))

int main(void) {
  SIZE(pq_tensor);
  FIELD(pq_tensor, data); FIELD(pq_tensor, dtype); FIELD(pq_tensor, memory);
  FIELD(pq_tensor, tokens); FIELD(pq_tensor, heads); FIELD(pq_tensor, head_dim);
  FIELD(pq_tensor, token_stride); FIELD(pq_tensor, head_stride);

  SIZE(pq_config);
  FIELD(pq_config, struct_size); FIELD(pq_config, num_layers); FIELD(pq_config, num_q_heads);
  FIELD(pq_config, num_kv_heads); FIELD(pq_config, head_dim); FIELD(pq_config, dtype);
  FIELD(pq_config, pq_subspaces); FIELD(pq_config, pq_bits); FIELD(pq_config, kmeans_iterations);
  FIELD(pq_config, kmeans_min_iterations); FIELD(pq_config, kmeans_max_iterations);
  FIELD(pq_config, kmeans_tolerance); FIELD(pq_config, kmeans_init);
  FIELD(pq_config, kmeans_max_points_per_centroid); FIELD(pq_config, seed);
  FIELD(pq_config, compute_alpha); FIELD(pq_config, compute_beta); FIELD(pq_config, compute_gamma);
  FIELD(pq_config, layer_time_budget); FIELD(pq_config, worker_threads); FIELD(pq_config, selector);
  FIELD(pq_config, sink_tokens); FIELD(pq_config, local_tokens); FIELD(pq_config, topk_tokens);
  FIELD(pq_config, topk_fraction); FIELD(pq_config, gqa_combine); FIELD(pq_config, host_memory_limit);
  FIELD(pq_config, backend); FIELD(pq_config, device_id); FIELD(pq_config, cuda_plugin_path);
  FIELD(pq_config, sparq_dims); FIELD(pq_config, block_tokens); FIELD(pq_config, block_representatives);
  FIELD(pq_config, observation_window); FIELD(pq_config, pooling_kernel);
  FIELD(pq_config, pyramid_ratio); FIELD(pq_config, scope_decode_share);
  FIELD(pq_config, cache_tokens); FIELD(pq_config, cache_block_tokens);
  FIELD(pq_config, cache_policy);

  SIZE(pq_selection);
  FIELD(pq_selection, positions); FIELD(pq_selection, counts); FIELD(pq_selection, capacity);

  SIZE(pq_layer_info);
  FIELD(pq_layer_info, struct_size); FIELD(pq_layer_info, tokens); FIELD(pq_layer_info, prefill_tokens);
  FIELD(pq_layer_info, middle_tokens); FIELD(pq_layer_info, coded_tokens);
  FIELD(pq_layer_info, build_pending); FIELD(pq_layer_info, kmeans_iterations);
  FIELD(pq_layer_info, kmeans_budget); FIELD(pq_layer_info, index_ready);
  FIELD(pq_layer_info, build_seconds); FIELD(pq_layer_info, last_select_bytes);

  SIZE(pq_stats);
  FIELD(pq_stats, struct_size); FIELD(pq_stats, sequences); FIELD(pq_stats, tokens);
  FIELD(pq_stats, kv_bytes); FIELD(pq_stats, index_bytes); FIELD(pq_stats, builds_finished);
  FIELD(pq_stats, builds_cancelled); FIELD(pq_stats, kmeans_iterations); FIELD(pq_stats, select_calls);
  FIELD(pq_stats, fetch_calls); FIELD(pq_stats, build_seconds); FIELD(pq_stats, select_seconds);
  FIELD(pq_stats, fetch_seconds); FIELD(pq_stats, bytes_scored); FIELD(pq_stats, bytes_fetched);
  FIELD(pq_stats, cache_hits); FIELD(pq_stats, cache_misses);
  return 0;
}
