// Issue 26, through the public API: the default index chosen from the head
// dimension, rotary-aware subspaces (config.key_rotary), exact re-ranking
// of the codes' candidates (config.pq_rerank) and their argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr uint64_t kSeq = 1;

pq_config auto_config(int32_t head_dim, int32_t rotary = PQ_ROTARY_NONE) {
  pq_config c;
  pq_config_default(&c);  // pq_subspaces and pq_bits stay 0: chosen by the library
  c.num_layers = 1;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.dtype = PQ_DTYPE_F32;
  c.key_rotary = rotary;
  c.worker_threads = 2;
  return c;
}

TEST(ApiIndexDefaults, ChosenFromTheHeadDimension) {
  pq_config d;
  pq_config_default(&d);
  EXPECT_EQ(d.pq_subspaces, 0);
  EXPECT_EQ(d.pq_bits, 0);
  EXPECT_EQ(d.key_rotary, PQ_ROTARY_NONE);
  EXPECT_EQ(d.pq_rerank, 0.f);
  EXPECT_EQ(d.pooling, PQ_POOLING_MAX);
  struct Case {
    int32_t head_dim, rotary, subspaces;
  } cases[] = {{64, PQ_ROTARY_NONE, 2},  {64, PQ_ROTARY_HALF, 2},  {128, PQ_ROTARY_HALF, 4},
               {256, PQ_ROTARY_HALF, 4}, {96, PQ_ROTARY_NONE, 3},  {96, PQ_ROTARY_HALF, 3},
               {80, PQ_ROTARY_HALF, 2},  {8, PQ_ROTARY_NONE, 1},   {6, PQ_ROTARY_INTERLEAVED, 1},
               {100, PQ_ROTARY_HALF, 2}, {100, PQ_ROTARY_NONE, 2}, {112, PQ_ROTARY_HALF, 2}};
  for (const Case& cs : cases) {
    SCOPED_TRACE("head_dim " + std::to_string(cs.head_dim) + " rotary " + std::to_string(cs.rotary));
    const pq_config c = auto_config(cs.head_dim, cs.rotary);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    pq_config got;
    pq_config_default(&got);
    PQ_ASSERT_OK(pq_get_config(ctx, &got));
    EXPECT_EQ(got.pq_subspaces, cs.subspaces);
    EXPECT_EQ(got.pq_bits, 8);
    EXPECT_EQ(cs.head_dim % got.pq_subspaces, 0);
    if (cs.rotary != PQ_ROTARY_NONE) EXPECT_EQ(cs.head_dim / got.pq_subspaces % 2, 0);
  }
  // An explicit setting is kept: the paper's 2 x 6 bits.
  pq_config paper = auto_config(64);
  paper.pq_subspaces = 2;
  paper.pq_bits = 6;
  Ctx ctx(paper);
  ASSERT_TRUE(ctx.ok());
  pq_config got;
  pq_config_default(&got);
  PQ_ASSERT_OK(pq_get_config(ctx, &got));
  EXPECT_EQ(got.pq_subspaces, 2);
  EXPECT_EQ(got.pq_bits, 6);
}

TEST(ApiIndexDefaults, BadSettingsAreNamed) {
  auto refused = [](pq_config c, std::initializer_list<const char*> words) {
    pq_context* ctx = nullptr;
    const pq_status s = pq_create(&c, &ctx);
    pq_destroy(ctx);
    return IsError(s, PQ_ERR_INVALID_ARGUMENT, words);
  };
  pq_config c = auto_config(64);
  c.key_rotary = 3;
  EXPECT_TRUE(refused(c, {"key_rotary", "3", "PQ_ROTARY_HALF"}));
  c = auto_config(7, PQ_ROTARY_HALF);
  EXPECT_TRUE(refused(c, {"key_rotary", "head_dim 7", "odd"}));
  c = auto_config(12, PQ_ROTARY_HALF);
  c.pq_subspaces = 4;  // 3 dimensions per subspace: a pair would be split
  EXPECT_TRUE(refused(c, {"pq_subspaces 4", "3 dimensions", "even"}));
  for (float bad : {-1.f, std::nanf(""), INFINITY, 65.f}) {
    c = auto_config(64);
    c.pq_rerank = bad;
    EXPECT_TRUE(refused(c, {"pq_rerank"}));
  }
  c = auto_config(64);
  c.pooling = 2;
  EXPECT_TRUE(refused(c, {"pooling", "PQ_POOLING_AVG"}));
}

