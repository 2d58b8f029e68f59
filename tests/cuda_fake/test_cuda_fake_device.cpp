// The decode step kept on the device (pq_decode_select_device,
// pq_fetch_kv_device) on the CUDA backend through the host fake of the
// plug-in: with a device query and device selection arrays, select and
// fetch are enqueued on the stream with no host wait and no LUT upload (the
// table is built on the device), and give what the CPU backend's
// pq_decode_select and pq_fetch_kv give. Plus every refusal: the CPU
// backend, host memory, another selector, a small capacity, a store the
// device cannot read; and positions outside the sequence, which are not
// read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

void sync_all() {
  char err[256] = {0};
  ASSERT_EQ(Fake::get().table->stream_synchronize(nullptr, err, sizeof err), 0) << err;
}

void prefill(pq_context* ctx, uint64_t id, int64_t tokens, int32_t dtype) {
  ASSERT_EQ(pq_sequence_add(ctx, id), PQ_OK);
  for (int32_t l = 0; l < kLayers; ++l) {
    HostTensor k = make_tensor(random_normal(tokens * kKvHeads * kDim, 3 * id + l), tokens,
                               kKvHeads, kDim, dtype);
    HostTensor v = make_tensor(random_normal(tokens * kKvHeads * kDim, 5 * id + l), tokens,
                               kKvHeads, kDim, dtype);
    ASSERT_EQ(pq_prefill_layer(ctx, id, l, k.get(), v.get()), PQ_OK) << pq_last_error();
  }
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
}

class FakeCudaDeviceStep : public ::testing::TestWithParam<int32_t> {};

TEST_P(FakeCudaDeviceStep, SelectAndFetchStayOnTheDeviceAndMatchTheCpu) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const int32_t dtype = GetParam();
  const pq_config c = base_config(dtype);  // block cache on: a device fetch bypasses it
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 700, dtype);
  if (HasFatalFailure()) return;
  const int32_t m = c.pq_subspaces;
  for (int64_t step = 0; step < 40; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(step));
      Step d = step_data(l, step, dtype, 1);
      for (pq_context* ctx : {cpu.get(), cuda.get()})
        ASSERT_EQ(pq_decode_append(ctx, 1, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
      const int64_t cap = selection_capacity(cpu, 1, l);
      Sel want(kKvHeads, cap);
      ASSERT_EQ(pq_decode_select(cpu, 1, l, d.q.get(), want.get()), PQ_OK);
      DeviceTensor dq(d.q);
      DeviceSel got(cap);
      pq_fake_cuda_counters before = Fake::get().counters();
      ASSERT_EQ(pq_decode_select_device(cuda, 1, l, &dq.t, &got.s), PQ_OK) << pq_last_error();
      pq_fake_cuda_counters sel = counters_since(before);
      EXPECT_EQ(sel.host_waits, 0u) << "the selection stays on the device";
      EXPECT_EQ(sel.kernel_launches, 4u) << "LUT, scan, top-k, fill";
      // Up: the codes of the token that left the window (and, at a layer's
      // first device selection, its middle's codes and its centroids); never
      // a LUT.
      if (step > 0) EXPECT_EQ(sel.bytes_to_device, uint64_t{kKvHeads} * m);

      HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR);
      HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR);
      ASSERT_EQ(pq_fetch_kv(cpu, 1, l, want.get(), hk.get(), hv.get()), PQ_OK);
      DeviceTensor dk(make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR));
      DeviceTensor dv(make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR));
      before = Fake::get().counters();
      ASSERT_EQ(pq_fetch_kv_device(cuda, 1, l, &got.s, &dk.t, &dv.t), PQ_OK) << pq_last_error();
      const pq_fake_cuda_counters fetch = counters_since(before);
      EXPECT_EQ(fetch.host_waits, 0u) << "the fetch reads the selection on the device";
      EXPECT_EQ(fetch.kernel_launches, 1u);
      EXPECT_EQ(Fake::get().pending() > 0, true) << "nothing was left for the stream to run";
      sync_all();
      for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(got.row(h), want.row(h)) << "head " << h;
      ASSERT_TRUE(dk.buffer.download() == hk.bytes) << "fetched keys differ";
      ASSERT_TRUE(dv.buffer.download() == hv.bytes) << "fetched values differ";
    }
  EXPECT_EQ(stats(cuda).bytes_staged, 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FakeCudaDeviceStep,
                         ::testing::Values(PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16),
                         [](const ::testing::TestParamInfo<int32_t>& p) {
                           return std::string(p.param == PQ_DTYPE_F32   ? "f32"
                                              : p.param == PQ_DTYPE_F16 ? "f16"
                                                                        : "bf16");
                         });

