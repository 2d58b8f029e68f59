// Selectors against the rules of their methods' own code, each re-typed
// here from the outside source (docs/selector-references.md names the files
// and commits): SnapKV's window scores and pooling (NVIDIA/kvpress
// SnapKVPress.score; FasterDecoding/SnapKV SnapKVCluster.update_kv),
// InfiniGen's partial column count (snu-comparch/InfiniGen
// partial_weight_index_generation) and FastGen's heavy hitters
// (AnswerDotAI/cold-compress KVCacheHybrid._eviction_idx_for_head). Public
// API only. Each test also checks that its data tell the outside rule from
// the nearest wrong one, so that it cannot pass by accident.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 3;

// keys [tokens][kv_heads][head_dim], queries [w][q_heads][head_dim].
struct Prompt {
  int32_t q_heads, kv_heads, dim;
  int64_t tokens, window;
  std::vector<float> keys, queries;
};

// The softmax of window row i of query head qh over the keys it sees (causal:
// prompt position tokens - window + i sees [0, tokens - window + i]), in
// double; 0 past what it sees.
std::vector<double> window_row_attention(const Prompt& p, int64_t i, int32_t qh) {
  const int32_t group = p.q_heads / p.kv_heads, h = qh / group;
  const int64_t seen = p.tokens - p.window + i + 1;
  const float* q = p.queries.data() + (static_cast<size_t>(i) * p.q_heads + qh) * p.dim;
  std::vector<double> logit(static_cast<size_t>(seen));
  for (int64_t t = 0; t < seen; ++t) {
    const float* k = p.keys.data() + (static_cast<size_t>(t) * p.kv_heads + h) * p.dim;
    double dot = 0;
    for (int32_t e = 0; e < p.dim; ++e) dot += double{q[e]} * k[e];
    logit[static_cast<size_t>(t)] = dot / std::sqrt(static_cast<double>(p.dim));
  }
  const double mx = *std::max_element(logit.begin(), logit.end());
  double total = 0;
  for (double l : logit) total += std::exp(l - mx);
  std::vector<double> out(static_cast<size_t>(p.tokens), 0.0);
  for (int64_t t = 0; t < seen; ++t) out[static_cast<size_t>(t)] = std::exp(logit[t] - mx) / total;
  return out;
}

// torch's avg_pool1d / max_pool1d over x with kernel_size k, padding k // 2,
// stride 1: avg counts the zero padding (count_include_pad=True, the
// default), max pads with -inf (the padding never wins).
std::vector<double> pool1d(const std::vector<double>& x, int32_t kernel, bool average) {
  const int64_t n = static_cast<int64_t>(x.size()), half = kernel / 2;
  std::vector<double> out(x.size());
  for (int64_t t = 0; t < n; ++t) {
    double sum = 0, mx = -std::numeric_limits<double>::infinity();
    for (int64_t u = t - half; u <= t + half; ++u) {
      if (u < 0 || u >= n) continue;  // padding: 0 to the sum, never the max
      sum += x[static_cast<size_t>(u)];
      mx = std::max(mx, x[static_cast<size_t>(u)]);
    }
    out[static_cast<size_t>(t)] = average ? sum / kernel : mx;
  }
  return out;
}

