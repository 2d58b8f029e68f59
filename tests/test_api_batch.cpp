// pq_decode_select_batch and pq_fetch_kv_batch: one layer for a batch of
// sequences gives exactly what the per-sequence calls give, item by item;
// items fail on their own; call-level errors touch nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kLayers = 2, kQHeads = 4, kKvHeads = 2, kDim = 16;

class ApiBatch : public ::testing::TestWithParam<int32_t> {
 protected:
  // Sequences of different lengths (some shorter than sink + local, some
  // long enough for a middle), each prefilled on both layers.
  void SetUp() override {
    pq_config c = make_config(kLayers, kQHeads, kKvHeads, kDim);
    c.selector = GetParam();
    c.sink_tokens = 4;
    c.local_tokens = 8;
    c.topk_tokens = 12;
    c.pq_subspaces = 4;
    c.pq_bits = 4;
    c.cache_tokens = 64;
    c.cache_block_tokens = 8;
    c.worker_threads = 2;
    ctx_ = Ctx(c);
    ASSERT_TRUE(ctx_.ok()) << pq_last_error();
    for (size_t i = 0; i < ids_.size(); ++i) {
      PQ_ASSERT_OK(pq_sequence_add(ctx_, ids_[i]));
      const int64_t n = lengths_[i];
      for (int32_t l = 0; l < kLayers; ++l) {
        auto k = random_normal(static_cast<size_t>(n) * kKvHeads * kDim, 100 * i + l);
        auto v = random_normal(static_cast<size_t>(n) * kKvHeads * kDim, 200 * i + l);
        HostTensor kt = make_tensor(k, n, kKvHeads, kDim, PQ_DTYPE_F32);
        HostTensor vt = make_tensor(v, n, kKvHeads, kDim, PQ_DTYPE_F32);
        PQ_ASSERT_OK(pq_prefill_layer(ctx_, ids_[i], l, kt.get(), vt.get()));
      }
      queries_.push_back(make_tensor(random_normal(kQHeads * kDim, 300 + i), 1, kQHeads, kDim,
                                     PQ_DTYPE_F32));
    }
    PQ_ASSERT_OK(pq_wait_builds(ctx_));
  }

  int64_t capacity(size_t i, int32_t layer) { return selection_capacity(ctx_, ids_[i], layer); }

  Ctx ctx_;
  std::vector<uint64_t> ids_ = {11, 7, 1000, 3, 42};
  std::vector<int64_t> lengths_ = {300, 9, 700, 64, 130};
  std::vector<HostTensor> queries_;
};

// Per-sequence selections, to compare with.
std::vector<Sel> select_one_by_one(pq_context* ctx, const std::vector<uint64_t>& ids,
                                   std::vector<HostTensor>& queries, int32_t layer) {
  std::vector<Sel> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    out.emplace_back(kKvHeads, selection_capacity(ctx, ids[i], layer));
    EXPECT_EQ(pq_decode_select(ctx, ids[i], layer, queries[i].get(), out.back().get()), PQ_OK)
        << pq_last_error();
  }
  return out;
}

TEST_P(ApiBatch, SelectGivesWhatThePerSequenceCallsGive) {
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<Sel> want = select_one_by_one(ctx_, ids_, queries_, layer);
    std::vector<Sel> got;
    std::vector<pq_select_item> items(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) got.emplace_back(kKvHeads, capacity(i, layer) + 3);
    for (size_t i = 0; i < ids_.size(); ++i) {
      items[i].seq_id = ids_[i];
      items[i].query = *queries_[i].get();
      items[i].out = *got[i].get();
      items[i].status = PQ_ERR_INTERNAL;  // must be overwritten
    }
    PQ_ASSERT_OK(pq_decode_select_batch(ctx_, layer, items.data(),
                                        static_cast<int64_t>(items.size())));
    for (size_t i = 0; i < ids_.size(); ++i) {
      EXPECT_EQ(items[i].status, PQ_OK);
      for (int32_t h = 0; h < kKvHeads; ++h)
        EXPECT_EQ(got[i].row(h), want[i].row(h)) << "item " << i << " head " << h;
    }
  }
}