TEST(FakeCudaDeviceStepErrors, RefusalsNameWhatIsWrongAndWriteNothing) {
  ASSERT_NE(Fake::get().table, nullptr);
  const pq_config c = base_config(PQ_DTYPE_F32);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 300, PQ_DTYPE_F32);
  if (HasFatalFailure()) return;
  Step d = step_data(0, 0, PQ_DTYPE_F32, 1);
  DeviceTensor dq(d.q);
  const int64_t cap = selection_capacity(cuda, 1, 0);
  DeviceSel sel(cap);
  PQ_EXPECT_ERR(pq_decode_select_device(cpu, 1, 0, d.q.get(), &sel.s), PQ_ERR_UNSUPPORTED,
                "needs the CUDA backend");
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, d.q.get(), &sel.s), PQ_ERR_UNSUPPORTED,
                "query.memory is PQ_MEMORY_HOST");
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, &dq.t, nullptr), PQ_ERR_INVALID_ARGUMENT,
                "out is NULL");
  // Host arrays for the selection: the device does not know them.
  Sel host(kKvHeads, cap);
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, &dq.t, host.get()), PQ_ERR_UNSUPPORTED,
                "out->positions is not memory CUDA knows as device memory");
  // Too small: the message says what is needed; the device counts stay as
  // they were (0xCD from the fake's allocation).
  DeviceSel small(cap - 1);
  const std::vector<uint8_t> counts_before = small.counts.download();
  const std::string needs = "needs " + std::to_string(cap);
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, &dq.t, &small.s), PQ_ERR_BUFFER_TOO_SMALL,
                needs.c_str());
  EXPECT_TRUE(small.counts.download() == counts_before);
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 9, 0, &dq.t, &sel.s), PQ_ERR_NOT_FOUND, "9");

  // The fetch: host outputs, outputs shorter than the capacity.
  ASSERT_EQ(pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s), PQ_OK) << pq_last_error();
  HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_fetch_kv_device(cuda, 1, 0, &sel.s, hk.get(), hv.get()), PQ_ERR_UNSUPPORTED,
                "out_keys.memory is PQ_MEMORY_HOST");
  DeviceTensor short_k(make_tensor(nullptr, cap - 1, kKvHeads, kDim, PQ_DTYPE_F32));
  DeviceTensor dv(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32));
  PQ_EXPECT_ERR(pq_fetch_kv_device(cuda, 1, 0, &sel.s, &short_k.t, &dv.t),
                PQ_ERR_INVALID_ARGUMENT, "out_keys");
  sync_all();
}

TEST(FakeCudaDeviceStepErrors, OtherSelectorsAndCallerStoresAreRefused) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = base_config(PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_EXACT;
  Ctx exact = make_fake_cuda_ctx(c);
  ASSERT_TRUE(exact.ok()) << pq_last_error();
  prefill(exact, 1, 300, PQ_DTYPE_F32);
  if (HasFatalFailure()) return;
  Step d = step_data(0, 0, PQ_DTYPE_F32, 1);
  DeviceTensor dq(d.q);
  const int64_t cap = selection_capacity(exact, 1, 0);
  DeviceSel sel(cap);
  PQ_EXPECT_ERR(pq_decode_select_device(exact, 1, 0, &dq.t, &sel.s), PQ_ERR_UNSUPPORTED,
                "PQ selector only");

  // A store in the caller's host_alloc memory: the device cannot read it.
  pq_hooks hooks;
  pq_hooks_default(&hooks);
  hooks.host_alloc = [](void*, size_t bytes, size_t alignment) -> void* {
    return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  };
  hooks.host_free = [](void*, void* p, size_t) { std::free(p); };
  pq_config pc = base_config(PQ_DTYPE_F32);
  pc.backend = PQ_BACKEND_CUDA;
  pc.cuda_plugin_path = PQ_FAKE_CUDA_PLUGIN_FILE;
  Ctx hooked(pc, hooks);
  ASSERT_TRUE(hooked.ok()) << pq_last_error();
  prefill(hooked, 1, 300, PQ_DTYPE_F32);
  if (HasFatalFailure()) return;
  ASSERT_EQ(pq_decode_select_device(hooked, 1, 0, &dq.t, &sel.s), PQ_OK) << pq_last_error();
  DeviceTensor dk(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32));
  DeviceTensor dv(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32));
  PQ_EXPECT_ERR(pq_fetch_kv_device(hooked, 1, 0, &sel.s, &dk.t, &dv.t), PQ_ERR_UNSUPPORTED,
                "host_alloc memory, which the device cannot read");
  sync_all();
}

