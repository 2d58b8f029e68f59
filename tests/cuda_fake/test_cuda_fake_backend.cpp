// The CUDA backend's logic, on every machine: contexts with PQ_BACKEND_CUDA
// load the host fake of the plug-in (fake_cuda_plugin.cpp) and must give,
// step for step, exactly what the CPU backend gives: the same selections
// (the device PQ path: one LUT upload, resident codes with delta uploads,
// one scan, one top-k, one wait), the same fetched bytes (the fetch plan
// over the device window ring, the device block cache and the misses), the
// same cache statistics, with asynchronous prefills from device memory and
// per-sequence streams. The fake defers device work until something waits
// for it, so a missing wait or a wrong stream order shows as wrong bytes.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "fake_cuda_plugin.h"
#include "fake_test_util.h"

namespace {

using namespace pqt;

class FakeCudaBackend : public ::testing::TestWithParam<int32_t> {
 protected:
  void SetUp() override {
    ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
    dtype_ = GetParam();
  }
  int32_t dtype_ = PQ_DTYPE_F32;
};

// Prefills seq on both contexts: host tensors on the CPU context; on the
// CUDA one, host tensors for layer 0 and device tensors for the others
// (the asynchronous ingest).
void prefill_both(pq_context* cpu, pq_context* cuda, uint64_t seq, int64_t tokens, int32_t dtype) {
  for (int32_t l = 0; l < kLayers; ++l) {
    HostTensor k = make_tensor(random_normal(tokens * kKvHeads * kDim, 17 * seq + l), tokens,
                               kKvHeads, kDim, dtype);
    HostTensor v = make_tensor(random_normal(tokens * kKvHeads * kDim, 31 * seq + l), tokens,
                               kKvHeads, kDim, dtype);
    ASSERT_EQ(pq_prefill_layer(cpu, seq, l, k.get(), v.get()), PQ_OK) << pq_last_error();
    if (l == 0) {
      ASSERT_EQ(pq_prefill_layer(cuda, seq, l, k.get(), v.get()), PQ_OK) << pq_last_error();
    } else {
      DeviceTensor dk(k), dv(v);
      ASSERT_EQ(pq_prefill_layer(cuda, seq, l, &dk.t, &dv.t), PQ_OK) << pq_last_error();
      // The ingest copies from dk/dv: let it land before they are freed.
      ASSERT_EQ(pq_wait_builds(cuda), PQ_OK) << pq_last_error();
    }
  }
  ASSERT_EQ(pq_wait_builds(cpu), PQ_OK) << pq_last_error();
}

// One decode step of seq on both contexts at every layer; selections and
// fetched bytes must be identical. The CUDA context fetches into device
// tensors (the device fetch path), the CPU one into host tensors.
void step_both(pq_context* cpu, pq_context* cuda, uint64_t seq, int64_t step, int32_t dtype,
               void* stream = nullptr) {
  for (int32_t l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(step));
    Step d = step_data(l, step, dtype, seq);
    ASSERT_EQ(pq_decode_append(cpu, seq, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_decode_append(cuda, seq, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
    const int64_t cap = selection_capacity(cpu, seq, l);
    ASSERT_EQ(cap, selection_capacity(cuda, seq, l));
    Sel a(kKvHeads, cap), b(kKvHeads, cap);
    ASSERT_EQ(pq_decode_select(cpu, seq, l, d.q.get(), a.get()), PQ_OK) << pq_last_error();
    DeviceTensor dq(d.q);
    ASSERT_EQ(pq_decode_select(cuda, seq, l, &dq.t, b.get()), PQ_OK) << pq_last_error();
    for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(a.row(h), b.row(h)) << "head " << h;

    HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR);
    HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, dtype, PQ_LAYOUT_HEAD_MAJOR);
    DeviceTensor dk(hk), dv(hv);
    ASSERT_EQ(pq_fetch_kv(cpu, seq, l, a.get(), hk.get(), hv.get()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_fetch_kv(cuda, seq, l, b.get(), &dk.t, &dv.t), PQ_OK) << pq_last_error();
    // The fetch's results are complete once its stream is
    // (pq_sequence_set_stream's contract); the copy back is synchronous.
    char err[256] = {0};
    ASSERT_EQ(Fake::get().table->stream_synchronize(stream, err, sizeof err), 0) << err;
    ASSERT_TRUE(dk.buffer.download() == host_bytes(hk)) << "fetched keys differ";
    ASSERT_TRUE(dv.buffer.download() == host_bytes(hv)) << "fetched values differ";
  }
}

TEST_P(FakeCudaBackend, DecodeStepsMatchTheCpuBackend) {
  const pq_config c = base_config(dtype_);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  int32_t backend = -1;
  ASSERT_EQ(pq_get_backend(cuda, &backend), PQ_OK);
  ASSERT_EQ(backend, PQ_BACKEND_CUDA);
  ASSERT_EQ(pq_sequence_add(cpu, 1), PQ_OK);
  ASSERT_EQ(pq_sequence_add(cuda, 1), PQ_OK);
  prefill_both(cpu, cuda, 1, 300, dtype_);
  // 60 steps: tokens leave the window ring (16) many times over, codes are
  // uploaded in deltas, the cache (8 blocks of 8) admits and evicts.
  for (int64_t step = 0; step < 60; ++step) {
    step_both(cpu, cuda, 1, step, dtype_);
    if (HasFatalFailure()) return;
  }
  const pq_stats a = stats(cpu), b = stats(cuda);
  EXPECT_EQ(a.cache_hits, b.cache_hits);
  EXPECT_EQ(a.cache_misses, b.cache_misses);
  EXPECT_GT(b.cache_hits, 0u) << "the device cache was never hit";
  EXPECT_EQ(a.bytes_fetched, b.bytes_fetched);
  // Fetches, window stores and cache fills all read the pinned store on
  // the device: the CPU staged no row.
  EXPECT_EQ(b.bytes_staged, 0u);
  EXPECT_EQ(Fake::get().pending(), 0u) << "device work left behind after the last wait";
}

// Issue 26: rotary-aware subspaces and exact re-ranking on the CUDA
// backend. The lookup table is the host's (it reorders the query), the
// device picks (1 + r) * k candidates, the host re-ranks them from its
// keys: the same selections as the CPU backend, step after step. (The
// device step does both on the device: test_cuda_fake_rotary_rerank.cpp.)
TEST_P(FakeCudaBackend, RotaryIndexAndReRankingMatchTheCpuBackend) {
  pq_config c = base_config(dtype_);
  c.key_rotary = PQ_ROTARY_HALF;
  c.pq_rerank = 0.5f;
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  ASSERT_EQ(pq_sequence_add(cpu, 1), PQ_OK);
  ASSERT_EQ(pq_sequence_add(cuda, 1), PQ_OK);
  prefill_both(cpu, cuda, 1, 300, dtype_);
  for (int64_t step = 0; step < 20; ++step) {
    step_both(cpu, cuda, 1, step, dtype_);
    if (HasFatalFailure()) return;
  }
}

// A fork of a prefix long enough that its codes are shared as frozen runs
// (code_column.h): the device selection uploads the child's codes run by
// run, and parent and child, each going on with its own tokens, select and
// fetch as on the CPU backend.
TEST_P(FakeCudaBackend, ForkedSequencesMatchTheCpuBackend) {
  const pq_config c = base_config(dtype_);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  ASSERT_EQ(pq_sequence_add(cpu, 1), PQ_OK);
  ASSERT_EQ(pq_sequence_add(cuda, 1), PQ_OK);
  prefill_both(cpu, cuda, 1, 4400, dtype_);
  for (int64_t step = 0; step < 3; ++step) {
    step_both(cpu, cuda, 1, step, dtype_);
    if (HasFatalFailure()) return;
  }
  ASSERT_EQ(pq_sequence_fork(cpu, 1, 2), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_sequence_fork(cuda, 1, 2), PQ_OK) << pq_last_error();
  // 300 tokens of the child's own before its first selection: its codes
  // are then a shared run and a long run of its own, both uploaded at once.
  for (int64_t step = 100; step < 400; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      Step d = step_data(l, step, dtype_, 2);
      ASSERT_EQ(pq_decode_append(cpu, 2, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
      ASSERT_EQ(pq_decode_append(cuda, 2, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
    }
  for (int64_t step = 3; step < 8; ++step) {
    step_both(cpu, cuda, 2, step, dtype_);
    step_both(cpu, cuda, 1, step, dtype_);
    if (HasFatalFailure()) return;
  }
}

TEST_P(FakeCudaBackend, SequencesOnTheirOwnStreamsMatchTheCpuBackend) {
  const pq_config c = base_config(dtype_);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  const pq_cuda_plugin* t = Fake::get().table;
  std::vector<void*> streams(3, nullptr);
  char err[256] = {0};
  for (uint64_t s = 0; s < streams.size(); ++s) {
    ASSERT_EQ(t->stream_create(&streams[s], err, sizeof err), 0) << err;
    ASSERT_EQ(pq_sequence_add(cpu, s), PQ_OK);
    ASSERT_EQ(pq_sequence_add(cuda, s), PQ_OK);
    ASSERT_EQ(pq_sequence_set_stream(cuda, s, streams[s]), PQ_OK) << pq_last_error();
    prefill_both(cpu, cuda, s, 150 + 70 * s, dtype_);
  }
  for (int64_t step = 0; step < 25; ++step)
    for (uint64_t s = 0; s < streams.size(); ++s) {
      step_both(cpu, cuda, s, step, dtype_, streams[s]);
      if (HasFatalFailure()) return;
    }
  for (uint64_t s = 0; s < streams.size(); ++s) {
    ASSERT_EQ(pq_sequence_set_stream(cuda, s, nullptr), PQ_OK);
    ASSERT_EQ(t->stream_destroy(streams[s], err, sizeof err), 0) << err;
  }
}

TEST_P(FakeCudaBackend, BatchedSelectAndFetchMatchTheCpuBackend) {
  const pq_config c = base_config(dtype_);
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  const std::vector<uint64_t> ids = {5, 6, 7, 8};
  for (uint64_t id : ids) {
    ASSERT_EQ(pq_sequence_add(cpu, id), PQ_OK);
    ASSERT_EQ(pq_sequence_add(cuda, id), PQ_OK);
    prefill_both(cpu, cuda, id, 100 + 40 * static_cast<int64_t>(id), dtype_);
  }
  for (int32_t l = 0; l < kLayers; ++l) {
    std::vector<Step> steps;
    std::vector<Sel> want, got;
    std::vector<pq_select_item> items(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      steps.push_back(step_data(l, 0, dtype_, ids[i]));
      want.emplace_back(kKvHeads, selection_capacity(cpu, ids[i], l));
      got.emplace_back(kKvHeads, selection_capacity(cuda, ids[i], l));
      ASSERT_EQ(pq_decode_select(cpu, ids[i], l, steps[i].q.get(), want[i].get()), PQ_OK);
      items[i].seq_id = ids[i];
      items[i].query = *steps[i].q.get();
      items[i].out = *got[i].get();
    }
    ASSERT_EQ(pq_decode_select_batch(cuda, l, items.data(), static_cast<int64_t>(items.size())),
              PQ_OK)
        << pq_last_error();
    for (size_t i = 0; i < ids.size(); ++i)
      for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(got[i].row(h), want[i].row(h));

    std::vector<HostTensor> hk, hv;
    std::vector<std::unique_ptr<DeviceTensor>> dk, dv;
    std::vector<pq_fetch_item> fetch(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t rows = want[i].max_count();
      hk.push_back(make_tensor(nullptr, rows, kKvHeads, kDim, dtype_));
      hv.push_back(make_tensor(nullptr, rows, kKvHeads, kDim, dtype_));
      ASSERT_EQ(pq_fetch_kv(cpu, ids[i], l, want[i].get(), hk[i].get(), hv[i].get()), PQ_OK);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      dk.push_back(std::make_unique<DeviceTensor>(make_tensor(
          nullptr, want[i].max_count(), kKvHeads, kDim, dtype_)));
      dv.push_back(std::make_unique<DeviceTensor>(make_tensor(
          nullptr, want[i].max_count(), kKvHeads, kDim, dtype_)));
      fetch[i].seq_id = ids[i];
      fetch[i].selection = *got[i].get();
      fetch[i].out_keys = dk[i]->t;
      fetch[i].out_values = dv[i]->t;
    }
    ASSERT_EQ(pq_fetch_kv_batch(cuda, l, fetch.data(), static_cast<int64_t>(fetch.size())), PQ_OK)
        << pq_last_error();
    char err[256] = {0};
    ASSERT_EQ(Fake::get().table->stream_synchronize(nullptr, err, sizeof err), 0) << err;
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_TRUE(dk[i]->buffer.download() == hk[i].bytes) << "item " << i;
      EXPECT_TRUE(dv[i]->buffer.download() == hv[i].bytes) << "item " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FakeCudaBackend, ::testing::Values(PQ_DTYPE_F32, PQ_DTYPE_F16),
                         [](const ::testing::TestParamInfo<int32_t>& p) {
                           return std::string(p.param == PQ_DTYPE_F32 ? "f32" : "f16");
                         });

// The layer-level device selection: one wait per layer whatever the number
// of kv heads, two kernels, and only the LUT plus the newly coded tokens go
// up at a decode step (the codes stay resident).
TEST(FakeCudaSelect, OneWaitPerLayerAndOnlyNewCodesGoUp) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = base_config(PQ_DTYPE_F32);
  c.num_kv_heads = 4;  // more heads than waits
  c.cache_tokens = 0;
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cuda.ok()) << pq_last_error();
  ASSERT_EQ(pq_sequence_add(cuda, 1), PQ_OK);
  const int64_t n = 500;
  HostTensor k = make_tensor(random_normal(n * 4 * kDim, 1), n, 4, kDim, PQ_DTYPE_F32);
  HostTensor v = make_tensor(random_normal(n * 4 * kDim, 2), n, 4, kDim, PQ_DTYPE_F32);
  ASSERT_EQ(pq_prefill_layer(cuda, 1, 0, k.get(), v.get()), PQ_OK);
  ASSERT_EQ(pq_wait_builds(cuda), PQ_OK);
  HostTensor q = make_tensor(random_normal(kQHeads * kDim, 3), 1, kQHeads, kDim, PQ_DTYPE_F32);
  const int32_t group = kQHeads / 4, m = c.pq_subspaces, centroids = 1 << c.pq_bits;
  const uint64_t lut_bytes = uint64_t{4} * group * m * centroids * sizeof(float);
  Sel sel(4, selection_capacity(cuda, 1, 0));

  // The first selection uploads every code of the middle.
  pq_fake_cuda_counters before = Fake::get().counters();
  ASSERT_EQ(pq_decode_select(cuda, 1, 0, q.get(), sel.get()), PQ_OK) << pq_last_error();
  pq_fake_cuda_counters after = Fake::get().counters();
  const int64_t middle_end = n - c.local_tokens;
  EXPECT_EQ(after.host_waits - before.host_waits, 1u);
  EXPECT_EQ(after.kernel_launches - before.kernel_launches, 2u);  // scan, top-k
  EXPECT_EQ(after.bytes_to_device - before.bytes_to_device,
            lut_bytes + static_cast<uint64_t>(middle_end) * 4 * m);

  // Decode steps: one token leaves the window, one token's codes go up.
  for (int step = 0; step < 5; ++step) {
    HostTensor k1 = make_tensor(random_normal(4 * kDim, 10 + step), 1, 4, kDim, PQ_DTYPE_F32);
    HostTensor v1 = make_tensor(random_normal(4 * kDim, 20 + step), 1, 4, kDim, PQ_DTYPE_F32);
    ASSERT_EQ(pq_decode_append(cuda, 1, 0, k1.get(), v1.get()), PQ_OK);
    Sel s(4, selection_capacity(cuda, 1, 0));
    before = Fake::get().counters();
    ASSERT_EQ(pq_decode_select(cuda, 1, 0, q.get(), s.get()), PQ_OK) << pq_last_error();
    after = Fake::get().counters();
    EXPECT_EQ(after.host_waits - before.host_waits, 1u) << "step " << step;
    EXPECT_EQ(after.bytes_to_device - before.bytes_to_device, lut_bytes + uint64_t{4} * m)
        << "step " << step;
  }
}

// The loader takes exactly its own plug-in ABI and names the one it found
// (ABI 7: the fake's table as 0.9 had it, without version 8's entries).
TEST(FakeCudaLoader, RefusesAnotherAbiVersionNamingIt) {
  for (const int abi : {3, 7}) {
    SCOPED_TRACE("ABI " + std::to_string(abi));
    // A copy of the fake is a second instance, which reads the variable anew.
    char path[] = "/tmp/pq_fake_cuda_abi_XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    {
      std::ifstream src(PQ_FAKE_CUDA_PLUGIN_FILE, std::ios::binary);
      std::ofstream dst(path, std::ios::binary);
      dst << src.rdbuf();
    }
    setenv("PQ_FAKE_CUDA_ABI", std::to_string(abi).c_str(), 1);
    pq_config c = base_config(PQ_DTYPE_F32);
    c.backend = PQ_BACKEND_CUDA;
    c.cuda_plugin_path = path;
    pq_context* ctx = nullptr;
    const std::string speaks = "speaks plug-in ABI " + std::to_string(abi);
    PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_NOT_FOUND, speaks.c_str());
    EXPECT_NE(std::string(pq_last_error()).find("needs ABI " +
                                                 std::to_string(PQ_CUDA_PLUGIN_ABI_VERSION)),
              std::string::npos)
        << pq_last_error();
    if (abi == 7)
      EXPECT_NE(std::string(pq_last_error()).find(
                    "table of " +
                    std::to_string(offsetof(pq_cuda_plugin, multi_rows_workspace_size)) + " bytes"),
                std::string::npos)
          << pq_last_error();
    EXPECT_EQ(ctx, nullptr);
    // AUTO falls back to the CPU backend for the same reason.
    c.backend = PQ_BACKEND_AUTO;
    ASSERT_EQ(pq_create(&c, &ctx), PQ_OK) << pq_last_error();
    int32_t backend = -1;
    ASSERT_EQ(pq_get_backend(ctx, &backend), PQ_OK);
    EXPECT_EQ(backend, PQ_BACKEND_CPU);
    pq_destroy(ctx);
    unsetenv("PQ_FAKE_CUDA_ABI");
    std::remove(path);
  }
}

}  // namespace
