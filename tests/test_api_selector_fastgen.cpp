// FastGen (fastgen_selector.cpp): a policy per kv head chosen from the
// observation window's attention and the token classes
// (pq_sequence_token_classes), then kept through decode. Public API only;
// the profile and the decode rule are recomputed here.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 5;
constexpr int32_t kHeads = 5, kDim = 8, kLayers = 2;
constexpr int64_t kPrompt = 40, kQueries = 2;
enum { kSpecial, kPunctuation, kHeavy, kWindow, kFull };

pq_config fastgen_config(float recovery) {
  pq_config c = pqt::make_config(kLayers, kHeads, kHeads, kDim, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_FASTGEN;
  c.sink_tokens = 2;
  c.local_tokens = 6;
  c.topk_tokens = 4;  // heavy hitters 2, recent window 2
  c.observation_window = 2;
  c.fastgen_recovery = recovery;
  c.worker_threads = 1;
  return c;
}

// The prompt: kv head h's window rows pay logit 5.8 to its targets and 0 to
// every other token (key dimension 0 is 1 on a target, everything else 0).
// Token 10 is special, 12 and 20 punctuation. Worked by hand, at recovery
// 0.9 (sinks and local window ~0.02 of the attention):
//   head 0  target 10 (special)        special 0.916              -> special
//   head 1  target 20 (punctuation)    special 0.02, + punct 0.92 -> punctuation
//   head 2  targets 15, 25             + the 2 heavy hitters 0.96 -> heavy
//   head 3  targets 15, 25, 33         heavy 0.66, + window {32, 33} 0.98 -> window
//   head 4  none (uniform)             window 0.375               -> full
// Head 0 recovers 0.896 without the sinks and local window: a library that
// left them out would give it the punctuation policy.
const std::vector<std::vector<int32_t>> kTargets = {{10}, {20}, {15, 25}, {15, 25, 33}, {}};
constexpr float kLogit = 5.8f;

std::vector<float> prompt_keys() {
  std::vector<float> k(static_cast<size_t>(kPrompt * kHeads * kDim), 0.f);
  for (int32_t h = 0; h < kHeads; ++h)
    for (int32_t t : kTargets[static_cast<size_t>(h)]) k[(t * kHeads + h) * kDim] = 1.f;
  return k;
}
std::vector<float> window_queries() {
  std::vector<float> q(static_cast<size_t>(kQueries * kHeads * kDim), 0.f);
  for (int64_t i = 0; i < kQueries; ++i)
    for (int32_t h = 0; h < kHeads; ++h) q[(i * kHeads + h) * kDim] = kLogit * std::sqrt(8.f);
  return q;
}
std::vector<uint8_t> prompt_classes() {
  std::vector<uint8_t> c(kPrompt, PQ_TOKEN_PLAIN);
  c[10] = PQ_TOKEN_SPECIAL;
  c[12] = c[20] = PQ_TOKEN_PUNCTUATION;
  return c;
}

// The rule, in the library's arithmetic where it matters (the window's
// column sums in double from float logits, the attention sums then in
// float). A heavy hitter ranks by its mean attention since it was stored
// (cold-compress's numerator / denominator): sum / observed.
struct FastGenRef {
  pq_config c;
  std::vector<uint8_t> classes;
  std::vector<int> policy;
  std::vector<std::vector<float>> score;
  std::vector<std::vector<uint32_t>> observed;
  std::vector<std::vector<bool>> dropped;

  explicit FastGenRef(const pq_config& config)
      : c(config), score(kHeads), observed(kHeads), dropped(kHeads) {}

  uint8_t class_of(int64_t t) const { return t < int64_t(classes.size()) ? classes[t] : 0; }
  void grow(int64_t n) {
    for (int32_t h = 0; h < kHeads; ++h) {
      score[h].resize(std::max<size_t>(n, score[h].size()), 0.f);
      observed[h].resize(score[h].size(), 0);
      dropped[h].resize(score[h].size(), false);
    }
  }
  bool protects(int p, int64_t t, int64_t mid_end, int64_t window) const {
    if (p == kFull || (class_of(t) & PQ_TOKEN_SPECIAL)) return true;
    if (p >= kPunctuation && (class_of(t) & PQ_TOKEN_PUNCTUATION)) return true;
    return p >= kWindow && t >= mid_end - window;
  }

  void profile(const std::vector<float>& keys, const std::vector<float>& q) {
    const pqt::Regions r = pqt::regions(kPrompt, c);
    const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
    grow(kPrompt);
    policy.assign(kHeads, kFull);
    for (int32_t h = 0; h < kHeads; ++h) {
      std::vector<double> sum(kPrompt, 0.0);
      for (int64_t i = 0; i < kQueries; ++i) {
        const int64_t seen = kPrompt - kQueries + i + 1;
        std::vector<float> l(seen);
        for (int64_t t = 0; t < seen; ++t)
          l[t] = q[(i * kHeads + h) * kDim] * keys[(t * kHeads + h) * kDim] * scale;
        const float mx = *std::max_element(l.begin(), l.end());
        double total = 0;
        for (float v : l) total += std::exp(double{v} - mx);
        for (int64_t t = 0; t < seen; ++t) sum[t] += std::exp(double{l[t]} - mx) * (1.0 / total);
      }
      // The profile is each token's first observation: the mean over the
      // window rows that see it.
      for (int64_t t = 0; t < kPrompt; ++t) {
        score[h][t] = static_cast<float>(sum[t] / std::min<int64_t>(kQueries, kPrompt - t));
        observed[h][t] = 1;
      }
      // The policies' recovered shares.
      const int64_t heavy = (r.k + 1) / 2, window = r.k - heavy;
      double rec[4] = {0, 0, 0, 0};
      std::vector<double> rest_heavy, rest_window;
      for (int64_t t = 0; t < kPrompt; ++t) {
        const double a = sum[t] / kQueries;
        const bool fixed = t < r.sink_end || t >= r.local_begin;
        if (fixed || (class_of(t) & PQ_TOKEN_SPECIAL)) {
          for (double& x : rec) x += a;
        } else if (class_of(t) & PQ_TOKEN_PUNCTUATION) {
          for (int p = kPunctuation; p <= kWindow; ++p) rec[p] += a;
        } else {
          rest_heavy.push_back(a);
          if (t >= r.local_begin - window) rec[kWindow] += a;
          else rest_window.push_back(a);
        }
      }
      for (auto* v : {&rest_heavy, &rest_window}) std::sort(v->rbegin(), v->rend());
      for (int64_t j = 0; j < heavy; ++j) {
        if (j < int64_t(rest_heavy.size())) rec[kHeavy] += rest_heavy[j];
        if (j < int64_t(rest_window.size())) rec[kWindow] += rest_window[j];
      }
      for (int p = kSpecial; p <= kWindow; ++p)
        if (rec[p] >= double{c.fastgen_recovery}) {
          policy[h] = p;
          break;
        }
    }
  }

  std::vector<int32_t> select(int32_t h, const pqt::Regions& r) {
    grow(r.n);
    const int p = policy[h];
    const int64_t heavy = std::min((r.k + 1) / 2, r.middle), window = r.k - (r.k + 1) / 2;
    std::vector<int32_t> keep;
    if (p <= kPunctuation || p == kFull) {
      for (int64_t t = r.sink_end; t < r.local_begin; ++t)
        if (protects(p, t, r.local_begin, window)) keep.push_back(int32_t(t));
      return keep;
    }
    int64_t guarded = 0;
    std::vector<std::pair<float, int32_t>> ranked;
    for (int64_t t = r.sink_end; t < r.local_begin; ++t) {
      float v = observed[h][t] == 0 ? 0.f : score[h][t] / static_cast<float>(observed[h][t]);
      if (protects(p, t, r.local_begin, window)) {
        dropped[h][t] = false;
        v = std::numeric_limits<float>::infinity();
        ++guarded;
      } else if (dropped[h][t]) {
        v = -std::numeric_limits<float>::infinity();
      }
      ranked.push_back({v, int32_t(t)});
    }
    std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) {
      return a.first != b.first ? a.first > b.first : a.second > b.second;
    });
    const size_t kept = std::min<size_t>(ranked.size(), guarded + heavy);
    for (size_t i = 0; i < ranked.size(); ++i) {
      const int32_t t = ranked[i].second;
      if (i < kept) {
        keep.push_back(t);
        dropped[h][t] = false;
      } else if (!dropped[h][t]) {
        dropped[h][t] = true;
        score[h][t] = 0.f;
        observed[h][t] = 0;
      }
    }
    std::sort(keep.begin(), keep.end());
    return keep;
  }

  void observe(int32_t h, const std::vector<int32_t>& tokens, const float* probs) {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (!dropped[h][tokens[i]]) {
        score[h][tokens[i]] += probs[i];
        ++observed[h][tokens[i]];
      }
  }
};