// A device query written by work on the sequence's stream (the caller's
// kernels) is read after that work: the library's copies of device inputs
// are ordered on the sequence's stream, not on the legacy stream that a
// non-blocking stream does not wait for. The fake holds the write back
// until something waits on that stream, so a read on another stream would
// see the allocation's poison bytes and select something else.
TEST(FakeCudaDeviceInputs, ADeviceQueryIsReadInOrderOnTheSequencesStream) {
  ASSERT_NE(Fake::get().table, nullptr);
  const pq_config c = base_config(PQ_DTYPE_F32);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 400, PQ_DTYPE_F32);
  if (HasFatalFailure()) return;
  const pq_cuda_plugin* t = Fake::get().table;
  void* stream = nullptr;
  char err[256] = {0};
  ASSERT_EQ(t->stream_create(&stream, err, sizeof err), 0) << err;
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, stream), PQ_OK) << pq_last_error();
  Step d = step_data(0, 0, PQ_DTYPE_F32, 1);
  DeviceBuffer dq(d.q.bytes.size());  // poisoned until the stream's copy runs
  ASSERT_EQ(t->copy_async(dq.get(), d.q.bytes.data(), d.q.bytes.size(), stream, err, sizeof err), 0)
      << err;
  pq_tensor query = d.q.t;
  query.data = dq.get();
  query.memory = PQ_MEMORY_DEVICE;
  const int64_t cap = selection_capacity(cpu, 1, 0);
  Sel want(kKvHeads, cap), got(kKvHeads, cap);
  ASSERT_EQ(pq_decode_select(cpu, 1, 0, d.q.get(), want.get()), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_decode_select(cuda, 1, 0, &query, got.get()), PQ_OK) << pq_last_error();
  for (int32_t h = 0; h < kKvHeads; ++h) EXPECT_EQ(got.row(h), want.row(h)) << "head " << h;
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, nullptr), PQ_OK);
  ASSERT_EQ(t->stream_destroy(stream, err, sizeof err), 0) << err;
}

// Positions the device reads are not checked by the host: one outside the
// sequence is not read, and its rows come out as zeros; the others are
// fetched as usual.
TEST(FakeCudaDeviceStepErrors, PositionsOutsideTheSequenceAreNotRead) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = base_config(PQ_DTYPE_F32);
  c.cache_tokens = 0;
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 300, PQ_DTYPE_F32);
  if (HasFatalFailure()) return;
  const int64_t cap = 4;
  const std::vector<int32_t> positions = {0, 299, 300, -1, 5, 100000, 17, 250};
  const std::vector<int32_t> counts = {4, 4};
  DeviceSel sel(cap);
  sel.positions.upload(positions.data(), positions.size() * 4);
  sel.counts.upload(counts.data(), counts.size() * 4);
  HostTensor zeros = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  std::memset(zeros.bytes.data(), 0x5A, zeros.bytes.size());  // not zero: a row not written shows
  DeviceTensor dk(zeros), dv(zeros);
  ASSERT_EQ(pq_fetch_kv_device(cuda, 1, 0, &sel.s, &dk.t, &dv.t), PQ_OK) << pq_last_error();
  sync_all();
  // The in-range rows as the CPU backend fetches them.
  Sel valid(kKvHeads, cap);
  const std::vector<int32_t> valid_positions = {0, 299, 299, 299, 5, 17, 17, 250};
  std::copy(valid_positions.begin(), valid_positions.end(), valid.positions.begin());
  valid.counts = {4, 4};
  HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  ASSERT_EQ(pq_fetch_kv(cpu, 1, 0, valid.get(), hk.get(), hv.get()), PQ_OK) << pq_last_error();
  const std::vector<uint8_t> got = dk.buffer.download();
  const size_t row = kDim * sizeof(float);
  for (int32_t h = 0; h < kKvHeads; ++h)
    for (int64_t i = 0; i < cap; ++i) {
      const int32_t p = positions[static_cast<size_t>(h * cap + i)];
      const size_t at = static_cast<size_t>((i * kKvHeads + h)) * row;  // token-major
      const bool outside = p < 0 || p >= 300;
      if (outside)
        EXPECT_TRUE(std::all_of(got.begin() + at, got.begin() + at + row,
                                [](uint8_t b) { return b == 0; }))
            << "head " << h << " row " << i << " (position " << p << ") was not zeroed";
      else
        EXPECT_EQ(std::memcmp(got.data() + at, hk.bytes.data() + at, row), 0)
            << "head " << h << " row " << i << " (position " << p << ")";
    }
}

