// Keyformer (keyformer_selector.cpp): accumulated Gumbel-softmax scores with
// a temperature that grows by step, drop semantics. Public API only; the
// rule, the documented noise stream included, is recomputed here in double.
#include <cmath>
#include <random>
#include <set>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 3;
constexpr int32_t kLayer = 1;  // not 0: the layer is part of the noise's seed

pq_config keyformer_config(float tau, float tau_step) {
  pq_config c = pqt::make_config(2, 4, 2, 8, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_KEYFORMER;
  c.sink_tokens = 4;
  c.local_tokens = 8;
  c.topk_tokens = 12;
  c.observation_window = 6;
  c.seed = 99;
  c.keyformer_tau = tau;
  c.keyformer_tau_step = tau_step;
  c.worker_threads = 1;
  return c;
}

// The noise as keyformer_selector.cpp documents it (base/rng.h's mixing).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t mix_seed(uint64_t seed, uint64_t value) {
  uint64_t state = seed ^ (value * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL);
  splitmix64(state);
  return splitmix64(state);
}
double gumbel(uint64_t seed, int64_t layer, int64_t head, int64_t step, int64_t row, int64_t t) {
  uint64_t s = seed ^ 0x6b6579666f726d72ULL;
  for (int64_t v : {layer, head, step, row, t}) s = mix_seed(s, static_cast<uint64_t>(v));
  const double u = (static_cast<double>(s >> 11) + 0.5) * 0x1.0p-53;
  return -std::log(-std::log(u));
}

// The rule, per kv head, in double.
struct KeyformerRef {
  pq_config c;
  bool noise = true;  // off: what a library that forgot the noise would do
  std::vector<std::vector<double>> score;
  std::vector<std::vector<bool>> dropped;
  std::vector<int64_t> steps;

  explicit KeyformerRef(const pq_config& config) : c(config), score(2), dropped(2), steps(2, 0) {}

  double tau(int32_t h) const { return c.keyformer_tau + steps[h] * double{c.keyformer_tau_step}; }
  void grow(int64_t n) {
    for (int32_t h = 0; h < 2; ++h) {
      score[h].resize(static_cast<size_t>(std::max<int64_t>(n, score[h].size())), 0.0);
      dropped[h].resize(score[h].size(), false);
    }
  }
  // softmax((x + g) / tau) over the entries with finite x and a kept token.
  void add_row(int32_t h, const std::vector<double>& x, const std::vector<int32_t>& tokens,
               int64_t row) {
    std::vector<double> z(x.size(), -INFINITY);
    double mx = -INFINITY;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i]) || dropped[h][tokens[i]]) continue;
      const double g = noise ? gumbel(c.seed, kLayer, h, steps[h], row, tokens[i]) : 0.0;
      z[i] = (x[i] + g) / tau(h);
      mx = std::max(mx, z[i]);
    }
    double sum = 0;
    for (double v : z) sum += std::isfinite(v) ? std::exp(v - mx) : 0.0;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isfinite(z[i])) score[h][tokens[i]] += std::exp(z[i] - mx) / sum;
  }
  // The window rows of pq_prefill_queries: row i * group + g.
  void prompt(const std::vector<float>& keys, int64_t P, const std::vector<float>& queries,
              int64_t q_tokens) {
    grow(P);
    const int64_t w = std::min<int64_t>(q_tokens, c.observation_window);
    const int32_t G = c.num_q_heads / c.num_kv_heads, d = c.head_dim;
    for (int32_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < w; ++i)
        for (int32_t g = 0; g < G; ++g) {
          const float* q =
              queries.data() + ((q_tokens - w + i) * c.num_q_heads + h * G + g) * d;
          std::vector<double> x;
          std::vector<int32_t> tokens;
          for (int64_t t = 0; t <= P - w + i; ++t) {
            double dot = 0;
            for (int32_t e = 0; e < d; ++e) dot += double{q[e]} * keys[(t * 2 + h) * d + e];
            x.push_back(dot / std::sqrt(double(d)));
            tokens.push_back(static_cast<int32_t>(t));
          }
          add_row(h, x, tokens, i * G + g);
        }
      ++steps[h];
    }
  }
  void observe(int32_t h, const std::vector<int32_t>& tokens, const float* probs) {
    std::vector<double> x;
    for (size_t i = 0; i < tokens.size(); ++i)
      x.push_back(probs[i] > 0 ? std::log(double{probs[i]}) : -INFINITY);
    add_row(h, x, tokens, 0);
    ++steps[h];
  }
  std::vector<int32_t> select(int32_t h, const pqt::Regions& r) {
    grow(r.n);
    std::vector<double> s;
    for (int64_t p = r.sink_end; p < r.local_begin; ++p)
      s.push_back(dropped[h][p] ? -INFINITY : score[h][p]);
    std::vector<int32_t> keep = pqt::topk_positions(s, r.sink_end, r.k);
    for (int64_t p = r.sink_end; p < r.local_begin; ++p)
      if (!std::binary_search(keep.begin(), keep.end(), static_cast<int32_t>(p))) {
        if (!dropped[h][p]) score[h][p] = 0;
        dropped[h][p] = true;
      }
    return keep;
  }
};

