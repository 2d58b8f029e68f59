// The oracle: exact q.k over every middle token's full key. It reads all
// middle keys, which is what PQ selection exists to avoid; use it as the
// reference for recall.
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

class ExactSelector final : public Selector {
 public:
  const char* name() const override { return "exact"; }

 protected:
  uint64_t score(const SelectionRequest& r, float* raw) const override {
    return r.exact_logits(nullptr, r.mid_begin(), r.middle(), raw);
  }
};

}  // namespace

std::unique_ptr<Selector> make_exact_selector() { return std::make_unique<ExactSelector>(); }

}  // namespace pq
