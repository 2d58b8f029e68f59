/* Every field of every public struct of include/pqcache.h, as an X-macro
 * list: X(struct, field). The programs that describe the header to the
 * Rust binding (struct_layout.c: sizes and offsets;
 * bindings/rust/header_facts.c: field types) expand it, so a field added to
 * the header is added here once. The Rust test finds the header's own
 * field names and fails when this list misses one. */
#ifndef PQ_PUBLIC_FIELDS_H
#define PQ_PUBLIC_FIELDS_H

#define PQ_PUBLIC_STRUCTS(S) \
  S(pq_tensor) \
  S(pq_config) \
  S(pq_selection) \
  S(pq_select_item) \
  S(pq_fetch_item) \
  S(pq_paged_keys) \
  S(pq_layer_info) \
  S(pq_stats) \
  S(pq_hooks) \
  S(pq_build_progress)

#define PQ_PUBLIC_FIELDS(X) \
  X(pq_tensor, data) \
  X(pq_tensor, dtype) \
  X(pq_tensor, memory) \
  X(pq_tensor, tokens) \
  X(pq_tensor, heads) \
  X(pq_tensor, head_dim) \
  X(pq_tensor, token_stride) \
  X(pq_tensor, head_stride) \
  X(pq_config, struct_size) \
  X(pq_config, num_layers) \
  X(pq_config, num_q_heads) \
  X(pq_config, num_kv_heads) \
  X(pq_config, head_dim) \
  X(pq_config, dtype) \
  X(pq_config, pq_subspaces) \
  X(pq_config, pq_bits) \
  X(pq_config, kmeans_iterations) \
  X(pq_config, kmeans_min_iterations) \
  X(pq_config, kmeans_max_iterations) \
  X(pq_config, kmeans_tolerance) \
  X(pq_config, kmeans_init) \
  X(pq_config, kmeans_max_points_per_centroid) \
  X(pq_config, seed) \
  X(pq_config, compute_alpha) \
  X(pq_config, compute_beta) \
  X(pq_config, compute_gamma) \
  X(pq_config, layer_time_budget) \
  X(pq_config, worker_threads) \
  X(pq_config, selector) \
  X(pq_config, sink_tokens) \
  X(pq_config, local_tokens) \
  X(pq_config, topk_tokens) \
  X(pq_config, topk_fraction) \
  X(pq_config, gqa_combine) \
  X(pq_config, host_memory_limit) \
  X(pq_config, backend) \
  X(pq_config, device_id) \
  X(pq_config, cuda_plugin_path) \
  X(pq_config, sparq_dims) \
  X(pq_config, block_tokens) \
  X(pq_config, block_representatives) \
  X(pq_config, observation_window) \
  X(pq_config, pooling_kernel) \
  X(pq_config, pyramid_ratio) \
  X(pq_config, scope_decode_share) \
  X(pq_config, cache_tokens) \
  X(pq_config, cache_block_tokens) \
  X(pq_config, cache_policy) \
  X(pq_config, cache_update_blocks) \
  X(pq_config, key_rotary) \
  X(pq_config, pq_rerank) \
  X(pq_config, pooling) \
  X(pq_config, pq_rebuild_share) \
  X(pq_config, history_window) \
  X(pq_config, keyformer_tau) \
  X(pq_config, keyformer_tau_step) \
  X(pq_config, cluster_count) \
  X(pq_config, adakv_safeguard) \
  X(pq_config, zigzag_mass) \
  X(pq_config, zigzag_floor) \
  X(pq_config, pyramidinfer_decay) \
  X(pq_config, fastgen_recovery) \
  X(pq_config, infinigen_partial_ratio) \
  X(pq_config, infinigen_alpha) \
  X(pq_config, kv_tier) \
  X(pq_config, kv_disk_path) \
  X(pq_config, kv_head_offset) \
  X(pq_config, kv_scale_count) \
  X(pq_config, kv_scales) \
  X(pq_config, tail_estimate) \
  X(pq_config, pq_outliers) \
  X(pq_config, top_p) \
  X(pq_config, top_p_floor) \
  X(pq_paged_keys, pool) \
  X(pq_paged_keys, slots) \
  X(pq_paged_keys, block_table) \
  X(pq_paged_keys, block_size) \
  X(pq_paged_keys, map_length) \
  X(pq_paged_keys, tokens) \
  X(pq_selection, positions) \
  X(pq_selection, counts) \
  X(pq_selection, capacity) \
  X(pq_select_item, seq_id) \
  X(pq_select_item, query) \
  X(pq_select_item, out) \
  X(pq_select_item, status) \
  X(pq_fetch_item, seq_id) \
  X(pq_fetch_item, selection) \
  X(pq_fetch_item, out_keys) \
  X(pq_fetch_item, out_values) \
  X(pq_fetch_item, status) \
  X(pq_layer_info, struct_size) \
  X(pq_layer_info, tokens) \
  X(pq_layer_info, prefill_tokens) \
  X(pq_layer_info, middle_tokens) \
  X(pq_layer_info, coded_tokens) \
  X(pq_layer_info, build_pending) \
  X(pq_layer_info, kmeans_iterations) \
  X(pq_layer_info, kmeans_budget) \
  X(pq_layer_info, index_ready) \
  X(pq_layer_info, build_seconds) \
  X(pq_layer_info, last_select_bytes) \
  X(pq_stats, struct_size) \
  X(pq_stats, sequences) \
  X(pq_stats, tokens) \
  X(pq_stats, kv_bytes) \
  X(pq_stats, index_bytes) \
  X(pq_stats, builds_finished) \
  X(pq_stats, builds_cancelled) \
  X(pq_stats, kmeans_iterations) \
  X(pq_stats, select_calls) \
  X(pq_stats, fetch_calls) \
  X(pq_stats, build_seconds) \
  X(pq_stats, select_seconds) \
  X(pq_stats, fetch_seconds) \
  X(pq_stats, bytes_scored) \
  X(pq_stats, bytes_fetched) \
  X(pq_stats, cache_hits) \
  X(pq_stats, cache_misses) \
  X(pq_stats, host_bytes) \
  X(pq_stats, bytes_staged) \
  X(pq_stats, hint_tokens) \
  X(pq_stats, hint_covered) \
  X(pq_hooks, struct_size) \
  X(pq_hooks, log) \
  X(pq_hooks, log_user) \
  X(pq_hooks, log_level) \
  X(pq_hooks, host_alloc) \
  X(pq_hooks, host_free) \
  X(pq_hooks, alloc_user) \
  X(pq_hooks, build_done) \
  X(pq_hooks, build_done_user) \
  X(pq_hooks, pool) \
  X(pq_hooks, disk_read) \
  X(pq_hooks, disk_write) \
  X(pq_hooks, disk_user) \
  X(pq_hooks, build_progress) \
  X(pq_hooks, build_progress_user) \
  X(pq_build_progress, struct_size) \
  X(pq_build_progress, seq_id) \
  X(pq_build_progress, layer) \
  X(pq_build_progress, stage) \
  X(pq_build_progress, done) \
  X(pq_build_progress, total) \
  X(pq_build_progress, fraction)

#endif