// SnapKV's scores, per kv head and prompt token: kvpress's
// SnapKVPress.score (the mean over the window rows, pooled per query head,
// then the mean over the GQA group) and, for one query head per kv head, the
// authors' update_kv (the sum over the window rows, then pooled): the same
// ranking. Each token is pooled within its span, which `split_at_window`
// decides: the outside code scores and pools attn_weights[..., :-window]
// alone, the tokens before the window (the library pools the window's own
// tokens among themselves); false pools across the whole prompt (the
// library's rule before the fix), for the check that the data tell the two
// apart.
std::vector<std::vector<double>> snapkv_scores(const Prompt& p, int32_t kernel, bool average,
                                               bool split_at_window) {
  const int32_t group = p.q_heads / p.kv_heads;
  const int64_t context = p.tokens - p.window;
  std::vector<std::vector<double>> out(static_cast<size_t>(p.kv_heads),
                                       std::vector<double>(static_cast<size_t>(p.tokens), 0.0));
  for (int32_t qh = 0; qh < p.q_heads; ++qh) {
    std::vector<double> mean(static_cast<size_t>(p.tokens), 0.0);
    for (int64_t i = 0; i < p.window; ++i) {
      const std::vector<double> a = window_row_attention(p, i, qh);
      for (int64_t t = 0; t < p.tokens; ++t) mean[t] += a[t] / static_cast<double>(p.window);
    }
    std::vector<double> pooled;
    if (split_at_window) {
      pooled = pool1d(std::vector<double>(mean.begin(), mean.begin() + context), kernel, average);
      const std::vector<double> window =
          pool1d(std::vector<double>(mean.begin() + context, mean.end()), kernel, average);
      pooled.insert(pooled.end(), window.begin(), window.end());
    } else {
      pooled = pool1d(mean, kernel, average);
    }
    for (int64_t t = 0; t < p.tokens; ++t) out[qh / group][t] += pooled[t] / group;
  }
  return out;
}

// The k positions of the highest of the first `span` scores, ascending. Max
// pooling copies a peak to its neighbours, so equal scores meet at the
// boundary: torch.topk leaves their order open, and the library keeps the
// larger position.
std::vector<int32_t> top_k(const std::vector<double>& s, int64_t span, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(span));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return s[a] != s[b] ? s[a] > s[b] : a > b;
  });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// A prompt with two kinds of tokens at the window's edge: `drawing` ones
// (key dimension 0 large where every query's is) take most of the window's
// attention, `ignored` ones (the opposite sign) almost none. Pooling across
// the edge lifts the ignored side there.
enum class Edge { kWindowDraws, kContextDraws };
Prompt edge_prompt(int32_t q_heads, int32_t kv_heads, uint64_t seed, Edge edge) {
  Prompt p{q_heads, kv_heads, 16, 160, 16, {}, {}};
  p.keys = pqt::random_normal(static_cast<size_t>(p.tokens) * kv_heads * p.dim, seed);
  p.queries = pqt::random_normal(static_cast<size_t>(p.window) * q_heads * p.dim, seed + 1);
  for (size_t i = 0; i < p.queries.size(); i += p.dim) p.queries[i] = 4.f;
  const int64_t context = p.tokens - p.window;
  // kWindowDraws: the whole window draws, the last 2 before it are ignored;
  // kContextDraws: the last 3 before it draw, the window's first 2 are ignored.
  const int64_t begin = edge == Edge::kWindowDraws ? context - 2 : context - 3;
  const int64_t end = edge == Edge::kWindowDraws ? p.tokens : context + 2;
  for (int64_t t = begin; t < end; ++t) {
    const bool draws = (t >= context) == (edge == Edge::kWindowDraws);
    for (int32_t h = 0; h < kv_heads; ++h)
      p.keys[(static_cast<size_t>(t) * kv_heads + h) * p.dim] = draws ? 4.f : -4.f;
  }
  return p;
}

// The library's SnapKV over the prompt, no sinks: its middle is [0, tokens -
// local).
std::vector<std::vector<int32_t>> library_snapkv(const Prompt& p, int32_t kernel, int32_t pooling,
                                                 int32_t local, int64_t k) {
  pq_config c = pqt::make_config(1, p.q_heads, p.kv_heads, p.dim, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_SNAPKV;
  c.sink_tokens = 0;
  c.local_tokens = local;
  c.topk_tokens = static_cast<int32_t>(k);
  c.observation_window = static_cast<int32_t>(p.window);
  c.pooling_kernel = kernel;
  c.pooling = pooling;
  c.worker_threads = 1;
  Ctx ctx(c);
  std::vector<std::vector<int32_t>> rows;
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  if (!ctx.ok()) return rows;
  pqt::HostTensor kt = pqt::make_tensor(p.keys, p.tokens, p.kv_heads, p.dim, c.dtype);
  pqt::HostTensor qt = pqt::make_tensor(p.queries, p.window, p.q_heads, p.dim, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_sequence_add(ctx, kSeq)));
  EXPECT_TRUE(pqt::IsOk(pq_prefill_layer(ctx, kSeq, 0, kt.get(), kt.get())));
  EXPECT_TRUE(pqt::IsOk(pq_prefill_queries(ctx, kSeq, 0, qt.get())));
  Sel sel(p.kv_heads, pqt::selection_capacity(ctx, kSeq, 0));
  std::vector<float> q(static_cast<size_t>(p.q_heads) * p.dim, 1.f);  // SnapKV ignores it
  pqt::HostTensor qd = pqt::make_tensor(q, 1, p.q_heads, p.dim, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, 0, qd.get(), sel.get())));
  const pqt::Regions r = pqt::regions(p.tokens, c);
  for (int32_t h = 0; h < p.kv_heads; ++h) rows.push_back(pqt::middle_of(sel.row(h), r));
  return rows;
}

