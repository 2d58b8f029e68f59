// ClusterKV (clusterkv_selector.cpp): cosine K-Means clusters of the middle,
// ranked by q . centroid, whole clusters taken and the last one cut; tokens
// not clustered yet kept first. Public API only: the keys are built so that
// the clusters are known (the even-rank initial tokens fall one in each),
// so what a selection must hold is computed here without clustering.
#include <algorithm>
#include <random>
#include <set>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 5;
constexpr int32_t kDim = 16;

pq_config clusterkv_config(int32_t clusters, int32_t kv_heads = 1, int32_t q_heads = 1) {
  pq_config c = pqt::make_config(1, q_heads, kv_heads, kDim, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_CLUSTERKV;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 20;
  c.cluster_count = clusters;
  c.worker_threads = 1;
  return c;
}

// Keys of `tokens` tokens whose middle [4, tokens - 16) falls into four
// clusters around orthogonal directions (scaled differently: the centroid
// is a mean of raw keys, the assignment cosine). Token t of the middle
// belongs to cluster label[t - 4]; the ranks the selector starts from,
// floor((2j + 1) * middle / 8), get clusters 0..3 in turn.
struct Clustered {
  std::vector<float> keys;     // [tokens][kv_heads = 1][kDim]
  std::vector<int32_t> label;  // per middle token
};
Clustered clustered_keys(int64_t tokens, uint32_t seed) {
  const int64_t middle = tokens - 4 - 16;
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.05f);
  Clustered out;
  out.label.resize(static_cast<size_t>(middle));
  for (int32_t& l : out.label) l = static_cast<int32_t>(rng() % 4);
  for (int32_t j = 0; j < 4; ++j) out.label[static_cast<size_t>((2 * j + 1) * middle / 8)] = j;
  out.keys.assign(static_cast<size_t>(tokens) * kDim, 0.f);
  for (int64_t t = 0; t < tokens; ++t) {
    float* k = out.keys.data() + t * kDim;
    for (int32_t e = 0; e < kDim; ++e) k[e] = noise(rng);
    const bool in_middle = t >= 4 && t < tokens - 16;
    const int32_t l = in_middle ? out.label[static_cast<size_t>(t - 4)] : static_cast<int32_t>(t % 4);
    k[l] += 1.0f + 0.5f * static_cast<float>(rng() % 3);  // |k| varies, the direction does not
  }
  return out;
}

std::vector<int32_t> select_middle(pq_context* ctx, const pq_config& c, const std::vector<float>& q,
                                   int64_t n) {
  Sel sel(c.num_kv_heads, pqt::selection_capacity(ctx, kSeq, 0));
  pqt::HostTensor qt = pqt::make_tensor(q, 1, c.num_q_heads, kDim, c.dtype);
  EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, 0, qt.get(), sel.get())));
  return pqt::middle_of(sel.row(0), pqt::regions(n, c));
}

