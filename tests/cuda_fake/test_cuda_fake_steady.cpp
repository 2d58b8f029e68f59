// The decode step as a serving engine runs it, through the host fake of the
// CUDA plug-in, which counts what the step must not do:
//   - a block of one sequence's store, or a buffer of its device state, is
//     not handed to another sequence while device work queued before the
//     release may still read it (truncate, remove), and neither waits for
//     the device;
//   - after pq_sequence_reserve, a steady step (append of host K/V,
//     pq_decode_select_device, pq_fetch_kv_device) makes no cudaMalloc,
//     cudaFree, cudaHostAlloc, cudaFreeHost, pageable copy or wait;
//   - the device step makes no call a CUDA graph capture refuses, and the
//     captured step, replayed after each append, selects and fetches at the
//     new length what an uncaptured step would.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

void prefill(pq_context* ctx, uint64_t id, int64_t tokens, uint64_t seed) {
  add_prefilled(ctx, id, tokens, PQ_DTYPE_F32, seed);
}

// Positions [first, first + count) of every kv head as a selection: host
// arrays, and the same uploaded to device arrays.
struct FixedSelection {
  Sel host;
  DeviceSel device;
  FixedSelection(int64_t first, int64_t count) : host(kKvHeads, count), device(count) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int64_t i = 0; i < count; ++i)
        host.positions[static_cast<size_t>(h * count + i)] = static_cast<int32_t>(first + i);
      host.counts[static_cast<size_t>(h)] = static_cast<int32_t>(count);
    }
    device.positions.upload(host.positions.data(), host.positions.size() * 4);
    device.counts.upload(host.counts.data(), host.counts.size() * 4);
  }
};

