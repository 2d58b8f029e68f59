// Scissorhands (methods digest, section 3.2): the persistence of importance.
// A token that mattered at recent steps is kept; one that kept getting less
// than its share of attention is dropped for good.
//
// The rule is that of the heavy-hitter cache built on Scissorhands'
// algorithm in cold-compress (AnswerDotAI/cold-compress, cache.py,
// attn_thresholding): each pq_observe_attention call is one step of a kv
// head, and a token it covers scored a hit when it got at least uniform
// attention over the tokens attended, i.e. prob >= 1 / count for one query
// head; the caller sums probabilities over the GQA group, so the test is
// prob >= group / count (the group's mean). A token's score is the share of
// hits among the steps that observed it within the last history_window
// steps of its head. A selection keeps the k middle tokens not dropped with
// the highest score (ties: the larger position) and drops the others for
// good, as H2O does (drop_selection.h): at a fixed budget that is
// cold-compress's one eviction per step of the lowest average.
// (The first author's perplexity simulation, lzcemma/Scissorhands,
// thresholds at each row's 90th percentile with no fixed budget; the budget
// here is the library's k, as for every selector.)
//
// Cold start: no observation gives every token score 0, so the most recent
// middle tokens are kept. Bytes: the state only; a decode step reads no key.
//
// State per kv head: the steps observed so far and, per token, two rings of
// history_window bits (observed at the step of that slot, hit at it), so a
// step clears its slot in every token before it writes the tokens observed.
#include <algorithm>
#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "base/cut_to.h"
#include "base/error.h"
#include "format/state_io.h"
#include "selectors/drop_selection.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

struct ScissorhandsState final : CopyableState<ScissorhandsState> {
  ScissorhandsState(int32_t kv_heads, int32_t group, int32_t window)
      : group(group),
        window(window),
        words((window + 63) / 64),
        steps(static_cast<size_t>(kv_heads), 0),
        seen(static_cast<size_t>(kv_heads)),
        hit(static_cast<size_t>(kv_heads)),
        dropped(static_cast<size_t>(kv_heads)) {}

  int32_t group;   // query heads per kv head
  int32_t window;  // history_window
  int32_t words;   // 64-bit words per token and ring
  std::vector<int64_t> steps;                 // [kv_head] observations so far
  std::vector<std::vector<uint64_t>> seen;    // [kv_head][token * words + w]
  std::vector<std::vector<uint64_t>> hit;     // [kv_head][token * words + w]
  std::vector<std::vector<uint8_t>> dropped;  // [kv_head][token]: 1 = dropped for good

  int64_t tokens(size_t h) const { return static_cast<int64_t>(dropped[h].size()); }

  void grow(size_t h, int64_t n) {
    if (tokens(h) >= n) return;
    seen[h].resize(static_cast<size_t>(n) * words, 0);
    hit[h].resize(static_cast<size_t>(n) * words, 0);
    dropped[h].resize(static_cast<size_t>(n), 0);
  }

  void observe(int32_t kv_head, const int32_t* positions, const float* probs, int64_t count) {
    if (count <= 0) return;
    const size_t h = static_cast<size_t>(kv_head);
    grow(h, tokens_covered(positions, count));
    const int64_t slot = steps[h] % window;
    const size_t word = static_cast<size_t>(slot / 64);
    const uint64_t bit = uint64_t{1} << (slot % 64);
    for (int64_t t = 0; t < tokens(h); ++t) {  // the slot's old step leaves the window
      seen[h][static_cast<size_t>(t) * words + word] &= ~bit;
      hit[h][static_cast<size_t>(t) * words + word] &= ~bit;
    }
    const double uniform = static_cast<double>(group) / static_cast<double>(count);
    for (int64_t i = 0; i < count; ++i) {
      const size_t p = static_cast<size_t>(positions[i]);
      if (dropped[h][p]) continue;  // evicted: nothing revives it
      seen[h][p * words + word] |= bit;
      if (static_cast<double>(probs[i]) >= uniform) hit[h][p * words + word] |= bit;
    }
    ++steps[h];
  }

  // Hits over observed steps in the window (0 when never observed).
  float score(size_t h, int64_t token) const {
    int observed = 0, hits = 0;
    const size_t base = static_cast<size_t>(token) * words;
    for (int32_t w = 0; w < words; ++w) {
      observed += static_cast<int>(std::bitset<64>(seen[h][base + w]).count());
      hits += static_cast<int>(std::bitset<64>(hit[h][base + w]).count());
    }
    return observed == 0 ? 0.f : static_cast<float>(hits) / static_cast<float>(observed);
  }