// Float accumulation may reorder scores closer than this; the data must
// not put two kept/dropped candidates that close at the boundary.
bool near_tie_at_boundary(const KeyformerRef& ref, int32_t h, const pqt::Regions& r) {
  std::vector<double> s;
  for (int64_t p = r.sink_end; p < r.local_begin; ++p)
    if (!ref.dropped[h][p]) s.push_back(ref.score[h][p]);
  std::sort(s.begin(), s.end(), std::greater<double>());
  if (r.k <= 0 || r.k >= static_cast<int64_t>(s.size())) return false;
  return std::fabs(s[r.k - 1] - s[r.k]) <= 1e-5 * std::max(1.0, std::fabs(s[r.k]));
}

struct Trace {
  std::vector<std::vector<int32_t>> middles;  // kv head 0 then 1, per step
  std::vector<std::vector<int32_t>> wanted;   // the reference's, alike
  int near_ties = 0;
};

// A prompt of P tokens, pq_prefill_queries, then `steps` decode steps: each
// appends a token, selects, and observes random probabilities (a fifth of
// them 0) over the selection. Checks every selection against the rule.
Trace run(const pq_config& c, int64_t steps, bool check = true, bool ref_noise = true) {
  const int64_t P = 80, q_tokens = 10;
  std::vector<float> keys = pqt::random_normal(static_cast<size_t>((P + steps) * 2 * 8), 21);
  std::vector<float> queries = pqt::random_normal(static_cast<size_t>(q_tokens * 4 * 8), 22, 2.f);
  Ctx ctx(c);
  Trace out;
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  if (!ctx.ok()) return out;
  KeyformerRef ref(c);
  ref.noise = ref_noise;
  EXPECT_TRUE(pqt::IsOk(pq_sequence_add(ctx, kSeq)));
  for (int32_t l = 0; l < 2; ++l) {
    pqt::HostTensor k = pqt::make_tensor(keys.data(), P, 2, 8, c.dtype);
    EXPECT_TRUE(pqt::IsOk(pq_prefill_layer(ctx, kSeq, l, k.get(), k.get())));
  }
  pqt::HostTensor qt = pqt::make_tensor(queries, q_tokens, 4, 8, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_prefill_queries(ctx, kSeq, kLayer, qt.get())));
  ref.prompt(keys, P, queries, q_tokens);
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  for (int64_t s = 0; s <= steps; ++s) {
    const int64_t n = P + s;
    if (s > 0) {
      pqt::HostTensor k = pqt::make_tensor(keys.data() + (n - 1) * 16, 1, 2, 8, c.dtype);
      EXPECT_TRUE(pqt::IsOk(pq_decode_append(ctx, kSeq, kLayer, k.get(), k.get())));
    }
    const pqt::Regions r = pqt::regions(n, c);
    Sel sel(2, pqt::selection_capacity(ctx, kSeq, kLayer));
    std::vector<float> q = pqt::random_normal(32, 100 + s);
    pqt::HostTensor qs = pqt::make_tensor(q, 1, 4, 8, c.dtype);
    EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, kLayer, qs.get(), sel.get())));
    for (int32_t h = 0; h < 2; ++h) {
      out.near_ties += near_tie_at_boundary(ref, h, r);
      std::vector<int32_t> want = ref.select(h, r), got = pqt::middle_of(sel.row(h), r);
      if (check) EXPECT_EQ(got, want) << "step " << s << ", kv head " << h;
      out.middles.push_back(got);
      out.wanted.push_back(want);
    }
    std::vector<float> probs(static_cast<size_t>(2 * sel.capacity));
    for (float& p : probs) p = unif(rng) < 0.2f ? 0.f : unif(rng);
    EXPECT_TRUE(pqt::IsOk(pq_observe_attention(ctx, kSeq, kLayer, sel.get(), probs.data())));
    for (int32_t h = 0; h < 2; ++h)
      ref.observe(h, sel.row(h), probs.data() + h * sel.capacity);
  }
  return out;
}

TEST(Keyformer, PromptAndDecodeStepsFollowTheGumbelSoftmaxRule) {
  for (auto [tau, step] : {std::pair{1.f, 0.25f}, std::pair{0.5f, 0.0078125f}}) {
    SCOPED_TRACE("tau " + std::to_string(tau) + " step " + std::to_string(step));
    Trace got = run(keyformer_config(tau, step), 12);
    EXPECT_EQ(got.near_ties, 0) << "pick another seed: the data has near ties";
    EXPECT_EQ(got.middles.size(), 26u);
  }
}

