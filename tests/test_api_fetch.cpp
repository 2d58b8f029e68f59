// pq_fetch_kv: returns exactly the stored bytes of the selected rows, for
// every dtype, input layout and output layout (with padding strides), and
// includes decode tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int32_t kQHeads = 4, kKvHeads = 2, kDim = 16;
constexpr int64_t kTokens = 100;

const char* dtype_name(int32_t d) {
  return d == PQ_DTYPE_F32 ? "F32" : d == PQ_DTYPE_F16 ? "F16" : "BF16";
}

struct LayoutSpec {
  const char* name;
  int32_t layout;
  int64_t pad_inner, pad_outer;
};

const LayoutSpec kLayouts[] = {
    {"token_major", PQ_LAYOUT_TOKEN_MAJOR, 0, 0},
    {"head_major", PQ_LAYOUT_HEAD_MAJOR, 0, 0},
    {"token_major_padded", PQ_LAYOUT_TOKEN_MAJOR, 3, 7},
    {"head_major_padded", PQ_LAYOUT_HEAD_MAJOR, 2, 11},
};

pq_config fetch_config(int32_t dtype) {
  pq_config c = make_config(1, kQHeads, kKvHeads, kDim, dtype);
  c.pq_bits = 4;
  c.sink_tokens = 4;
  c.local_tokens = 8;
  c.topk_tokens = 12;
  c.kmeans_iterations = 5;
  c.worker_threads = 2;
  return c;
}

// Reference rows: bytes of (pos, head) as the caller passed them.
struct RefRows {
  size_t row_bytes = 0;
  std::vector<std::vector<unsigned char>> k, v;  // [pos * kv_heads + h]
  void add(const HostTensor& K, const HostTensor& V) {
    row_bytes = K.row_bytes();
    for (int64_t t = 0; t < K.t.tokens; ++t)
      for (int32_t h = 0; h < K.t.heads; ++h) {
        k.emplace_back(K.row(t, h), K.row(t, h) + row_bytes);
        v.emplace_back(V.row(t, h), V.row(t, h) + row_bytes);
      }
  }
};