struct Outcome {
  std::vector<int> policies;                 // from the first selection's counts and rows
  std::vector<std::vector<int32_t>> first;   // the first selection's middle, per head
  std::vector<int32_t> first_counts;
  int steps_checked = 0;
};

// Classes before the K/V, the prompt on both layers, its window queries on
// both, then `steps` decode steps on layer 1: each appends a token (its
// class given before the append on even steps, after on odd ones), selects,
// checks every head against the rule and observes random probabilities.
Outcome run(const pq_config& c, int64_t steps) {
  Outcome out;
  const std::vector<float> keys = prompt_keys(), q = window_queries();
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  if (!ctx.ok()) return out;
  FastGenRef ref(c);
  ref.classes = prompt_classes();
  EXPECT_TRUE(pqt::IsOk(pq_sequence_add(ctx, kSeq)));
  EXPECT_TRUE(pqt::IsOk(pq_sequence_token_classes(ctx, kSeq, 0, kPrompt, ref.classes.data())));
  pqt::HostTensor k = pqt::make_tensor(keys.data(), kPrompt, kHeads, kDim, c.dtype);
  pqt::HostTensor qt = pqt::make_tensor(q, kQueries, kHeads, kDim, c.dtype);
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(pqt::IsOk(pq_prefill_layer(ctx, kSeq, l, k.get(), k.get())));
    EXPECT_TRUE(pqt::IsOk(pq_prefill_queries(ctx, kSeq, l, qt.get())));
  }
  ref.profile(keys, q);
  out.policies = ref.policy;
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  const std::vector<float> decode_keys = pqt::random_normal(size_t(steps + 1) * kHeads * kDim, 42);
  for (int64_t s = 0; s <= steps; ++s) {
    const int64_t n = kPrompt + s;
    if (s > 0) {
      const uint8_t cls = s % 3 == 0 ? PQ_TOKEN_PUNCTUATION
                          : s % 5 == 0 ? PQ_TOKEN_SPECIAL | PQ_TOKEN_PUNCTUATION
                                       : PQ_TOKEN_PLAIN;
      ref.classes.resize(n, PQ_TOKEN_PLAIN);
      ref.classes[n - 1] = cls;
      if (s % 2 == 0) EXPECT_TRUE(pqt::IsOk(pq_sequence_token_classes(ctx, kSeq, n - 1, 1, &cls)));
      pqt::HostTensor kv = pqt::make_tensor(decode_keys.data() + s * kHeads * kDim, 1, kHeads,
                                            kDim, c.dtype);
      for (int32_t l = 0; l < kLayers; ++l)
        EXPECT_TRUE(pqt::IsOk(pq_decode_append(ctx, kSeq, l, kv.get(), kv.get())));
      if (s % 2 == 1) EXPECT_TRUE(pqt::IsOk(pq_sequence_token_classes(ctx, kSeq, n - 1, 1, &cls)));
    }
    const pqt::Regions r = pqt::regions(n, c);
    Sel sel(kHeads, pqt::selection_capacity(ctx, kSeq, 1));
    EXPECT_EQ(sel.capacity, r.n) << "a full head keeps the whole middle";
    std::vector<float> qd = pqt::random_normal(kHeads * kDim, 100 + s);
    pqt::HostTensor qs = pqt::make_tensor(qd, 1, kHeads, kDim, c.dtype);
    EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, 1, qs.get(), sel.get())));
    for (int32_t h = 0; h < kHeads; ++h) {
      const std::vector<int32_t> row = sel.row(h);
      const std::vector<int32_t> want = ref.select(h, r);
      pqt::Regions rh = r;
      rh.k = static_cast<int64_t>(row.size()) - r.sink_end - (r.n - r.local_begin);
      const std::vector<int32_t> got = pqt::middle_of(row, rh);
      EXPECT_EQ(got, want) << "step " << s << ", kv head " << h << ", policy " << ref.policy[h];
      if (s == 0) {
        out.first.push_back(got);
        out.first_counts.push_back(static_cast<int32_t>(got.size()));
      }
    }
    ++out.steps_checked;
    std::vector<float> probs(static_cast<size_t>(kHeads * sel.capacity));
    for (float& p : probs) p = unif(rng) < 0.2f ? 0.f : unif(rng);
    EXPECT_TRUE(pqt::IsOk(pq_observe_attention(ctx, kSeq, 1, sel.get(), probs.data())));
    for (int32_t h = 0; h < kHeads; ++h) ref.observe(h, sel.row(h), probs.data() + h * sel.capacity);
  }
  return out;
}