HostTensor rows_tensor(int64_t tokens) {
  return make_tensor(nullptr, tokens, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
}

pq_config hazard_config() {
  pq_config c = base_config(PQ_DTYPE_F32);
  c.cache_tokens = 0;
  return c;
}

// The rows of positions [256, 274) of seq 1 (300 tokens), layer 0, fetched on the host
// right after its prefill (the truth), then on the device with the fetch
// left queued while `between` runs; another sequence's prefill then takes
// whatever store blocks the pool hands out. The device fetch must still
// return seq 1's rows.
void expect_queued_fetch_reads_its_own_rows(const std::function<void(pq_context*)>& between,
                                            pq_fake_cuda_counters* during = nullptr) {
  Ctx cuda = make_fake_cuda_ctx(hazard_config());
  ASSERT_TRUE(cuda.ok()) << pq_last_error();
  // A prompt of 280, 20 decode tokens: chunk 1 holds tokens 256..299, and a
  // truncate to 290 keeps the index (no rebuild holds the old chunk).
  prefill(cuda, 1, 280, 11);
  if (::testing::Test::HasFatalFailure()) return;
  for (int64_t t = 0; t < 20; ++t)
    for (int32_t l = 0; l < kLayers; ++l) {
      Step d = step_data(l, t, PQ_DTYPE_F32, 1);
      ASSERT_EQ(pq_decode_append(cuda, 1, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
    }
  FixedSelection sel(256, 18);
  HostTensor want_k = rows_tensor(18), want_v = rows_tensor(18);
  ASSERT_EQ(pq_fetch_kv(cuda, 1, 0, sel.host.get(), want_k.get(), want_v.get()), PQ_OK)
      << pq_last_error();
  DeviceTensor got_k(rows_tensor(18)), got_v(rows_tensor(18));
  Fake::get().synchronize_all();
  ASSERT_EQ(pq_sequence_truncate(cuda, 1, 290), PQ_OK) << pq_last_error();
  // Queued, not run: nothing waits for it until the end.
  ASSERT_EQ(pq_fetch_kv_device(cuda, 1, 0, &sel.device.s, &got_k.t, &got_v.t), PQ_OK)
      << pq_last_error();
  ASSERT_GT(Fake::get().pending(), 0u);
  const pq_fake_cuda_counters before = Fake::get().counters();
  between(cuda);
  if (during != nullptr) *during = counters_since(before);
  prefill(cuda, 2, 256, 77);  // a fresh chunk for seq 2: the pool's next free blocks
  if (::testing::Test::HasFatalFailure()) return;
  Fake::get().synchronize_all();
  EXPECT_TRUE(got_k.buffer.download() == want_k.bytes)
      << "the queued fetch returned keys that are not seq 1's";
  EXPECT_TRUE(got_v.buffer.download() == want_v.bytes)
      << "the queued fetch returned values that are not seq 1's";
}

TEST(FakeCudaReuseHazard, AnAppendAfterTruncateDoesNotHandAQueuedFetchsBlockToAnotherSequence) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_fake_cuda_counters during{};
  // The append copies the partial last chunk (marked shared by the
  // truncate) and lets go of the old one, which the fetch still reads.
  expect_queued_fetch_reads_its_own_rows(
      [](pq_context* ctx) {
        Step d = step_data(0, 0, PQ_DTYPE_F32, 1);
        ASSERT_EQ(pq_decode_append(ctx, 1, 0, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
      },
      &during);
  EXPECT_EQ(during.host_waits, 0u);
  EXPECT_EQ(during.device_frees + during.host_frees, 0u) << "a free waits for the whole device";
}

TEST(FakeCudaReuseHazard, ARemoveNeitherWaitsNorHandsAQueuedFetchsBlockToAnotherSequence) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_fake_cuda_counters during{};
  expect_queued_fetch_reads_its_own_rows(
      [](pq_context* ctx) { ASSERT_EQ(pq_sequence_remove(ctx, 1), PQ_OK) << pq_last_error(); },
      &during);
  EXPECT_EQ(during.host_waits, 0u);
  EXPECT_EQ(during.device_frees + during.host_frees, 0u) << "a free waits for the whole device";
}

// The device step of (seq, layer) against the CPU backend's.
void expect_device_step_matches(pq_context* cpu, pq_context* cuda, uint64_t id, int32_t layer,
                                Step d) {
  const int64_t cap = selection_capacity(cpu, id, layer);
  Sel want(kKvHeads, cap);
  ASSERT_EQ(pq_decode_select(cpu, id, layer, d.q.get(), want.get()), PQ_OK) << pq_last_error();
  HostTensor hk = rows_tensor(cap), hv = rows_tensor(cap);
  ASSERT_EQ(pq_fetch_kv(cpu, id, layer, want.get(), hk.get(), hv.get()), PQ_OK);
  DeviceTensor dq(d.q);
  DeviceSel got(cap);
  DeviceTensor dk(rows_tensor(cap)), dv(rows_tensor(cap));
  ASSERT_EQ(pq_decode_select_device(cuda, id, layer, &dq.t, &got.s), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_fetch_kv_device(cuda, id, layer, &got.s, &dk.t, &dv.t), PQ_OK) << pq_last_error();
  Fake::get().synchronize_all();
  const std::vector<uint8_t> got_positions = got.positions.download();
  for (int32_t h = 0; h < kKvHeads; ++h) {
    const std::vector<int32_t> w = want.row(h);
    std::vector<int32_t> g(w.size());
    std::memcpy(g.data(), got_positions.data() + 4 * h * cap, 4 * g.size());
    ASSERT_EQ(g, w) << "head " << h << ": the device selected other tokens than the CPU";
  }
  EXPECT_TRUE(dk.buffer.download() == hk.bytes) << "keys differ from the CPU backend's";
  EXPECT_TRUE(dv.buffer.download() == hv.bytes) << "values differ from the CPU backend's";
}

TEST(FakeCudaTruncate, KeepsTheDeviceStateOfKeptTokensAndWaitsForNothing) {
  ASSERT_NE(Fake::get().table, nullptr);
  const pq_config c = hazard_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 600, 5);
  if (HasFatalFailure()) return;
  // Speculative decoding: 4 tokens appended, 3 rejected, every step.
  int64_t length = 600;
  for (int64_t step = 0; step < 30; ++step) {
    for (int64_t t = 0; t < 4; ++t)
      for (int32_t l = 0; l < kLayers; ++l) {
        Step d = step_data(l, 100 * step + t, PQ_DTYPE_F32, 1);
        for (pq_context* ctx : {cpu.get(), cuda.get()})
          ASSERT_EQ(pq_decode_append(ctx, 1, l, d.k.get(), d.v.get()), PQ_OK);
      }
    length += 1;
    const pq_fake_cuda_counters before = Fake::get().counters();
    ASSERT_EQ(pq_sequence_truncate(cuda, 1, length), PQ_OK) << pq_last_error();
    const pq_fake_cuda_counters cut = counters_since(before);
    EXPECT_EQ(cut.host_waits, 0u) << "step " << step;
    EXPECT_EQ(cut.device_frees + cut.host_frees + cut.device_allocs, 0u) << "step " << step;
    ASSERT_EQ(pq_sequence_truncate(cpu, 1, length), PQ_OK);
    for (int32_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("step " + std::to_string(step) + " layer " + std::to_string(l));
      expect_device_step_matches(cpu, cuda, 1, l, step_data(l, 7 + step, PQ_DTYPE_F32, 1));
      if (HasFatalFailure()) return;
    }
  }
}

// What a serving engine's decode loop costs: per generated token, every
// layer appends the token's K/V and runs the device step; the engine waits
// once per token for its own logits (synchronize_all: the engine's wait, not
// the library's, so not counted).
TEST(FakeCudaSteadyStep, AllocatesFreesCopiesPageableAndWaitsForNothingAfterAReserve) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = hazard_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 700, 9);
  if (HasFatalFailure()) return;
  constexpr int64_t kWarmup = 8, kSteady = 1000;
  ASSERT_EQ(pq_sequence_reserve(cuda, 1, 700 + kWarmup + kSteady + 1), PQ_OK) << pq_last_error();
  int64_t capacity = 0;
  ASSERT_EQ(pq_selection_capacity_for(cuda, 0, 700 + kWarmup + kSteady, &capacity), PQ_OK);
  // The engine's buffers, sized once.
  Step first = step_data(0, 0, PQ_DTYPE_F32, 1);
  DeviceTensor dq(first.q);
  DeviceSel sel(capacity);
  DeviceTensor dk(rows_tensor(capacity)), dv(rows_tensor(capacity));
  pq_fake_cuda_counters before{};
  for (int64_t step = 0; step < kWarmup + kSteady; ++step) {
    if (step == kWarmup) before = Fake::get().counters();
    for (int32_t l = 0; l < kLayers; ++l) {
      Step d = step_data(l, step, PQ_DTYPE_F32, 1);
      ASSERT_EQ(pq_decode_append(cuda, 1, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
      ASSERT_EQ(pq_decode_select_device(cuda, 1, l, &dq.t, &sel.s), PQ_OK) << pq_last_error();
      ASSERT_EQ(pq_fetch_kv_device(cuda, 1, l, &sel.s, &dk.t, &dv.t), PQ_OK) << pq_last_error();
    }
    Fake::get().synchronize_all();
  }
  const pq_fake_cuda_counters steady = counters_since(before);
  EXPECT_EQ(steady.device_allocs, 0u) << "cudaMalloc in " << kSteady << " steady steps";
  EXPECT_EQ(steady.device_frees, 0u) << "cudaFree (a device-wide wait)";
  EXPECT_EQ(steady.host_allocs, 0u) << "cudaHostAlloc";
  EXPECT_EQ(steady.host_frees, 0u) << "cudaFreeHost (a device-wide wait)";
  EXPECT_EQ(steady.pageable_copies, 0u) << "copies from pageable memory";
  EXPECT_EQ(steady.host_waits, 0u) << "host waits";
  EXPECT_GT(steady.kernel_launches, uint64_t{kSteady} * kLayers * 4) << "the steps ran";
  // And the steps were right: the state after them matches the CPU's.
  for (int64_t step = 0; step < kWarmup + kSteady; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      Step d = step_data(l, step, PQ_DTYPE_F32, 1);
      ASSERT_EQ(pq_decode_append(cpu, 1, l, d.k.get(), d.v.get()), PQ_OK);
    }
  for (int32_t l = 0; l < kLayers; ++l)
    expect_device_step_matches(cpu, cuda, 1, l, step_data(l, 99999, PQ_DTYPE_F32, 1));
}

// K/V the engine computed on the device are appended with no host round
// trip: the device writes the store rows and the window, the host checks
// the values once they have landed (a later call, without waiting when they
// have). Steps equal the CPU backend's host appends.
TEST(FakeCudaDeviceAppend, WaitsForNothingAndMatchesHostAppends) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = hazard_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 600, 3);
  if (HasFatalFailure()) return;
  constexpr int64_t kSteps = 300;
  ASSERT_EQ(pq_sequence_reserve(cuda, 1, 600 + kSteps + 1), PQ_OK) << pq_last_error();
  int64_t capacity = 0;
  ASSERT_EQ(pq_selection_capacity_for(cuda, 0, 600 + kSteps, &capacity), PQ_OK);
  // Each layer's K/V and query buffers, as an engine has them.
  std::vector<std::unique_ptr<DeviceTensor>> dkey, dvalue, dq;
  for (int32_t l = 0; l < kLayers; ++l) {
    Step first = step_data(l, 0, PQ_DTYPE_F32, 1);
    dkey.push_back(std::make_unique<DeviceTensor>(first.k));
    dvalue.push_back(std::make_unique<DeviceTensor>(first.v));
    dq.push_back(std::make_unique<DeviceTensor>(first.q));
  }
  DeviceSel sel(capacity);
  DeviceTensor dk(rows_tensor(capacity)), dv(rows_tensor(capacity));
  pq_fake_cuda_counters before{};
  for (int64_t step = 0; step < kSteps; ++step) {
    if (step == 4) before = Fake::get().counters();
    for (int32_t l = 0; l < kLayers; ++l) {
      Step d = step_data(l, step, PQ_DTYPE_F32, 1);
      // The engine's kernels wrote them (the fake's device memory is host
      // memory; every stream ran at the end of the last step).
      std::memcpy(dkey[l]->buffer.get(), d.k.bytes.data(), d.k.bytes.size());
      std::memcpy(dvalue[l]->buffer.get(), d.v.bytes.data(), d.v.bytes.size());
      std::memcpy(dq[l]->buffer.get(), d.q.bytes.data(), d.q.bytes.size());
      ASSERT_EQ(pq_decode_append(cuda, 1, l, &dkey[l]->t, &dvalue[l]->t), PQ_OK)
          << pq_last_error();
      ASSERT_EQ(pq_decode_append(cpu, 1, l, d.k.get(), d.v.get()), PQ_OK);
      ASSERT_EQ(pq_decode_select_device(cuda, 1, l, &dq[l]->t, &sel.s), PQ_OK) << pq_last_error();
      ASSERT_EQ(pq_fetch_kv_device(cuda, 1, l, &sel.s, &dk.t, &dv.t), PQ_OK) << pq_last_error();
    }
    Fake::get().synchronize_all();
  }
  const pq_fake_cuda_counters steady = counters_since(before);
  EXPECT_EQ(steady.host_waits, 0u) << "the device K/V went through the host";
  EXPECT_EQ(steady.pageable_copies, 0u);
  EXPECT_EQ(steady.bytes_to_host, 0u);
  EXPECT_EQ(steady.device_allocs + steady.device_frees + steady.host_allocs + steady.host_frees, 0u);
  for (int32_t l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    expect_device_step_matches(cpu, cuda, 1, l, step_data(l, 4242, PQ_DTYPE_F32, 1));
  }
}

