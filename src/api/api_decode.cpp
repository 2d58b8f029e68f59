// The C API of a decode step: storing K/V, selection, fetch and attention,
// the batched and the device-resident calls, the selectors' inputs and the
// index's introspection.
#include "api/handles.h"

using namespace pq::api;

extern "C" {

pq_status pq_prefill_layer(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* keys,
                           const pq_tensor* values) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).prefill(seq_id, layer, keys, values); });
}

pq_status pq_decode_append(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* keys,
                           const pq_tensor* values) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).decode_append(seq_id, layer, keys, values); });
}

pq_status pq_selection_capacity(const pq_context* ctx, uint64_t seq_id, int32_t layer,
                                int64_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    require_out(out, "out_capacity");
    *out = c.selection_capacity(seq_id, layer);
  });
}

pq_status pq_selection_capacity_for(const pq_context* ctx, int32_t layer, int64_t tokens,
                                    int64_t* out) {
  return guarded_on(ctx, __func__, [&] {
    const pq::Context& c = ctx_of(ctx);
    require_out(out, "out_capacity");
    *out = c.selection_capacity_for(layer, tokens);
  });
}

pq_status pq_decode_attend(pq_context* ctx, uint64_t seq_id, int32_t layer,
                           const pq_tensor* query, const pq_selection* selection, float scale,
                           float* out, float* out_lse) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).decode_attend(seq_id, layer, query, selection, scale, out, out_lse);
  });
}

pq_status pq_decode_tail(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* query,
                         const pq_selection* selection, float scale, float* out, float* out_lse) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).decode_attend(seq_id, layer, query, selection, scale, out, out_lse,
                              /*tail_only=*/true);
  });
}

pq_status pq_decode_select_batch(pq_context* ctx, int32_t layer, pq_select_item* items,
                                 int64_t count) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).decode_select_batch(layer, items, count); });
}

pq_status pq_fetch_kv_batch(pq_context* ctx, int32_t layer, pq_fetch_item* items,
                            int64_t count) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).fetch_batch(layer, items, count); });
}

pq_status pq_decode_select_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                  const pq_tensor* query, pq_selection* out) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).decode_select_device(seq_id, layer, query, out); });
}

pq_status pq_fetch_kv_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                             const pq_selection* selection, const pq_tensor* out_keys,
                             const pq_tensor* out_values) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).fetch_kv_device(seq_id, layer, selection, out_keys, out_values);
  });
}

pq_status pq_decode_select_device_batch(pq_context* ctx, int32_t layer, pq_select_item* items,
                                        int64_t count) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).decode_select_device_batch(layer, items, count); });
}

pq_status pq_fetch_kv_device_batch(pq_context* ctx, int32_t layer, pq_fetch_item* items,
                                   int64_t count) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).fetch_kv_device_batch(layer, items, count); });
}

pq_status pq_decode_select(pq_context* ctx, uint64_t seq_id, int32_t layer, const pq_tensor* query,
                           pq_selection* out) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).decode_select(seq_id, layer, query, out); });
}

pq_status pq_decode_speculate(pq_context* ctx, uint64_t seq_id, int32_t layer,
                              const pq_tensor* query_estimate, pq_selection* out) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).decode_select(seq_id, layer, query_estimate, out, true); });
}

pq_status pq_fetch_kv(pq_context* ctx, uint64_t seq_id, int32_t layer,
                      const pq_selection* selection, const pq_tensor* out_keys,
                      const pq_tensor* out_values) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).fetch(seq_id, layer, selection, out_keys, out_values);
  });
}

pq_status pq_prefill_queries(pq_context* ctx, uint64_t seq_id, int32_t layer,
                             const pq_tensor* queries) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).prefill_queries(seq_id, layer, queries); });
}

pq_status pq_observe_attention(pq_context* ctx, uint64_t seq_id, int32_t layer,
                               const pq_selection* selection, const float* probs) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).observe_attention(seq_id, layer, selection, probs);
  });
}

pq_status pq_sequence_token_classes(pq_context* ctx, uint64_t seq_id, int64_t first,
                                    int64_t count, const uint8_t* classes) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).token_classes(seq_id, first, count, classes); });
}

pq_status pq_layer_info_get(const pq_context* ctx, uint64_t seq_id, int32_t layer,
                            pq_layer_info* out) {
  return guarded_on(ctx, __func__, [&] { ctx_of(ctx).layer_info(seq_id, layer, out); });
}

pq_status pq_index_codes(pq_context* ctx, uint64_t seq_id, int32_t layer, int32_t kv_head,
                         int64_t first, int64_t count, uint8_t* out) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).index_codes(seq_id, layer, kv_head, first, count, out);
  });
}

pq_status pq_index_centroids(pq_context* ctx, uint64_t seq_id, int32_t layer, int32_t kv_head,
                             float* out, int64_t out_floats) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).index_centroids(seq_id, layer, kv_head, out, out_floats);
  });
}

// --- sequence state ----------------------------------------------------------

}  // extern "C"
