// The CUDA backend's fetch into device tensors, through the host fake of
// the plug-in, with its counters: the K/V store lives in the backend's
// page-locked pool, so a fetch is one plan upload and one gather launch that
// reads the rows from the store itself (no CPU copy of a row: bytes_staged
// stays 0); a store in the caller's host_alloc memory is staged, and
// counted. Both give the CPU backend's bytes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

constexpr int64_t kPrompt = 600;

pq_config fetch_config() {
  pq_config c = base_config(PQ_DTYPE_F32);
  c.cache_tokens = 0;  // every middle row from the store: nothing hides in the cache
  return c;
}

// Prefills seq 1 on both contexts (host tensors) and appends one token.
void prefill(pq_context* cpu, pq_context* cuda) {
  for (pq_context* ctx : {cpu, cuda}) ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
  for (int32_t l = 0; l < kLayers; ++l) {
    HostTensor k = make_tensor(random_normal(kPrompt * kKvHeads * kDim, 40 + l), kPrompt,
                               kKvHeads, kDim, PQ_DTYPE_F32);
    HostTensor v = make_tensor(random_normal(kPrompt * kKvHeads * kDim, 50 + l), kPrompt,
                               kKvHeads, kDim, PQ_DTYPE_F32);
    for (pq_context* ctx : {cpu, cuda})
      ASSERT_EQ(pq_prefill_layer(ctx, 1, l, k.get(), v.get()), PQ_OK) << pq_last_error();
  }
  for (pq_context* ctx : {cpu, cuda}) ASSERT_EQ(pq_wait_builds(ctx), PQ_OK) << pq_last_error();
}

struct FetchCount {
  pq_fake_cuda_counters device;  // the fake's counters over the fetch
  uint64_t staged = 0;           // pq_stats.bytes_staged over the fetch
  int64_t rows = 0;              // rows fetched per tensor (all kv heads)
  int64_t middle_rows = 0;       // of them, top-k rows (not sink or local)
};

// One select at layer 0 on both contexts, then a fetch into host tensors
// (CPU) and device tensors (CUDA): the bytes must be equal. Returns what
// the CUDA fetch cost.
FetchCount fetch_both(pq_context* cpu, pq_context* cuda) {
  FetchCount out;
  HostTensor q = make_tensor(random_normal(kQHeads * kDim, 99), 1, kQHeads, kDim, PQ_DTYPE_F32);
  const int64_t cap = selection_capacity(cpu, 1, 0);
  Sel a(kKvHeads, cap), b(kKvHeads, cap);
  EXPECT_EQ(pq_decode_select(cpu, 1, 0, q.get(), a.get()), PQ_OK) << pq_last_error();
  EXPECT_EQ(pq_decode_select(cuda, 1, 0, q.get(), b.get()), PQ_OK) << pq_last_error();
  for (int32_t h = 0; h < kKvHeads; ++h) {
    EXPECT_EQ(a.row(h), b.row(h)) << "head " << h;
    out.rows += a.counts[static_cast<size_t>(h)];
  }
  pq_config c = fetch_config();
  out.middle_rows = static_cast<int64_t>(c.topk_tokens) * kKvHeads;
  HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
  HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
  DeviceTensor dk(hk), dv(hv);
  EXPECT_EQ(pq_fetch_kv(cpu, 1, 0, a.get(), hk.get(), hv.get()), PQ_OK) << pq_last_error();
  const pq_stats before_stats = stats(cuda);
  const pq_fake_cuda_counters before = Fake::get().counters();
  EXPECT_EQ(pq_fetch_kv(cuda, 1, 0, b.get(), &dk.t, &dv.t), PQ_OK) << pq_last_error();
  out.device = counters_since(before);
  out.staged = stats(cuda).bytes_staged - before_stats.bytes_staged;
  char err[256] = {0};
  EXPECT_EQ(Fake::get().table->stream_synchronize(nullptr, err, sizeof err), 0) << err;
  EXPECT_TRUE(dk.buffer.download() == hk.bytes) << "fetched keys differ";
  EXPECT_TRUE(dv.buffer.download() == hv.bytes) << "fetched values differ";
  return out;
}