TEST(FastGen, EachHeadTakesTheFirstPolicyThatRecoversTheShare) {
  const Outcome got = run(fastgen_config(0.9f), 16);
  ASSERT_EQ(got.policies, (std::vector<int>{kSpecial, kPunctuation, kHeavy, kWindow, kFull}));
  ASSERT_EQ(got.first.size(), 5u);
  // The first selection, by hand: the middle is [2, 34).
  EXPECT_EQ(got.first[0], (std::vector<int32_t>{10}));
  EXPECT_EQ(got.first[1], (std::vector<int32_t>{10, 12, 20}));
  EXPECT_EQ(got.first[2], (std::vector<int32_t>{10, 12, 15, 20, 25}));
  EXPECT_EQ(got.first[3], (std::vector<int32_t>{10, 12, 15, 20, 25, 32, 33}));
  std::vector<int32_t> middle(32);
  std::iota(middle.begin(), middle.end(), 2);
  EXPECT_EQ(got.first[4], middle);
  EXPECT_EQ(got.steps_checked, 17);
}

// The recovery ratio moves heads along the policies (the reference's
// choice, checked by hand for these two): lower asks less of each head.
TEST(FastGen, RecoveryRatioMovesHeadsAlongThePolicies) {
  EXPECT_EQ(run(fastgen_config(0.5f), 8).policies,
            (std::vector<int>{kSpecial, kPunctuation, kHeavy, kHeavy, kFull}));
  EXPECT_EQ(run(fastgen_config(0.3f), 8).policies,
            (std::vector<int>{kSpecial, kPunctuation, kHeavy, kHeavy, kHeavy}));
  EXPECT_EQ(run(fastgen_config(1.f), 4).policies, std::vector<int>(kHeads, kFull));
  for (float bad : {0.f, -0.5f, 1.5f, NAN}) {
    pq_config c = fastgen_config(bad);
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"fastgen_recovery"}))
        << bad;
    EXPECT_EQ(ctx, nullptr);
  }
}

