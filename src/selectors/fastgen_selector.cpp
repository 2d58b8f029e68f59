// FastGen (methods digest, section 4.1; docs/selector-references.md,
// section 4): a policy per kv head, chosen once from the head's attention
// profile, then kept. The rule follows cold-compress's KVCacheHybrid (no
// author code exists), mapped onto the library's regions:
//
// Profile, at pq_prefill_queries (P prompt tokens, middle M = [sinks,
// P - local_tokens), k the configured budget of M): a[t] is the attention
// the window rows pay token t, averaged over the rows and the GQA group
// (each row sums to 1). The fixed part F = a's sum over the sinks and the
// local window, which every policy keeps (cold-compress keeps 4 global
// tokens and a local window in every policy as well). The policies, each
// adding to the one before, keep of M:
//   special      the tokens of class PQ_TOKEN_SPECIAL
//   punctuation  + the tokens of class PQ_TOKEN_PUNCTUATION
//   heavy        + the ceil(k / 2) other tokens with the highest a
//   window       + the newest k - ceil(k / 2) tokens of M, the heavy
//                hitters then chosen among the tokens left
//   full         every token
// and recover F + the sum of a over what they keep. A head takes the
// first policy that recovers at least fastgen_recovery (full always does).
//
// Decode, per select: a special or punctuation head keeps those classes of
// the current middle (later tokens by the classes given for them); a full
// head the whole middle; a heavy head its protected classes and the
// ceil(k / 2) other middle tokens with the highest mean attention since
// they were stored, the others dropped for good (drop_selection.h). The
// mean is cold-compress's numerator / denominator (KVCacheHeavyHitter's
// attention history): the profile is a token's first observation (the
// attention the window rows that see it paid it, summed over the GQA group
// as pq_observe_attention's probabilities are, averaged over those rows),
// and every pq_observe_attention that covers it one more. Cold-compress
// evicts the lowest mean one token per step: at a fixed budget the same set
// (a sum would favour the oldest tokens: 0.79 Jaccard after 128 steps). A
// window head also keeps the newest k - ceil(k / 2) middle tokens, which
// join the heavy-hitter contest as they age out of it. Heads keep
// different numbers of tokens (pq_selection.counts); the capacity is the
// middle (a full head's count).
//
// Where the library differs from cold-compress: the profile is the
// observation window's rows, not the whole prompt's attention (which a
// server with FlashAttention never holds); the mean is over every
// observation since the token was stored (cold-compress keeps the last 400,
// history_window_size, so from the 400th step on a token's oldest ones
// leave its mean there); the budgets are the library's k (cold-compress:
// 0.3 of the maximum cache length each for the heavy hitters and the
// window); the local window and sinks are the library's.
//
// Classes come from pq_sequence_token_classes, per layer in this state (so
// truncate, fork and save carry them); a token never described is plain.
// Give the prompt's before pq_prefill_queries: the profile reads them.
// A later pq_prefill_queries profiles anew (attention histories and drop
// marks start over). A truncate keeps the policies. Bytes: the state only;
// a decode step reads no key (the profile read the prompt keys once).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "base/cut_to.h"
#include "base/error.h"
#include "format/state_io.h"
#include "selectors/attention_accumulator.h"
#include "selectors/prompt_scores.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

enum Policy : uint8_t { kSpecial = 0, kPunctuation = 1, kHeavy = 2, kWindow = 3, kFull = 4 };
constexpr uint8_t kPolicies = 5;

// The heavy-hitter and window budgets of a middle whose budget is k.
int64_t heavy_budget(int64_t k) { return (k + 1) / 2; }
int64_t window_budget(int64_t k) { return k - heavy_budget(k); }

struct FastGenState final : CopyableState<FastGenState> {
  FastGenState(int32_t layer, int32_t kv_heads)
      : layer(layer), attention(kv_heads), observed(static_cast<size_t>(kv_heads)) {}
  int32_t layer;
  int64_t prompt_tokens = -1;       // tokens at the last pq_prefill_queries; -1 before
  std::vector<uint8_t> policy;      // [kv_head], once profiled
  AttentionAccumulator attention;   // the attention histories' sums (saturating), drop marks
  std::vector<std::vector<uint32_t>> observed;  // [kv_head][token]: observations in the sum
  std::vector<uint8_t> classes;     // [token] pq_token_class flags; may pass the stored tokens

