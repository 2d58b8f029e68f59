// What a serving engine calls beyond the dense API: keys from its paged
// pool (pq_prefill_layer_paged, pq_decode_append_paged), several query
// tokens in one select (pq_decode_select_multi, and _device with queries
// and rows in device memory), and the refusal of the calls that read K/V an
// index-only context does not keep.
#include <optional>
#include <string>
#include <vector>

#include "backend/staging.h"
#include "base/call_args.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"
#include "pq/rerank.h"
#include "sequence/context.h"
#include "store/pool_keys.h"

namespace pq {

void Context::require_kv_kept() const {
  if (shared_.config.kv_tier == PQ_KV_TIER_CALLER)
    fail(PQ_ERR_UNSUPPORTED,
         "the context is index-only (config.kv_tier PQ_KV_TIER_CALLER): the library keeps the "
         "index, not the K/V; read the selected positions from your own pool");
}

void Context::append_paged(uint64_t id, int32_t layer_index, const pq_paged_keys* keys_arg,
                           bool is_prefill) {
  const pq_config& c = shared_.config;
  check_layer(layer_index);
  if (keys_arg == nullptr) invalid("keys is NULL");
  const pq_paged_keys keys = *keys_arg;  // read once
  if (c.kv_tier != PQ_KV_TIER_CALLER)
    fail(PQ_ERR_UNSUPPORTED,
         "paged keys carry no values, and this context stores K/V (config.kv_tier is not "
         "PQ_KV_TIER_CALLER); pass keys and values with pq_prefill_layer / pq_decode_append");
  if (keys.tokens < 1) invalid("keys->tokens is " + str(keys.tokens) + "; expected >= 1");
  const PoolKeys pool(keys, c, "keys");
  std::shared_ptr<Sequence> seq = find(id);
  Layer& layer = *seq->layers[static_cast<size_t>(layer_index)];
  layer.settle();  // an earlier prefill in flight sets the length the keys follow
  std::vector<uint8_t> buffer;
  const pq_tensor dense = pool.gather(layer.tokens(), keys.tokens, buffer);
  layer.append(dense, dense, is_prefill, seq->info());
}

void Context::selection_capacity_multi(uint64_t id, int32_t layer, int64_t query_tokens,
                                       int32_t rows, int64_t* out_rows,
                                       int64_t* out_capacity) const {
  check_layer(layer);
  if (query_tokens < 1) invalid("query_tokens is " + str(query_tokens) + "; expected >= 1");
  if (rows < PQ_ROWS_PER_TOKEN || rows > PQ_ROWS_PER_REQUEST)
    invalid("rows is " + str(rows) +
            "; expected PQ_ROWS_PER_TOKEN (0), PQ_ROWS_PER_HEAD (1) or PQ_ROWS_PER_REQUEST (2)");
  const std::shared_ptr<Sequence> seq = find(id);
  Layer& l = *seq->layers[static_cast<size_t>(layer)];
  l.settle();
  l.multi_capacity(query_tokens, rows, out_rows, out_capacity);
}

namespace {

void check_rows(int32_t rows) {
  if (rows < PQ_ROWS_PER_TOKEN || rows > PQ_ROWS_PER_REQUEST)
    invalid("rows is " + str(rows) +
            "; expected PQ_ROWS_PER_TOKEN (0), PQ_ROWS_PER_HEAD (1) or PQ_ROWS_PER_REQUEST (2)");
}

// The rows' descriptor, read once (the positions written may cover it):
// capacity >= 0, arrays given, positions and counts apart. Addresses only:
// the device call's arrays are never read here.
pq_selection multi_rows_out(const pq_selection* out, int64_t q, int32_t rows, int32_t kv_heads) {
  if (out == nullptr) invalid("out is NULL");
  const pq_selection copy = *out;
  const int64_t out_rows = rows == PQ_ROWS_PER_TOKEN ? q * kv_heads
                           : rows == PQ_ROWS_PER_HEAD ? kv_heads
                                                      : 1;
  if (copy.capacity < 0) invalid("out->capacity is " + str(copy.capacity) + "; expected >= 0");
  if (copy.positions == nullptr && copy.capacity > 0) invalid("out->positions is NULL");
  if (copy.counts == nullptr) invalid("out->counts is NULL");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(copy.capacity),
                             static_cast<uint64_t>(out_rows) * sizeof(int32_t), &bytes) ||
      reinterpret_cast<uintptr_t>(copy.positions) > UINTPTR_MAX - bytes)
    invalid("out->capacity is " + str(copy.capacity) + "; " + str(out_rows) +
            " rows x capacity positions from out->positions overflow the address space");
  require_apart(copy.positions, bytes, "out->positions", copy.counts,
                static_cast<uint64_t>(out_rows) * sizeof(int32_t), "out->counts");
  return copy;
}

}  // namespace

