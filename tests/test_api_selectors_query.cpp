// The query-only selectors of the literature through the public API: SparQ,
// InfLLM, Quest and RANDOM. Bookkeeping invariants for every selector, dtype
// and GQA group; SparQ equals EXACT where its approximation is exact; Quest
// and InfLLM equal EXACT on block-constant keys and take whole blocks;
// InfLLM with every token a representative ranks blocks by their max q.k;
// block selectors beat RANDOM on clustered keys; RANDOM is seeded,
// deterministic and uniform; last_select_bytes follows each selector's
// formula; incremental block summaries equal a one-shot prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr uint64_t kSeq = 1;

const char* selector_name(int32_t s) {
  switch (s) {
    case PQ_SELECTOR_EXACT: return "EXACT";
    case PQ_SELECTOR_SPARQ: return "SPARQ";
    case PQ_SELECTOR_INFLLM: return "INFLLM";
    case PQ_SELECTOR_QUEST: return "QUEST";
    case PQ_SELECTOR_RANDOM: return "RANDOM";
    default: return "?";
  }
}

const int32_t kQuerySelectors[] = {PQ_SELECTOR_SPARQ, PQ_SELECTOR_INFLLM, PQ_SELECTOR_QUEST,
                                   PQ_SELECTOR_RANDOM};

// keys/values: [n][kv_heads][head_dim] floats, stored in c.dtype.
void prefill(pq_context* ctx, const pq_config& c, int32_t layer, const std::vector<float>& keys,
             int64_t first, int64_t n) {
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const float* k = keys.data() + static_cast<size_t>(first) * row;
  HostTensor K = make_tensor(k, n, c.num_kv_heads, c.head_dim, c.dtype);
  HostTensor V = make_tensor(k, n, c.num_kv_heads, c.head_dim, c.dtype);  // values unused
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, layer, K.get(), V.get()));
}

void append(pq_context* ctx, const pq_config& c, int32_t layer, const std::vector<float>& keys,
            int64_t first, int64_t n) {
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const float* k = keys.data() + static_cast<size_t>(first) * row;
  HostTensor K = make_tensor(k, n, c.num_kv_heads, c.head_dim, c.dtype);
  HostTensor V = make_tensor(k, n, c.num_kv_heads, c.head_dim, c.dtype);
  PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, layer, K.get(), V.get()));
}

// A context with the first n tokens of `keys` prefilled into every layer.
Ctx make_ctx(const pq_config& c, const std::vector<float>& keys, int64_t n) {
  Ctx ctx(c);
  EXPECT_TRUE(IsOk(ctx.status()));
  if (!ctx.ok()) return ctx;
  EXPECT_TRUE(IsOk(pq_sequence_add(ctx, kSeq)));
  for (int32_t l = 0; l < c.num_layers; ++l) prefill(ctx, c, l, keys, 0, n);
  return ctx;
}

// Selects with exactly pq_selection_capacity() entries; returns one row per
// kv head (empty rows on failure, which is reported).
std::vector<std::vector<int32_t>> select_rows(pq_context* ctx, const pq_config& c, int32_t layer,
                                              const std::vector<float>& query) {
  int64_t cap = selection_capacity(ctx, kSeq, layer);
  EXPECT_GE(cap, 0) << pq_last_error();
  Sel s(c.num_kv_heads, std::max<int64_t>(cap, 0));
  HostTensor Q = make_tensor(query, 1, c.num_q_heads, c.head_dim, c.dtype);
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(c.num_kv_heads));
  if (!IsOk(pq_decode_select(ctx, kSeq, layer, Q.get(), s.get()))) {
    ADD_FAILURE() << "pq_decode_select: " << pq_last_error();
    return rows;
  }
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    EXPECT_EQ(s.counts[static_cast<size_t>(h)], cap) << "kv head " << h;
    rows[static_cast<size_t>(h)] = s.row(h);
  }
  return rows;
}

// Sinks and locals present, ascending unique positions, exactly k middle
// tokens, count == capacity (checked by select_rows).
::testing::AssertionResult bookkeeping_ok(const std::vector<int32_t>& row, const Regions& r) {
  if (static_cast<int64_t>(row.size()) != r.count())
    return ::testing::AssertionFailure() << "count " << row.size() << ", expected " << r.count();
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] <= row[i - 1])
      return ::testing::AssertionFailure() << "not strictly ascending at " << i;
  for (int32_t p : row)
    if (p < 0 || p >= r.n) return ::testing::AssertionFailure() << "position " << p << " out of range";
  for (int64_t p = 0; p < r.sink_end; ++p)
    if (row[static_cast<size_t>(p)] != p)
      return ::testing::AssertionFailure() << "sink " << p << " missing";
  int64_t locals = r.n - r.local_begin;
  for (int64_t i = 0; i < locals; ++i)
    if (row[row.size() - static_cast<size_t>(locals) + static_cast<size_t>(i)] != r.local_begin + i)
      return ::testing::AssertionFailure() << "local " << r.local_begin + i << " missing";
  int64_t mid = static_cast<int64_t>(middle_of(row, r).size());
  if (mid != r.k) return ::testing::AssertionFailure() << mid << " middle tokens, expected " << r.k;
  return ::testing::AssertionSuccess();
}

pq_config base_config(int32_t selector, int32_t dtype, int32_t group, int32_t kv_heads,
                      int32_t head_dim) {
  pq_config c = make_config(1, kv_heads * group, kv_heads, head_dim, dtype);
  c.selector = selector;
  c.worker_threads = 2;
  return c;
}

