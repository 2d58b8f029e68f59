// RANDOM: k distinct middle tokens drawn uniformly at random, a floor for the
// other selectors' recall. The stream of one selection is seeded from
// config.seed, the layer, the kv head and a per-(sequence, layer) step
// counter kept in the state and advanced once per pq_decode_select (in
// update_state, under the layer lock). So repeated calls draw different
// tokens, while a rerun with the same seed and the same sequence of calls
// draws the same ones. Sampling is Floyd's algorithm (k draws, every
// k-subset equally likely); nothing is read, so 0 bytes.
#include <cstdint>
#include <vector>

#include "base/rng.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "format/state_io.h"

namespace pq {

namespace {

struct RandomState final : CopyableState<RandomState> {
  uint64_t step = 0;  // selections made on this (sequence, layer)
  // The stream goes on: a truncated sequence does not replay its draws.
  void truncate(int64_t) override {}
  void save(ByteWriter& out) const override { out.put<uint64_t>(step); }
  void load(ByteReader& in, int64_t, const pq_config&) override {
    step = in.get<uint64_t>("random selector: step");
  }
};

// Separates this stream from the K-Means streams of the same seed.
constexpr uint64_t kSalt = 0x72616e646f6d5f73ULL;  // "random_s"

class RandomSelector final : public Selector {
 public:
  const char* name() const override { return "random"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<RandomState>();
  }
  StateCost state_cost(const pq_config&) const override { return {sizeof(RandomState), 0}; }

  void update_state(SelectorState* state, const KvTier&, int64_t, int64_t, int64_t,
                    const pq_config&) const override {
    ++state_of<RandomState>(state, "random").step;
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    if (select_without_scoring(r, out)) return 0;
    const int64_t m = r.middle();
    const uint64_t step = state_of<const RandomState>(r.state(), "random").step;
    uint64_t seed = mix_seed(r.config().seed ^ kSalt, static_cast<uint64_t>(r.layer_index()));
    seed = mix_seed(seed, static_cast<uint64_t>(r.kv_head + r.config().kv_head_offset));
    seed = mix_seed(seed, step);
    Rng rng(seed);
    // Floyd: for j = m-k .. m-1 draw t in [0, j]; take t, or j if t is taken.
    std::vector<uint8_t>& chosen = r.scratch.chosen;
    chosen.assign(static_cast<size_t>(m), 0);
    for (int64_t j = m - r.k(); j < m; ++j) {
      const uint64_t t = rng.below(static_cast<uint64_t>(j) + 1);
      uint8_t& slot = chosen[static_cast<size_t>(t)];
      if (slot) chosen[static_cast<size_t>(j)] = 1;
      else slot = 1;
    }
    int64_t w = 0;
    for (int64_t i = 0; i < m; ++i)
      if (chosen[static_cast<size_t>(i)]) out[w++] = static_cast<int32_t>(r.mid_begin() + i);
    return 0;
  }
};

}  // namespace

std::unique_ptr<Selector> make_random_selector() { return std::make_unique<RandomSelector>(); }

}  // namespace pq