// Keys [n][kv][d] with the low half of each head a noisy copy of a few
// patterns, queries [q_heads][d].
struct Data {
  std::vector<float> keys, values, query;
};

Data make_data(const pq_config& c, int64_t n, uint64_t seed) {
  Data d;
  d.keys = random_normal(static_cast<size_t>(n) * c.num_kv_heads * c.head_dim, seed, 1.0f);
  d.values = random_normal(d.keys.size(), seed + 1, 1.0f);
  d.query = random_normal(static_cast<size_t>(c.num_q_heads) * c.head_dim, seed + 2, 1.5f);
  return d;
}

// [n][heads][d] reordered along d: out[..][p] = in[..][order[p]].
std::vector<float> reorder(const std::vector<float>& in, int32_t d, const std::vector<int32_t>& order) {
  std::vector<float> out(in.size());
  for (size_t row = 0; row < in.size() / d; ++row)
    for (int32_t p = 0; p < d; ++p) out[row * d + p] = in[row * d + order[p]];
  return out;
}

Sel prefill_and_select(const pq_config& c, const Data& d, int64_t n) {
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  EXPECT_TRUE(IsOk(pq_sequence_add(ctx, kSeq)));
  HostTensor K = make_tensor(d.keys, n, c.num_kv_heads, c.head_dim, c.dtype);
  HostTensor V = make_tensor(d.values, n, c.num_kv_heads, c.head_dim, c.dtype);
  EXPECT_TRUE(IsOk(pq_prefill_layer(ctx, kSeq, 0, K.get(), V.get())));
  const int64_t cap = selection_capacity(ctx, kSeq, 0);
  Sel s(c.num_kv_heads, std::max<int64_t>(cap, 1));
  HostTensor Q = make_tensor(d.query, 1, c.num_q_heads, c.head_dim, c.dtype);
  EXPECT_TRUE(IsOk(pq_decode_select(ctx, kSeq, 0, Q.get(), s.get())));
  return s;
}

// PQ_ROTARY_HALF selects exactly what PQ_ROTARY_NONE selects on keys and
// queries the caller reordered by rotary pair (what pqcache.transformers'
// rope_pairs did before 0.7), in every dtype.
TEST(ApiIndexRotary, HalfEqualsPairsReorderedByTheCaller) {
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16}) {
    SCOPED_TRACE("dtype " + std::to_string(dtype));
    pq_config half = auto_config(32, PQ_ROTARY_HALF);
    half.dtype = dtype;
    half.pq_subspaces = 4;  // 8 dimensions, 4 rotary pairs, per subspace
    half.topk_tokens = 60;
    half.local_tokens = 32;
    const int64_t n = 1200;
    const Data d = make_data(half, n, 91);
    std::vector<int32_t> order;
    for (int32_t i = 0; i < 16; ++i) {
      order.push_back(i);
      order.push_back(i + 16);
    }
    Data by_hand{reorder(d.keys, 32, order), d.values, reorder(d.query, 32, order)};
    pq_config none = half;
    none.key_rotary = PQ_ROTARY_NONE;
    const Sel a = prefill_and_select(half, d, n);
    const Sel b = prefill_and_select(none, by_hand, n);
    const Sel plain = prefill_and_select(none, d, n);
    for (int32_t h = 0; h < half.num_kv_heads; ++h) {
      EXPECT_EQ(a.row(h), b.row(h)) << "kv head " << h;
      EXPECT_NE(a.row(h), plain.row(h)) << "the pairing must change the index on these keys";
    }
  }
}