// One prompt on both layers with its classes and window queries.
void prefill(pq_context* ctx, uint64_t seq, const pq_config& c) {
  const std::vector<float> keys = prompt_keys(), q = window_queries();
  const std::vector<uint8_t> classes = prompt_classes();
  PQ_ASSERT_OK(pq_sequence_add(ctx, seq));
  PQ_ASSERT_OK(pq_sequence_token_classes(ctx, seq, 0, kPrompt, classes.data()));
  pqt::HostTensor k = pqt::make_tensor(keys.data(), kPrompt, kHeads, kDim, c.dtype);
  pqt::HostTensor qt = pqt::make_tensor(q, kQueries, kHeads, kDim, c.dtype);
  for (int32_t l = 0; l < kLayers; ++l) {
    PQ_ASSERT_OK(pq_prefill_layer(ctx, seq, l, k.get(), k.get()));
    PQ_ASSERT_OK(pq_prefill_queries(ctx, seq, l, qt.get()));
  }
}

// Appends one token on every layer and returns layer `layer`'s selection
// of kv head 1 (the punctuation head).
std::vector<int32_t> step(pq_context* ctx, uint64_t seq, const pq_config& c, int32_t layer = 1) {
  std::vector<float> kv = pqt::random_normal(kHeads * kDim, 7);
  pqt::HostTensor t = pqt::make_tensor(kv, 1, kHeads, kDim, c.dtype);
  for (int32_t l = 0; l < kLayers; ++l)
    EXPECT_TRUE(pqt::IsOk(pq_decode_append(ctx, seq, l, t.get(), t.get())));
  Sel sel(kHeads, pqt::selection_capacity(ctx, seq, layer));
  pqt::HostTensor qs = pqt::make_tensor(kv, 1, kHeads, kDim, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, seq, layer, qs.get(), sel.get())));
  return sel.row(1);
}