  void truncate(int64_t n) override {
    for (size_t h = 0; h < dropped.size(); ++h)
      if (tokens(h) > n) {
        cut_to(seen[h], static_cast<size_t>(n) * words);
        cut_to(hit[h], static_cast<size_t>(n) * words);
        cut_to(dropped[h], static_cast<size_t>(n));
      }
  }

  void save(ByteWriter& out) const override {
    out.put<int32_t>(window);
    out.put<uint32_t>(static_cast<uint32_t>(dropped.size()));
    for (size_t h = 0; h < dropped.size(); ++h) {
      out.put<int64_t>(steps[h]);
      out.put_vector(seen[h]);
      out.put_vector(hit[h]);
      out.put_vector(dropped[h]);
    }
  }

  void load(ByteReader& in, int64_t n, const pq_config&) override {
    const int32_t saved_window = in.get<int32_t>("scissorhands: history window");
    if (saved_window != window)
      in.corrupt("scissorhands' history window is " + std::to_string(saved_window) +
                 "; this context's history_window is " + std::to_string(window));
    const uint32_t heads = in.get<uint32_t>("scissorhands: kv heads");
    if (heads != dropped.size())
      in.corrupt("scissorhands has " + std::to_string(heads) + " kv heads; expected " +
                 std::to_string(dropped.size()));
    const uint64_t max_words = static_cast<uint64_t>(n) * static_cast<uint64_t>(words);
    for (size_t h = 0; h < dropped.size(); ++h) {
      steps[h] = in.get<int64_t>("scissorhands: steps");
      if (steps[h] < 0) in.corrupt("scissorhands: " + std::to_string(steps[h]) + " steps");
      seen[h] = in.get_vector<uint64_t>("scissorhands: observed steps", max_words);
      hit[h] = in.get_vector<uint64_t>("scissorhands: hits", max_words);
      dropped[h] = in.get_vector<uint8_t>("scissorhands: drop marks", static_cast<uint64_t>(n));
      const size_t t = dropped[h].size();
      if (seen[h].size() != t * words || hit[h].size() != t * words)
        in.corrupt("scissorhands of kv head " + std::to_string(h) + " holds " +
                   std::to_string(seen[h].size()) + " and " + std::to_string(hit[h].size()) +
                   " history words for " + std::to_string(t) + " tokens; expected " +
                   std::to_string(t * words) + " each");
      const uint64_t tail = window % 64 == 0 ? 0 : ~uint64_t{0} << (window % 64);
      for (size_t i = 0; i < t; ++i) {
        if (dropped[h][i] > 1) in.corrupt("scissorhands: a drop mark is not 0 or 1");
        for (int32_t w = 0; w < words; ++w) {
          const uint64_t s = seen[h][i * words + w], x = hit[h][i * words + w];
          const bool last = w == words - 1;
          if ((x & ~s) != 0 || (last && ((s | x) & tail) != 0))
            in.corrupt("scissorhands: token " + std::to_string(i) +
                       " has hits at steps that did not observe it, or bits past the window");
        }
      }
    }
  }
};

class ScissorhandsSelector final : public Selector {
 public:
  const char* name() const override { return "scissorhands"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t) const override {
    return std::make_unique<ScissorhandsState>(c.num_kv_heads, c.num_q_heads / c.num_kv_heads,
                                               c.history_window);
  }
  StateCost state_cost(const pq_config& c) const override {
    const uint64_t words = (static_cast<uint64_t>(c.history_window) + 63) / 64;
    return {sizeof(ScissorhandsState), per_token_cost(c, 2 * words * sizeof(uint64_t) + 1)};
  }

  void update_state(SelectorState* state, const KvTier&, int64_t n, int64_t, int64_t,
                    const pq_config&) const override {
    auto& s = state_of<ScissorhandsState>(state, "scissorhands");
    for (size_t h = 0; h < s.dropped.size(); ++h) s.grow(h, n);
  }

  void observe_attention(SelectorState* state, int32_t kv_head, const int32_t* positions,
                         const float* probs, int64_t count) const override {
    state_of<ScissorhandsState>(state, "scissorhands").observe(kv_head, positions, probs, count);
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    auto& s = state_of<ScissorhandsState>(r.state(), "scissorhands");
    const size_t h = static_cast<size_t>(r.kv_head);
    s.grow(h, r.mid_end());
    keep_top_k_and_drop(
        r, r.mid_begin(), r.mid_end(), r.k(), [&](int64_t p) { return s.score(h, p); },
        s.dropped[h], out, [](int64_t) {});
    return 0;
  }
};

}  // namespace

std::unique_ptr<Selector> make_scissorhands_selector() {
  return std::make_unique<ScissorhandsSelector>();
}

}  // namespace pq