// The comparison above would catch a library that ignored the noise or the
// temperature's schedule: each changes what is selected on this data.
TEST(Keyformer, NoiseAndTemperatureScheduleEachChangeTheSelection) {
  const pq_config c = keyformer_config(1.f, 0.25f);
  const Trace rule = run(c, 12);
  EXPECT_NE(run(c, 12, false, false).wanted, rule.middles) << "noise changes nothing here";
  EXPECT_NE(run(keyformer_config(1.f, 0.f), 12, false).middles, rule.middles)
      << "the schedule changes nothing here";
  pq_config other_seed = c;
  other_seed.seed = 100;
  EXPECT_NE(run(other_seed, 12, false).middles, rule.middles) << "the seed changes nothing";
  EXPECT_EQ(run(c, 12, false).middles, rule.middles) << "not deterministic";
}

TEST(Keyformer, TemperatureSettingsAreChecked) {
  struct Bad {
    float tau, step;
    const char* field;
  };
  for (Bad b : {Bad{0.f, 0.f, "keyformer_tau"}, Bad{-1.f, 0.f, "keyformer_tau"},
                Bad{NAN, 0.f, "keyformer_tau"}, Bad{2e6f, 0.f, "keyformer_tau"},
                Bad{1.f, -0.5f, "keyformer_tau_step"}, Bad{1.f, INFINITY, "keyformer_tau_step"}}) {
    pq_config c = keyformer_config(b.tau, b.step);
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {b.field}))
        << b.tau << " " << b.step;
    EXPECT_EQ(ctx, nullptr);
  }
  pq_config c = keyformer_config(1e-3f, 0.f);  // tiny but positive: a hard argmax
  EXPECT_TRUE(Ctx(c).ok()) << pq_last_error();
}

// A fork carries the scores, drop marks and step counts: fed the same
// inputs, the fork and the original select alike; truncation forgets the
// scores of the tokens it removes and keeps the drops of the others.
TEST(Keyformer, ForkAndTruncateCarryTheState) {
  const pq_config c = keyformer_config(1.f, 0.25f);
  const int64_t P = 60;
  std::vector<float> keys = pqt::random_normal(static_cast<size_t>((P + 20) * 16), 31);
  std::vector<float> queries = pqt::random_normal(6 * 32, 32, 2.f);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  for (int32_t l = 0; l < 2; ++l) {
    pqt::HostTensor k = pqt::make_tensor(keys.data(), P, 2, 8, c.dtype);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, l, k.get(), k.get()));
  }
  pqt::HostTensor qt = pqt::make_tensor(queries, 6, 4, 8, c.dtype);
  PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, kLayer, qt.get()));
  std::set<int32_t> dropped;
  auto step = [&](uint64_t seq, int64_t n, int salt) {
    pqt::HostTensor k = pqt::make_tensor(keys.data() + (n - 1) * 16, 1, 2, 8, c.dtype);
    EXPECT_TRUE(pqt::IsOk(pq_decode_append(ctx, seq, kLayer, k.get(), k.get())));
    Sel sel(2, pqt::selection_capacity(ctx, seq, kLayer));
    std::vector<float> q = pqt::random_normal(32, 7);
    pqt::HostTensor qs = pqt::make_tensor(q, 1, 4, 8, c.dtype);
    EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, seq, kLayer, qs.get(), sel.get())));
    std::vector<float> probs(static_cast<size_t>(2 * sel.capacity));
    for (size_t i = 0; i < probs.size(); ++i) probs[i] = float((i * 7 + n * 3 + salt) % 13) / 13.f;
    EXPECT_TRUE(pqt::IsOk(pq_observe_attention(ctx, seq, kLayer, sel.get(), probs.data())));
    return sel.row(0);
  };
  for (int64_t n = P + 1; n <= P + 6; ++n) {
    std::vector<int32_t> row = step(kSeq, n, 0);
    const pqt::Regions r = pqt::regions(n, c);
    std::vector<int32_t> mid = pqt::middle_of(row, r);
    for (int64_t p = r.sink_end; p < r.local_begin; ++p)
      if (!std::binary_search(mid.begin(), mid.end(), static_cast<int32_t>(p)))
        dropped.insert(static_cast<int32_t>(p));
  }
  PQ_ASSERT_OK(pq_sequence_fork(ctx, kSeq, kSeq + 1));
  for (int64_t n = P + 7; n <= P + 12; ++n)
    EXPECT_EQ(step(kSeq, n, 1), step(kSeq + 1, n, 1)) << "fork diverged at " << n;
  // Back to P + 6 tokens on every layer of the fork, then on again.
  PQ_ASSERT_OK(pq_sequence_truncate(ctx, kSeq + 1, P + 6));
  for (int64_t n = P + 7; n <= P + 12; ++n) {
    std::vector<int32_t> mid = pqt::middle_of(step(kSeq + 1, n, 2), pqt::regions(n, c));
    for (int32_t p : mid) EXPECT_EQ(dropped.count(p), 0u) << "dropped token " << p << " returned";
    EXPECT_EQ(mid.size(), static_cast<size_t>(c.topk_tokens));
  }
}

}  // namespace
