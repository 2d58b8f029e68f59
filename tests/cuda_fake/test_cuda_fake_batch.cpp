// A batch of sequences at one layer on the CUDA backend, through the host
// fake of the plug-in and its counters: pq_decode_select_batch chooses every
// item's middle with one scan and one top-k launch and one host wait,
// whatever the batch, where per-sequence calls take two launches and one
// wait each; pq_fetch_kv_batch gathers every item in one launch. Results
// equal the CPU backend's. Items on different streams fall back to one
// chain per item, still correct.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

constexpr int32_t kLayer = 1;

pq_config batch_config() {
  pq_config c = base_config(PQ_DTYPE_F32);
  c.cache_tokens = 0;  // no slot fills: the fetch is one gather
  return c;
}

struct Batch {
  std::vector<uint64_t> ids;
  std::vector<Step> steps;
  std::vector<Sel> want, got;
};

// Adds and prefills `n` sequences of different lengths on both contexts.
Batch make_batch(pq_context* cpu, pq_context* cuda, int n) {
  Batch b;
  for (int i = 0; i < n; ++i) {
    const uint64_t id = 100 + i;
    b.ids.push_back(id);
    for (pq_context* ctx : {cpu, cuda}) EXPECT_EQ(pq_sequence_add(ctx, id), PQ_OK);
    const int64_t tokens = 180 + 37 * i;
    for (int32_t l = 0; l < kLayers; ++l) {
      HostTensor k = make_tensor(random_normal(tokens * kKvHeads * kDim, 7 * id + l), tokens,
                                 kKvHeads, kDim, PQ_DTYPE_F32);
      HostTensor v = make_tensor(random_normal(tokens * kKvHeads * kDim, 11 * id + l), tokens,
                                 kKvHeads, kDim, PQ_DTYPE_F32);
      for (pq_context* ctx : {cpu, cuda})
        EXPECT_EQ(pq_prefill_layer(ctx, id, l, k.get(), v.get()), PQ_OK) << pq_last_error();
    }
  }
  for (pq_context* ctx : {cpu, cuda}) EXPECT_EQ(pq_wait_builds(ctx), PQ_OK);
  for (uint64_t id : b.ids) {
    b.steps.push_back(step_data(kLayer, 0, PQ_DTYPE_F32, id));
    b.want.emplace_back(kKvHeads, selection_capacity(cpu, id, kLayer));
    b.got.emplace_back(kKvHeads, selection_capacity(cuda, id, kLayer));
  }
  for (size_t i = 0; i < b.ids.size(); ++i)
    EXPECT_EQ(pq_decode_select(cpu, b.ids[i], kLayer, b.steps[i].q.get(), b.want[i].get()), PQ_OK);
  return b;
}

TEST(FakeCudaBatch, SelectBatchIsOneLaunchChainAndOneWait) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const pq_config c = batch_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  const int n = 8;
  Batch b = make_batch(cpu, cuda, n);
  if (HasFatalFailure()) return;

  // Per sequence first: two launches and one wait each (and every code of
  // each middle goes up, once).
  std::vector<Sel> single;
  for (int i = 0; i < n; ++i) single.emplace_back(kKvHeads, selection_capacity(cuda, b.ids[i], kLayer));
  pq_fake_cuda_counters before = Fake::get().counters();
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(pq_decode_select(cuda, b.ids[i], kLayer, b.steps[i].q.get(), single[i].get()), PQ_OK)
        << pq_last_error();
  const pq_fake_cuda_counters loop = counters_since(before);
  EXPECT_EQ(loop.kernel_launches, 2u * n);
  EXPECT_EQ(loop.host_waits, static_cast<uint64_t>(n));

  // The batch: the same selections, two launches and one wait in all.
  std::vector<pq_select_item> items(n);
  for (int i = 0; i < n; ++i) {
    items[i].seq_id = b.ids[i];
    items[i].query = *b.steps[i].q.get();
    items[i].out = *b.got[i].get();
  }
  before = Fake::get().counters();
  ASSERT_EQ(pq_decode_select_batch(cuda, kLayer, items.data(), n), PQ_OK) << pq_last_error();
  const pq_fake_cuda_counters batch = counters_since(before);
  EXPECT_EQ(batch.kernel_launches, 2u) << "one scan and one top-k for the batch";
  EXPECT_EQ(batch.host_waits, 1u) << "one wait for the batch";

  // Device queries: they come over together, one more wait in all.
  std::vector<std::unique_ptr<DeviceTensor>> dq;
  for (int i = 0; i < n; ++i) {
    dq.push_back(std::make_unique<DeviceTensor>(b.steps[i].q));
    items[i].query = dq.back()->t;
  }
  before = Fake::get().counters();
  ASSERT_EQ(pq_decode_select_batch(cuda, kLayer, items.data(), n), PQ_OK) << pq_last_error();
  EXPECT_EQ(counters_since(before).host_waits, 2u) << "the queries' read and the positions'";
  EXPECT_EQ(counters_since(before).kernel_launches, 2u);
  // Up: every item's LUTs and the two row tables, in one copy; the codes
  // stayed resident from the per-sequence calls.
  const uint64_t lut_bytes = uint64_t{kKvHeads} * (kQHeads / kKvHeads) * c.pq_subspaces *
                             (uint64_t{1} << c.pq_bits) * sizeof(float);
  EXPECT_EQ(batch.bytes_to_device,
            n * (lut_bytes + kKvHeads * (sizeof(pq_scan_row) + sizeof(pq_topk_row))));
  for (int i = 0; i < n; ++i)
    for (int32_t h = 0; h < kKvHeads; ++h) {
      ASSERT_EQ(b.got[i].row(h), b.want[i].row(h)) << "item " << i << " head " << h;
      ASSERT_EQ(single[i].row(h), b.want[i].row(h)) << "item " << i << " head " << h;
    }
  const pq_stats s = stats(cuda);
  EXPECT_EQ(s.select_calls, 3u * n) << "each batched item counts as a selection";
}