TEST(FakeCudaFetch, PinnedStoreIsReadByTheGatherWithNoCpuCopy) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const pq_config c = fetch_config();
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  prefill(cpu, cuda);
  if (HasFatalFailure()) return;
  for (int round = 0; round < 3; ++round) {
    const FetchCount f = fetch_both(cpu, cuda);
    if (HasFailure()) return;
    EXPECT_EQ(f.staged, 0u) << "round " << round << ": the CPU copied rows of a pinned store";
    EXPECT_EQ(f.device.kernel_launches, 1u) << "one gather for K and V";
    // Up: the positions and counts (4 bytes a row) and the gather's table;
    // the store's chunk addresses (3 chunks, K and V) once, at the first
    // fetch. Not the rows, nor a plan of pointers.
    const uint64_t positions = sizeof(pq_selected_gather) +
                               uint64_t{kKvHeads} * (1 + f.rows / kKvHeads) * sizeof(int32_t);
    EXPECT_EQ(f.device.bytes_to_device,
              positions + (round == 0 ? 2 * 3 * sizeof(void*) : 0))
        << "round " << round;
    EXPECT_EQ(f.device.host_waits, 0u)
        << "the previous fetch has run (the test waited for it): nothing to wait for";
  }
}

// The caller's allocator wins over the pinned pool: its memory is not
// device-readable, so the middle rows (sinks and local rows come from the
// device window) are staged through pinned memory, and counted.
TEST(FakeCudaFetch, CallerAllocatedStoreIsStagedAndCounted) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const pq_config c = fetch_config();
  pq_hooks hooks;
  pq_hooks_default(&hooks);
  hooks.host_alloc = [](void*, size_t bytes, size_t alignment) -> void* {
    return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  };
  hooks.host_free = [](void*, void* p, size_t) { std::free(p); };
  Ctx cpu(c);
  pq_config cc = c;
  cc.backend = PQ_BACKEND_CUDA;
  cc.cuda_plugin_path = PQ_FAKE_CUDA_PLUGIN_FILE;
  Ctx cuda(cc, hooks);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  prefill(cpu, cuda);
  if (HasFatalFailure()) return;
  const FetchCount f = fetch_both(cpu, cuda);
  EXPECT_EQ(f.staged, static_cast<uint64_t>(f.middle_rows) * 2 * kDim * sizeof(float));
  EXPECT_EQ(f.device.kernel_launches, 1u);
}

// With the block cache, the fetch builds a plan of pointers per row; at
// 8,192 rows or more it is built over the worker pool. Several steps (cache
// hits after the first) give the CPU backend's bytes on that path too.
TEST(FakeCudaFetch, ALargePlanBuiltOverThePoolGivesTheCpuBytes) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = base_config(PQ_DTYPE_F32);
  c.topk_tokens = 5000;  // 2 kv heads x 5,020 entries: past the pool's threshold
  c.cache_tokens = 2048;
  c.cache_block_tokens = 64;
  c.worker_threads = 2;
  Ctx cpu(c);
  Ctx cuda = make_fake_cuda_ctx(c);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  constexpr int64_t kLong = 12000;
  for (pq_context* ctx : {cpu.get(), cuda.get()}) {
    ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
    HostTensor k = make_tensor(random_normal(kLong * kKvHeads * kDim, 61), kLong, kKvHeads, kDim,
                               PQ_DTYPE_F32);
    HostTensor v = make_tensor(random_normal(kLong * kKvHeads * kDim, 62), kLong, kKvHeads, kDim,
                               PQ_DTYPE_F32);
    ASSERT_EQ(pq_prefill_layer(ctx, 1, 0, k.get(), v.get()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  }
  const int64_t cap = selection_capacity(cpu, 1, 0);
  ASSERT_GE(cap * kKvHeads, 8192);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    HostTensor q = make_tensor(random_normal(kQHeads * kDim, 700 + step), 1, kQHeads, kDim,
                               PQ_DTYPE_F32);
    Sel a(kKvHeads, cap), b(kKvHeads, cap);
    ASSERT_EQ(pq_decode_select(cpu, 1, 0, q.get(), a.get()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_decode_select(cuda, 1, 0, q.get(), b.get()), PQ_OK) << pq_last_error();
    HostTensor hk = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
    HostTensor hv = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
    ASSERT_EQ(pq_fetch_kv(cpu, 1, 0, a.get(), hk.get(), hv.get()), PQ_OK) << pq_last_error();
    DeviceTensor dk(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR));
    DeviceTensor dv(make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR));
    ASSERT_EQ(pq_fetch_kv(cuda, 1, 0, b.get(), &dk.t, &dv.t), PQ_OK) << pq_last_error();
    EXPECT_TRUE(dk.buffer.download() == hk.bytes) << "keys differ";
    EXPECT_TRUE(dv.buffer.download() == hv.bytes) << "values differ";
  }
  EXPECT_GT(stats(cuda).cache_hits, 0u) << "the cache was in use";
}

}  // namespace