double recall(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  return want.empty() ? 1.0 : static_cast<double>(overlap(got, want)) / want.size();
}

// The middle range [begin, end) of absolute block b.
std::pair<int64_t, int64_t> block_range(int64_t b, int32_t B, const Regions& r) {
  return {std::max<int64_t>(b * B, r.sink_end), std::min<int64_t>((b + 1) * B, r.local_begin)};
}

// The block rule the test expects of InfLLM and Quest: blocks by score
// (ties: the later block), whole until r.k tokens are taken, the last one cut
// to its highest positions; positions ascending. order: (score, block).
std::vector<int32_t> take_blocks_by_score(std::vector<std::pair<double, int64_t>> order,
                                          int32_t B, const Regions& r) {
  std::sort(order.begin(), order.end(), [](auto& x, auto& y) {
    return x.first != y.first ? x.first > y.first : x.second > y.second;
  });
  std::vector<int32_t> want;
  int64_t left = r.k;
  for (auto& [s, b] : order) {
    if (left == 0) break;
    auto [begin, end] = block_range(b, B, r);
    int64_t take = std::min(left, end - begin);
    for (int64_t p = end - take; p < end; ++p) want.push_back(static_cast<int32_t>(p));
    left -= take;
  }
  std::sort(want.begin(), want.end());
  return want;
}

// Whole blocks: every block the middle positions touch is taken entirely,
// except at most one, of which a suffix (its highest positions) is taken.
::testing::AssertionResult whole_blocks(const std::vector<int32_t>& mid, int32_t B,
                                        const Regions& r) {
  std::map<int64_t, std::vector<int32_t>> by_block;
  for (int32_t p : mid) by_block[p / B].push_back(p);
  int cut = 0;
  for (auto& [b, ps] : by_block) {
    auto [begin, end] = block_range(b, B, r);
    int64_t len = end - begin;
    if (static_cast<int64_t>(ps.size()) == len) continue;
    ++cut;
    // A suffix: the last ps.size() positions of the block, ascending.
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i] != end - static_cast<int64_t>(ps.size()) + static_cast<int64_t>(i))
        return ::testing::AssertionFailure()
               << "block " << b << " is cut but not to its highest positions";
  }
  if (cut > 1) return ::testing::AssertionFailure() << cut << " blocks are cut (at most 1)";
  return ::testing::AssertionSuccess();
}

}  // namespace

// ---------------------------------------------------------------------------
// Bookkeeping for every selector, dtype and GQA group, through decode steps
// that grow the middle (partial blocks, block boundaries) and tiny contexts.
// ---------------------------------------------------------------------------

TEST(ApiQuerySelectors, BookkeepingAllSelectorsDtypesGroups) {
  for (int32_t sel : kQuerySelectors)
    for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16})
      for (int32_t group : {1, 3}) {
        SCOPED_TRACE(std::string(selector_name(sel)) + " dtype " + std::to_string(dtype) +
                     " group " + std::to_string(group));
        pq_config c = base_config(sel, dtype, group, 2, 32);
        c.num_layers = 2;
        c.sink_tokens = 5;
        c.local_tokens = 40;
        c.topk_fraction = 0.25f;  // exact in float: the test's ceil matches the library's
        c.block_tokens = 16;
        c.block_representatives = 2;
        c.sparq_dims = 4;
        const int64_t prompt = 517, steps = 20;
        std::vector<float> keys =
            random_normal(static_cast<size_t>(prompt + steps) * 2 * 32, 11 + group);
        Ctx ctx = make_ctx(c, keys, prompt);
        ASSERT_TRUE(ctx.ok());
        for (int64_t s = 0; s <= steps; ++s) {
          if (s > 0) append(ctx, c, 0, keys, prompt + s - 1, 1);
          std::vector<float> q = random_normal(static_cast<size_t>(2 * group * 32), 100 + s);
          Regions r = regions(prompt + s, c);
          ASSERT_GT(r.k, 0);
          auto rows = select_rows(ctx, c, 0, q);
          for (int32_t h = 0; h < 2; ++h)
            ASSERT_TRUE(bookkeeping_ok(rows[static_cast<size_t>(h)], r))
                << "step " << s << " kv head " << h;
        }
        // The other layer, never appended to.
        std::vector<float> q = random_normal(static_cast<size_t>(2 * group * 32), 7);
        auto rows = select_rows(ctx, c, 1, q);
        for (int32_t h = 0; h < 2; ++h)
          EXPECT_TRUE(bookkeeping_ok(rows[static_cast<size_t>(h)], regions(prompt, c)));
      }
}

TEST(ApiQuerySelectors, BookkeepingTinyMiddles) {
  // Empty middle, a middle of one token (k = 1 = middle), and one of two.
  for (int32_t sel : kQuerySelectors)
    for (int64_t n : {3, 20, 21, 22}) {
      SCOPED_TRACE(std::string(selector_name(sel)) + " n " + std::to_string(n));
      pq_config c = base_config(sel, PQ_DTYPE_F32, 2, 1, 8);
      c.sink_tokens = 4;
      c.local_tokens = 16;
      c.topk_tokens = 1;
      c.block_tokens = 4;
      c.block_representatives = 4;
      std::vector<float> keys = random_normal(static_cast<size_t>(n) * 8, 3);
      Ctx ctx = make_ctx(c, keys, n);
      ASSERT_TRUE(ctx.ok());
      auto rows = select_rows(ctx, c, 0, random_normal(16, 4));
      EXPECT_TRUE(bookkeeping_ok(rows[0], regions(n, c)));
    }
}