TEST(FakeCudaBatch, FetchBatchIsOneGather) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const pq_config c = batch_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  const int n = 6;
  Batch b = make_batch(cpu, cuda, n);
  if (HasFatalFailure()) return;
  std::vector<HostTensor> hk, hv;
  std::vector<std::unique_ptr<DeviceTensor>> dk, dv;
  std::vector<pq_fetch_item> items(n);
  uint64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t cap = b.want[i].capacity;
    hk.push_back(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR));
    hv.push_back(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR));
    ASSERT_EQ(pq_fetch_kv(cpu, b.ids[i], kLayer, b.want[i].get(), hk[i].get(), hv[i].get()), PQ_OK);
    dk.push_back(std::make_unique<DeviceTensor>(hk[i]));
    dv.push_back(std::make_unique<DeviceTensor>(hv[i]));
    items[i].seq_id = b.ids[i];
    items[i].selection = *b.want[i].get();
    items[i].out_keys = dk[i]->t;
    items[i].out_values = dv[i]->t;
    for (int32_t h = 0; h < kKvHeads; ++h) rows += b.want[i].counts[h];
  }
  const pq_fake_cuda_counters before = Fake::get().counters();
  ASSERT_EQ(pq_fetch_kv_batch(cuda, kLayer, items.data(), n), PQ_OK) << pq_last_error();
  const pq_fake_cuda_counters d = counters_since(before);
  EXPECT_EQ(d.kernel_launches, 1u) << "one gather for every item's K and V";
  EXPECT_LE(d.host_waits, 1u);
  // Up: each item's positions, counts and gather entry, and each layer's
  // chunk addresses at its first device fetch: 4 bytes a row and a little.
  uint64_t positions = 0, chunk_tables = 0;
  for (int i = 0; i < n; ++i) {
    positions += sizeof(pq_selected_gather) +
                 uint64_t{kKvHeads} * (1 + b.want[i].max_count()) * sizeof(int32_t);
    int64_t tokens = 0;
    ASSERT_EQ(pq_sequence_length(cuda, b.ids[i], kLayer, &tokens), PQ_OK);
    chunk_tables += 2 * ((tokens + 255) / 256) * sizeof(void*);
  }
  EXPECT_EQ(d.bytes_to_device, positions + chunk_tables) << "positions, not a plan or rows";
  EXPECT_EQ(stats(cuda).bytes_staged, 0u);
  char err[256] = {0};
  ASSERT_EQ(Fake::get().table->stream_synchronize(nullptr, err, sizeof err), 0) << err;
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(dk[i]->buffer.download() == hk[i].bytes) << "item " << i;
    EXPECT_TRUE(dv[i]->buffer.download() == hv[i].bytes) << "item " << i;
  }
}

// Items on different streams cannot share one launch chain: each runs its
// own (two launches and one wait per item), with the same selections.
TEST(FakeCudaBatch, ItemsOnDifferentStreamsRunOneChainEach) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const pq_config c = batch_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  const int n = 3;
  Batch b = make_batch(cpu, cuda, n);
  if (HasFatalFailure()) return;
  void* stream = nullptr;
  char err[256] = {0};
  ASSERT_EQ(Fake::get().table->stream_create(&stream, err, sizeof err), 0) << err;
  ASSERT_EQ(pq_sequence_set_stream(cuda, b.ids[1], stream), PQ_OK) << pq_last_error();
  std::vector<pq_select_item> items(n);
  for (int i = 0; i < n; ++i) {
    items[i].seq_id = b.ids[i];
    items[i].query = *b.steps[i].q.get();
    items[i].out = *b.got[i].get();
  }
  const pq_fake_cuda_counters before = Fake::get().counters();
  ASSERT_EQ(pq_decode_select_batch(cuda, kLayer, items.data(), n), PQ_OK) << pq_last_error();
  const pq_fake_cuda_counters d = counters_since(before);
  EXPECT_EQ(d.kernel_launches, 2u * n);
  EXPECT_EQ(d.host_waits, static_cast<uint64_t>(n));
  for (int i = 0; i < n; ++i)
    for (int32_t h = 0; h < kKvHeads; ++h)
      EXPECT_EQ(b.got[i].row(h), b.want[i].row(h)) << "item " << i << " head " << h;
  ASSERT_EQ(pq_sequence_set_stream(cuda, b.ids[1], nullptr), PQ_OK);
  ASSERT_EQ(Fake::get().table->stream_destroy(stream, err, sizeof err), 0) << err;
}

}  // namespace
