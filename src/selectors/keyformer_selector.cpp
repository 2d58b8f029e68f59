// Keyformer (methods digest, section 3.3): tokens kept by an accumulated,
// Gumbel-regularised attention score; the others are dropped for good.
//
// The rule follows the authors' code (d-matrix-ai/keyformer-llm,
// models/mpt-keyformer-lib/attention.py, commit f327831): at every step the
// scaled logits x of a query row get Gumbel noise g and a temperature tau,
//   y = softmax((x + g) / tau),   tau = keyformer_tau + step * keyformer_tau_step,
// and y, summed over the rows of the step, adds to each token's score.
// The prompt is step 0 and every later input is one step more.
//
// Where the inputs come from:
// - pq_prefill_queries: each window row (the last w prompt queries, every
//   query head of the group) gives a row of logits over the keys it sees;
//   the call is one step. Keyformer's code sums over every prompt row: an
//   observation_window as long as the prompt does exactly that (it reads the
//   prompt's keys once per row); the default window scores the prompt as
//   SnapKV and the H2O seed do.
// - pq_observe_attention: each call is one step of a kv head. The caller
//   gives probabilities (summed over the GQA group), so the logits are
//   log(prob): the softmax of the row is unchanged by the missing constant.
//   Tokens with probability 0 (or negative), and dropped tokens, take no
//   part (the code masks evicted keys to the lowest logit before the noise).
//
// Selection keeps the k middle tokens not dropped with the highest score
// (ties: the larger position) and drops the rest for good; a dropped token's
// score is 0 and later inputs skip it (drop_selection.h, as H2O). The
// code's recent window is the library's local window. One difference
// remains: in the code the token that leaves the recent window is dropped
// before it can compete (the key set is frozen after the prompt, see
// docs/selector-references.md); here it enters the middle and competes
// with its score.
//
// The noise is fully determined, so forks, restores and reruns select
// alike: for token t of row r at step s of kv head h in layer l,
//   u = ((mix(seed ^ salt, l, h, s, r, t) >> 11) + 0.5) * 2^-53,  g = -log(-log(u))
// with mix = mix_seed applied in that order (base/rng.h) and salt
// 0x6b6579666f726d72 ("keyformr"); decode observations are row 0.
// (bindings/python/tests/test_keyformer_reference.py recomputes it.)
//
// Bytes: the prompt keys are read at pq_prefill_queries; a select reads none.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/rng.h"
#include "selectors/attention_accumulator.h"
#include "selectors/prompt_scores.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

constexpr uint64_t kSalt = 0x6b6579666f726d72ULL;  // "keyformr"

// The noise stream of one (layer, kv head, step, row): gumbel(t) per token.
class GumbelNoise {
 public:
  GumbelNoise(uint64_t seed, int32_t layer, int32_t kv_head, int64_t step, int64_t row) {
    uint64_t s = mix_seed(seed ^ kSalt, static_cast<uint64_t>(layer));
    s = mix_seed(s, static_cast<uint64_t>(kv_head));
    s = mix_seed(s, static_cast<uint64_t>(step));
    row_seed_ = mix_seed(s, static_cast<uint64_t>(row));
  }
  double operator()(int64_t token) const {
    const uint64_t x = mix_seed(row_seed_, static_cast<uint64_t>(token));
    const double u = (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;  // in (0, 1)
    return -std::log(-std::log(u));
  }

 private:
  uint64_t row_seed_;
};

struct KeyformerState final : CopyableState<KeyformerState> {
  KeyformerState(const pq_config& c, int32_t layer)
      : layer(layer),
        seed(c.seed),
        head_offset(c.kv_head_offset),
        tau0(c.keyformer_tau),
        tau_step(c.keyformer_tau_step),
        attention(c.num_kv_heads),
        steps(static_cast<size_t>(c.num_kv_heads), 0) {}
  int32_t layer;
  uint64_t seed;          // config.seed
  int32_t head_offset;    // config.kv_head_offset: the noise is the model head's
  double tau0, tau_step;  // config.keyformer_tau, keyformer_tau_step
  AttentionAccumulator attention;  // score = accumulated y; drop marks
  std::vector<int64_t> steps;      // [kv_head] steps so far (the prompt's included)

  double tau(size_t h) const { return tau0 + static_cast<double>(steps[h]) * tau_step; }
  GumbelNoise noise(int32_t kv_head, int64_t row) const {
    return GumbelNoise(seed, layer, kv_head + head_offset, steps[static_cast<size_t>(kv_head)],
                       row);
  }