// Re-ranking every middle token exactly is the exact selector.
TEST(ApiIndexRerank, AllCandidatesEqualsExact) {
  for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN}) {
    SCOPED_TRACE("combine " + std::to_string(combine));
    pq_config c = auto_config(32);
    c.gqa_combine = combine;
    c.topk_tokens = 20;
    c.local_tokens = 16;
    c.pq_rerank = 64.f;  // 21 x 20 candidates > the middle: all of it
    const int64_t n = 400;
    const Data d = make_data(c, n, 17);
    const Sel reranked = prefill_and_select(c, d, n);
    pq_config exact = c;
    exact.selector = PQ_SELECTOR_EXACT;
    exact.pq_rerank = 0.f;
    const Sel oracle = prefill_and_select(exact, d, n);
    pq_config plain = c;
    plain.pq_rerank = 0.f;
    const Sel codes = prefill_and_select(plain, d, n);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      EXPECT_EQ(reranked.row(h), oracle.row(h)) << "kv head " << h;
      EXPECT_NE(codes.row(h), oracle.row(h)) << "the codes alone must differ on these keys";
    }
  }
}

// With pq_rerank r the selection is the exact best k among the codes' best
// ceil((1 + r) * k), and on these keys it finds more of the exact top k.
TEST(ApiIndexRerank, PicksTheExactBestAmongTheCandidates) {
  pq_config c = auto_config(64);
  c.topk_tokens = 100;
  c.pq_rerank = 1.f;
  const int64_t n = 3000;
  const Data d = make_data(c, n, 5);
  const Sel reranked = prefill_and_select(c, d, n);
  pq_config wide = c;
  wide.pq_rerank = 0.f;
  wide.topk_tokens = 200;
  const Sel candidates = prefill_and_select(wide, d, n);
  pq_config plain = c;
  plain.pq_rerank = 0.f;
  const Sel codes = prefill_and_select(plain, d, n);
  const Regions r = regions(n, c);
  const Regions rw = regions(n, wide);
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    SCOPED_TRACE("kv head " + std::to_string(h));
    const std::vector<int32_t> pool = middle_of(candidates.row(h), rw);
    ASSERT_EQ(pool.size(), 200u);
    // The exact best 100 of the pool: softmax over the pool per query head,
    // summed over the group (the library's SUM_SOFTMAX over the candidates).
    const int32_t G = c.num_q_heads / c.num_kv_heads;
    std::vector<double> pooled(pool.size(), 0.0), logit(pool.size());
    for (int32_t g = 0; g < G; ++g) {
      const float* q = d.query.data() + static_cast<size_t>(h * G + g) * c.head_dim;
      for (size_t i = 0; i < pool.size(); ++i) {
        const float* k = d.keys.data() + (static_cast<size_t>(pool[i]) * c.num_kv_heads + h) * c.head_dim;
        double dot = 0;
        for (int32_t x = 0; x < c.head_dim; ++x) dot += static_cast<double>(q[x]) * k[x];
        logit[i] = dot / std::sqrt(static_cast<double>(c.head_dim));
      }
      const double mx = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (double l : logit) sum += std::exp(l - mx);
      for (size_t i = 0; i < pool.size(); ++i) pooled[i] += std::exp(logit[i] - mx) / sum;
    }
    std::vector<int32_t> best_of_pool = topk_positions(pooled, 0, 100);
    for (int32_t& i : best_of_pool) i = pool[static_cast<size_t>(i)];
    std::sort(best_of_pool.begin(), best_of_pool.end());
    const std::vector<int32_t> got = middle_of(reranked.row(h), r);
    ASSERT_EQ(got.size(), 100u);
    EXPECT_EQ(got, best_of_pool);
    const std::vector<double> all = combined_scores(d.keys, c.num_kv_heads, c.head_dim, d.query,
                                                    c.num_q_heads, h, r.sink_end, r.local_begin,
                                                    c.gqa_combine);
    const std::vector<int32_t> truth = topk_positions(all, r.sink_end, 100);
    const std::vector<int32_t> plain_mid = middle_of(codes.row(h), r);
    std::printf("[rerank] kv head %d: exact top-100 recall, codes %zu, re-ranked %zu\n", h,
                overlap(plain_mid, truth), overlap(got, truth));
    EXPECT_GT(overlap(got, truth), overlap(plain_mid, truth));
  }
}