TEST(ClusterKv, TakesWholeClustersByQueryScoreAndCutsTheLastOne) {
  const int64_t P = 200;
  pq_config c = clusterkv_config(4);
  c.topk_tokens = 60;
  const size_t K = 60;
  Clustered data = clustered_keys(P, 3);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  pqt::HostTensor k = pqt::make_tensor(data.keys.data(), P, 1, kDim, c.dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
  std::vector<int32_t> by_cluster[4];
  for (size_t i = 0; i < data.label.size(); ++i)
    by_cluster[data.label[i]].push_back(static_cast<int32_t>(4 + i));
  // The query points mostly at direction 2, then 0: all of cluster 2, then
  // the first (smallest) positions of cluster 0.
  std::vector<float> q(kDim, 0.f);
  q[2] = 4.f, q[0] = 3.f, q[3] = 2.f, q[1] = 1.f;
  ASSERT_LT(by_cluster[2].size(), K) << "cluster 2 alone must not fill k";
  ASSERT_GT(by_cluster[2].size() + by_cluster[0].size(), K);
  std::vector<int32_t> want = by_cluster[2];
  want.insert(want.end(), by_cluster[0].begin(),
              by_cluster[0].begin() + static_cast<long>(K - by_cluster[2].size()));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(select_middle(ctx, c, q, P), want);
  // Another query, another order: 1 first, then 3.
  std::vector<float> q2(kDim, 0.f);
  q2[1] = 4.f, q2[3] = 3.f;
  ASSERT_LT(by_cluster[1].size(), K);
  want = by_cluster[1];
  for (int32_t p : by_cluster[3])
    if (want.size() < K) want.push_back(p);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(select_middle(ctx, c, q2, P), want);
  EXPECT_EQ(pqt::layer_info(ctx, kSeq, 0).last_select_bytes, 4u * kDim * sizeof(float))
      << "a select reads the centroids";
}

// Tokens that enter the middle after the first select are kept first until
// 320 of them have come; then they are clustered into 8 clusters of their
// own and compete, and the prompt's clusters stay as they were.
TEST(ClusterKv, NewMiddleTokensAreKeptUntilTheirWindowIsClustered) {
  const int64_t P = 120, steps = 330;
  pq_config c = clusterkv_config(4);
  Clustered data = clustered_keys(P + steps, 9);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  pqt::HostTensor k = pqt::make_tensor(data.keys.data(), P, 1, kDim, c.dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
  std::vector<float> q(kDim, 0.f);
  q[2] = 4.f;
  (void)select_middle(ctx, c, q, P);  // clusters [4, 104)
  const int64_t first_new = P - 16;     // the first token to enter the middle later
  for (int64_t n = P + 1; n <= P + steps; ++n) {
    pqt::HostTensor one = pqt::make_tensor(data.keys.data() + (n - 1) * kDim, 1, 1, kDim, c.dtype);
    PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, 0, one.get(), one.get()));
    const std::vector<int32_t> mid = select_middle(ctx, c, q, n);
    const int64_t entered = n - 16 - first_new;  // middle tokens since the first select
    if (entered < 320) {
      // Not clustered: they come first, the most recent when they exceed k.
      std::vector<int32_t> want;
      for (int64_t p = std::max<int64_t>(first_new, n - 16 - 20); p < n - 16; ++p)
        want.push_back(static_cast<int32_t>(p));
      if (static_cast<int64_t>(want.size()) == 20) {
        ASSERT_EQ(mid, want) << "step " << n;
      } else {
        for (int32_t p : want)
          ASSERT_TRUE(std::binary_search(mid.begin(), mid.end(), p)) << "step " << n << ": " << p;
      }
    } else {
      // The window [first_new, first_new + 320) is clustered now: the
      // selection is no longer the most recent tokens, and it still holds
      // the tokens entered after the window.
      for (int64_t p = first_new + 320; p < n - 16; ++p)
        EXPECT_TRUE(std::binary_search(mid.begin(), mid.end(), static_cast<int32_t>(p)));
      EXPECT_LT(mid.front(), first_new + 300) << "step " << n << ": still only recent tokens";
    }
  }
}

// Issue 39 (audit D1): a truncate kept every cluster, so truncate-regrow
// cycles grew the clusters without bound (106 MB of heap in 2000 cycles,
// host_bytes unchanged) until the saved state no longer restored ("tokens
// [4, 1024) in 16400 clusters do not fit"). A cut now drops the window it
// goes through: regrown with the same tokens, the sequence selects as one
// that never truncated, its saved size stays put, and it restores. A cut
// inside the prompt's clusters keeps them for the tokens left (its windows
// then start there): the size stays put over cycles and it restores too.
TEST(ClusterKv, TruncateAndRegrowSelectsAsIfNeverCutAndStaysRestorable) {
  const int64_t P = 120, grown = 800, n = P + grown;  // prompt middle [4, 104)
  pq_config c = clusterkv_config(4);
  Clustered data = clustered_keys(n, 13);
  std::vector<float> q(kDim, 0.f);
  q[1] = 4.f, q[2] = 1.f;
  auto append = [&](pq_context* ctx, int64_t from, int64_t to) {
    for (int64_t t = from; t < to; ++t) {
      pqt::HostTensor one = pqt::make_tensor(data.keys.data() + t * kDim, 1, 1, kDim, c.dtype);
      ASSERT_TRUE(pqt::IsOk(pq_decode_append(ctx, kSeq, 0, one.get(), one.get())));
      if (t % 97 == 0) (void)select_middle(ctx, c, q, t + 1);  // windows form at any select
    }
  };
  auto state_size = [&](pq_context* ctx) {
    uint64_t size = 0;
    EXPECT_TRUE(pqt::IsOk(pq_sequence_state_size(ctx, kSeq, &size)));
    return size;
  };
  Ctx never(c), cut(c);
  for (pq_context* ctx : {never.get(), cut.get()}) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    pqt::HostTensor k = pqt::make_tensor(data.keys.data(), P, 1, kDim, c.dtype);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
    (void)select_middle(ctx, c, q, P);
  }
  append(never, P, n);
  const std::vector<int32_t> want = select_middle(never, c, q, n);
  const uint64_t never_size = state_size(never);
  // Cuts in the first window, in the second, on a window's end.
  for (int cycle = 0; cycle < 30; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    append(cut, cycle == 0 ? P : P + 1, n);
    (void)select_middle(cut, c, q, n);
    const int64_t to[] = {200 + cycle, 470 + cycle, 744};
    PQ_ASSERT_OK(pq_sequence_truncate(cut, kSeq, to[cycle % 3]));
    append(cut, to[cycle % 3], n);
    EXPECT_EQ(select_middle(cut, c, q, n), want);
    EXPECT_EQ(state_size(cut), never_size) << "the clusters grew with the cycles";
    PQ_ASSERT_OK(pq_sequence_truncate(cut, kSeq, P + 1));
  }
  // A cut inside the prompt's clusters, then cycles as above.
  PQ_ASSERT_OK(pq_sequence_truncate(cut, kSeq, 70));
  append(cut, 70, n);
  (void)select_middle(cut, c, q, n);
  const uint64_t prompt_cut_size = state_size(cut);
  for (int cycle = 0; cycle < 10; ++cycle) {
    PQ_ASSERT_OK(pq_sequence_truncate(cut, kSeq, 300 + 37 * cycle));
    append(cut, 300 + 37 * cycle, n);
    (void)select_middle(cut, c, q, n);
    EXPECT_EQ(state_size(cut), prompt_cut_size) << "cycle " << cycle;
  }
  std::vector<uint8_t> state(prompt_cut_size);
  uint64_t written = 0;
  PQ_ASSERT_OK(pq_sequence_save_buffer(cut, kSeq, state.data(), state.size(), &written));
  Ctx restored(c);
  PQ_ASSERT_OK(pq_sequence_restore(restored, kSeq, state.data(), written));
  EXPECT_EQ(select_middle(restored, c, q, n), select_middle(cut, c, q, n));
}