// The library's top k of its middle against the same of the outside scores;
// `local` = the window makes the middle the outside code's context.
void expect_snapkv_pools_within_spans(const Prompt& p, int32_t kernel, int32_t pooling,
                                      int32_t local) {
  const int64_t k = 24, middle = p.tokens - local;
  const bool average = pooling == PQ_POOLING_AVG;
  const auto split = snapkv_scores(p, kernel, average, true);
  const auto across = snapkv_scores(p, kernel, average, false);
  const auto got = library_snapkv(p, kernel, pooling, local, k);
  ASSERT_EQ(got.size(), static_cast<size_t>(p.kv_heads));
  for (int32_t h = 0; h < p.kv_heads; ++h) {
    SCOPED_TRACE("kv head " + std::to_string(h));
    const std::vector<int32_t> want = top_k(split[h], middle, k);
    ASSERT_NE(want, top_k(across[h], middle, k))
        << "the data do not tell pooling across the window's edge from pooling within it";
    EXPECT_EQ(got[h], want);
  }
}

// kvpress's default: avg_pool1d, kernel 5, over a GQA group of 2.
TEST(SnapKvReference, AveragePoolingSeesOnlyTheTokensBeforeTheWindowAsKvpress) {
  const Prompt p = edge_prompt(4, 2, 11, Edge::kWindowDraws);
  expect_snapkv_pools_within_spans(p, 5, PQ_POOLING_AVG, static_cast<int32_t>(p.window));
}

// The authors' maxpool (SnapKVCluster.update_kv) with the paper's kernel 7,
// one query head per kv head as in their code.
TEST(SnapKvReference, MaxPoolingSeesOnlyTheTokensBeforeTheWindowAsTheAuthors) {
  const Prompt p = edge_prompt(2, 2, 21, Edge::kWindowDraws);
  expect_snapkv_pools_within_spans(p, 7, PQ_POOLING_MAX, static_cast<int32_t>(p.window));
}

// A local window shorter than the observation window leaves window tokens in
// the middle, which the outside code never scores (it keeps them): the
// library pools them among themselves, so the tokens before them lift none.
TEST(SnapKvReference, WindowTokensInTheMiddlePoolAmongThemselves) {
  for (int32_t pooling : {PQ_POOLING_AVG, PQ_POOLING_MAX}) {
    SCOPED_TRACE(pooling == PQ_POOLING_AVG ? "avg" : "max");
    const Prompt p = edge_prompt(4, 2, 41, Edge::kContextDraws);
    expect_snapkv_pools_within_spans(p, 5, pooling, 4);
  }
}

// ---------------------------------------------------------------------------
// InfiniGen: the partial column count
// ---------------------------------------------------------------------------

