// The tail estimate of a layer's attention (pq_decode_attend with
// config.tail_estimate PQ_TAIL_CODE_MEANS; pq/tail_estimate.h): the part of
// each kv head's softmax that the coded middle tokens its selection leaves
// out add, estimated from the index, merged by the attend with the exact
// part of the selected rows.
#include <algorithm>
#include <vector>

#include "base/error.h"
#include "layer/layer.h"

namespace pq {

void Layer::prepare_tail(const Regions& r, uint64_t seq_id) {
  require_index(seq_id);
  code_tokens(r.mid_end);
  const PqIndex& index = *build_.index();
  const uint64_t bytes = CodeValueSums::bytes_for(*index.codebook, shared_.config.head_dim);
  if (tail_.charge.bytes() != bytes) {
    tail_.charge = Reservation{};
    tail_.charge = shared_.budget.reserve_or_describe(bytes, [&] {
      return std::make_pair("the tail estimate's value means of layer " + str(layer_index_) +
                                " (config.tail_estimate)",
                            std::string("; use PQ_TAIL_NONE, or a larger host_memory_limit"));
    });
  }
  tail_.sums.update(index, shared_.config.head_dim, shared_.config.dtype, r.sink_end, r.mid_end,
                    [&](int32_t head, int64_t first, int64_t end,
                        const std::function<void(const uint8_t*, int64_t)>& fn) {
                      store_->for_each_run(false, head, first, end, fn);
                    });
}

void Layer::tail_part(int32_t h, const Regions& r, const pq_selection* sel, const float* queries,
                      float scale, AttentionPart part) const {
  const int32_t group = shared_.group_size, d = shared_.config.head_dim;
  for (int32_t g = 0; g < group; ++g) part.max[g] = kNoRows, part.sum[g] = 0.0;
  std::fill(part.acc, part.acc + static_cast<size_t>(group) * d, 0.f);
  const PqIndex& index = *build_.index();
  const int64_t begin = r.sink_end, end = std::min(r.mid_end, index.coded_tokens);
  if (end <= begin) return;
  // The selection's middle tokens, as bits over [begin, end).
  std::vector<uint64_t> chosen(static_cast<size_t>((end - begin + 63) / 64), 0);
  const int32_t* row = sel->positions + static_cast<size_t>(h) * sel->capacity;
  for (int32_t i = 0; i < sel->counts[h]; ++i)
    if (row[i] >= begin && row[i] < end) {
      const uint64_t t = static_cast<uint64_t>(row[i] - begin);
      chosen[t >> 6] |= uint64_t{1} << (t & 63);
    }
  const PqCodebook& cb = *index.codebook;
  std::vector<float> lut(cb.lut_floats(group));
  cb.lut(h, queries, group, d, lut.data());
  std::vector<float> weights(static_cast<size_t>(cb.centroids) * group), shift(group);
  tail_weights(cb, lut.data(), group, scale, index.codes[static_cast<size_t>(h)], begin, end,
               chosen.data(), weights.data(), shift.data());
  const float* sums = tail_.sums.sums(h);
  const uint32_t* counts = tail_.sums.counts(h);
  for (int32_t g = 0; g < group; ++g) {
    double total = 0.0;
    float* acc = part.acc + static_cast<size_t>(g) * d;
    for (int32_t c = 0; c < cb.centroids; ++c) {
      const float w = weights[static_cast<size_t>(c) * group + g];
      if (w == 0.f || counts[c] == 0) continue;
      total += w;
      const float per_token = w / static_cast<float>(counts[c]);  // w x the code's mean
      const float* s = sums + static_cast<size_t>(c) * d;
      for (int32_t k = 0; k < d; ++k) acc[k] += per_token * s[k];
    }
    if (total > 0.0) part.max[g] = shift[g], part.sum[g] = total;
  }
}

}  // namespace pq