TEST(ClusterKv, ClusterCountIsCheckedAndGroupsRankTogether) {
  for (int32_t bad : {0, -1, 65537}) {
    pq_config c = clusterkv_config(bad);
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"cluster_count"}))
        << bad;
  }
  // A group of two query heads, one for direction 0 and one for 1: with
  // PQ_GQA_MAX both clusters beat the others, so k = both clusters' tokens
  // holds exactly them.
  const int64_t P = 200;
  pq_config c = clusterkv_config(4, 1, 2);
  c.gqa_combine = PQ_GQA_MAX;
  Clustered data = clustered_keys(P, 4);
  int64_t both = 0;
  for (int32_t l : data.label) both += l <= 1;
  c.topk_tokens = static_cast<int32_t>(both);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  pqt::HostTensor k = pqt::make_tensor(data.keys.data(), P, 1, kDim, c.dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
  std::vector<float> q(2 * kDim, 0.f);
  q[0] = 4.f, q[kDim + 1] = 4.f;
  std::vector<int32_t> want;
  for (size_t i = 0; i < data.label.size(); ++i)
    if (data.label[i] <= 1) want.push_back(static_cast<int32_t>(4 + i));
  EXPECT_EQ(select_middle(ctx, c, q, P), want);
}

// A large layer (middle >= 4096) selects its kv heads on the worker pool,
// each clustering its own keys: with 1 or 4 worker threads (the heads
// spread differently) the selections are the same, over the first select
// (the clustering) and the steps after it. TSan runs it too.
TEST(ClusterKv, HeadsOnThePoolSelectAlikeWhateverThePool) {
  const int64_t P = 4400, steps = 4;
  std::vector<std::vector<int32_t>> rows[2];
  for (int threads : {1, 4}) {
    pq_config c = clusterkv_config(16, 4, 8);
    c.topk_tokens = 300;
    c.worker_threads = threads;
    std::vector<float> keys = pqt::random_normal(static_cast<size_t>((P + steps) * 4 * kDim), 61);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    pqt::HostTensor k = pqt::make_tensor(keys.data(), P, 4, kDim, c.dtype);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
    for (int64_t n = P; n <= P + steps; ++n) {
      if (n > P) {
        pqt::HostTensor one = pqt::make_tensor(keys.data() + (n - 1) * 4 * kDim, 1, 4, kDim, c.dtype);
        PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, 0, one.get(), one.get()));
      }
      Sel sel(4, pqt::selection_capacity(ctx, kSeq, 0));
      std::vector<float> q = pqt::random_normal(8 * kDim, static_cast<uint64_t>(n));
      pqt::HostTensor qt = pqt::make_tensor(q, 1, 8, kDim, c.dtype);
      PQ_ASSERT_OK(pq_decode_select(ctx, kSeq, 0, qt.get(), sel.get()));
      for (int32_t h = 0; h < 4; ++h) rows[threads == 4].push_back(sel.row(h));
    }
  }
  EXPECT_EQ(rows[0], rows[1]);
}

}  // namespace