// Compares fetched rows with the reference and checks that bytes outside
// the rows of the output tensors (padding) were not written.
void check_fetch(const Sel& sel, const HostTensor& OK, const HostTensor& OV, const RefRows& ref,
                 unsigned char fill, const std::string& what) {
  SCOPED_TRACE(what);
  int64_t bad = 0;
  for (int32_t h = 0; h < sel.heads; ++h) {
    std::vector<int32_t> row = sel.row(h);
    for (size_t i = 0; i < row.size(); ++i) {
      size_t idx = static_cast<size_t>(row[i]) * kKvHeads + static_cast<size_t>(h);
      ASSERT_LT(idx, ref.k.size());
      if (std::memcmp(OK.row(static_cast<int64_t>(i), h), ref.k[idx].data(), ref.row_bytes) != 0) {
        if (++bad < 5) ADD_FAILURE() << "key row " << i << " head " << h << " (position " << row[i] << ") differs";
      }
      if (std::memcmp(OV.row(static_cast<int64_t>(i), h), ref.v[idx].data(), ref.row_bytes) != 0) {
        if (++bad < 5) ADD_FAILURE() << "value row " << i << " head " << h << " (position " << row[i] << ") differs";
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // Padding between rows untouched.
  for (const HostTensor* T : {&OK, &OV}) {
    std::vector<char> in_row(T->bytes.size(), 0);
    for (int64_t t = 0; t < T->t.tokens; ++t)
      for (int32_t h = 0; h < T->t.heads; ++h) {
        size_t off = static_cast<size_t>(T->row(t, h) - T->bytes.data());
        std::fill(in_row.begin() + static_cast<std::ptrdiff_t>(off),
                  in_row.begin() + static_cast<std::ptrdiff_t>(off + T->row_bytes()), 1);
      }
    int64_t touched = 0;
    for (size_t b = 0; b < T->bytes.size(); ++b)
      if (!in_row[b] && T->bytes[b] != fill) ++touched;
    EXPECT_EQ(touched, 0) << "bytes between rows of the output were written";
  }
}

HostTensor out_tensor(int64_t tokens, int32_t dtype, const LayoutSpec& L, unsigned char fill) {
  return make_tensor(nullptr, tokens, kKvHeads, kDim, dtype, L.layout, L.pad_inner, L.pad_outer, fill);
}

class ApiFetch : public ::testing::TestWithParam<int32_t> {};

TEST_P(ApiFetch, ExactBytesForEveryLayoutCombination) {
  const int32_t dtype = GetParam();
  const pq_config c = fetch_config(dtype);
  const size_t es = elem_size(dtype);
  std::vector<float> k = random_normal(static_cast<size_t>(kTokens * kKvHeads * kDim), 1, 2.0f);
  std::vector<float> v = random_normal(static_cast<size_t>(kTokens * kKvHeads * kDim), 2, 3.0f);
  std::vector<float> q = random_normal(static_cast<size_t>(kQHeads * kDim), 3);

  for (const LayoutSpec& in : kLayouts) {
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    HostTensor K = make_tensor(k.data(), kTokens, kKvHeads, kDim, dtype, in.layout, in.pad_inner,
                               in.pad_outer);
    HostTensor V = make_tensor(v.data(), kTokens, kKvHeads, kDim, dtype, in.layout, in.pad_inner,
                               in.pad_outer);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, K.get(), V.get()));
    RefRows ref;
    ref.add(K, V);
    // The caller may reuse its buffers right after the call.
    std::fill(K.bytes.begin(), K.bytes.end(), 0);
    std::fill(V.bytes.begin(), V.bytes.end(), 0);

    int64_t cap = selection_capacity(ctx, 1, 0);
    ASSERT_EQ(cap, 4 + 12 + 8);
    Sel sel(kKvHeads, cap);
    HostTensor Q = make_tensor(q.data(), 1, kQHeads, kDim, dtype);
    PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, Q.get(), sel.get()));

    for (const LayoutSpec& out : kLayouts) {
      std::string what = std::string(dtype_name(dtype)) + " in " + in.name + " out " + out.name;
      pq_stats before = stats(ctx);
      HostTensor OK = out_tensor(cap, dtype, out, 0x5c);
      HostTensor OV = out_tensor(cap, dtype, out, 0x5c);
      PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), OK.get(), OV.get())) << what;
      check_fetch(sel, OK, OV, ref, 0x5c, what);
      pq_stats after = stats(ctx);
      uint64_t rows = 0;
      for (int32_t cnt : sel.counts) rows += static_cast<uint64_t>(cnt);
      EXPECT_EQ(after.fetch_calls, before.fetch_calls + 1) << what;
      EXPECT_EQ(after.bytes_fetched - before.bytes_fetched, rows * kDim * es * 2) << what;
    }

    // A hand-made selection of every token, with different counts per head.
    Sel all(kKvHeads, kTokens);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      all.counts[static_cast<size_t>(h)] = static_cast<int32_t>(h == 0 ? kTokens : kTokens / 2);
      for (int64_t i = 0; i < all.counts[static_cast<size_t>(h)]; ++i)
        all.positions[static_cast<size_t>(h * kTokens + i)] =
            static_cast<int32_t>(h == 0 ? i : 2 * i + 1);
    }
    HostTensor AK = out_tensor(kTokens, dtype, kLayouts[3], 0x33);
    HostTensor AV = out_tensor(kTokens, dtype, kLayouts[3], 0x33);
    PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, all.get(), AK.get(), AV.get()));
    check_fetch(all, AK, AV, ref, 0x33, std::string(dtype_name(dtype)) + " all tokens, in " + in.name);
  }
}