// pq_decode_select_device_batch and pq_fetch_kv_device_batch: sequences on
// one stream are one launch chain (four launches for every selection, one
// gather for every fetch), no host wait, and each item gets what its
// host-positions call gives on the CPU backend; a sequence whose middle is
// shorter than k takes it whole within the same chain.
TEST(FakeCudaDeviceBatch, OneLaunchChainForEverySequenceMatchesTheCpu) {
  ASSERT_NE(Fake::get().table, nullptr);
  const pq_config c = base_config(PQ_DTYPE_F16);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  const std::vector<uint64_t>& ids = kBatchIds;
  add_batch_sequences({cpu.get(), cuda.get()}, PQ_DTYPE_F16);
  if (HasFatalFailure()) return;
  for (int64_t step = 0; step < 3; ++step) {
    const int32_t l = static_cast<int32_t>(step % kLayers);
    std::vector<Step> data;
    std::vector<std::unique_ptr<DeviceTensor>> dq, dk, dv;
    std::vector<std::unique_ptr<DeviceSel>> sels;
    std::vector<pq_select_item> select_items;
    std::vector<pq_fetch_item> fetch_items;
    int64_t cap = 0;
    for (uint64_t id : ids) cap = std::max(cap, selection_capacity(cpu, id, l));
    for (size_t i = 0; i < ids.size(); ++i) {
      data.push_back(step_data(l, step, PQ_DTYPE_F16, ids[i]));
      for (pq_context* ctx : {cpu.get(), cuda.get()})
        ASSERT_EQ(pq_decode_append(ctx, ids[i], l, data[i].k.get(), data[i].v.get()), PQ_OK);
    }
    for (uint64_t id : ids) cap = std::max(cap, selection_capacity(cpu, id, l));
    for (size_t i = 0; i < ids.size(); ++i) {
      dq.push_back(std::make_unique<DeviceTensor>(data[i].q));
      sels.push_back(std::make_unique<DeviceSel>(cap));
      dk.push_back(std::make_unique<DeviceTensor>(
          make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR)));
      dv.push_back(std::make_unique<DeviceTensor>(
          make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR)));
      select_items.push_back(pq_select_item{ids[i], dq[i]->t, sels[i]->s, PQ_ERR_INTERNAL});
      fetch_items.push_back(
          pq_fetch_item{ids[i], sels[i]->s, dk[i]->t, dv[i]->t, PQ_ERR_INTERNAL});
    }
    pq_fake_cuda_counters before = Fake::get().counters();
    ASSERT_EQ(pq_decode_select_device_batch(cuda, l, select_items.data(),
                                            static_cast<int64_t>(ids.size())),
              PQ_OK)
        << pq_last_error();
    const pq_fake_cuda_counters sel = counters_since(before);
    EXPECT_EQ(sel.host_waits, 0u);
    EXPECT_EQ(sel.kernel_launches, 4u) << "LUTs, scan, top-k, fill: for every sequence at once";
    before = Fake::get().counters();
    ASSERT_EQ(pq_fetch_kv_device_batch(cuda, l, fetch_items.data(),
                                       static_cast<int64_t>(ids.size())),
              PQ_OK)
        << pq_last_error();
    const pq_fake_cuda_counters fetch = counters_since(before);
    EXPECT_EQ(fetch.host_waits, 0u);
    EXPECT_EQ(fetch.kernel_launches, 1u) << "one gather for every sequence";
    for (const pq_select_item& item : select_items) EXPECT_EQ(item.status, PQ_OK);
    for (const pq_fetch_item& item : fetch_items) EXPECT_EQ(item.status, PQ_OK);
    sync_all();
    for (size_t i = 0; i < ids.size(); ++i) {
      SCOPED_TRACE("seq " + std::to_string(ids[i]) + " step " + std::to_string(step));
      Sel want(kKvHeads, cap);
      ASSERT_EQ(pq_decode_select(cpu, ids[i], l, data[i].q.get(), want.get()), PQ_OK);
      for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(sels[i]->row(h), want.row(h)) << "head " << h;
      HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
      HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
      ASSERT_EQ(pq_fetch_kv(cpu, ids[i], l, want.get(), hk.get(), hv.get()), PQ_OK);
      const std::vector<uint8_t> got_k = dk[i]->buffer.download(), got_v = dv[i]->buffer.download();
      const size_t row = kDim * 2;
      for (int32_t h = 0; h < kKvHeads; ++h) {
        const size_t n = want.row(h).size();
        const size_t at = static_cast<size_t>(h) * cap * row;
        EXPECT_EQ(std::memcmp(got_k.data() + at, hk.bytes.data() + at, n * row), 0) << "keys, head " << h;
        EXPECT_EQ(std::memcmp(got_v.data() + at, hv.bytes.data() + at, n * row), 0) << "values, head " << h;
      }
    }
  }
  // Items fail on their own: an unknown sequence, the others selected.
  Step d = step_data(0, 9, PQ_DTYPE_F16, 5);
  DeviceTensor q(d.q);
  DeviceSel a(selection_capacity(cuda, 5, 0)), b(selection_capacity(cuda, 5, 0));
  pq_select_item items[2] = {{5, q.t, a.s, PQ_OK}, {404, q.t, b.s, PQ_OK}};
  PQ_EXPECT_ERR(pq_decode_select_device_batch(cuda, 0, items, 2), PQ_ERR_NOT_FOUND, "items[1]");
  EXPECT_EQ(items[0].status, PQ_OK);
  EXPECT_EQ(items[1].status, PQ_ERR_NOT_FOUND);
}