  // Adds softmax((x + g) / tau) to acc[token(i)] over the entries of one
  // row whose logit is finite and whose token is not dropped; x[i] belongs
  // to token(i). z has room for count entries: nothing here allocates.
  template <class Token>
  void add_row(size_t h, const double* x, int64_t count, Token token, const GumbelNoise& noise,
               double tau, std::vector<double>& z, float* acc) const {
    const std::vector<uint8_t>& dropped = attention.dropped[h];
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t t = token(i);
      z[i] = (std::isfinite(x[i]) && !dropped[static_cast<size_t>(t)])
                 ? (x[i] + noise(t)) / tau
                 : -std::numeric_limits<double>::infinity();
      mx = std::max(mx, z[i]);
    }
    if (!std::isfinite(mx)) return;  // nothing takes part
    double sum = 0.0;
    for (int64_t i = 0; i < count; ++i) sum += z[i] == -std::numeric_limits<double>::infinity()
                                                   ? 0.0
                                                   : std::exp(z[i] - mx);
    for (int64_t i = 0; i < count; ++i)
      if (z[i] != -std::numeric_limits<double>::infinity())
        acc[token(i)] += static_cast<float>(std::exp(z[i] - mx) / sum);
  }

  void truncate(int64_t tokens) override { attention.truncate(tokens); }
  void save(ByteWriter& out) const override {
    out.put_vector(steps);
    attention.save(out);
  }
  void load(ByteReader& in, int64_t tokens, const pq_config&) override {
    std::vector<int64_t> saved = in.get_vector<int64_t>("keyformer: steps", steps.size());
    if (saved.size() != steps.size())
      in.corrupt("keyformer has steps for " + std::to_string(saved.size()) +
                 " kv heads; expected " + std::to_string(steps.size()));
    for (int64_t s : saved)
      if (s < 0) in.corrupt("keyformer: " + std::to_string(s) + " steps");
    steps.swap(saved);
    attention.load(in, tokens);
  }
};

class KeyformerSelector final : public Selector {
 public:
  const char* name() const override { return "keyformer"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<KeyformerState>(c, layer);
  }
  StateCost state_cost(const pq_config& c) const override {
    return {sizeof(KeyformerState) + static_cast<uint64_t>(c.num_kv_heads) * sizeof(int64_t),
            per_token_cost(c, AttentionAccumulator::kBytesPerToken)};
  }

  void update_state(SelectorState* state, const KvTier&, int64_t n, int64_t, int64_t,
                    const pq_config&) const override {
    state_of<KeyformerState>(state, name()).attention.grow(n);
  }

  void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                       int64_t w, const pq_config& c) const override {
    auto& s = state_of<KeyformerState>(state, name());
    const int64_t P = store.tokens();
    check_window(w, P);
    // Every head's step is computed aside and added at the end, so a failed
    // allocation leaves the state as it was.
    s.attention.grow(P);
    std::vector<std::vector<float>> step(static_cast<size_t>(c.num_kv_heads),
                                         std::vector<float>(static_cast<size_t>(P), 0.f));
    std::vector<double> x(static_cast<size_t>(P)), z(static_cast<size_t>(P));
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const size_t hh = static_cast<size_t>(h);
      for_each_window_row(store, queries, w, c, h, [&](int64_t r, const float* l, int64_t n) {
        std::copy(l, l + n, x.begin());
        s.add_row(hh, x.data(), n, [](int64_t i) { return i; }, s.noise(h, r), s.tau(hh), z,
                  step[hh].data());
      });
    }
    for (size_t h = 0; h < step.size(); ++h) {
      std::vector<float>& score = s.attention.score[h];
      for (int64_t t = 0; t < P; ++t) score[static_cast<size_t>(t)] += step[h][static_cast<size_t>(t)];
      ++s.steps[h];
    }
  }

  void observe_attention(SelectorState* state, int32_t kv_head, const int32_t* positions,
                         const float* probs, int64_t count) const override {
    if (count <= 0) return;
    auto& s = state_of<KeyformerState>(state, name());
    const size_t h = static_cast<size_t>(kv_head);
    s.attention.grow(tokens_covered(positions, count));
    std::vector<double> x(static_cast<size_t>(count)), z(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      x[i] = probs[i] > 0.f ? std::log(static_cast<double>(probs[i]))
                            : -std::numeric_limits<double>::infinity();
    s.add_row(h, x.data(), count, [&](int64_t i) { return int64_t{positions[i]}; },
              s.noise(kv_head, 0), s.tau(h), z, s.attention.score[h].data());
    ++s.steps[h];
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    state_of<KeyformerState>(r.state(), name())
        .attention.select_and_drop(r, r.mid_begin(), r.mid_end(), r.k(), out);
    return 0;
  }
};

}  // namespace

std::unique_ptr<Selector> make_keyformer_selector() {
  return std::make_unique<KeyformerSelector>();
}

}  // namespace pq