TEST_P(ApiFetch, IncludesDecodeTokens) {
  const int32_t dtype = GetParam();
  const pq_config c = fetch_config(dtype);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
  std::vector<float> k = random_normal(static_cast<size_t>(kTokens * kKvHeads * kDim), 11);
  std::vector<float> v = random_normal(static_cast<size_t>(kTokens * kKvHeads * kDim), 12);
  HostTensor K = make_tensor(k.data(), kTokens, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR);
  HostTensor V = make_tensor(v.data(), kTokens, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 2, 0, K.get(), V.get()));
  RefRows ref;
  ref.add(K, V);
  std::vector<float> q = random_normal(static_cast<size_t>(kQHeads * kDim), 13);
  HostTensor Q = make_tensor(q.data(), 1, kQHeads, kDim, dtype);

  // 12 decode steps of one token, then one of 3 tokens; fetch after each.
  int64_t n = kTokens;
  for (int step = 0; step < 13; ++step) {
    int64_t add = step == 12 ? 3 : 1;
    std::vector<float> dk = random_normal(static_cast<size_t>(add * kKvHeads * kDim), 100 + step, 5.0f);
    std::vector<float> dv = random_normal(static_cast<size_t>(add * kKvHeads * kDim), 200 + step, 5.0f);
    HostTensor AK = make_tensor(dk.data(), add, kKvHeads, kDim, dtype, PQ_LAYOUT_TOKEN_MAJOR, 1, 2);
    HostTensor AV = make_tensor(dv.data(), add, kKvHeads, kDim, dtype, PQ_LAYOUT_TOKEN_MAJOR, 1, 2);
    PQ_ASSERT_OK(pq_decode_append(ctx, 2, 0, AK.get(), AV.get()));
    ref.add(AK, AV);
    n += add;

    int64_t cap = selection_capacity(ctx, 2, 0);
    Sel sel(kKvHeads, cap);
    PQ_ASSERT_OK(pq_decode_select(ctx, 2, 0, Q.get(), sel.get()));
    for (int32_t h = 0; h < kKvHeads; ++h) {
      std::vector<int32_t> row = sel.row(h);
      ASSERT_FALSE(row.empty());
      EXPECT_EQ(row.back(), n - 1) << "the newest token is a local token";
    }
    HostTensor OK = make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR, 0, 0, 0x77);
    HostTensor OV = make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR, 0, 0, 0x77);
    PQ_ASSERT_OK(pq_fetch_kv(ctx, 2, 0, sel.get(), OK.get(), OV.get()));
    check_fetch(sel, OK, OV, ref, 0x77, "step " + std::to_string(step));
  }
  // All appended tokens can be fetched directly too.
  Sel tail(kKvHeads, n - kTokens);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    tail.counts[static_cast<size_t>(h)] = static_cast<int32_t>(n - kTokens);
    for (int64_t i = 0; i < n - kTokens; ++i)
      tail.positions[static_cast<size_t>(h * (n - kTokens) + i)] = static_cast<int32_t>(kTokens + i);
  }
  HostTensor TK = make_tensor(nullptr, n - kTokens, kKvHeads, kDim, dtype, PQ_LAYOUT_TOKEN_MAJOR, 0, 0, 0x11);
  HostTensor TV = make_tensor(nullptr, n - kTokens, kKvHeads, kDim, dtype, PQ_LAYOUT_TOKEN_MAJOR, 0, 0, 0x11);
  PQ_ASSERT_OK(pq_fetch_kv(ctx, 2, 0, tail.get(), TK.get(), TV.get()));
  check_fetch(tail, TK, TV, ref, 0x11, "appended tokens");

  pq_stats s = stats(ctx);
  EXPECT_EQ(s.fetch_calls, 14u);
  EXPECT_EQ(s.select_calls, 13u);
  EXPECT_GT(s.bytes_fetched, 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ApiFetch,
                         ::testing::Values(PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST(ApiFetchStats, CountersGrowPerSequenceAndContext) {
  const pq_config c = fetch_config(PQ_DTYPE_F16);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  std::vector<float> k = random_normal(static_cast<size_t>(kTokens * kKvHeads * kDim), 21);
  HostTensor K = make_tensor(k.data(), kTokens, kKvHeads, kDim, PQ_DTYPE_F16);
  std::vector<float> q = random_normal(static_cast<size_t>(kQHeads * kDim), 22);
  HostTensor Q = make_tensor(q.data(), 1, kQHeads, kDim, PQ_DTYPE_F16);
  for (uint64_t seq : {1u, 2u}) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, seq));
    PQ_ASSERT_OK(pq_prefill_layer(ctx, seq, 0, K.get(), K.get()));
  }
  uint64_t last_bytes = 0, last_calls = 0;
  for (int i = 0; i < 5; ++i) {
    for (uint64_t seq : {1u, 2u}) {
      Sel sel(kKvHeads, 24);
      PQ_ASSERT_OK(pq_decode_select(ctx, seq, 0, Q.get(), sel.get()));
      HostTensor OK = make_tensor(nullptr, 24, kKvHeads, kDim, PQ_DTYPE_F16);
      HostTensor OV = make_tensor(nullptr, 24, kKvHeads, kDim, PQ_DTYPE_F16);
      PQ_ASSERT_OK(pq_fetch_kv(ctx, seq, 0, sel.get(), OK.get(), OV.get()));
    }
    pq_stats s = stats(ctx);
    EXPECT_GT(s.bytes_fetched, last_bytes);
    EXPECT_EQ(s.fetch_calls, last_calls + 2);
    last_bytes = s.bytes_fetched;
    last_calls = s.fetch_calls;
  }
  pq_stats s1;
  std::memset(&s1, 0, sizeof s1);
  s1.struct_size = sizeof s1;
  PQ_ASSERT_OK(pq_sequence_stats_get(ctx, 1, &s1));
  EXPECT_EQ(s1.fetch_calls, 5u);
  EXPECT_EQ(s1.select_calls, 5u);
  EXPECT_EQ(s1.bytes_fetched, 5u * 2 * 24 * kDim * 2 * 2);  // 24 rows per head, f16, K+V
  // Removed sequences' counters stay in the context totals.
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 1));
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.fetch_calls, 10u);
  EXPECT_EQ(s.bytes_fetched, last_bytes);
  EXPECT_EQ(s.sequences, 1);
  EXPECT_EQ(s.tokens, kTokens);
}

}  // namespace
