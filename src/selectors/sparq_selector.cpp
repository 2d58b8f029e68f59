// SparQ (Ribar et al., "SparQ Attention"), its first step: approximate q.k
// from the r query dimensions of largest magnitude, reading only those r
// elements of every middle key. r = config.sparq_dims, or ceil(head_dim/128)
// when 0 (the PQCache paper's 1/128 extra communication).
//
// For a GQA group the r dimensions are shared by the group's query heads (one
// fetch of key elements per kv head): they are the dimensions with the
// largest sum over the group of |q_g[d]|, ties to the lower dimension. Each
// query head's partial dot product over those dimensions is its raw score;
// the default select_middle then combines the group and takes the top k.
//
// SparQ's second step (fetching the top-k' full keys to compute exact
// attention, and the mean-value reallocation) is not done here: the caller
// attends to the selected tokens' full K/V after pq_fetch_kv anyway.
// Bytes read: middle * r * element_size per kv head.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/dtype.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "base/vector_math.h"

namespace pq {

namespace {

class SparqSelector final : public Selector {
 public:
  const char* name() const override { return "sparq"; }

 protected:
  uint64_t score(const SelectionRequest& r, float* raw) const override {
    const int32_t d = r.head_dim(), G = r.group_size();
    int32_t dims = r.config().sparq_dims > 0 ? r.config().sparq_dims : (d + 127) / 128;
    dims = std::min(dims, d);
    // Magnitude of each dimension over the group.
    std::vector<float> magnitude(static_cast<size_t>(d), 0.f);
    for (int32_t g = 0; g < G; ++g) {
      const float* q = r.queries() + static_cast<size_t>(g) * d;
      for (int32_t i = 0; i < d; ++i) magnitude[static_cast<size_t>(i)] += std::fabs(q[i]);
    }
    std::vector<int32_t> order(static_cast<size_t>(d));
    for (int32_t i = 0; i < d; ++i) order[static_cast<size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + dims, order.end(),
                      [&magnitude](int32_t a, int32_t b) {
                        float ma = magnitude[static_cast<size_t>(a)];
                        float mb = magnitude[static_cast<size_t>(b)];
                        return ma != mb ? ma > mb : a < b;
                      });
    order.resize(static_cast<size_t>(dims));
    std::sort(order.begin(), order.end());  // read each key row front to back

    // The group's queries restricted to those dimensions: qs[g][j].
    std::vector<float> qs(static_cast<size_t>(G) * dims);
    for (int32_t g = 0; g < G; ++g)
      for (int32_t j = 0; j < dims; ++j)
        qs[static_cast<size_t>(g) * dims + j] =
            r.queries()[static_cast<size_t>(g) * d + order[static_cast<size_t>(j)]];

    const int64_t m = r.middle();
    const size_t es = dtype_size(r.dtype());
    // The r dimensions of the middle's keys, a block of tokens at a time.
    constexpr int64_t kBlock = 256;
    std::vector<float> ks(static_cast<size_t>(std::min(m, kBlock)) * dims);
    for (int64_t b = 0; b < m; b += kBlock) {
      const int64_t n = std::min(kBlock, m - b);
      r.store().key_columns_as_float(r.kv_head, r.mid_begin() + b, n, order.data(), dims,
                                     ks.data());
      for (int64_t i = 0; i < n; ++i)
        for (int32_t g = 0; g < G; ++g)
          raw[static_cast<size_t>(g) * m + b + i] = dot(
              qs.data() + static_cast<size_t>(g) * dims, ks.data() + i * dims, dims);
    }
    return static_cast<uint64_t>(m) * static_cast<uint64_t>(dims) * es;
  }
};

}  // namespace

std::unique_ptr<Selector> make_sparq_selector() { return std::make_unique<SparqSelector>(); }

}  // namespace pq
