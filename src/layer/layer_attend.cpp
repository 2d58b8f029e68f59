// A layer's attention over a selection (pq_decode_attend), read from the
// host store: kv heads in parallel when the selection is large.
#include <vector>

#include "backend/attention.h"
#include "base/call_args.h"
#include "layer/layer.h"

namespace pq {

void Layer::attend(const std::vector<float>& queries, const pq_selection* sel, float scale,
                   float* out, float* out_lse, uint64_t seq_id) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_prefill(seq_id, "pq_decode_attend");
  require_kv(seq_id, "pq_decode_attend");
  const int32_t kv_heads = shared_.config.num_kv_heads, group = shared_.group_size;
  const int32_t d = shared_.config.head_dim;
  check_positions(sel, kv_heads, store_.tokens(), layer_index_);
  // Results aside first: out and out_lse are written only on success.
  std::vector<float> result(static_cast<size_t>(kv_heads) * group * d);
  std::vector<float> lse(static_cast<size_t>(kv_heads) * group);
  int64_t rows = 0;
  for (int32_t h = 0; h < kv_heads; ++h) rows += sel->counts[h];
  auto head = [&](int64_t h) {
    const int64_t count = sel->counts[h];
    std::vector<float> work(static_cast<size_t>(attention_work_floats(count, group, d)));
    attend_head(store_, static_cast<int32_t>(h), sel->positions + h * sel->capacity, count,
                queries.data() + static_cast<size_t>(h) * group * d, group, scale,
                result.data() + static_cast<size_t>(h) * group * d,
                lse.data() + static_cast<size_t>(h) * group, work.data());
  };
  if (kv_heads > 1 && rows >= 4096)
    shared_.pool->parallel_for(kv_heads, head);
  else
    for (int32_t h = 0; h < kv_heads; ++h) head(h);
  std::copy(result.begin(), result.end(), out);
  if (out_lse != nullptr) std::copy(lse.begin(), lse.end(), out_lse);
}

}  // namespace pq
