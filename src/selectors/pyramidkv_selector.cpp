// PyramidKV (methods digest, section 5.1): SnapKV's static prompt scores and
// selection (prompt_scores.h), with a budget that shrinks linearly from the
// bottom layer to the top ("pyramidal information funnelling").
//
// With k the configured middle budget (topk_tokens, or topk_fraction of the
// middle, already clipped to the middle), L = num_layers and
// rho = pyramid_ratio (top budget / bottom budget, in (0, 1]):
//
//   k_l = round( 2k / (1 + rho) * (1 - (1 - rho) * l / (L - 1)) ),  l = 0..L-1
//
// i.e. k_0 = 2k / (1 + rho) at the bottom, k_{L-1} = rho * k_0 at the top,
// linear in between, so the mean over layers is exactly k before rounding
// (each layer is rounded half away from zero, so the mean is k within 0.5)
// and the total matches a uniform budget. Then k_l is clipped to [0, middle]:
// when 2k / (1 + rho) exceeds the middle, the lower layers keep all their
// middle tokens and the total falls below L * k. One layer: k_0 = k.
// (The public PyramidKV code uses an integer step
// max - l * floor((max - min) / L) with the same mean; the formula above
// is its exact linear form.)
#include <cmath>

#include "selectors/prompt_scores.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

class PyramidKvSelector final : public PromptScoreSelector, public LayerBudgets {
 public:
  const char* name() const override { return "pyramidkv"; }
  const LayerBudgets* layer_budgets() const override { return this; }

  int64_t budget(int64_t k, int64_t middle, int32_t layer, const pq_config& c) const override {
    if (c.num_layers <= 1 || k <= 0) return std::min(k, middle);
    const double rho = c.pyramid_ratio;
    const double bottom = 2.0 * static_cast<double>(k) / (1.0 + rho);
    const double frac = static_cast<double>(layer) / static_cast<double>(c.num_layers - 1);
    const double want = bottom * (1.0 - (1.0 - rho) * frac);
    const int64_t b = static_cast<int64_t>(std::llround(want));
    return std::max<int64_t>(0, std::min(b, middle));
  }
};

}  // namespace

std::unique_ptr<Selector> make_pyramidkv_selector() {
  return std::make_unique<PyramidKvSelector>();
}

}  // namespace pq