// A middle of >= 4096 tokens selects the kv heads in parallel. Every head
// must still select what a one-head context holding only its keys selects,
// and RANDOM stays deterministic.
TEST(ApiQuerySelectors, LargeMiddleParallelHeadsAreIndependent) {
  const int32_t d = 16, kvh = 4, group = 2;
  const int64_t n = 4400;
  std::vector<float> keys = random_normal(static_cast<size_t>(n) * kvh * d, 70);
  std::vector<float> q = random_normal(static_cast<size_t>(kvh * group * d), 71);
  for (int32_t sel : kQuerySelectors) {
    SCOPED_TRACE(selector_name(sel));
    pq_config c = base_config(sel, PQ_DTYPE_F16, group, kvh, d);
    c.topk_tokens = 300;
    c.block_tokens = 32;
    c.block_representatives = 2;
    c.sparq_dims = 4;
    Ctx ctx = make_ctx(c, keys, n);
    ASSERT_TRUE(ctx.ok());
    Regions r = regions(n, c);
    ASSERT_GE(r.middle, 4096);
    auto rows = select_rows(ctx, c, 0, q);
    for (int32_t h = 0; h < kvh; ++h)
      EXPECT_TRUE(bookkeeping_ok(rows[static_cast<size_t>(h)], r)) << "kv head " << h;
    if (sel == PQ_SELECTOR_RANDOM) {
      Ctx again = make_ctx(c, keys, n);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(select_rows(again, c, 0, q), rows);
      continue;
    }
    for (int32_t h = 0; h < kvh; ++h) {
      pq_config c1 = c;
      c1.num_kv_heads = 1;
      c1.num_q_heads = group;
      std::vector<float> k1(static_cast<size_t>(n) * d);
      for (int64_t t = 0; t < n; ++t)
        std::copy_n(keys.begin() + (t * kvh + h) * d, d, k1.begin() + t * d);
      std::vector<float> q1(q.begin() + h * group * d, q.begin() + (h + 1) * group * d);
      Ctx one = make_ctx(c1, k1, n);
      ASSERT_TRUE(one.ok());
      EXPECT_EQ(select_rows(one, c1, 0, q1)[0], rows[static_cast<size_t>(h)]) << "kv head " << h;
    }
  }
}

// The block summaries are kept incrementally (update_state): a context that
// grew by chunked prefill and many single-token appends, selecting between
// them, must select what a context prefilled at once selects.
TEST(ApiQuerySelectors, IncrementalSummariesEqualOneShotPrefill) {
  for (int32_t sel : {PQ_SELECTOR_SPARQ, PQ_SELECTOR_INFLLM, PQ_SELECTOR_QUEST})
    for (int32_t group : {1, 2}) {
      SCOPED_TRACE(std::string(selector_name(sel)) + " group " + std::to_string(group));
      pq_config c = base_config(sel, PQ_DTYPE_F16, group, 2, 16);
      c.sink_tokens = 3;
      c.local_tokens = 20;
      c.topk_tokens = 45;
      c.block_tokens = 8;
      c.block_representatives = 2;
      c.sparq_dims = 5;
      const int64_t total = 260;
      std::vector<float> keys = random_normal(static_cast<size_t>(total) * 2 * 16, 21);
      std::vector<float> q = random_normal(static_cast<size_t>(2 * group * 16), 22);

      Ctx grown(c);
      ASSERT_TRUE(grown.ok());
      PQ_ASSERT_OK(pq_sequence_add(grown, kSeq));
      prefill(grown, c, 0, keys, 0, 150);
      select_rows(grown, c, 0, q);
      prefill(grown, c, 0, keys, 150, 61);  // a second prompt chunk
      for (int64_t t = 211; t < total; ++t) {
        append(grown, c, 0, keys, t, 1);
        if (t % 3 == 0) select_rows(grown, c, 0, random_normal(q.size(), 300 + t));
      }
      auto a = select_rows(grown, c, 0, q);

      Ctx fresh = make_ctx(c, keys, total);
      ASSERT_TRUE(fresh.ok());
      auto b = select_rows(fresh, c, 0, q);
      for (int32_t h = 0; h < 2; ++h) {
        EXPECT_EQ(a[static_cast<size_t>(h)], b[static_cast<size_t>(h)]) << "kv head " << h;
        EXPECT_TRUE(bookkeeping_ok(a[static_cast<size_t>(h)], regions(total, c)));
      }
    }
}

// ---------------------------------------------------------------------------
// SparQ
// ---------------------------------------------------------------------------

// With r = head_dim SparQ computes the full q.k: on integer-valued data the
// sums are exact, so it must select exactly what EXACT selects.
TEST(ApiSparq, AllDimensionsEqualsExact) {
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16})
    for (int32_t group : {1, 3})
      for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN}) {
        SCOPED_TRACE("dtype " + std::to_string(dtype) + " group " + std::to_string(group) +
                     " combine " + std::to_string(combine));
        const int32_t d = 24, kvh = 2;
        const int64_t n = 400;
        std::vector<float> keys = random_ints(static_cast<size_t>(n) * kvh * d, 5, -8, 8);
        std::vector<float> q = random_ints(static_cast<size_t>(kvh * group * d), 6, -4, 4);
        pq_config c = base_config(PQ_SELECTOR_SPARQ, dtype, group, kvh, d);
        c.gqa_combine = combine;
        c.sparq_dims = d;
        c.topk_tokens = 57;
        c.local_tokens = 30;
        Ctx sparq = make_ctx(c, keys, n);
        pq_config ce = c;
        ce.selector = PQ_SELECTOR_EXACT;
        Ctx exact = make_ctx(ce, keys, n);
        ASSERT_TRUE(sparq.ok() && exact.ok());
        auto a = select_rows(sparq, c, 0, q);
        auto b = select_rows(exact, ce, 0, q);
        for (int32_t h = 0; h < kvh; ++h)
          EXPECT_EQ(a[static_cast<size_t>(h)], b[static_cast<size_t>(h)]) << "kv head " << h;
        if (group == 1 && combine == PQ_GQA_MAX) {  // and EXACT is the test's own top-k
          Regions r = regions(n, c);
          for (int32_t h = 0; h < kvh; ++h) {
            auto want = topk_positions(
                combined_scores(keys, kvh, d, q, kvh * group, h, r.sink_end, r.local_begin, combine),
                r.sink_end, r.k);
            EXPECT_EQ(middle_of(a[static_cast<size_t>(h)], r), want);
          }
        }
      }
}

