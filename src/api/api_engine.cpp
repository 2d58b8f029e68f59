// The C API a serving engine calls beyond the dense one: keys from its paged
// pool and several query tokens in one select, on the host or the device
// (added in 0.10).
#include "api/handles.h"

using namespace pq::api;

extern "C" {

pq_status pq_prefill_layer_paged(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                 const pq_paged_keys* keys) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).append_paged(seq_id, layer, keys, /*is_prefill=*/true); });
}

pq_status pq_decode_append_paged(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                 const pq_paged_keys* keys) {
  return guarded_on(ctx, __func__,
                    [&] { ctx_of(ctx).append_paged(seq_id, layer, keys, /*is_prefill=*/false); });
}

pq_status pq_selection_capacity_multi(const pq_context* ctx, uint64_t seq_id, int32_t layer,
                                      int64_t query_tokens, int32_t rows, int64_t* out_rows,
                                      int64_t* out_capacity) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).selection_capacity_multi(seq_id, layer, query_tokens, rows, out_rows,
                                         out_capacity);
  });
}

pq_status pq_decode_select_multi(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                 const pq_tensor* queries, int32_t rows,
                                 const pq_paged_keys* keys, pq_selection* out) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).decode_select_multi(seq_id, layer, queries, rows, keys, out);
  });
}

pq_status pq_decode_select_multi_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                        const pq_tensor* queries, int32_t rows,
                                        pq_selection* out) {
  return guarded_on(ctx, __func__, [&] {
    ctx_of(ctx).decode_select_multi_device(seq_id, layer, queries, rows, out);
  });
}

}  // extern "C"