// Items of one launch chain must not write the same device bytes: outputs
// that overlap are refused before any item runs (no status written).
TEST(FakeCudaDeviceBatch, OverlappingOutputsOfTwoItemsAreRefusedBeforeAnyRuns) {
  ASSERT_NE(Fake::get().table, nullptr);
  Ctx cuda = make_fake_cuda_ctx(base_config(PQ_DTYPE_F16));
  ASSERT_TRUE(cuda.ok()) << pq_last_error();
  for (uint64_t id : {1, 2}) prefill(cuda, id, 300, PQ_DTYPE_F16);
  if (HasFatalFailure()) return;
  const int64_t cap = selection_capacity(cuda, 1, 0);
  Step d = step_data(0, 0, PQ_DTYPE_F16, 1);
  DeviceTensor q(d.q);
  DeviceSel a(cap);
  pq_selection shifted = a.s;  // the second item's positions inside the first's
  DeviceBuffer other_counts(kKvHeads * 4);
  shifted.positions += 1;
  shifted.capacity = cap - 1;
  shifted.counts = static_cast<int32_t*>(other_counts.get());
  pq_select_item items[2] = {{1, q.t, a.s, PQ_ERR_INTERNAL}, {2, q.t, shifted, PQ_ERR_INTERNAL}};
  PQ_EXPECT_ERR(pq_decode_select_device_batch(cuda, 0, items, 2), PQ_ERR_INVALID_ARGUMENT,
                "items[1].out.positions");
  EXPECT_EQ(items[0].status, PQ_ERR_INTERNAL) << "no item ran";
  DeviceTensor k(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR));
  DeviceTensor v(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR));
  DeviceSel b(cap);
  pq_fetch_item fetch[2] = {{1, a.s, k.t, v.t, PQ_ERR_INTERNAL},
                            {2, b.s, k.t, v.t, PQ_ERR_INTERNAL}};  // the same outputs
  PQ_EXPECT_ERR(pq_fetch_kv_device_batch(cuda, 0, fetch, 2), PQ_ERR_INVALID_ARGUMENT, "overlap");
  EXPECT_EQ(fetch[0].status, PQ_ERR_INTERNAL) << "no item ran";
}

}  // namespace
