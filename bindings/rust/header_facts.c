/* Prints what the C compiler knows about include/pqcache.h that
 * tests/struct_layout.c does not: every field's C type and every enum and
 * macro constant. pqcache-sys/tests/header.rs compares these lines with the
 * Rust declarations; together with pq_struct_layout (sizes, offsets) the
 * hand-written Rust side cannot drift from the header unnoticed.
 *   field STRUCT FIELD CTYPE     const NAME VALUE     string NAME VALUE
 * C11 for _Generic. A field or constant added to the header must be added
 * here too (the test finds the header's names and asks for them). */
#include <stdint.h>
#include <stdio.h>

#include "pqcache.h"

#define C_TYPE(x)                                                                         \
  _Generic((x), int32_t: "int32_t", uint32_t: "uint32_t", int64_t: "int64_t",              \
           uint64_t: "uint64_t", float: "float", double: "double", void*: "void*",          \
           const char*: "const char*", int32_t*: "int32_t*", default: "unknown")
#define FIELD(s, f) printf("field %s %s %s\n", #s, #f, C_TYPE(((s*)0)->f))
#define CONST(c) printf("const %s %lld\n", #c, (long long)(c))

int main(void) {
  FIELD(pq_tensor, data); FIELD(pq_tensor, dtype); FIELD(pq_tensor, memory);
  FIELD(pq_tensor, tokens); FIELD(pq_tensor, heads); FIELD(pq_tensor, head_dim);
  FIELD(pq_tensor, token_stride); FIELD(pq_tensor, head_stride);

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

  FIELD(pq_selection, positions); FIELD(pq_selection, counts); FIELD(pq_selection, capacity);

  FIELD(pq_layer_info, struct_size); FIELD(pq_layer_info, tokens); FIELD(pq_layer_info, prefill_tokens);
  FIELD(pq_layer_info, middle_tokens); FIELD(pq_layer_info, coded_tokens);
  FIELD(pq_layer_info, build_pending); FIELD(pq_layer_info, kmeans_iterations);
  FIELD(pq_layer_info, kmeans_budget); FIELD(pq_layer_info, index_ready);
  FIELD(pq_layer_info, build_seconds); FIELD(pq_layer_info, last_select_bytes);

  FIELD(pq_stats, struct_size); FIELD(pq_stats, sequences); FIELD(pq_stats, tokens);
  FIELD(pq_stats, kv_bytes); FIELD(pq_stats, index_bytes); FIELD(pq_stats, builds_finished);
  FIELD(pq_stats, builds_cancelled); FIELD(pq_stats, kmeans_iterations); FIELD(pq_stats, select_calls);
  FIELD(pq_stats, fetch_calls); FIELD(pq_stats, build_seconds); FIELD(pq_stats, select_seconds);
  FIELD(pq_stats, fetch_seconds); FIELD(pq_stats, bytes_scored); FIELD(pq_stats, bytes_fetched);
  FIELD(pq_stats, cache_hits); FIELD(pq_stats, cache_misses);

  CONST(PQ_VERSION_MAJOR); CONST(PQ_VERSION_MINOR); CONST(PQ_VERSION_PATCH); CONST(PQ_VERSION_NUMBER);
  printf("string PQ_VERSION_STRING %s\n", PQ_VERSION_STRING);

  CONST(PQ_OK); CONST(PQ_ERR_INVALID_ARGUMENT); CONST(PQ_ERR_OUT_OF_MEMORY); CONST(PQ_ERR_BAD_STATE);
  CONST(PQ_ERR_NOT_FOUND); CONST(PQ_ERR_UNSUPPORTED); CONST(PQ_ERR_BACKEND); CONST(PQ_ERR_INTERNAL);
  CONST(PQ_DTYPE_F32); CONST(PQ_DTYPE_F16); CONST(PQ_DTYPE_BF16);
  CONST(PQ_MEMORY_HOST); CONST(PQ_MEMORY_DEVICE);
  CONST(PQ_SELECTOR_PQ); CONST(PQ_SELECTOR_EXACT); CONST(PQ_SELECTOR_WINDOW); CONST(PQ_SELECTOR_SPARQ);
  CONST(PQ_SELECTOR_INFLLM); CONST(PQ_SELECTOR_QUEST); CONST(PQ_SELECTOR_RANDOM); CONST(PQ_SELECTOR_H2O);
  CONST(PQ_SELECTOR_SCOPE); CONST(PQ_SELECTOR_SNAPKV); CONST(PQ_SELECTOR_PYRAMIDKV);
  CONST(PQ_GQA_SUM_SOFTMAX); CONST(PQ_GQA_MAX); CONST(PQ_GQA_MEAN);
  CONST(PQ_KMEANS_INIT_RANDOM); CONST(PQ_KMEANS_INIT_KMEANSPP);
  CONST(PQ_BACKEND_CPU); CONST(PQ_BACKEND_CUDA); CONST(PQ_BACKEND_AUTO);
  CONST(PQ_CACHE_LRU); CONST(PQ_CACHE_LFU);
  CONST(PQ_LAYOUT_TOKEN_MAJOR); CONST(PQ_LAYOUT_HEAD_MAJOR);
  return 0;
}
