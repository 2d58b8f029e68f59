// StreamingLLM: attention sinks plus a recent window. The top-k budget goes
// to the most recent middle tokens, so the window covers sink + k + local
// tokens, the same number of tokens the other selectors attend to.
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

class WindowSelector final : public Selector {
 public:
  const char* name() const override { return "window"; }
  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    for (int64_t i = 0; i < r.k(); ++i) out[i] = static_cast<int32_t>(r.mid_end() - r.k() + i);
    return 0;
  }
};

}  // namespace

std::unique_ptr<Selector> make_window_selector() { return std::make_unique<WindowSelector>(); }

}  // namespace pq