// A query that is non-zero in only r dimensions (the same r for the whole
// group) makes SparQ's r-dimension product the exact q.k. A dense query with
// r = 1 does not, and the selection must then differ from EXACT's.
TEST(ApiSparq, SparseQueryEqualsExactAndDenseQueryDoesNot) {
  const int32_t d = 32, kvh = 2, r_dims = 3;
  const int64_t n = 500;
  for (int32_t group : {1, 3}) {
    SCOPED_TRACE("group " + std::to_string(group));
    std::vector<float> keys = random_ints(static_cast<size_t>(n) * kvh * d, 8, -6, 6);
    std::vector<float> q(static_cast<size_t>(kvh * group * d), 0.f);
    const int32_t dims[kvh][r_dims] = {{2, 17, 30}, {0, 9, 31}};
    std::vector<float> vals = random_ints(static_cast<size_t>(kvh * group * r_dims), 9, 1, 5);
    for (int32_t h = 0; h < kvh; ++h)
      for (int32_t g = 0; g < group; ++g)
        for (int32_t j = 0; j < r_dims; ++j) {
          float v = vals[static_cast<size_t>((h * group + g) * r_dims + j)];
          q[static_cast<size_t>((h * group + g) * d + dims[h][j])] = (j % 2 ? -v : v);
        }
    pq_config c = base_config(PQ_SELECTOR_SPARQ, PQ_DTYPE_F32, group, kvh, d);
    c.sparq_dims = r_dims;
    c.topk_tokens = 60;
    pq_config ce = c;
    ce.selector = PQ_SELECTOR_EXACT;
    Ctx sparq = make_ctx(c, keys, n), exact = make_ctx(ce, keys, n);
    ASSERT_TRUE(sparq.ok() && exact.ok());
    auto a = select_rows(sparq, c, 0, q);
    auto b = select_rows(exact, ce, 0, q);
    for (int32_t h = 0; h < kvh; ++h)
      EXPECT_EQ(a[static_cast<size_t>(h)], b[static_cast<size_t>(h)]) << "kv head " << h;

    // Dense query, r = 1: an approximation, not EXACT.
    std::vector<float> dense = random_ints(q.size(), 10, -5, 5);
    pq_config c1 = c;
    c1.sparq_dims = 1;
    Ctx sparq1 = make_ctx(c1, keys, n);
    ASSERT_TRUE(sparq1.ok());
    auto a1 = select_rows(sparq1, c1, 0, dense);
    auto b1 = select_rows(exact, ce, 0, dense);
    Regions r = regions(n, c);
    for (int32_t h = 0; h < kvh; ++h)
      EXPECT_LT(recall(middle_of(a1[static_cast<size_t>(h)], r),
                       middle_of(b1[static_cast<size_t>(h)], r)),
                0.95)
          << "kv head " << h;
  }
}

// sparq_dims = 0 means ceil(head_dim / 128): 1 for head_dim <= 128, 2 for 136.
TEST(ApiSparq, DefaultDimsIsHeadDimOver128) {
  for (int32_t d : {32, 136}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const int64_t n = 300;
    std::vector<float> keys = random_normal(static_cast<size_t>(n) * d, 12);
    std::vector<float> q = random_normal(static_cast<size_t>(d), 13);
    pq_config c = base_config(PQ_SELECTOR_SPARQ, PQ_DTYPE_F32, 1, 1, d);
    c.topk_tokens = 30;
    c.sparq_dims = 0;
    pq_config ce = c;
    ce.sparq_dims = (d + 127) / 128;
    Ctx dflt = make_ctx(c, keys, n), expl = make_ctx(ce, keys, n);
    ASSERT_TRUE(dflt.ok() && expl.ok());
    EXPECT_EQ(select_rows(dflt, c, 0, q), select_rows(expl, ce, 0, q));
    EXPECT_EQ(layer_info(dflt, kSeq, 0).last_select_bytes,
              static_cast<uint64_t>(regions(n, c).middle) * ce.sparq_dims * 4);
  }
}

// ---------------------------------------------------------------------------
// Quest and InfLLM
// ---------------------------------------------------------------------------

