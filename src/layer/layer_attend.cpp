// A layer's attention over a selection (pq_decode_attend), read from the
// host store: kv heads, and at long selections parts of a head's rows, in
// parallel on the pool, merged through their maxima and sums.
#include <algorithm>
#include <vector>

#include "backend/attention.h"
#include "base/call_args.h"
#include "layer/layer.h"

namespace pq {

namespace {

// Below this many rows in a call the pool's hand-off costs more than the
// second core gives; a part of a head is at least this long.
constexpr int64_t kParallelRows = 4096;
constexpr int64_t kMinPartRows = 2048;

struct AttendTask {
  int32_t head;
  int64_t begin, end;
};

}  // namespace

void Layer::attend(const std::vector<float>& queries, const pq_selection* sel, float scale,
                   float* out, float* out_lse, uint64_t seq_id, bool tail_only) {
  if (tail_only && shared_.config.tail_estimate == PQ_TAIL_NONE)
    fail(PQ_ERR_BAD_STATE,
         "config.tail_estimate is PQ_TAIL_NONE: this context keeps no tail estimate (create it "
         "with PQ_TAIL_CODE_MEANS)");
  if (tail_only && out_lse == nullptr)
    invalid("out_lse is NULL; the tail's log-sum-exp is what merges it with your attention");
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  const char* call = tail_only ? "pq_decode_tail" : "pq_decode_attend";
  require_prefill(seq_id, call);
  require_kv(seq_id, call);
  const int32_t kv_heads = shared_.config.num_kv_heads, group = shared_.group_size;
  const int32_t d = shared_.config.head_dim;
  check_positions(sel, kv_heads, store_->tokens(), layer_index_);
  const bool tail = tail_only || shared_.config.tail_estimate != PQ_TAIL_NONE;
  const Regions regions = shared_.regions(store_->tokens(), layer_index_);
  if (tail) prepare_tail(regions, seq_id);
  int64_t rows = 0;
  for (int32_t h = 0; h < kv_heads; ++h) rows += sel->counts[h];
  // The tail's tasks each scan the whole middle of a kv head.
  const bool parallel = shared_.pool != nullptr &&
                        (rows >= kParallelRows ||
                         (tail && regions.mid_end - regions.sink_end >= kParallelRows));
  // Enough tasks for every thread: a head is cut into parts when there are
  // fewer heads than threads (one or two kv heads, a large pool).
  const int64_t threads = parallel ? shared_.pool->size() + 1 : 1;
  const int64_t parts_per_head = (threads + kv_heads - 1) / kv_heads;
  std::vector<AttendTask> tasks;
  std::vector<int32_t> first_task(static_cast<size_t>(kv_heads) + 1);
  for (int32_t h = 0; h < kv_heads; ++h) {
    first_task[h] = static_cast<int32_t>(tasks.size());
    if (tail_only) continue;
    const int64_t count = sel->counts[h];
    const int64_t parts = std::max<int64_t>(1, std::min(parts_per_head, count / kMinPartRows));
    for (int64_t p = 0; p < parts; ++p)
      tasks.push_back({h, count * p / parts, count * (p + 1) / parts});
  }
  first_task[kv_heads] = static_cast<int32_t>(tasks.size());
  const size_t exact_tasks = tasks.size();
  if (tail)  // one more task per kv head, its tail (begin -1), merged after its parts
    for (int32_t h = 0; h < kv_heads; ++h) tasks.push_back({h, -1, -1});
  const size_t n = tasks.size();
  std::vector<float> acc(n * group * d), max(n * group);
  std::vector<double> sum(n * group);
  std::vector<AttentionPart> parts(n);
  for (size_t i = 0; i < n; ++i)
    parts[i] = {acc.data() + i * group * d, max.data() + i * group, sum.data() + i * group};
  std::vector<RowStaging> staging(n);  // rows a tier reads from elsewhere land here
  // fp8 scales leave the rows as stored: q . (s_k K) is (s_k q) . K, and
  // the values' scale multiplies the output once (scaled_out below).
  std::vector<float> scaled_queries;
  const float* q = queries.data();
  if (store_->key_scales() != nullptr) {
    scaled_queries = queries;
    for (int32_t h = 0; h < kv_heads; ++h)
      for (size_t i = 0; i < static_cast<size_t>(group) * d; ++i)
        scaled_queries[static_cast<size_t>(h) * group * d + i] *= store_->key_scale(h);
    q = scaled_queries.data();
  }
  auto run = [&](int64_t i) {
    const AttendTask& t = tasks[static_cast<size_t>(i)];
    if (t.begin < 0) {  // the tail's logits are q . centroids: the queries as given
      tail_part(t.head, regions, sel, queries.data() + static_cast<size_t>(t.head) * group * d,
                scale, parts[static_cast<size_t>(i)]);
      return;
    }
    const SelectedRows rows =
        store_->select_rows(t.head, sel->positions + t.head * sel->capacity + t.begin,
                            t.end - t.begin, staging[static_cast<size_t>(i)]);
    attend_rows(*rows.table, t.head, rows.positions, t.end - t.begin,
                q + static_cast<size_t>(t.head) * group * d, group, scale,
                parts[static_cast<size_t>(i)]);
  };
  if (parallel && n > 1)
    shared_.pool->parallel_for(static_cast<int64_t>(n), run);
  else
    for (size_t i = 0; i < n; ++i) run(static_cast<int64_t>(i));
  // out and out_lse are written only now, on success.
  std::vector<AttentionPart> head_parts;  // a head's parts and its tail (with the estimate only)
  for (int32_t h = 0; h < kv_heads; ++h) {
    float* scaled_out = out + static_cast<size_t>(h) * group * d;
    const AttentionPart* merged = parts.data() + first_task[h];
    int count = first_task[h + 1] - first_task[h];
    if (tail) {
      head_parts.assign(merged, merged + count);
      head_parts.push_back(parts[exact_tasks + static_cast<size_t>(h)]);
      merged = head_parts.data(), count = static_cast<int>(head_parts.size());
    }
    merge_attention(merged, count, group, d, scaled_out,
                    out_lse != nullptr ? out_lse + static_cast<size_t>(h) * group : nullptr);
    if (const float v = store_->value_scale(h); v != 1.f)
      for (size_t i = 0; i < static_cast<size_t>(group) * d; ++i) scaled_out[i] *= v;
  }
}

}  // namespace pq