// InfiniGen reads r floats per middle token and kv head at a select
// (pq_layer_info.last_select_bytes = kv_heads * middle * r * 4): r from the
// outside.
int64_t library_partial_columns(int32_t head_dim, float ratio) {
  constexpr int32_t kKv = 2, kQ = 2;
  constexpr int64_t kTokens = 48;
  pq_config c = pqt::make_config(1, kQ, kKv, head_dim, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_INFINIGEN;
  c.sink_tokens = 2;
  c.local_tokens = 6;
  c.topk_tokens = 8;
  c.observation_window = 8;
  c.infinigen_partial_ratio = ratio;
  c.worker_threads = 1;
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  if (!ctx.ok()) return -1;
  const std::vector<float> keys = pqt::random_normal(size_t{kTokens} * kKv * head_dim, 5);
  const std::vector<float> queries = pqt::random_normal(size_t{8} * kQ * head_dim, 6);
  pqt::HostTensor kt = pqt::make_tensor(keys, kTokens, kKv, head_dim, c.dtype);
  pqt::HostTensor qt = pqt::make_tensor(queries, 8, kQ, head_dim, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_sequence_add(ctx, kSeq)));
  EXPECT_TRUE(pqt::IsOk(pq_prefill_layer(ctx, kSeq, 0, kt.get(), kt.get())));
  EXPECT_TRUE(pqt::IsOk(pq_prefill_queries(ctx, kSeq, 0, qt.get())));
  Sel sel(kKv, pqt::selection_capacity(ctx, kSeq, 0));
  pqt::HostTensor qd = pqt::make_tensor(queries.data(), 1, kQ, head_dim, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, 0, qd.get(), sel.get())));
  const uint64_t bytes = pqt::layer_info(ctx, kSeq, 0).last_select_bytes;
  const int64_t middle = pqt::regions(kTokens, c).middle;
  return static_cast<int64_t>(bytes / (uint64_t{kKv} * middle * sizeof(float)));
}

// partial_weight_index_generation: int(head_dim * partial_weight_ratio), a
// Python float product truncated toward zero; the library keeps at least one
// column (pqcache.h). The ratios are the decimals a caller writes; a float
// holding 0.7 is below 0.7, so the float product alone would truncate 10 x
// 0.7 to 6 where Python says 7.
TEST(InfiniGenReference, PartialColumnsAreTheAuthorsTruncatedCount) {
  struct Case {
    int32_t head_dim;
    double ratio;  // as the authors' scripts pass it (--partial-weight-ratio)
  };
  for (Case c : {Case{64, 0.2}, Case{128, 0.2}, Case{10, 0.7}, Case{20, 0.35}, Case{100, 0.29},
                 Case{16, 0.9}, Case{8, 0.05}, Case{64, 1.0}}) {
    SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + ", ratio " + std::to_string(c.ratio));
    const int64_t authors = static_cast<int64_t>(c.head_dim * c.ratio);  // Python's int()
    const int64_t want = std::max<int64_t>(1, authors);
    EXPECT_EQ(library_partial_columns(c.head_dim, static_cast<float>(c.ratio)), want);
  }
  // The case: rounding gives 13 at head size 64, the authors 12.
  EXPECT_NE(std::lround(64 * 0.2), static_cast<long>(64 * 0.2));
}

// ---------------------------------------------------------------------------
// FastGen: heavy hitters by mean attention since insertion
// ---------------------------------------------------------------------------

// cold-compress's heavy-hitter heads (KVCacheHybrid over KVCacheHeavyHitter),
// mapped onto the library's regions: every token has a history of observed
// attention, numerator (the sum) and denominator (the observations since it
// was stored; the profile's prompt attention, attn.sum over the rows that
// see a key / their number, is the first); a head keeps `heavy` of its
// middle, and while more compete it evicts the argmin of numerator /
// denominator (_eviction_idx_for_head), for good. `mean` false ranks by the
// numerator alone (the library's rule before the fix), for the check.
struct ColdCompressHeavyHitters {
  bool mean;
  int64_t heavy;
  std::vector<std::vector<double>> numerator;
  std::vector<std::vector<int64_t>> denominator;
  std::vector<std::vector<bool>> evicted;