// Keys constant within each absolute block: Quest's bound and every InfLLM
// representative are then the exact q.k of every token of the block, and
// cutting the last block to its highest positions is EXACT's own tie rule,
// so both must select exactly what EXACT selects (clipped first block,
// partial last block, k not a multiple of the block size included).
TEST(ApiBlockSelectors, BlockConstantKeysEqualExact) {
  const int32_t d = 16, kvh = 2, B = 16;
  const int64_t n = 611;
  std::vector<float> block_keys = random_ints(static_cast<size_t>(n / B + 1) * kvh * d, 14, -5, 5);
  std::vector<float> keys(static_cast<size_t>(n) * kvh * d);
  for (int64_t t = 0; t < n; ++t)
    for (int32_t h = 0; h < kvh; ++h)
      for (int32_t i = 0; i < d; ++i)
        keys[static_cast<size_t>((t * kvh + h) * d + i)] =
            block_keys[static_cast<size_t>(((t / B) * kvh + h) * d + i)];
  struct Case {
    int32_t group, combine, dtype;
  };
  for (Case cs : {Case{1, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F32}, Case{1, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F16},
                  Case{3, PQ_GQA_MAX, PQ_DTYPE_F32}, Case{3, PQ_GQA_MEAN, PQ_DTYPE_F16}}) {
    std::vector<float> q = random_ints(static_cast<size_t>(kvh * cs.group * d), 15 + cs.group, -4, 4);
    pq_config ce = base_config(PQ_SELECTOR_EXACT, cs.dtype, cs.group, kvh, d);
    ce.gqa_combine = cs.combine;
    ce.sink_tokens = 5;
    ce.local_tokens = 37;
    ce.block_tokens = B;
    for (int32_t k : {64, 100}) {
      ce.topk_tokens = k;
      Ctx exact = make_ctx(ce, keys, n);
      ASSERT_TRUE(exact.ok());
      auto want = select_rows(exact, ce, 0, q);
      for (int32_t sel : {PQ_SELECTOR_QUEST, PQ_SELECTOR_INFLLM})
        for (int32_t reps : {1, 3}) {
          if (sel == PQ_SELECTOR_QUEST && reps != 1) continue;
          SCOPED_TRACE(std::string(selector_name(sel)) + " group " + std::to_string(cs.group) +
                       " combine " + std::to_string(cs.combine) + " dtype " +
                       std::to_string(cs.dtype) + " k " + std::to_string(k) + " reps " +
                       std::to_string(reps));
          pq_config c = ce;
          c.selector = sel;
          c.block_representatives = reps;
          Ctx ctx = make_ctx(c, keys, n);
          ASSERT_TRUE(ctx.ok());
          auto got = select_rows(ctx, c, 0, q);
          for (int32_t h = 0; h < kvh; ++h)
            EXPECT_EQ(got[static_cast<size_t>(h)], want[static_cast<size_t>(h)]) << "kv head " << h;
        }
    }
  }
}

// With block_representatives = block_tokens every token represents its block,
// so a block's score is the max of q.k over it (group 3 with PQ_GQA_MAX: the
// max over the group too). The test ranks blocks itself (ties: the later
// block), takes them until k, cuts the last to its highest positions.
TEST(ApiInfllm, AllTokensRepresentativesRankBlocksByMax) {
  const int32_t d = 16, kvh = 2, B = 8;
  const int64_t n = 403;
  std::vector<float> keys = random_ints(static_cast<size_t>(n) * kvh * d, 16, -7, 7);
  for (int32_t group : {1, 3}) {
    SCOPED_TRACE("group " + std::to_string(group));
    std::vector<float> q = random_ints(static_cast<size_t>(kvh * group * d), 17, -3, 3);
    pq_config c = base_config(PQ_SELECTOR_INFLLM, PQ_DTYPE_F32, group, kvh, d);
    c.gqa_combine = PQ_GQA_MAX;
    c.block_tokens = B;
    c.block_representatives = B;
    c.sink_tokens = 3;
    c.local_tokens = 29;
    c.topk_tokens = 77;
    Ctx ctx = make_ctx(c, keys, n);
    ASSERT_TRUE(ctx.ok());
    auto got = select_rows(ctx, c, 0, q);
    Regions r = regions(n, c);
    for (int32_t h = 0; h < kvh; ++h) {
      // Block scores: max over tokens and group heads of the integer q.k.
      std::map<int64_t, double> best;
      for (int64_t t = r.sink_end; t < r.local_begin; ++t)
        for (int32_t g = 0; g < group; ++g) {
          double s = 0;
          for (int32_t i = 0; i < d; ++i)
            s += static_cast<double>(q[static_cast<size_t>((h * group + g) * d + i)]) *
                 keys[static_cast<size_t>((t * kvh + h) * d + i)];
          auto it = best.find(t / B);
          if (it == best.end()) best[t / B] = s;
          else it->second = std::max(it->second, s);
        }
      std::vector<std::pair<double, int64_t>> order;
      for (auto& [b, s] : best) order.push_back({s, b});
      EXPECT_EQ(middle_of(got[static_cast<size_t>(h)], r), take_blocks_by_score(order, B, r))
          << "kv head " << h;
    }
  }
}