// pq_rebuild_share: once the tokens appended past the index's build pass
// the share, a select queues a rebuild over every stored token and goes on
// with the old index; once installed, the index is the one a prefill of all
// the tokens builds (the same seeded K-Means over the same tokens).
TEST(ApiIndexRebuild, LongOutputsGetTheIndexOfAllTheirTokens) {
  pq_config c = auto_config(32);
  c.num_layers = 1;
  c.topk_tokens = 40;
  c.local_tokens = 16;
  c.kmeans_iterations = 3;
  const int64_t prompt = 1500, out = 400;
  const Data d = make_data(c, prompt + out, 23);
  auto builds = [](pq_context* ctx) { return stats(ctx).builds_finished; };
  auto select_now = [&](pq_context* ctx) {
    Sel s(c.num_kv_heads, selection_capacity(ctx, kSeq, 0));
    HostTensor Q = make_tensor(d.query, 1, c.num_q_heads, c.head_dim, c.dtype);
    EXPECT_TRUE(IsOk(pq_decode_select(ctx, kSeq, 0, Q.get(), s.get())));
    return s;
  };
  for (float share : {0.f, 0.1f}) {
    SCOPED_TRACE("share " + std::to_string(share));
    pq_config cs = c;
    cs.pq_rebuild_share = share;
    Ctx ctx(cs);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    HostTensor K = make_tensor(d.keys, prompt, c.num_kv_heads, c.head_dim, c.dtype);
    HostTensor V = make_tensor(d.values, prompt, c.num_kv_heads, c.head_dim, c.dtype);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, K.get(), V.get()));
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    ASSERT_EQ(builds(ctx), 1u);
    // 100 appended tokens: 100 <= 0.1 x 1600, no rebuild yet.
    HostTensor K1 = make_tensor(d.keys.data() + prompt * c.num_kv_heads * c.head_dim, 100,
                                c.num_kv_heads, c.head_dim, c.dtype);
    HostTensor V1 = make_tensor(d.values.data() + prompt * c.num_kv_heads * c.head_dim, 100,
                                c.num_kv_heads, c.head_dim, c.dtype);
    PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, 0, K1.get(), V1.get()));
    select_now(ctx);
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    EXPECT_EQ(builds(ctx), 1u);
    // 400 in all: 400 > 0.1 x 1900.
    HostTensor K2 = make_tensor(d.keys.data() + (prompt + 100) * c.num_kv_heads * c.head_dim,
                                out - 100, c.num_kv_heads, c.head_dim, c.dtype);
    HostTensor V2 = make_tensor(d.values.data() + (prompt + 100) * c.num_kv_heads * c.head_dim,
                                out - 100, c.num_kv_heads, c.head_dim, c.dtype);
    PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, 0, K2.get(), V2.get()));
    select_now(ctx);  // queues the rebuild (share 0.1) and selects with the old index
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    EXPECT_EQ(builds(ctx), share > 0.f ? 2u : 1u);
    const Sel after = select_now(ctx);
    const Sel all_at_once = prefill_and_select(cs, d, prompt + out);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      if (share > 0.f)
        EXPECT_EQ(after.row(h), all_at_once.row(h)) << "kv head " << h;
      else
        EXPECT_NE(after.row(h), all_at_once.row(h)) << "kv head " << h;
    }
  }
}

}  // namespace