  double score(int32_t h, int64_t t) const {
    if (!mean) return numerator[h][t];
    return denominator[h][t] == 0 ? 0.0 : numerator[h][t] / denominator[h][t];
  }
  void grow(int64_t n) {
    for (size_t h = 0; h < numerator.size(); ++h) {
      numerator[h].resize(static_cast<size_t>(n), 0.0);
      denominator[h].resize(static_cast<size_t>(n), 0);
      evicted[h].resize(static_cast<size_t>(n), false);
    }
  }
  // The middle tokens kept, ascending, after evicting down to `heavy`.
  std::vector<int32_t> select(int32_t h, const pqt::Regions& r) {
    std::vector<int32_t> kept;
    for (int64_t t = r.sink_end; t < r.local_begin; ++t)
      if (!evicted[h][t]) kept.push_back(static_cast<int32_t>(t));
    while (static_cast<int64_t>(kept.size()) > heavy) {
      auto lowest = std::min_element(kept.begin(), kept.end(), [&](int32_t a, int32_t b) {
        return score(h, a) < score(h, b);
      });
      evicted[h][*lowest] = true;
      kept.erase(lowest);
    }
    return kept;
  }
  void observe(int32_t h, int32_t t, double p) {
    numerator[h][t] += p;
    denominator[h][t] += 1;
  }
};

// The attention a step pays a token: any finite value >= 0 is allowed; these
// are spread so that no two histories tie.
double step_probability(int64_t step, int32_t h, int32_t t) {
  uint64_t x = (static_cast<uint64_t>(step) << 40) ^ (static_cast<uint64_t>(h) << 32) ^
               static_cast<uint64_t>(t);
  x += 0x9E3779B97F4A7C15ull;  // splitmix64
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return 0.001 + 0.999 * static_cast<double>(x >> 11) / 9007199254740992.0;
}

double jaccard(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::set<int32_t> u(a.begin(), a.end());
  u.insert(b.begin(), b.end());
  return u.empty() ? 1.0 : static_cast<double>(pqt::overlap(a, b)) / static_cast<double>(u.size());
}