// Quest ranks blocks by the upper bound sum_d max(q_d min_d, q_d max_d) of
// the element-wise min and max keys (group 3 with PQ_GQA_MAX: the max bound
// over the group). The test computes the bounds itself on integer keys.
TEST(ApiQuest, RanksBlocksByTheMinMaxBound) {
  const int32_t d = 12, kvh = 2, B = 8;
  const int64_t n = 389;
  std::vector<float> keys = random_ints(static_cast<size_t>(n) * kvh * d, 19, -9, 9);
  for (int32_t group : {1, 3}) {
    SCOPED_TRACE("group " + std::to_string(group));
    std::vector<float> q = random_ints(static_cast<size_t>(kvh * group * d), 20, -3, 3);
    pq_config c = base_config(PQ_SELECTOR_QUEST, PQ_DTYPE_F16, group, kvh, d);
    c.gqa_combine = PQ_GQA_MAX;
    c.block_tokens = B;
    c.sink_tokens = 2;
    c.local_tokens = 31;
    c.topk_tokens = 61;
    Ctx ctx = make_ctx(c, keys, n);
    ASSERT_TRUE(ctx.ok());
    auto got = select_rows(ctx, c, 0, q);
    Regions r = regions(n, c);
    for (int32_t h = 0; h < kvh; ++h) {
      std::vector<std::pair<double, int64_t>> order;  // (bound, block)
      for (int64_t b = r.sink_end / B; b * B < r.local_begin; ++b) {
        auto [begin, end] = block_range(b, B, r);
        double best = -1e300;
        for (int32_t g = 0; g < group; ++g) {
          double bound = 0;
          for (int32_t i = 0; i < d; ++i) {
            double lo = 1e300, hi = -1e300;
            for (int64_t t = begin; t < end; ++t) {
              double v = keys[static_cast<size_t>((t * kvh + h) * d + i)];
              lo = std::min(lo, v);
              hi = std::max(hi, v);
            }
            double qi = q[static_cast<size_t>((h * group + g) * d + i)];
            bound += std::max(qi * lo, qi * hi);
          }
          best = std::max(best, bound);
        }
        order.push_back({best, b});
      }
      EXPECT_EQ(middle_of(got[static_cast<size_t>(h)], r), take_blocks_by_score(order, B, r))
          << "kv head " << h;
    }
  }
}

// InfLLM's representative proxy: with R = 1 a block is represented by the
// key with the largest dot product with the block's mean key. Block 1 holds
// a, a, a, b with a = (2, 0), b = (0, 3): mean (1.5, 0.75), so a represents
// it (a.mean = 3 > b.mean = 2.25). For q = (0, 1) its representative scores
// 0 although b scores 3; block 2, constant c = (0, 1), scores 1 and wins.
// With R = 4 (every token) block 1 wins. Other blocks are (0, -1): score -1.
TEST(ApiInfllm, RepresentativeIsTheKeyClosestToTheBlockMean) {
  const int32_t d = 2, B = 4;
  const int64_t n = 4 * B;  // blocks 0..3; sinks = block 0, locals = block 3
  std::vector<float> keys(static_cast<size_t>(n) * d);
  auto set = [&](int64_t t, float x, float y) {
    keys[static_cast<size_t>(t * d)] = x;
    keys[static_cast<size_t>(t * d + 1)] = y;
  };
  for (int64_t t = 0; t < n; ++t) set(t, 0, -1);
  for (int64_t t = 4; t < 7; ++t) set(t, 2, 0);
  set(7, 0, 3);
  for (int64_t t = 8; t < 12; ++t) set(t, 0, 1);
  std::vector<float> q = {0, 1};
  for (int32_t reps : {1, 4}) {
    SCOPED_TRACE("reps " + std::to_string(reps));
    pq_config c = base_config(PQ_SELECTOR_INFLLM, PQ_DTYPE_F32, 1, 1, d);
    c.block_tokens = B;
    c.block_representatives = reps;
    c.sink_tokens = B;
    c.local_tokens = B;
    c.topk_tokens = B;
    Ctx ctx = make_ctx(c, keys, n);
    ASSERT_TRUE(ctx.ok());
    auto row = select_rows(ctx, c, 0, q)[0];
    std::vector<int32_t> want = reps == 1 ? std::vector<int32_t>{8, 9, 10, 11}
                                          : std::vector<int32_t>{4, 5, 6, 7};
    EXPECT_EQ(middle_of(row, regions(n, c)), want);
  }
}

// On random keys (no structure), over many queries, k values and block
// geometries, the chosen middle is whole blocks plus at most one block cut
// to its highest positions.
TEST(ApiBlockSelectors, TakeWholeBlocksPlusOneCut) {
  for (int32_t sel : {PQ_SELECTOR_QUEST, PQ_SELECTOR_INFLLM})
    for (int32_t B : {7, 16}) {
      SCOPED_TRACE(std::string(selector_name(sel)) + " B " + std::to_string(B));
      const int32_t d = 16, kvh = 2, group = 2;
      const int64_t n = 500;
      std::vector<float> keys = random_normal(static_cast<size_t>(n) * kvh * d, 18 + B);
      pq_config c = base_config(sel, PQ_DTYPE_F32, group, kvh, d);
      c.block_tokens = B;
      c.block_representatives = 2;
      c.sink_tokens = 4;
      c.local_tokens = 33;
      for (int32_t k : {1, 30, 45, 200}) {
        c.topk_tokens = k;
        Ctx ctx = make_ctx(c, keys, n);
        ASSERT_TRUE(ctx.ok());
        Regions r = regions(n, c);
        for (int s = 0; s < 4; ++s) {
          auto rows =
              select_rows(ctx, c, 0, random_normal(static_cast<size_t>(kvh * group * d), 40 + s));
          for (int32_t h = 0; h < kvh; ++h) {
            auto mid = middle_of(rows[static_cast<size_t>(h)], r);
            ASSERT_EQ(static_cast<int64_t>(mid.size()), r.k);
            EXPECT_TRUE(whole_blocks(mid, B, r)) << "k " << k << " query " << s << " head " << h;
          }
        }
      }
    }
}