  bool ready() const { return prompt_tokens >= 0; }
  // A heavy hitter's score: its mean attention since it was stored; 0
  // before its first observation.
  float mean_attention(size_t h, int64_t t) const {
    const uint32_t n = observed[h][static_cast<size_t>(t)];
    return n == 0 ? 0.f : attention.score[h][static_cast<size_t>(t)] / static_cast<float>(n);
  }
  // Room for n tokens in every head (new tokens: no observation, kept).
  void grow(int64_t n) {
    attention.grow(n);
    for (std::vector<uint32_t>& o : observed)
      if (static_cast<int64_t>(o.size()) < n) o.resize(static_cast<size_t>(n), 0);
  }
  void observe(int32_t kv_head, const int32_t* positions, const float* probs, int64_t count) {
    if (count <= 0) return;
    grow(tokens_covered(positions, count));
    const size_t h = static_cast<size_t>(kv_head);
    std::vector<float>& sum = attention.score[h];
    std::vector<uint32_t>& n = observed[h];
    for (int64_t i = 0; i < count; ++i) {
      const size_t t = static_cast<size_t>(positions[i]);
      if (attention.dropped[h][t]) continue;  // dropped for good: ignored, as H2O's
      sum[t] = saturating_add(sum[t], probs[i]);
      if (n[t] < std::numeric_limits<uint32_t>::max()) ++n[t];
    }
  }
  uint8_t class_of(int64_t t) const {
    return t < static_cast<int64_t>(classes.size()) ? classes[static_cast<size_t>(t)] : 0;
  }
  // Whether policy p keeps token t of the middle [.., mid_end) by class or
  // recency alone (window: the newest `window` tokens).
  bool protects(uint8_t p, int64_t t, int64_t mid_end, int64_t window) const {
    if (p == kFull) return true;
    const uint8_t c = class_of(t);
    if (c & PQ_TOKEN_SPECIAL) return true;
    if (p >= kPunctuation && (c & PQ_TOKEN_PUNCTUATION)) return true;
    return p >= kWindow && t >= mid_end - window;
  }

  // The classes are charged as held (caller_bytes), not per chunk: they may
  // describe positions before their K/V.
  uint64_t caller_bytes() const override { return classes.capacity(); }
  uint64_t caller_bytes_after_classes(int64_t end) const override {
    return std::max<uint64_t>(classes.capacity(), grown_capacity(end));
  }
  // The capacity observe_token_classes gives the classes to describe
  // positions before `end`: doubling, so that classes given token by token
  // cost amortised O(1), and never more than twice what is described.
  uint64_t grown_capacity(int64_t end) const {
    const uint64_t need = static_cast<uint64_t>(end);
    return need <= classes.capacity() ? classes.capacity()
                                      : std::max<uint64_t>(need, 2 * classes.capacity());
  }

  void truncate(int64_t tokens) override {
    attention.truncate(tokens);
    for (std::vector<uint32_t>& o : observed)
      if (static_cast<int64_t>(o.size()) > tokens) cut_to(o, static_cast<size_t>(tokens));
    if (static_cast<int64_t>(classes.size()) > tokens) {
      classes.resize(static_cast<size_t>(tokens));
      classes.shrink_to_fit();  // its charge goes down with it
    }
    if (prompt_tokens > tokens) prompt_tokens = tokens;
  }
  void save(ByteWriter& out) const override {
    out.put<int64_t>(prompt_tokens);
    out.put_vector(policy);
    attention.save(out);
    for (const std::vector<uint32_t>& o : observed) out.put_vector(o);
    out.put_vector(classes);
  }
  void load(ByteReader& in, int64_t tokens, const pq_config& c) override {
    prompt_tokens = in.get<int64_t>("fastgen: prompt tokens");
    if (prompt_tokens < -1 || prompt_tokens > tokens)
      in.corrupt("fastgen's profile covers " + std::to_string(prompt_tokens) +
                 " tokens; the layer holds " + std::to_string(tokens));
    policy = in.get_vector<uint8_t>("fastgen: policies", static_cast<uint64_t>(c.num_kv_heads));
    const size_t heads = ready() ? static_cast<size_t>(c.num_kv_heads) : 0;
    if (policy.size() != heads)
      in.corrupt("fastgen has " + std::to_string(policy.size()) + " head policies; expected " +
                 std::to_string(heads));
    for (uint8_t p : policy)
      if (p >= kPolicies)
        in.corrupt("fastgen: a head's policy is " + std::to_string(p) + "; expected 0 to 4");
    attention.load(in, tokens);
    for (size_t h = 0; h < observed.size(); ++h) {
      const std::vector<float>& sum = attention.score[h];
      observed[h] = in.get_vector<uint32_t>("fastgen: observations", sum.size());
      if (observed[h].size() != sum.size())
        in.corrupt("fastgen: kv head " + std::to_string(h) + " has " +
                   std::to_string(observed[h].size()) + " observation counts for " +
                   std::to_string(sum.size()) + " attention sums");
      for (size_t t = 0; t < sum.size(); ++t)
        if (observed[h][t] == 0 && sum[t] != 0.f)
          in.corrupt("fastgen: kv head " + std::to_string(h) + ", token " + std::to_string(t) +
                     " has attention " + number_text(sum[t]) + " but no observation");
    }
    classes = in.get_vector<uint8_t>("fastgen: token classes", in.left());
    for (size_t t = 0; t < classes.size(); ++t)
      if (classes[t] & ~(PQ_TOKEN_SPECIAL | PQ_TOKEN_PUNCTUATION))
        in.corrupt("fastgen: the class of token " + std::to_string(t) + " is " +
                   std::to_string(classes[t]) + "; expected flags 1 and 2 only");
  }
};