TEST_P(ApiBatch, FetchGivesWhatThePerSequenceCallsGive) {
  const int32_t layer = 1;
  std::vector<Sel> sel = select_one_by_one(ctx_, ids_, queries_, layer);
  // Two contexts' worth of state would differ in their caches: compare the
  // batch against per-sequence fetches of the same selections on a twin.
  std::vector<HostTensor> want_k, want_v, got_k, got_v;
  for (size_t i = 0; i < ids_.size(); ++i) {
    const int64_t rows = sel[i].max_count();
    want_k.push_back(make_tensor(nullptr, rows, kKvHeads, kDim, PQ_DTYPE_F32));
    want_v.push_back(make_tensor(nullptr, rows, kKvHeads, kDim, PQ_DTYPE_F32));
    got_k.push_back(make_tensor(nullptr, rows, kKvHeads, kDim, PQ_DTYPE_F32,
                                PQ_LAYOUT_HEAD_MAJOR));
    got_v.push_back(make_tensor(nullptr, rows, kKvHeads, kDim, PQ_DTYPE_F32,
                                PQ_LAYOUT_HEAD_MAJOR));
  }
  const pq_stats before = stats(ctx_);
  for (size_t i = 0; i < ids_.size(); ++i)
    PQ_ASSERT_OK(pq_fetch_kv(ctx_, ids_[i], layer, sel[i].get(), want_k[i].get(),
                             want_v[i].get()));
  const pq_stats middle = stats(ctx_);
  std::vector<pq_fetch_item> items(ids_.size());
  for (size_t i = 0; i < ids_.size(); ++i) {
    items[i].seq_id = ids_[i];
    items[i].selection = *sel[i].get();
    items[i].out_keys = *got_k[i].get();
    items[i].out_values = *got_v[i].get();
    items[i].status = PQ_ERR_INTERNAL;
  }
  PQ_ASSERT_OK(pq_fetch_kv_batch(ctx_, layer, items.data(), static_cast<int64_t>(items.size())));
  const pq_stats after = stats(ctx_);
  for (size_t i = 0; i < ids_.size(); ++i) {
    EXPECT_EQ(items[i].status, PQ_OK);
    for (int64_t t = 0; t < sel[i].max_count(); ++t)
      for (int32_t h = 0; h < kKvHeads; ++h) {
        EXPECT_EQ(0, std::memcmp(got_k[i].row(t, h), want_k[i].row(t, h), got_k[i].row_bytes()))
            << "item " << i << " row " << t << " head " << h;
        EXPECT_EQ(0, std::memcmp(got_v[i].row(t, h), want_v[i].row(t, h), got_v[i].row_bytes()));
      }
  }
  // The batch did the same work: fetch calls and bytes counted per item.
  EXPECT_EQ(after.fetch_calls - middle.fetch_calls, middle.fetch_calls - before.fetch_calls);
  EXPECT_EQ(after.bytes_fetched - middle.bytes_fetched, middle.bytes_fetched - before.bytes_fetched);
}

INSTANTIATE_TEST_SUITE_P(Selectors, ApiBatch,
                         ::testing::Values(PQ_SELECTOR_PQ, PQ_SELECTOR_EXACT, PQ_SELECTOR_QUEST,
                                           PQ_SELECTOR_H2O),
                         [](const ::testing::TestParamInfo<int32_t>& p) {
                           switch (p.param) {
                             case PQ_SELECTOR_PQ: return std::string("pq");
                             case PQ_SELECTOR_EXACT: return std::string("exact");
                             case PQ_SELECTOR_QUEST: return std::string("quest");
                             default: return std::string("h2o");
                           }
                         });