TEST(FakeCudaDeviceAppend, HostReadersWaitAndANonFiniteValueIsReportedOnceAndDropped) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = hazard_config();
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cuda.ok()) << pq_last_error();
  prefill(cuda, 1, 300, 8);
  if (HasFatalFailure()) return;
  // A host read of a token still in flight waits for it and sees it.
  Step d = step_data(0, 1, PQ_DTYPE_F32, 1);
  DeviceTensor dkey(d.k), dvalue(d.v);
  ASSERT_EQ(pq_decode_append(cuda, 1, 0, &dkey.t, &dvalue.t), PQ_OK) << pq_last_error();
  ASSERT_GT(Fake::get().pending(), 0u);
  FixedSelection last(300, 1);
  HostTensor hk = rows_tensor(1), hv = rows_tensor(1);
  ASSERT_EQ(pq_fetch_kv(cuda, 1, 0, last.host.get(), hk.get(), hv.get()), PQ_OK) << pq_last_error();
  for (int32_t h = 0; h < kKvHeads; ++h)
    EXPECT_EQ(std::memcmp(hk.row(0, h), d.k.row(0, h), kDim * 4), 0) << "head " << h;
  // A NaN: accepted by the call (the host cannot see it yet), reported once
  // by the next call on the layer, and the token dropped.
  std::vector<float> bad(kKvHeads * kDim, 0.5f);
  bad[kDim + 3] = std::numeric_limits<float>::quiet_NaN();
  DeviceTensor nan_key(make_tensor(bad, 1, kKvHeads, kDim, PQ_DTYPE_F32));
  ASSERT_EQ(pq_decode_append(cuda, 1, 0, &nan_key.t, &dvalue.t), PQ_OK) << pq_last_error();
  Fake::get().synchronize_all();
  int64_t length = 0;
  Step q = step_data(0, 2, PQ_DTYPE_F32, 1);
  DeviceTensor dq(q.q);
  DeviceSel sel(400);
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s), PQ_ERR_INVALID_ARGUMENT,
                "non-finite");
  ASSERT_EQ(pq_sequence_length(cuda, 1, 0, &length), PQ_OK);
  EXPECT_EQ(length, 301) << "the NaN token was dropped, the one before kept";
  EXPECT_EQ(pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s), PQ_OK) << "reported once";
}

