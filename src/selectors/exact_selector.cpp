// The oracle: exact q.k over every middle token's full key. It reads all
// middle keys, which is what PQ selection exists to avoid; use it as the
// reference for recall.
#include <vector>

#include "base/dtype.h"
#include "selectors/selector.h"
#include "base/vector_math.h"

namespace pq {

namespace {

class ExactSelector final : public Selector {
 public:
  const char* name() const override { return "exact"; }

 protected:
  uint64_t score(const SelectionRequest& r, float* raw) const override {
    const int64_t m = r.middle();
    std::vector<float> key(static_cast<size_t>(r.head_dim()));
    for (int64_t i = 0; i < m; ++i) {
      to_float(r.store().key_row(r.mid_begin() + i, r.kv_head), r.dtype(), r.head_dim(), key.data());
      for (int32_t g = 0; g < r.group_size(); ++g)
        raw[static_cast<size_t>(g) * m + i] =
            dot(r.queries() + static_cast<size_t>(g) * r.head_dim(), key.data(), r.head_dim());
    }
    return static_cast<uint64_t>(m) * r.store().row_bytes();
  }
};

}  // namespace

std::unique_ptr<Selector> make_exact_selector() { return std::make_unique<ExactSelector>(); }

}  // namespace pq