class ApiBatchErrors : public ApiBatch {};

// A status no call writes, to see which items a failed call touched. It is
// put and read through memcpy: 123 is no pq_status value, and loading it as
// one is undefined (UBSan's enum check says so).
constexpr int kPoison = 123;
static_assert(sizeof(pq_status) == sizeof(int), "poison() writes an int");
void poison(pq_status* status) { std::memcpy(status, &kPoison, sizeof kPoison); }
int raw(const pq_status& status) {
  int value = 0;
  std::memcpy(&value, &status, sizeof value);
  return value;
}

TEST_P(ApiBatchErrors, ItemsFailOnTheirOwnAndTheFirstIsNamed) {
  const int32_t layer = 0;
  std::vector<Sel> want = select_one_by_one(ctx_, ids_, queries_, layer);
  std::vector<Sel> got;
  for (size_t i = 0; i < ids_.size(); ++i) got.emplace_back(kKvHeads, capacity(i, layer));
  got[3] = Sel(kKvHeads, capacity(3, layer) - 1);  // too small by one
  std::vector<pq_select_item> items(ids_.size());
  for (size_t i = 0; i < ids_.size(); ++i) {
    items[i].seq_id = ids_[i];
    items[i].query = *queries_[i].get();
    items[i].out = *got[i].get();
  }
  items[1].seq_id = 999;  // no such sequence
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, layer, items.data(),
                                       static_cast<int64_t>(items.size())),
                PQ_ERR_NOT_FOUND, "items[1] (seq_id 999)");
  EXPECT_EQ(items[0].status, PQ_OK);
  EXPECT_EQ(items[1].status, PQ_ERR_NOT_FOUND);
  EXPECT_EQ(items[2].status, PQ_OK);
  EXPECT_EQ(items[3].status, PQ_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(items[4].status, PQ_OK);
  for (size_t i : {0u, 2u, 4u})
    for (int32_t h = 0; h < kKvHeads; ++h) EXPECT_EQ(got[i].row(h), want[i].row(h));
  // The too-small item learned the size it needs, and nothing else.
  for (int32_t h = 0; h < kKvHeads; ++h) EXPECT_EQ(got[3].counts[h], capacity(3, layer));
  for (int32_t p : got[3].positions) EXPECT_EQ(p, -1);
  for (int32_t c : got[1].counts) EXPECT_EQ(c, -1);

  // A bad query shape fails its item with the per-sequence call's message.
  HostTensor wrong = make_tensor(nullptr, 1, kQHeads + 1, kDim, PQ_DTYPE_F32);
  items[1].seq_id = ids_[1];
  items[1].query = *wrong.get();
  got[3] = Sel(kKvHeads, capacity(3, layer));
  items[3].out = *got[3].get();
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, layer, items.data(),
                                       static_cast<int64_t>(items.size())),
                PQ_ERR_INVALID_ARGUMENT, "items[1]", "query");
  EXPECT_EQ(items[1].status, PQ_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(items[3].status, PQ_OK);
}