TEST(FakeCudaReserve, RefusalsNameWhatIsWrongAndTheCpuBackendHasNothingToReserve) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = hazard_config();
  c.host_memory_limit = 8 << 20;
  Ctx cuda = make_fake_cuda_ctx(c);
  Ctx cpu(hazard_config());
  ASSERT_TRUE(cuda.ok() && cpu.ok()) << pq_last_error();
  prefill(cuda, 1, 300, 4);
  prefill(cpu, 1, 300, 4);
  if (HasFatalFailure()) return;
  PQ_EXPECT_ERR(pq_sequence_reserve(cuda, 9, 1000), PQ_ERR_NOT_FOUND, "9");
  PQ_EXPECT_ERR(pq_sequence_reserve(cuda, 1, -1), PQ_ERR_INVALID_ARGUMENT, "tokens is -1");
  PQ_EXPECT_ERR(pq_sequence_reserve(cuda, 1, int64_t{1} << 32), PQ_ERR_INVALID_ARGUMENT,
                "2147483647");
  // 8 MiB admit a few thousand tokens of this geometry, not a million; and
  // nothing was pinned for the refusal.
  const pq_fake_cuda_counters before = Fake::get().counters();
  PQ_EXPECT_ERR(pq_sequence_reserve(cuda, 1, 1000000), PQ_ERR_OUT_OF_MEMORY, "host_memory_limit");
  EXPECT_EQ(counters_since(before).host_allocs, 0u);
  EXPECT_EQ(pq_sequence_reserve(cuda, 1, 1000), PQ_OK) << pq_last_error();
  EXPECT_EQ(pq_sequence_reserve(cpu, 1, 100000), PQ_OK) << pq_last_error();
  EXPECT_EQ(pq_sequence_reserve(cuda, 1, 10), PQ_OK) << "less than held: nothing to do";
}