class FastGenSelector final : public Selector, public LayerBudgets, public TokenClassObserver {
 public:
  const char* name() const override { return "fastgen"; }
  const LayerBudgets* layer_budgets() const override { return this; }
  const TokenClassObserver* token_class_observer() const override { return this; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<FastGenState>(layer, c.num_kv_heads);
  }
  StateCost state_cost(const pq_config& c) const override {
    // Per token the accumulated attention and its observation count; the
    // token classes are charged apart, as held (caller_bytes).
    return {sizeof(FastGenState),
            per_token_cost(c, AttentionAccumulator::kBytesPerToken + sizeof(uint32_t))};
  }
  int64_t head_capacity(int64_t, int64_t middle, const pq_config&) const override {
    return middle;
  }

  void observe_token_classes(SelectorState* state, int64_t first, int64_t count,
                             const uint8_t* classes) const override {
    FastGenState& s = state_of<FastGenState>(state, name());
    if (static_cast<int64_t>(s.classes.size()) < first + count) {
      s.classes.reserve(static_cast<size_t>(s.grown_capacity(first + count)));
      s.classes.resize(static_cast<size_t>(first + count), PQ_TOKEN_PLAIN);
    }
    std::copy(classes, classes + count, s.classes.begin() + first);
  }

  void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                       int64_t w, const pq_config& c) const override {
    FastGenState& s = state_of<FastGenState>(state, name());
    const int64_t P = store.tokens();
    check_window(w, P);
    const int64_t mid_begin = std::min<int64_t>(c.sink_tokens, P);
    const int64_t mid_end = std::max(mid_begin, P - static_cast<int64_t>(c.local_tokens));
    const int64_t k = configured_k(c, mid_end - mid_begin);
    const double rows = static_cast<double>(w) * (c.num_q_heads / c.num_kv_heads);
    std::vector<double> sum(static_cast<size_t>(P));
    std::vector<uint8_t> policy(static_cast<size_t>(c.num_kv_heads));
    s.attention.truncate(0);  // the profile starts the attention histories over
    for (std::vector<uint32_t>& o : s.observed) o.clear();
    s.grow(P);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for_each_window_row(store, queries, w, c, h, [&](int64_t, const float* l, int64_t n) {
        add_softmax(l, n, 1.0, sum.data());
      });
      // The first observation: the mean over the window rows that see t
      // (row i, at position P - w + i, sees [0, P - w + i]).
      std::vector<float>& score = s.attention.score[static_cast<size_t>(h)];
      for (int64_t t = 0; t < P; ++t) {
        const int64_t seen_by = std::min(w, P - t);
        score[static_cast<size_t>(t)] = static_cast<float>(sum[t] / static_cast<double>(seen_by));
        s.observed[static_cast<size_t>(h)][static_cast<size_t>(t)] = 1;
      }
      policy[static_cast<size_t>(h)] =
          choose_policy(s, sum, rows, mid_begin, mid_end, k, c.fastgen_recovery);
    }
    s.policy.swap(policy);
    s.prompt_tokens = P;
  }

  void update_state(SelectorState* state, const KvTier&, int64_t n, int64_t, int64_t,
                    const pq_config&) const override {
    FastGenState& s = state_of<FastGenState>(state, name());
    if (!s.ready()) fail_needs_prefill_queries(name(), s.layer);
    s.grow(n);
  }

  void observe_attention(SelectorState* state, int32_t kv_head, const int32_t* positions,
                         const float* probs, int64_t count) const override {
    state_of<FastGenState>(state, name()).observe(kv_head, positions, probs, count);
  }

  uint64_t select_layer(const LayerSelection& r, int32_t* out) const override {
    FastGenState& s = state_of<FastGenState>(r.state, name());
    if (!s.ready()) fail_needs_prefill_queries(name(), r.context.layer);
    const int64_t begin = r.middle.begin, end = r.middle.end, m = r.middle.size();
    const int64_t heavy = std::min(heavy_budget(r.k_mean), m);
    const int64_t window = window_budget(r.k_mean);
    r.for_each_head([&](int64_t h64) {
      const int32_t h = static_cast<int32_t>(h64);
      const uint8_t p = s.policy[static_cast<size_t>(h)];
      int32_t* row = out + h64 * r.k;
      int64_t kept = 0;
      if (p <= kPunctuation || p == kFull) {
        for (int64_t t = begin; t < end; ++t)
          if (s.protects(p, t, end, window)) row[kept++] = static_cast<int32_t>(t);
      } else {
        // The protected tokens rank +inf, so a top-k of protected + heavy
        // takes them all and the heavy hitters among the rest; the rest is
        // dropped. A protected token is kept whatever happened to it before.
        std::vector<uint8_t>& dropped = s.attention.dropped[static_cast<size_t>(h)];
        std::vector<float>& sum = s.attention.score[static_cast<size_t>(h)];
        std::vector<uint32_t>& observed = s.observed[static_cast<size_t>(h)];
        int64_t guarded = 0;
        for (int64_t t = begin; t < end; ++t)
          if (s.protects(p, t, end, window)) {
            dropped[static_cast<size_t>(t)] = 0;
            ++guarded;
          }
        kept = std::min(m, guarded + heavy);
        ScratchLease lease(r.scratch);
        const SelectionRequest head = r.head(h, *lease);
        keep_top_k_and_drop(
            head, begin, end, kept,
            [&](int64_t t) {
              return s.protects(p, t, end, window) ? std::numeric_limits<float>::infinity()
                                                   : s.mean_attention(static_cast<size_t>(h), t);
            },
            dropped, row, [&](int64_t t) {
              sum[static_cast<size_t>(t)] = 0.f;  // a revived token starts a new history
              observed[static_cast<size_t>(t)] = 0;
            });
      }
      r.head_counts[h] = static_cast<int32_t>(kept);
    });
    return 0;  // the prompt keys were read once, at pq_prefill_queries
  }

 private:
  // The first policy whose kept share of the window's attention reaches
  // `recovery`: sum[t] is the attention the window rows paid token t, over
  // `rows` rows.
  static uint8_t choose_policy(const FastGenState& s, const std::vector<double>& sum, double rows,
                               int64_t mid_begin, int64_t mid_end, int64_t k, float recovery) {
    const int64_t P = static_cast<int64_t>(sum.size());
    auto share = [&](int64_t t) { return sum[static_cast<size_t>(t)] / rows; };
    double fixed = 0.0;  // sinks and the local window
    for (int64_t t = 0; t < mid_begin; ++t) fixed += share(t);
    for (int64_t t = mid_end; t < P; ++t) fixed += share(t);
    const int64_t heavy = heavy_budget(k), window = window_budget(k);
    double recovered[kPolicies] = {fixed, fixed, fixed, fixed, 1.0};
    std::vector<double> rest[2];  // heavy-hitter candidates of policies heavy and window
    for (int64_t t = mid_begin; t < mid_end; ++t) {
      const uint8_t c = s.class_of(t);
      const double a = share(t);
      if (c & PQ_TOKEN_SPECIAL) {
        for (int p = kSpecial; p <= kWindow; ++p) recovered[p] += a;
      } else if (c & PQ_TOKEN_PUNCTUATION) {
        for (int p = kPunctuation; p <= kWindow; ++p) recovered[p] += a;
      } else {
        rest[0].push_back(a);
        if (t >= mid_end - window) {
          recovered[kWindow] += a;
        } else {
          rest[1].push_back(a);
        }
      }
    }
    for (int i = 0; i < 2; ++i) {  // the top `heavy` of each candidate set
      std::vector<double>& v = rest[i];
      const int64_t take = std::min<int64_t>(heavy, static_cast<int64_t>(v.size()));
      std::nth_element(v.begin(), v.begin() + take, v.end(), std::greater<double>());
      for (int64_t j = 0; j < take; ++j) recovered[kHeavy + i] += v[static_cast<size_t>(j)];
    }
    for (uint8_t p = kSpecial; p < kFull; ++p)
      if (recovered[p] >= static_cast<double>(recovery)) return p;
    return kFull;
  }
};

}  // namespace

std::unique_ptr<Selector> make_fastgen_selector() { return std::make_unique<FastGenSelector>(); }

}  // namespace pq