TEST_P(ApiBatchErrors, CallLevelErrorsRunNoItem) {
  const int32_t layer = 0;
  std::vector<Sel> got;
  for (size_t i = 0; i < ids_.size(); ++i) got.emplace_back(kKvHeads, capacity(i, layer));
  std::vector<pq_select_item> items(ids_.size());
  auto reset = [&] {
    for (size_t i = 0; i < ids_.size(); ++i) {
      items[i].seq_id = ids_[i];
      items[i].query = *queries_[i].get();
      items[i].out = *got[i].get();
      poison(&items[i].status);
    }
  };
  auto untouched = [&] {
    for (size_t i = 0; i < ids_.size(); ++i) {
      EXPECT_EQ(raw(items[i].status), kPoison) << i;
      for (int32_t c : got[i].counts) EXPECT_EQ(c, -1) << i;
    }
  };
  const int64_t n = static_cast<int64_t>(items.size());
  reset();
  items[4].seq_id = ids_[1];
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, layer, items.data(), n), PQ_ERR_INVALID_ARGUMENT,
                "items[4].seq_id 7 repeats items[1]");
  untouched();
  reset();
  items[2].out.counts = got[0].counts.data();  // two items write one array
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, layer, items.data(), n), PQ_ERR_INVALID_ARGUMENT,
                "items[0].out.counts", "items[2].out.counts");
  untouched();
  reset();
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, kLayers, items.data(), n), PQ_ERR_INVALID_ARGUMENT,
                "layer");
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, layer, items.data(), -1), PQ_ERR_INVALID_ARGUMENT,
                "count");
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, layer, nullptr, 2), PQ_ERR_INVALID_ARGUMENT,
                "items");
  PQ_EXPECT_ERR(pq_decode_select_batch(nullptr, layer, items.data(), n), PQ_ERR_INVALID_ARGUMENT,
                "ctx");
  untouched();
  PQ_EXPECT_OK(pq_decode_select_batch(ctx_, layer, nullptr, 0));
  PQ_EXPECT_OK(pq_fetch_kv_batch(ctx_, layer, nullptr, 0));
}

TEST_P(ApiBatchErrors, FetchOutputsOfTwoItemsMustNotOverlap) {
  const int32_t layer = 0;
  std::vector<Sel> sel = select_one_by_one(ctx_, ids_, queries_, layer);
  int32_t rows = 0;
  for (Sel& s : sel) rows = std::max(rows, s.max_count());
  const int64_t n = static_cast<int64_t>(ids_.size());
  // One buffer for the whole batch, [kv_head][item][rows][dim]: every
  // item's rows interleave with the others' without touching. Accepted.
  std::vector<float> keys(static_cast<size_t>(kKvHeads) * n * rows * kDim, -7.f);
  std::vector<float> values(keys.size(), -7.f);
  std::vector<pq_fetch_item> items(ids_.size());
  auto item_tensor = [&](std::vector<float>& buf, int64_t i) {
    pq_tensor t{};
    t.data = buf.data() + i * rows * kDim;
    t.dtype = PQ_DTYPE_F32;
    t.memory = PQ_MEMORY_HOST;
    t.tokens = rows;
    t.heads = kKvHeads;
    t.head_dim = kDim;
    t.token_stride = kDim;
    t.head_stride = n * rows * kDim;
    return t;
  };
  for (int64_t i = 0; i < n; ++i) {
    items[i].seq_id = ids_[i];
    items[i].selection = *sel[i].get();
    items[i].out_keys = item_tensor(keys, i);
    items[i].out_values = item_tensor(values, i);
  }
  PQ_ASSERT_OK(pq_fetch_kv_batch(ctx_, layer, items.data(), n));
  // Shifting one item by a row makes it write another item's rows.
  items[2].out_keys.data = static_cast<float*>(items[2].out_keys.data) + kDim;
  for (auto& it : items) poison(&it.status);
  PQ_EXPECT_ERR(pq_fetch_kv_batch(ctx_, layer, items.data(), n), PQ_ERR_INVALID_ARGUMENT,
                "items[2].out_keys");
  for (auto& it : items) EXPECT_EQ(raw(it.status), kPoison);
  // An item whose own arguments are wrong fails alone.
  items[2].out_keys = item_tensor(keys, 2);
  items[4].selection.counts = nullptr;
  PQ_EXPECT_ERR(pq_fetch_kv_batch(ctx_, layer, items.data(), n), PQ_ERR_INVALID_ARGUMENT,
                "items[4]", "counts");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(items[i].status, PQ_OK);
  EXPECT_EQ(items[4].status, PQ_ERR_INVALID_ARGUMENT);
}

INSTANTIATE_TEST_SUITE_P(Pq, ApiBatchErrors, ::testing::Values(PQ_SELECTOR_PQ));

}  // namespace
