// Every pq_config field, once: its default, its bounds and its kind.
// pq_config_default, the checks of resolve_config and their error text all
// come from this table (config.cpp); only the checks that tie several fields
// together are written out after it.
//
//   INT(field, default, lo, hi)         an integer in [lo, hi]; a bound may
//                                       name an earlier field as c.<field>
//   REAL(field, default, lo, hi, open)  finite, in [lo, hi]; open: (lo, hi]
//   ENUM(field, default, names)         one of the values a names table lists
//   FREE(field, default)                any value: ids, limits, pointers, and
//                                       fields whose check needs another field
//
// The order is the struct's: a bound may only name a field checked before.
#pragma once

#define PQ_CONFIG_FIELDS(INT, REAL, ENUM, FREE)                              \
  INT(num_layers, 0, 1, 1 << 20)                                             \
  INT(num_q_heads, 0, 1, 1 << 16)                                            \
  INT(num_kv_heads, 0, 1, 1 << 16)                                           \
  INT(head_dim, 0, 1, 1 << 16)                                               \
  ENUM(dtype, PQ_DTYPE_F16, kDtypeNames)                                     \
  INT(pq_subspaces, 0, 0, c.head_dim)                                        \
  INT(pq_bits, 0, 0, 8)                                                      \
  INT(kmeans_iterations, 0, 0, kMaxKmeansIterations)                         \
  INT(kmeans_min_iterations, 2, 0, kMaxKmeansIterations)                     \
  INT(kmeans_max_iterations, 25, c.kmeans_min_iterations, kMaxKmeansIterations) \
  REAL(kmeans_tolerance, 1e-4f, 0.0, kMaxReal, false)                        \
  ENUM(kmeans_init, PQ_KMEANS_INIT_KMEANSPP, kKmeansInitNames)               \
  INT(kmeans_max_points_per_centroid, 256, 1, 1 << 24)                       \
  FREE(seed, 0x5eed)                                                         \
  REAL(compute_alpha, 0.0, 0.0, kMaxReal, false)                             \
  REAL(compute_beta, 0.0, 0.0, kMaxReal, false)                              \
  REAL(compute_gamma, 0.0, 0.0, kMaxReal, false)                             \
  REAL(layer_time_budget, 0.0, 0.0, kMaxReal, false)                         \
  INT(worker_threads, 0, 0, 1024)                                            \
  ENUM(selector, PQ_SELECTOR_PQ, selector_names())                          \
  INT(sink_tokens, 4, 0, INT32_MAX)                                          \
  INT(local_tokens, 128, 0, INT32_MAX)                                       \
  INT(topk_tokens, 0, 0, INT32_MAX)                                          \
  FREE(topk_fraction, 0.2f)                                                  \
  ENUM(gqa_combine, PQ_GQA_SUM_SOFTMAX, kGqaCombineNames)                    \
  FREE(host_memory_limit, 0)                                                 \
  ENUM(backend, PQ_BACKEND_CPU, kBackendNames)                               \
  INT(device_id, 0, 0, 1 << 16)                                              \
  FREE(cuda_plugin_path, nullptr)                                            \
  INT(sparq_dims, 0, 0, c.head_dim)                                          \
  INT(block_tokens, 128, 1, 1 << 20)                                         \
  INT(block_representatives, 1, 1, c.block_tokens)                          \
  INT(observation_window, 32, 1, 1 << 20)                                   \
  INT(pooling_kernel, 7, 1, 1025)                                            \
  REAL(pyramid_ratio, 0.25f, 0.0, 1.0, true)                                 \
  REAL(scope_decode_share, 0.5f, 0.0, 1.0, false)                            \
  INT(cache_tokens, 0, 0, int64_t{1} << 40)                                  \
  INT(cache_block_tokens, 128, 1, 1 << 20)                                   \
  ENUM(cache_policy, PQ_CACHE_LRU, kCachePolicyNames)                        \
  INT(cache_update_blocks, 0, 0, INT32_MAX)                                  \
  ENUM(key_rotary, PQ_ROTARY_NONE, kKeyRotaryNames)                          \
  REAL(pq_rerank, 0.0f, 0.0, kMaxRerank, false)                              \
  ENUM(pooling, PQ_POOLING_MAX, kPoolingNames)                               \
  REAL(pq_rebuild_share, 0.0f, 0.0, 1.0, false)                             \
  INT(history_window, 400, 1, 4096)                                          \
  REAL(keyformer_tau, 1.0f, 0.0, 1e6, true)                                  \
  REAL(keyformer_tau_step, 0.0078125f, 0.0, 1e6, false)                      \
  INT(cluster_count, 400, 1, 1 << 16)                                        \
  REAL(adakv_safeguard, 0.2f, 0.0, 1.0, false)                               \
  REAL(zigzag_mass, 0.9f, 0.0, 1.0, true)                                    \
  REAL(zigzag_floor, 0.2f, 0.0, 1.0, false)                                 \
  REAL(pyramidinfer_decay, 0.9f, 0.0, 1.0, true)                             \
  REAL(fastgen_recovery, 0.9f, 0.0, 1.0, true)                               \
  REAL(infinigen_partial_ratio, 0.2f, 0.0, 1.0, true)                        \
  REAL(infinigen_alpha, 4.0f, 0.0, 1e6, true)                              \
  ENUM(kv_tier, PQ_KV_TIER_HOST, kKvTierNames)                               \
  FREE(kv_disk_path, nullptr)                                                \
  INT(kv_head_offset, 0, 0, 1 << 16)                                         \
  FREE(kv_scale_count, 0)                                                    \
  FREE(kv_scales, nullptr)                                                   \
  ENUM(tail_estimate, PQ_TAIL_NONE, kTailEstimateNames)                      \
  REAL(pq_outliers, 0.0f, 0.0, kMaxOutlierShare, false)                     \
  REAL(top_p, 0.0f, 0.0, 1.0, false)                                         \
  REAL(top_p_floor, 0.02f, 0.0, 1.0, false)
