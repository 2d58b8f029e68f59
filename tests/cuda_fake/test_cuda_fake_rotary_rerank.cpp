// The device step with every setting of the host path (issue 42), through
// the host fake of the CUDA plug-in: the rotate-half pairing
// (config.key_rotary = PQ_ROTARY_HALF: the device's lookup table reads the
// query in the codebook's dimension order) and exact re-ranking
// (config.pq_rerank: the candidates' keys read on the device from the
// store, combined and re-ranked there). Single, batched and captured, the
// selections are the CPU backend's pq_decode_select, for several seeds and
// every GQA combine; the step still waits for nothing, and a re-ranking
// adds one launch. The one refusal left: re-ranking over a store in the
// caller's host_alloc memory, which the device cannot read.
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

struct Setting {
  int32_t rotary;
  float rerank;
  int32_t combine;
  int32_t dtype;
  int64_t prompt;
};

std::string describe(const Setting& s) {
  return "rotary " + std::to_string(s.rotary) + " rerank " + std::to_string(s.rerank) +
         " combine " + std::to_string(s.combine) + " dtype " + std::to_string(s.dtype) +
         " prompt " + std::to_string(s.prompt);
}

pq_config setting_config(const Setting& s) {
  pq_config c = base_config(s.dtype);
  c.key_rotary = s.rotary;
  c.pq_rerank = s.rerank;
  c.gqa_combine = s.combine;
  c.cache_tokens = 0;
  return c;
}

// `steps` decode steps of one sequence on both backends: each device
// selection (single call) equals the CPU's, in `launches` launches and no
// wait.
void expect_device_steps_match(const Setting& s, uint64_t seed, int64_t steps,
                               uint64_t launches) {
  SCOPED_TRACE(describe(s) + " seed " + std::to_string(seed));
  const pq_config c = setting_config(s);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) add_prefilled(ctx, 1, s.prompt, s.dtype, seed);
  if (::testing::Test::HasFatalFailure()) return;
  for (int64_t step = 0; step < steps; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(step));
      Step d = step_data(l, step, s.dtype, seed);
      for (pq_context* ctx : {cpu.get(), cuda.get()})
        ASSERT_EQ(pq_decode_append(ctx, 1, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
      const int64_t cap = selection_capacity(cpu, 1, l);
      Sel want(kKvHeads, cap);
      ASSERT_EQ(pq_decode_select(cpu, 1, l, d.q.get(), want.get()), PQ_OK) << pq_last_error();
      DeviceTensor dq(d.q);
      DeviceSel got(cap);
      const pq_fake_cuda_counters before = Fake::get().counters();
      ASSERT_EQ(pq_decode_select_device(cuda, 1, l, &dq.t, &got.s), PQ_OK) << pq_last_error();
      const pq_fake_cuda_counters used = counters_since(before);
      EXPECT_EQ(used.host_waits, 0u) << "the selection stays on the device";
      // (The first selection of a layer uploads its centroids and codes.)
      if (step > 0) EXPECT_EQ(used.pageable_copies, 0u);
      EXPECT_EQ(used.kernel_launches, launches);
      Fake::get().synchronize_all();
      for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(got.row(h), want.row(h)) << "head " << h;
    }
}

TEST(FakeCudaRotaryHalf, TheDeviceTableSelectsWhatTheHostSelects) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16})
    for (uint64_t seed : {1u, 2u, 3u}) {
      expect_device_steps_match({PQ_ROTARY_HALF, 0.f, PQ_GQA_SUM_SOFTMAX, dtype, 700}, seed, 6,
                                4);  // LUT, scan, top-k, fill
      if (HasFatalFailure()) return;
    }
}

// Re-ranking adds one launch (the re-ranking: scores, top-k of the k and
// the pick, three kernels behind one plug-in call) and no wait; with every
// combine, both pairings, candidates of part of the middle or all of it.
TEST(FakeCudaReRank, TheDeviceReRankingSelectsWhatTheHostSelects) {
  ASSERT_NE(Fake::get().table, nullptr);
  const Setting settings[] = {
      {PQ_ROTARY_NONE, 0.5f, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F32, 700},
      {PQ_ROTARY_HALF, 1.f, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_BF16, 700},
      {PQ_ROTARY_NONE, 3.f, PQ_GQA_MAX, PQ_DTYPE_F16, 500},
      {PQ_ROTARY_HALF, 0.25f, PQ_GQA_MEAN, PQ_DTYPE_F32, 600},
      {PQ_ROTARY_INTERLEAVED, 2.f, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F16, 400},
      // 64 x 24 candidates > a middle of 40: the whole middle, re-ranked.
      {PQ_ROTARY_HALF, 64.f, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F32, 60},
  };
  for (const Setting& s : settings)
    for (uint64_t seed : {11u, 12u}) {
      expect_device_steps_match(s, seed, 5, 5);  // LUT, scan, top-k, re-rank, fill
      if (HasFatalFailure()) return;
    }
}