// A planted cluster of keys occupying 4 contiguous blocks and a query near
// its centre: EXACT's top-k is the cluster, the block selectors find it, and
// RANDOM does not. The recalls are printed for the record.
TEST(ApiBlockSelectors, ClusteredRecallFarAboveRandom) {
  const int32_t d = 64, kvh = 1, group = 2, B = 16;
  const int64_t n = 2048, cluster_begin = 640, cluster_len = 4 * B;
  std::vector<float> keys = random_normal(static_cast<size_t>(n) * kvh * d, 30);
  std::vector<float> centre = random_normal(static_cast<size_t>(d), 31, 3.0f);
  std::vector<float> noise = random_normal(static_cast<size_t>(cluster_len) * d, 32, 0.3f);
  for (int64_t t = 0; t < cluster_len; ++t)
    for (int32_t i = 0; i < d; ++i)
      keys[static_cast<size_t>((cluster_begin + t) * d + i)] =
          centre[static_cast<size_t>(i)] + noise[static_cast<size_t>(t * d + i)];
  std::vector<float> q(static_cast<size_t>(group * d));
  std::vector<float> qnoise = random_normal(q.size(), 33, 0.5f);
  for (int32_t g = 0; g < group; ++g)
    for (int32_t i = 0; i < d; ++i)
      q[static_cast<size_t>(g * d + i)] =
          0.2f * centre[static_cast<size_t>(i)] + qnoise[static_cast<size_t>(g * d + i)];

  pq_config c = base_config(PQ_SELECTOR_EXACT, PQ_DTYPE_F32, group, kvh, d);
  c.topk_tokens = static_cast<int32_t>(cluster_len);
  c.block_tokens = B;
  c.block_representatives = 1;
  c.sparq_dims = 8;
  c.local_tokens = 64;
  Regions r = regions(n, c);
  std::vector<int32_t> want = topk_positions(
      combined_scores(keys, kvh, d, q, group, 0, r.sink_end, r.local_begin, c.gqa_combine),
      r.sink_end, r.k);
  // The planted cluster is the oracle's answer.
  ASSERT_EQ(overlap(want, [&] {
              std::vector<int32_t> cl;
              for (int64_t t = 0; t < cluster_len; ++t) cl.push_back(static_cast<int32_t>(cluster_begin + t));
              return cl;
            }()),
            static_cast<size_t>(cluster_len));

  std::map<int32_t, double> rec;
  for (int32_t sel : {PQ_SELECTOR_INFLLM, PQ_SELECTOR_QUEST, PQ_SELECTOR_SPARQ, PQ_SELECTOR_RANDOM}) {
    pq_config cs = c;
    cs.selector = sel;
    Ctx ctx = make_ctx(cs, keys, n);
    ASSERT_TRUE(ctx.ok());
    double sum = 0;
    const int steps = sel == PQ_SELECTOR_RANDOM ? 10 : 1;
    for (int s = 0; s < steps; ++s) sum += recall(middle_of(select_rows(ctx, cs, 0, q)[0], r), want);
    rec[sel] = sum / steps;
    std::printf("[ recall ] %-6s recall of EXACT top-%lld on clustered keys: %.3f\n",
                selector_name(sel), static_cast<long long>(r.k), rec[sel]);
  }
  EXPECT_GE(rec[PQ_SELECTOR_INFLLM], 0.9);
  EXPECT_GE(rec[PQ_SELECTOR_QUEST], 0.9);
  EXPECT_GE(rec[PQ_SELECTOR_SPARQ], 0.9);
  EXPECT_LE(rec[PQ_SELECTOR_RANDOM], 0.15);
  EXPECT_GE(rec[PQ_SELECTOR_INFLLM] - rec[PQ_SELECTOR_RANDOM], 0.7);
  EXPECT_GE(rec[PQ_SELECTOR_QUEST] - rec[PQ_SELECTOR_RANDOM], 0.7);
}

// ---------------------------------------------------------------------------
// RANDOM
// ---------------------------------------------------------------------------

TEST(ApiRandom, SeededDeterministicAndUniform) {
  const int32_t d = 8, kvh = 2;
  const int64_t prompt = 1100;
  std::vector<float> keys = random_normal(static_cast<size_t>(prompt + 40) * kvh * d, 50);
  pq_config c = base_config(PQ_SELECTOR_RANDOM, PQ_DTYPE_F32, 1, kvh, d);
  c.num_layers = 2;
  c.topk_tokens = 50;
  c.seed = 1234;
  pq_config c2 = c;
  c2.seed = 1235;
  Ctx a = make_ctx(c, keys, prompt), b = make_ctx(c, keys, prompt), other = make_ctx(c2, keys, prompt);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  std::vector<float> q = random_normal(static_cast<size_t>(kvh * d), 51);

  // The same call sequence (selects, appends, another layer) in a and b.
  int differ_other = 0, differ_step = 0, differ_head = 0;
  std::vector<std::vector<int32_t>> previous;
  for (int s = 0; s < 30; ++s) {
    if (s % 3 == 2) {
      append(a, c, 0, keys, prompt + s, 1);
      append(b, c, 0, keys, prompt + s, 1);
      append(other, c, 0, keys, prompt + s, 1);
    }
    auto ra = select_rows(a, c, 0, q);
    auto rb = select_rows(b, c, 0, q);
    auto ro = select_rows(other, c2, 0, q);
    int64_t n = 0;
    PQ_ASSERT_OK(pq_sequence_length(a, kSeq, 0, &n));
    for (int32_t h = 0; h < kvh; ++h) EXPECT_TRUE(bookkeeping_ok(ra[static_cast<size_t>(h)], regions(n, c)));
    ASSERT_EQ(ra, rb) << "step " << s;
    differ_other += ra != ro;
    differ_step += !previous.empty() && previous != ra;
    differ_head += ra[0] != ra[1];
    previous = ra;
    if (s % 10 == 0) {  // layer 1 draws its own stream
      auto l1 = select_rows(a, c, 1, q);
      ASSERT_EQ(l1, select_rows(b, c, 1, q));
      select_rows(other, c2, 1, q);
      EXPECT_NE(l1[0], ra[0]);
    }
  }
  EXPECT_EQ(differ_other, 30) << "another seed draws other tokens";
  EXPECT_EQ(differ_step, 29) << "repeated calls draw other tokens";
  EXPECT_EQ(differ_head, 30) << "kv heads draw other tokens";

  // Uniform: 200 selections x 2 heads x 50 tokens of a fixed middle.
  Ctx u = make_ctx(c, keys, prompt);
  ASSERT_TRUE(u.ok());
  Regions r = regions(prompt, c);
  std::vector<int64_t> deciles(10, 0);
  double sum = 0;
  int64_t count = 0;
  for (int s = 0; s < 200; ++s) {
    auto rows = select_rows(u, c, 0, q);
    for (auto& row : rows)
      for (int32_t p : middle_of(row, r)) {
        sum += p;
        ++count;
        ++deciles[static_cast<size_t>((p - r.sink_end) * 10 / r.middle)];
      }
  }
  ASSERT_EQ(count, 200 * kvh * r.k);
  double centre = r.sink_end + (r.middle - 1) / 2.0;
  // sd of the mean: (middle / sqrt(12)) / sqrt(count) ~ 2.1 positions.
  EXPECT_NEAR(sum / count, centre, 15.0);
  for (int i = 0; i < 10; ++i)  // expected 2000 each, sd ~ 42
    EXPECT_NEAR(static_cast<double>(deciles[static_cast<size_t>(i)]), count / 10.0, 300.0)
        << "decile " << i;
}