bool holds(const std::vector<int32_t>& row, int32_t p) {
  return std::find(row.begin(), row.end(), p) != row.end();
}

TEST(FastGen, TokenClassesAreCheckedAndNeededBeforeTheProfile) {
  const pq_config c = fastgen_config(0.9f);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  const uint8_t plain[3] = {0, 0, 0}, bad[3] = {0, 2, 4};
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq, -1, 1, plain),
                           PQ_ERR_INVALID_ARGUMENT, {"first is -1"}));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq, 0, -2, plain),
                           PQ_ERR_INVALID_ARGUMENT, {"count is -2"}));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq, 0, 3, nullptr),
                           PQ_ERR_INVALID_ARGUMENT, {"classes is NULL"}));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq, 0, 3, bad),
                           PQ_ERR_INVALID_ARGUMENT, {"classes[2] is 4"}));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq, 1, 3, plain),
                           PQ_ERR_INVALID_ARGUMENT, {"first is 1", "stores 0 tokens"}));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq + 9, 0, 3, plain),
                           PQ_ERR_NOT_FOUND, {"14"}));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(nullptr, kSeq, 0, 3, plain),
                           PQ_ERR_INVALID_ARGUMENT, {"ctx"}));
  PQ_ASSERT_OK(pq_sequence_token_classes(ctx, kSeq, 0, 0, nullptr));  // nothing to say
  // A select before the profile names the call it needs.
  const std::vector<float> keys = prompt_keys();
  pqt::HostTensor k = pqt::make_tensor(keys.data(), kPrompt, kHeads, kDim, c.dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
  Sel sel(kHeads, pqt::selection_capacity(ctx, kSeq, 0));
  std::vector<float> q(kHeads * kDim, 0.5f);
  pqt::HostTensor qs = pqt::make_tensor(q, 1, kHeads, kDim, c.dtype);
  EXPECT_TRUE(pqt::IsError(pq_decode_select(ctx, kSeq, 0, qs.get(), sel.get()),
                           PQ_ERR_BAD_STATE, {"pq_prefill_queries", "fastgen"}));
  // Classes may describe the stored tokens and the next one (layer 0 holds
  // 40; layer 1 none yet: the fullest layer counts).
  PQ_ASSERT_OK(pq_sequence_token_classes(ctx, kSeq, kPrompt, 1, plain));
  EXPECT_TRUE(pqt::IsError(pq_sequence_token_classes(ctx, kSeq, kPrompt + 1, 1, plain),
                           PQ_ERR_INVALID_ARGUMENT, {"first is 41"}));
  // Without the classes (token 40's alone was given), head 1's target is a
  // plain token: the head becomes a heavy-hitter head, its 2 heavy hitters
  // the target and the newest of the equals.
  const std::vector<float> qw = window_queries();
  pqt::HostTensor qt = pqt::make_tensor(qw, kQueries, kHeads, kDim, c.dtype);
  PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, 0, qt.get()));
  PQ_ASSERT_OK(pq_decode_select(ctx, kSeq, 0, qs.get(), sel.get()));
  const pqt::Regions r = pqt::regions(kPrompt, c);
  EXPECT_EQ(pqt::middle_of(sel.row(1), {r.n, r.sink_end, r.local_begin, r.middle, 2}),
            (std::vector<int32_t>{20, 33}));
}