void Context::decode_select_multi(uint64_t id, int32_t layer, const pq_tensor* queries_arg,
                                  int32_t rows, const pq_paged_keys* keys_arg,
                                  pq_selection* out) {
  const pq_config& c = shared_.config;
  check_layer(layer);
  const pq_tensor queries = copy_descriptor(queries_arg, "queries");
  validate_tensor(&queries, {"queries", c.num_q_heads, c.head_dim,
                             query_dtype(c.dtype, queries, "queries"), 1, -1});
  if (queries.memory != PQ_MEMORY_HOST)
    fail(PQ_ERR_UNSUPPORTED, "queries.memory is PQ_MEMORY_DEVICE; pq_decode_select_multi reads "
                             "queries in host memory (pq_decode_select_multi_device takes them "
                             "in device memory)");
  check_rows(rows);
  pq_selection copy = multi_rows_out(out, queries.tokens, rows, c.num_kv_heads);
  const int64_t q = queries.tokens;
  std::optional<PoolKeys> pool;
  if (keys_arg != nullptr && c.kv_tier == PQ_KV_TIER_CALLER) pool.emplace(*keys_arg, c, "keys");

  // Every token's query as floats, [q][q_heads][head_dim], checked finite.
  const size_t per_token = static_cast<size_t>(c.num_q_heads) * c.head_dim;
  std::vector<float> floats(static_cast<size_t>(q) * per_token);
  for (int64_t t = 0; t < q; ++t) {
    pq_tensor one = queries;
    one.data = static_cast<uint8_t*>(queries.data) +
               t * queries.token_stride * static_cast<int64_t>(dtype_size(queries.dtype));
    one.tokens = 1;
    const std::vector<float> f = query_floats(one, c.num_q_heads, c.head_dim, queries.dtype);
    std::copy(f.begin(), f.end(), floats.begin() + static_cast<std::ptrdiff_t>(t * per_token));
  }
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
  seq->layers[static_cast<size_t>(layer)]->select_multi(floats, q, rows,
                                                        pool ? &*pool : nullptr, &copy,
                                                        seq->info());
}

void Context::decode_select_multi_device(uint64_t id, int32_t layer, const pq_tensor* queries_arg,
                                         int32_t rows, pq_selection* out) {
  const pq_config& c = shared_.config;
  const char* call = "pq_decode_select_multi_device";
  check_layer(layer);
  const pq_tensor queries = copy_descriptor(queries_arg, "queries");
  validate_tensor(&queries, {"queries", c.num_q_heads, c.head_dim,
                             query_dtype(c.dtype, queries, "queries"), 1, -1});
  require_device_step(call, queries, "queries");
  if (!shared_.selector->needs_index())
    fail(PQ_ERR_UNSUPPORTED, std::string(call) + " chooses on the device with the PQ selector "
                                                 "only; this context's selector is " +
                                 shared_.selector->name() + " (use pq_decode_select_multi)");
  if (c.kv_tier == PQ_KV_TIER_CALLER && c.pq_rerank > 0.f)
    fail(PQ_ERR_UNSUPPORTED, std::string(call) + ": " + index_only_rerank_refusal());
  check_rows(rows);
  // Every token's kv heads are rows of int32 counts on the device.
  if (queries.tokens > INT32_MAX / c.num_kv_heads)
    invalid("queries.tokens is " + str(queries.tokens) + "; at most " +
            str(INT32_MAX / c.num_kv_heads) + " (INT32_MAX / num_kv_heads) in one call");
  const pq_selection copy = multi_rows_out(out, queries.tokens, rows, c.num_kv_heads);
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
  seq->layers[static_cast<size_t>(layer)]->select_multi_to_device(queries, rows, copy,
                                                                  seq->info());
}

}  // namespace pq