// The batched launch chain: one more launch for the re-ranking of every kv
// head of every item (items whose middle is shorter than k take it whole,
// with no re-ranking, in the same chain); no wait; each item equals its
// CPU selection.
TEST(FakeCudaReRank, OneBatchedLaunchChainReRanksEverySequence) {
  ASSERT_NE(Fake::get().table, nullptr);
  for (const float rerank : {0.f, 1.5f}) {
    SCOPED_TRACE("rerank " + std::to_string(rerank));
    const Setting s{PQ_ROTARY_HALF, rerank, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F16, 0};
    const pq_config c = setting_config(s);
    Ctx cpu(c);
    Ctx cuda = make_fake_cuda_ctx(c);
    ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
    const std::vector<uint64_t>& ids = kBatchIds;  // one with a middle shorter than k
    add_batch_sequences({cpu.get(), cuda.get()}, PQ_DTYPE_F16);
    if (HasFatalFailure()) return;
    for (int64_t step = 0; step < 4; ++step) {
      const int32_t l = static_cast<int32_t>(step % kLayers);
      std::vector<Step> data;
      int64_t cap = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        data.push_back(step_data(l, step, PQ_DTYPE_F16, ids[i]));
        for (pq_context* ctx : {cpu.get(), cuda.get()})
          ASSERT_EQ(pq_decode_append(ctx, ids[i], l, data[i].k.get(), data[i].v.get()), PQ_OK);
      }
      for (uint64_t id : ids) cap = std::max(cap, selection_capacity(cpu, id, l));
      std::vector<std::unique_ptr<DeviceTensor>> dq;
      std::vector<std::unique_ptr<DeviceSel>> sels;
      std::vector<pq_select_item> items;
      for (size_t i = 0; i < ids.size(); ++i) {
        dq.push_back(std::make_unique<DeviceTensor>(data[i].q));
        sels.push_back(std::make_unique<DeviceSel>(cap));
        items.push_back(pq_select_item{ids[i], dq[i]->t, sels[i]->s, PQ_ERR_INTERNAL});
      }
      const pq_fake_cuda_counters before = Fake::get().counters();
      ASSERT_EQ(pq_decode_select_device_batch(cuda, l, items.data(),
                                              static_cast<int64_t>(items.size())),
                PQ_OK)
          << pq_last_error();
      const pq_fake_cuda_counters used = counters_since(before);
      EXPECT_EQ(used.host_waits, 0u);
      EXPECT_EQ(used.kernel_launches, rerank > 0.f ? 5u : 4u)
          << "LUTs, scan, top-k, (re-rank,) fill: for every sequence at once";
      for (const pq_select_item& item : items) EXPECT_EQ(item.status, PQ_OK);
      Fake::get().synchronize_all();
      for (size_t i = 0; i < ids.size(); ++i) {
        SCOPED_TRACE("seq " + std::to_string(ids[i]) + " step " + std::to_string(step));
        Sel want(kKvHeads, cap);
        ASSERT_EQ(pq_decode_select(cpu, ids[i], l, data[i].q.get(), want.get()), PQ_OK);
        for (int32_t h = 0; h < kKvHeads; ++h)
          ASSERT_EQ(sels[i]->row(h), want.row(h)) << "head " << h;
      }
    }
  }
}