TEST(FastGenReference, HeavyHittersRankByMeanAttentionSinceInsertionAsColdCompress) {
  constexpr int32_t kQ = 4, kKv = 2, kDim = 8;
  constexpr int64_t kPrompt = 64, kWindow = 4, kSteps = 128;
  pq_config c = pqt::make_config(1, kQ, kKv, kDim, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_FASTGEN;
  c.sink_tokens = 2;
  c.local_tokens = 8;
  c.topk_tokens = 8;  // heavy hitters ceil(8 / 2) = 4
  c.observation_window = kWindow;
  c.fastgen_recovery = 0.9f;
  c.worker_threads = 1;
  // The window rows of each kv head attend to three targets (key dimension 0
  // is 1 there, 0 elsewhere; the queries' is large), so the heavy-hitter
  // policy recovers 0.9 and the special one (sinks and local window) does not.
  Prompt p{kQ, kKv, kDim, kPrompt, kWindow, {}, {}};
  p.keys = pqt::random_normal(size_t{kPrompt} * kKv * kDim, 31, 0.5f);
  p.queries = pqt::random_normal(size_t{kWindow} * kQ * kDim, 32, 0.3f);
  for (int64_t t = 0; t < kPrompt; ++t)
    for (int32_t h = 0; h < kKv; ++h) p.keys[(t * kKv + h) * kDim] = 0.f;
  const int32_t targets[kKv][3] = {{12, 30, 41}, {20, 33, 47}};
  for (int32_t h = 0; h < kKv; ++h)
    for (int32_t t : targets[h]) p.keys[(t * kKv + h) * kDim] = 1.f;
  for (size_t i = 0; i < p.queries.size(); i += kDim) p.queries[i] = 6.f * std::sqrt(8.f);

  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  pqt::HostTensor kt = pqt::make_tensor(p.keys, kPrompt, kKv, kDim, c.dtype);
  pqt::HostTensor qt = pqt::make_tensor(p.queries, kWindow, kQ, kDim, c.dtype);
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, kt.get(), kt.get()));
  PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, 0, qt.get()));

  const int64_t heavy = (c.topk_tokens + 1) / 2;
  ColdCompressHeavyHitters mean_rule{true, heavy, {}, {}, {}}, sum_rule{false, heavy, {}, {}, {}};
  for (ColdCompressHeavyHitters* rule : {&mean_rule, &sum_rule}) {
    rule->numerator.resize(kKv);
    rule->denominator.resize(kKv);
    rule->evicted.resize(kKv);
    rule->grow(kPrompt);
  }
  // The profile as the first observation: the group's attention summed (as
  // pq_observe_attention's probabilities are), averaged over the window rows
  // that see the token.
  const int32_t group = kQ / kKv;
  for (int32_t h = 0; h < kKv; ++h) {
    std::vector<double> sum(kPrompt, 0.0);
    for (int64_t i = 0; i < kWindow; ++i)
      for (int32_t g = 0; g < group; ++g) {
        const std::vector<double> a = window_row_attention(p, i, h * group + g);
        for (int64_t t = 0; t < kPrompt; ++t) sum[t] += a[t];
      }
    for (int64_t t = 0; t < kPrompt; ++t) {
      const int64_t rows = std::min<int64_t>(kWindow, kPrompt - t);
      for (ColdCompressHeavyHitters* rule : {&mean_rule, &sum_rule}) rule->observe(h, int32_t(t), sum[t] / rows);
    }
  }

  const std::vector<float> decode_keys = pqt::random_normal(size_t{kSteps} * kKv * kDim, 33);
  double jaccard_sum_rule = 0;
  int64_t compared = 0, equal = 0;
  for (int64_t s = 0; s <= kSteps; ++s) {
    const int64_t n = kPrompt + s;
    if (s > 0) {
      pqt::HostTensor kv = pqt::make_tensor(decode_keys.data() + (s - 1) * kKv * kDim, 1, kKv,
                                            kDim, c.dtype);
      ASSERT_TRUE(pqt::IsOk(pq_decode_append(ctx, kSeq, 0, kv.get(), kv.get())));
    }
    for (ColdCompressHeavyHitters* rule : {&mean_rule, &sum_rule}) rule->grow(n);
    const pqt::Regions r = pqt::regions(n, c);
    Sel sel(kKv, pqt::selection_capacity(ctx, kSeq, 0));
    pqt::HostTensor qd = pqt::make_tensor(p.queries.data(), 1, kQ, kDim, c.dtype);
    ASSERT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, 0, qd.get(), sel.get())));
    std::vector<float> probs(static_cast<size_t>(kKv * sel.capacity), 0.f);
    for (int32_t h = 0; h < kKv; ++h) {
      const std::vector<int32_t> row = sel.row(h);
      const std::vector<int32_t> got = pqt::middle_of(row, r);
      ASSERT_EQ(static_cast<int64_t>(got.size()), std::min(heavy, r.middle))
          << "kv head " << h << " does not hold the heavy-hitter policy";
      const std::vector<int32_t> want = mean_rule.select(h, r);
      const std::vector<int32_t> by_sum = sum_rule.select(h, r);
      EXPECT_EQ(got, want) << "step " << s << ", kv head " << h;
      ++compared;
      equal += got == want;
      jaccard_sum_rule += jaccard(by_sum, want);
      // Every token the head attends this step (sinks, kept middle, local
      // window) is observed, in the library and in both rules.
      for (size_t i = 0; i < row.size(); ++i) {
        const double v = step_probability(s, h, row[i]);
        probs[h * sel.capacity + i] = static_cast<float>(v);
      }
      for (ColdCompressHeavyHitters* rule : {&mean_rule, &sum_rule}) {
        std::vector<int32_t> attended;
        for (int64_t t = 0; t < r.sink_end; ++t) attended.push_back(int32_t(t));
        const std::vector<int32_t> middle = rule == &mean_rule ? want : by_sum;
        attended.insert(attended.end(), middle.begin(), middle.end());
        for (int64_t t = r.local_begin; t < n; ++t) attended.push_back(int32_t(t));
        for (int32_t t : attended) rule->observe(h, t, static_cast<float>(step_probability(s, h, t)));
      }
    }
    ASSERT_TRUE(pqt::IsOk(pq_observe_attention(ctx, kSeq, 0, sel.get(), probs.data())));
  }
  std::printf("FastGen against cold-compress's mean rule: %lld of %lld selections equal; "
              "the sum rule's mean Jaccard with it %.3f\n",
              static_cast<long long>(equal), static_cast<long long>(compared),
              jaccard_sum_rule / static_cast<double>(compared));
  EXPECT_LT(jaccard_sum_rule / static_cast<double>(compared), 0.95)
      << "the data do not tell the sum from the mean";
}

}  // namespace