// Inside a capture window the step may make no call a capture refuses; the
// captured select and fetch, replayed after each of 100 appends, give what
// the CPU backend selects and fetches at each new length (the lengths are
// read on the device from the tables each append writes).
TEST(FakeCudaCapture, TheCapturedStepReplayedFor100TokensMatchesTheUncapturedOne) {
  ASSERT_NE(Fake::get().table, nullptr);
  const pq_config c = hazard_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) prefill(ctx, 1, 700, 21);
  if (HasFatalFailure()) return;
  char err[256] = {0};
  void* stream = nullptr;
  ASSERT_EQ(Fake::get().table->stream_create(&stream, err, sizeof err), 0) << err;
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, stream), PQ_OK);
  constexpr int64_t kTokens = 100;
  ASSERT_EQ(pq_sequence_reserve(cuda, 1, 700 + kTokens + 1), PQ_OK) << pq_last_error();
  int64_t cap = 0;
  ASSERT_EQ(pq_selection_capacity_for(cuda, 0, 700 + kTokens, &cap), PQ_OK);
  Step first = step_data(0, 0, PQ_DTYPE_F32, 1);
  DeviceTensor dq(first.q);
  DeviceSel sel(cap);
  DeviceTensor dk(rows_tensor(cap)), dv(rows_tensor(cap));
  // Refused before an uncaptured step filled the tables' caller fields.
  Fake::get().capture_begin(stream);
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s), PQ_ERR_BAD_STATE,
                "uncaptured");
  Fake::get().capture_end(stream);
  // Uncaptured once with the engine's buffers, then captured.
  ASSERT_EQ(pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_fetch_kv_device(cuda, 1, 0, &sel.s, &dk.t, &dv.t), PQ_OK) << pq_last_error();
  Fake::get().synchronize_all();
  // (A capture begun anew drops what an earlier one recorded, as a new
  // graph would.) Other buffers than the tables hold are refused inside a capture.
  DeviceSel other(cap);
  Fake::get().capture_begin(stream);
  PQ_EXPECT_ERR(pq_decode_select_device(cuda, 1, 0, &dq.t, &other.s), PQ_ERR_BAD_STATE, "differ");
  Fake::get().capture_end(stream);
  const pq_fake_cuda_counters before = Fake::get().counters();
  Fake::get().capture_begin(stream);
  const pq_status s1 = pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s);
  const std::string e1 = pq_last_error();
  const pq_status s2 = pq_fetch_kv_device(cuda, 1, 0, &sel.s, &dk.t, &dv.t);
  const std::string e2 = pq_last_error();
  const int64_t captured = Fake::get().capture_end(stream);
  ASSERT_EQ(s1, PQ_OK) << e1;
  ASSERT_EQ(s2, PQ_OK) << e2;
  EXPECT_EQ(counters_since(before).capture_refusals, 0u) << "a call refused in a capture";
  EXPECT_EQ(captured, 5) << "pq_lut, pq_scan_rows, topk_rows, fill_selection_rows, gather";
  for (int64_t token = 1; token <= kTokens; ++token) {
    SCOPED_TRACE("token " + std::to_string(token));
    Step d = replay_token(cpu, cuda, stream, token, dq);
    if (HasFailure()) return;
    const int64_t need = selection_capacity(cpu, 1, 0);
    Sel want(kKvHeads, need);
    ASSERT_EQ(pq_decode_select(cpu, 1, 0, d.q.get(), want.get()), PQ_OK);
    HostTensor hk = rows_tensor(cap), hv = rows_tensor(cap);
    Sel want_cap(kKvHeads, cap);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const std::vector<int32_t> row = want.row(h);
      std::copy(row.begin(), row.end(), want_cap.positions.begin() + h * cap);
      want_cap.counts[static_cast<size_t>(h)] = static_cast<int32_t>(row.size());
    }
    ASSERT_EQ(pq_fetch_kv(cpu, 1, 0, want_cap.get(), hk.get(), hv.get()), PQ_OK);
    const std::vector<uint8_t> positions = sel.positions.download(), counts = sel.counts.download();
    const std::vector<uint8_t> got_k = dk.buffer.download(), got_v = dv.buffer.download();
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const std::vector<int32_t> row = want.row(h);
      int32_t count = 0;
      std::memcpy(&count, counts.data() + 4 * h, 4);
      ASSERT_EQ(count, static_cast<int32_t>(row.size())) << "head " << h;
      std::vector<int32_t> got(row.size());
      std::memcpy(got.data(), positions.data() + 4 * h * cap, 4 * got.size());
      ASSERT_EQ(got, row) << "head " << h << ": the replay selected other tokens";
      const size_t at = static_cast<size_t>(h) * cap * kDim * 4, bytes = row.size() * kDim * 4;
      ASSERT_EQ(std::memcmp(got_k.data() + at, hk.bytes.data() + at, bytes), 0) << "keys, head " << h;
      ASSERT_EQ(std::memcmp(got_v.data() + at, hv.bytes.data() + at, bytes), 0) << "values, head " << h;
    }
  }
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, nullptr), PQ_OK);
  ASSERT_EQ(pq_sequence_remove(cuda, 1), PQ_OK);
  Fake::get().synchronize_all();
  ASSERT_EQ(Fake::get().table->stream_destroy(stream, err, sizeof err), 0) << err;
}

}  // namespace