// After pq_sequence_reserve a re-ranking step allocates, frees and waits
// for nothing, and the step a CUDA graph captures re-ranks too: replayed
// after each append, it selects at the new length what the CPU selects.
TEST(FakeCudaReRank, TheCapturedStepReRanksAtEveryNewLength) {
  ASSERT_NE(Fake::get().table, nullptr);
  const Setting s{PQ_ROTARY_HALF, 1.f, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F32, 700};
  const pq_config c = setting_config(s);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  for (pq_context* ctx : {cpu.get(), cuda.get()}) add_prefilled(ctx, 1, 700, PQ_DTYPE_F32, 21);
  if (HasFatalFailure()) return;
  char err[256] = {0};
  void* stream = nullptr;
  ASSERT_EQ(Fake::get().table->stream_create(&stream, err, sizeof err), 0) << err;
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, stream), PQ_OK);
  constexpr int64_t kUncaptured = 4, kTokens = 40;
  ASSERT_EQ(pq_sequence_reserve(cuda, 1, 700 + kUncaptured + kTokens + 1), PQ_OK)
      << pq_last_error();
  int64_t cap = 0;
  ASSERT_EQ(pq_selection_capacity_for(cuda, 0, 700 + kUncaptured + kTokens, &cap), PQ_OK);
  DeviceTensor dq(step_data(0, 0, PQ_DTYPE_F32, 1).q);
  DeviceSel sel(cap);
  auto expect_cpu_selection = [&](Step& d) {
    Sel want(kKvHeads, selection_capacity(cpu, 1, 0));
    ASSERT_EQ(pq_decode_select(cpu, 1, 0, d.q.get(), want.get()), PQ_OK) << pq_last_error();
    for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(sel.row(h), want.row(h)) << "head " << h;
  };
  // Uncaptured steady steps with the engine's buffers (the checks' own
  // downloads wait, so the counters cover the step's calls only).
  for (int64_t token = 0; token < kUncaptured; ++token) {
    SCOPED_TRACE("uncaptured token " + std::to_string(token));
    Step d = step_data(0, token, PQ_DTYPE_F32, 1);
    ASSERT_EQ(pq_decode_append(cpu, 1, 0, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
    std::memcpy(dq.buffer.get(), d.q.bytes.data(), d.q.bytes.size());
    const pq_fake_cuda_counters before = Fake::get().counters();
    ASSERT_EQ(pq_decode_append(cuda, 1, 0, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s), PQ_OK) << pq_last_error();
    const pq_fake_cuda_counters step = counters_since(before);
    if (token > 0) {  // the first step uploads the layer's centroids and codes
      EXPECT_EQ(step.device_allocs, 0u);
      EXPECT_EQ(step.device_frees, 0u);
      EXPECT_EQ(step.host_allocs, 0u);
      EXPECT_EQ(step.pageable_copies, 0u);
    }
    EXPECT_EQ(step.host_waits, 0u);
    Fake::get().synchronize_all();
    expect_cpu_selection(d);
    if (HasFatalFailure()) return;
  }
  // Captured once, replayed after every append.
  const pq_fake_cuda_counters capture_before = Fake::get().counters();
  Fake::get().capture_begin(stream);
  const pq_status status = pq_decode_select_device(cuda, 1, 0, &dq.t, &sel.s);
  const std::string error = pq_last_error();
  const int64_t captured = Fake::get().capture_end(stream);
  ASSERT_EQ(status, PQ_OK) << error;
  EXPECT_EQ(counters_since(capture_before).capture_refusals, 0u);
  EXPECT_EQ(captured, 5) << "pq_lut, pq_scan_rows, topk_rows, pq_rerank_rows, fill_selection_rows";
  for (int64_t token = kUncaptured; token < kUncaptured + kTokens; ++token) {
    SCOPED_TRACE("token " + std::to_string(token));
    Step d = replay_token(cpu, cuda, stream, token, dq);
    if (HasFailure()) return;
    expect_cpu_selection(d);
    if (HasFatalFailure()) return;
  }
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, nullptr), PQ_OK);
  ASSERT_EQ(pq_sequence_remove(cuda, 1), PQ_OK);
  Fake::get().synchronize_all();
  ASSERT_EQ(Fake::get().table->stream_destroy(stream, err, sizeof err), 0) << err;
}

// The one setting the device cannot serve: re-ranking reads the keys on the
// device, and a store in the caller's host_alloc memory is not readable
// there (refused at every call, single or batched, naming why; nothing is
// enqueued). The rotate-half pairing alone reads no key and is served.
TEST(FakeCudaReRank, ACallerStoreTheDeviceCannotReadIsRefused) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_hooks hooks;
  pq_hooks_default(&hooks);
  hooks.host_alloc = [](void*, size_t bytes, size_t alignment) -> void* {
    return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  };
  hooks.host_free = [](void*, void* p, size_t) { std::free(p); };
  Step d = step_data(0, 0, PQ_DTYPE_F32, 1);
  DeviceTensor dq(d.q);
  for (const float rerank : {0.f, 1.f}) {
    SCOPED_TRACE("rerank " + std::to_string(rerank));
    pq_config c = setting_config({PQ_ROTARY_HALF, rerank, PQ_GQA_SUM_SOFTMAX, PQ_DTYPE_F32, 0});
    c.backend = PQ_BACKEND_CUDA;
    c.cuda_plugin_path = PQ_FAKE_CUDA_PLUGIN_FILE;
    Ctx hooked(c, hooks);
    ASSERT_TRUE(hooked.ok()) << pq_last_error();
    add_prefilled(hooked, 1, 300, PQ_DTYPE_F32, 5);
    if (HasFatalFailure()) return;
    DeviceSel sel(selection_capacity(hooked, 1, 0));
    pq_select_item item{1, dq.t, sel.s, PQ_ERR_INTERNAL};
    if (rerank == 0.f) {
      EXPECT_EQ(pq_decode_select_device(hooked, 1, 0, &dq.t, &sel.s), PQ_OK) << pq_last_error();
      EXPECT_EQ(pq_decode_select_device_batch(hooked, 0, &item, 1), PQ_OK) << pq_last_error();
    } else {
      const uint64_t pending = Fake::get().pending();
      PQ_EXPECT_ERR(pq_decode_select_device(hooked, 1, 0, &dq.t, &sel.s), PQ_ERR_UNSUPPORTED,
                    "pq_rerank re-ranks by the keys on the device");
      PQ_EXPECT_ERR(pq_decode_select_device(hooked, 1, 0, &dq.t, &sel.s), PQ_ERR_UNSUPPORTED,
                    "host_alloc memory, which the device cannot read");
      EXPECT_EQ(Fake::get().pending(), pending) << "a refused selection enqueued work";
      PQ_EXPECT_ERR(pq_decode_select_device_batch(hooked, 0, &item, 1), PQ_ERR_UNSUPPORTED,
                    "items[0]");
      EXPECT_EQ(item.status, PQ_ERR_UNSUPPORTED);
    }
    Fake::get().synchronize_all();
  }
}

}  // namespace