// ---------------------------------------------------------------------------
// Bytes read to decide, per selector, at a known geometry
// ---------------------------------------------------------------------------

TEST(ApiQuerySelectors, LastSelectBytesFollowTheFormulas) {
  // n = 300, sinks 5, locals 42: middle [5, 258) = 253 tokens. Blocks of 16:
  // absolute blocks 0 .. 16, block 0 clipped to [5, 16) (11 tokens), block 16
  // partial [256, 258) (2 tokens): 17 blocks.
  const int32_t d = 32, kvh = 2, B = 16, R = 3;
  const int64_t n = 300, middle = 253, blocks = 17;
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16}) {
    const uint64_t es = elem_size(dtype);
    std::vector<float> keys = random_normal(static_cast<size_t>(n) * kvh * d, 60);
    std::vector<float> q = random_normal(static_cast<size_t>(kvh * 2 * d), 61);
    pq_config c = base_config(PQ_SELECTOR_SPARQ, dtype, 2, kvh, d);
    c.sink_tokens = 5;
    c.local_tokens = 42;
    c.topk_tokens = 40;
    c.block_tokens = B;
    c.block_representatives = R;
    c.sparq_dims = 3;
    ASSERT_EQ(regions(n, c).middle, middle);
    struct Want {
      int32_t selector;
      uint64_t bytes;
    };
    // InfLLM: min(R, tokens) representatives per block: 16 blocks x 3 + 2.
    for (Want w : {Want{PQ_SELECTOR_SPARQ, kvh * middle * 3 * es},
                   Want{PQ_SELECTOR_INFLLM, kvh * (16 * R + 2) * d * es},
                   Want{PQ_SELECTOR_QUEST, kvh * blocks * 2 * d * es},
                   Want{PQ_SELECTOR_RANDOM, 0}, Want{PQ_SELECTOR_EXACT, kvh * middle * d * es}}) {
      SCOPED_TRACE(std::string(selector_name(w.selector)) + " dtype " + std::to_string(dtype));
      pq_config cs = c;
      cs.selector = w.selector;
      Ctx ctx = make_ctx(cs, keys, n);
      ASSERT_TRUE(ctx.ok());
      select_rows(ctx, cs, 0, q);
      EXPECT_EQ(layer_info(ctx, kSeq, 0).last_select_bytes, w.bytes);
      EXPECT_EQ(stats(ctx).bytes_scored, w.bytes);
      // Selecting the whole middle reads nothing.
      pq_config all = cs;
      all.topk_tokens = static_cast<int32_t>(middle);
      Ctx ctx_all = make_ctx(all, keys, n);
      ASSERT_TRUE(ctx_all.ok());
      select_rows(ctx_all, all, 0, q);
      EXPECT_EQ(layer_info(ctx_all, kSeq, 0).last_select_bytes, 0u);
    }
  }
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

TEST(ApiQuerySelectors, ConfigErrorsNameTheField) {
  pq_config c = base_config(PQ_SELECTOR_INFLLM, PQ_DTYPE_F32, 1, 2, 32);
  pq_context* ctx = nullptr;
  c.block_tokens = 8;
  c.block_representatives = 9;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "block_representatives");
  c.block_representatives = 0;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "block_representatives");
  c.block_representatives = 1;
  c.block_tokens = 0;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "block_tokens");
  c.block_tokens = 8;
  c.block_representatives = 8;  // every token a representative is fine
  {
    Ctx ok(c);
    EXPECT_TRUE(IsOk(ok.status()));
  }
  c.selector = PQ_SELECTOR_SPARQ;
  c.sparq_dims = 33;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "sparq_dims");
  c.sparq_dims = -1;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "sparq_dims");
  EXPECT_EQ(ctx, nullptr);
  c.sparq_dims = 32;
  Ctx ok(c);
  EXPECT_TRUE(IsOk(ok.status()));
}