// Classes follow the sequence: a fork's own later classes are its own, a
// truncate forgets the classes of the tokens it removes, and a restored
// sequence has the saved ones.
TEST(FastGen, ClassesFollowForkTruncateAndSaveRestore) {
  const pq_config c = fastgen_config(0.9f);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  prefill(ctx, kSeq, c);
  PQ_ASSERT_OK(pq_sequence_fork(ctx, kSeq, kSeq + 1));
  // Token 40 is punctuation in the fork only; it reaches the middle after
  // local_tokens more tokens.
  const uint8_t punct = PQ_TOKEN_PUNCTUATION;
  PQ_ASSERT_OK(pq_sequence_token_classes(ctx, kSeq + 1, kPrompt, 1, &punct));
  std::vector<int32_t> parent, child;
  for (int i = 0; i < 8; ++i) {
    parent = step(ctx, kSeq, c);
    child = step(ctx, kSeq + 1, c);
  }
  EXPECT_FALSE(holds(parent, kPrompt)) << "the fork's class leaked into the parent";
  EXPECT_TRUE(holds(child, kPrompt)) << "the punctuation head dropped a punctuation token";
  EXPECT_TRUE(holds(step(ctx, kSeq + 1, c, 0), kPrompt)) << "layer 0 lacks the class";

  // Save and restore the fork: the restored sequence selects as the fork.
  const uint64_t restored = kSeq + 2;
  std::vector<uint8_t> state;
  uint64_t size = 0;
  PQ_ASSERT_OK(pq_sequence_state_size(ctx, kSeq + 1, &size));
  state.resize(size);
  PQ_ASSERT_OK(pq_sequence_save_buffer(ctx, kSeq + 1, state.data(), state.size(), &size));
  PQ_ASSERT_OK(pq_sequence_restore(ctx, restored, state.data(), size));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(step(ctx, restored, c), step(ctx, kSeq + 1, c)) << i;

  // Truncate the fork to before token 40 and store a plain token there.
  PQ_ASSERT_OK(pq_sequence_truncate(ctx, kSeq + 1, kPrompt));
  for (int i = 0; i < 8; ++i) child = step(ctx, kSeq + 1, c);
  EXPECT_FALSE(holds(child, kPrompt)) << "the truncate kept the class of a removed token";
}

// pq_sequence_token_classes takes each layer's lock in turn: it may run
// while the layers select and append (TSan checks this in CI).
TEST(FastGen, ClassesGivenWhileLayersSelect) {
  const pq_config c = fastgen_config(0.9f);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  prefill(ctx, kSeq, c);
  std::thread classes([&] {
    std::vector<uint8_t> punct(kPrompt, PQ_TOKEN_PUNCTUATION);
    for (int i = 0; i < 200; ++i)
      EXPECT_TRUE(pqt::IsOk(pq_sequence_token_classes(ctx, kSeq, 0, kPrompt, punct.data())));
  });
  for (int i = 0; i < 50; ++i) (void)step(ctx, kSeq, c, i % kLayers);
  classes.join();
}

}  // namespace
