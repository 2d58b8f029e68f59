// Allocation-failure injection: every allocation a call makes on the
// calling thread fails once in turn (this program replaces operator new,
// which the library's allocations resolve to). Each time the call must
// return PQ_ERR_OUT_OF_MEMORY with a message, hold no more memory than
// before (pq_stats.host_bytes, the heap, and LeakSanitizer in the sanitizer
// build), and leave the context usable, its data bit-exact: the same call
// then succeeds. Index builds run on worker threads; a failing build is
// checked by WorkerThreadFailures.
#include <gtest/gtest.h>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

namespace {

// -1: off. n >= 0: the calling thread's allocation number n (from 0) fails.
thread_local long long t_fail_at = -1;
thread_local long long t_seen = 0;  // allocations since arming
// For worker threads: the next `g_worker_failures` allocations of threads
// other than the arming one fail.
std::atomic<int> g_worker_failures{0};
thread_local bool t_is_test_thread = false;

void* allocate(std::size_t n, std::size_t align = 0) {
  if (t_fail_at >= 0 && t_seen++ == t_fail_at) throw std::bad_alloc();
  if (!t_is_test_thread && g_worker_failures.load() > 0 && g_worker_failures.fetch_sub(1) > 0)
    throw std::bad_alloc();
  void* p = align ? std::aligned_alloc(align, (n + align - 1) / align * align)
                  : std::malloc(n ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace pqt;

namespace {

constexpr int32_t kKv = 2, kQ = 4, kDim = 8;

size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

pq_config config(int32_t selector) {
  pq_config c = make_config(2, kQ, kKv, kDim, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 2;
  c.local_tokens = 8;
  c.topk_tokens = 6;
  c.pq_bits = 3;
  c.kmeans_iterations = 2;
  c.worker_threads = 1;
  c.cache_tokens = 64;
  c.cache_block_tokens = 16;
  return c;
}

// The stored K/V of (seq, layer), fetched whole: [kv][n][dim] twice.
std::vector<float> contents(pq_context* ctx, uint64_t seq, int32_t layer) {
  int64_t n = 0;
  if (pq_sequence_length(ctx, seq, layer, &n) != PQ_OK || n == 0) return {};
  Sel sel(kKv, n);
  for (int32_t h = 0; h < kKv; ++h) {
    for (int64_t i = 0; i < n; ++i) sel.positions[static_cast<size_t>(h * n + i)] = static_cast<int32_t>(i);
    sel.counts[static_cast<size_t>(h)] = static_cast<int32_t>(n);
  }
  std::vector<float> k(static_cast<size_t>(kKv * n * kDim)), v(k.size());
  pq_tensor kt, vt;
  pq_tensor_init(&kt, k.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, n, kKv, kDim);
  pq_tensor_init(&vt, v.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, n, kKv, kDim);
  EXPECT_EQ(pq_fetch_kv(ctx, seq, layer, sel.get(), &kt, &vt), PQ_OK) << pq_last_error();
  k.insert(k.end(), v.begin(), v.end());
  return k;
}

struct Fixture {
  Ctx ctx;
  // 512 tokens: two full chunks, so that an append opens a chunk.
  HostTensor prompt = make_tensor(random_normal(512 * kKv * kDim, 1), 512, kKv, kDim, PQ_DTYPE_F32);
  HostTensor one = make_tensor(random_normal(kKv * kDim, 2), 1, kKv, kDim, PQ_DTYPE_F32);
  HostTensor q = make_tensor(random_normal(kQ * kDim, 3), 1, kQ, kDim, PQ_DTYPE_F32);
  HostTensor window = make_tensor(random_normal(8 * kQ * kDim, 4), 8, kQ, kDim, PQ_DTYPE_F32);

  Sel sel{kKv, 0};
  std::vector<int32_t> positions, counts;  // sel's, before the call
  std::vector<float> probs;                // for pq_observe_attention
  std::vector<float> k_out, v_out;
  pq_tensor k_tensor{}, v_tensor{};

  explicit Fixture(int32_t selector) : ctx(config(selector)) {
    EXPECT_TRUE(ctx.ok());
    // Sequence 2 is the bystander whose data must stay bit-exact; sequence
    // 1 is the one the calls work on, with layer 0 prefilled.
    for (uint64_t s : {1, 2}) {
      EXPECT_EQ(pq_sequence_add(ctx, s), PQ_OK);
      EXPECT_EQ(pq_prefill_layer(ctx, s, 0, prompt.get(), prompt.get()), PQ_OK);
    }
    if (selector == PQ_SELECTOR_SNAPKV || selector == PQ_SELECTOR_SCOPE)
      EXPECT_EQ(pq_prefill_queries(ctx, 1, 0, window.get()), PQ_OK);
    EXPECT_EQ(pq_wait_builds(ctx), PQ_OK);
    // A selection to fetch, and the buffers for it.
    sel = Sel(kKv, selection_capacity(ctx, 1, 0));
    EXPECT_EQ(pq_decode_select(ctx, 1, 0, q.get(), sel.get()), PQ_OK);
    k_out.assign(static_cast<size_t>(kKv * sel.capacity * kDim), 0.f);
    v_out.assign(k_out.size(), 0.f);
    pq_tensor_init(&k_tensor, k_out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, sel.capacity,
                   kKv, kDim);
    pq_tensor_init(&v_tensor, v_out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, sel.capacity,
                   kKv, kDim);
    positions = sel.positions;
    counts = sel.counts;
    probs.assign(sel.positions.size(), 0.01f);
  }
};

struct Operation {
  const char* name;
  int32_t selector;
  std::function<pq_status(Fixture&)> call;
  bool may_allocate_nothing = false;  // then there is no site to fail
};

// The selection into the fixture's buffers (allocating nothing itself: the
// armed allocations must be the library's); the test checks them after.
pq_status select(Fixture& f) { return pq_decode_select(f.ctx, 1, 0, f.q.get(), f.sel.get()); }

pq_status fetch(Fixture& f) {
  return pq_fetch_kv(f.ctx, 1, 0, f.sel.get(), &f.k_tensor, &f.v_tensor);
}

std::vector<Operation> operations() {
  return {
      {"pq_sequence_add", PQ_SELECTOR_EXACT, [](Fixture& f) { return pq_sequence_add(f.ctx, 3); }},
      {"pq_prefill_layer (new layer)", PQ_SELECTOR_EXACT,
       [](Fixture& f) { return pq_prefill_layer(f.ctx, 1, 1, f.prompt.get(), f.prompt.get()); }},
      {"pq_prefill_layer (more tokens, PQ)", PQ_SELECTOR_PQ,
       [](Fixture& f) { return pq_prefill_layer(f.ctx, 1, 0, f.prompt.get(), f.prompt.get()); }},
      {"pq_decode_append", PQ_SELECTOR_PQ,
       [](Fixture& f) { return pq_decode_append(f.ctx, 1, 0, f.one.get(), f.one.get()); }},
      {"pq_decode_select (PQ)", PQ_SELECTOR_PQ, select},
      {"pq_decode_select (H2O)", PQ_SELECTOR_H2O, select},
      {"pq_decode_select (Quest)", PQ_SELECTOR_QUEST, select},
      {"pq_decode_select (SnapKV)", PQ_SELECTOR_SNAPKV, select},
      {"pq_fetch_kv (block cache)", PQ_SELECTOR_PQ, fetch},
      {"pq_observe_attention (H2O)", PQ_SELECTOR_H2O,
       [](Fixture& f) { return pq_observe_attention(f.ctx, 1, 0, f.sel.get(), f.probs.data()); },
       true},  // the accumulators were sized by the selection
      {"pq_prefill_queries (SCOPE)", PQ_SELECTOR_SCOPE,
       [](Fixture& f) { return pq_prefill_queries(f.ctx, 1, 0, f.window.get()); }},
      {"pq_prefill_queries (Keyformer)", PQ_SELECTOR_KEYFORMER,
       [](Fixture& f) { return pq_prefill_queries(f.ctx, 1, 0, f.window.get()); }},
      {"pq_observe_attention (Keyformer)", PQ_SELECTOR_KEYFORMER,
       [](Fixture& f) { return pq_observe_attention(f.ctx, 1, 0, f.sel.get(), f.probs.data()); }},
  };
}

// Runs op with allocation `n` of the calling thread failing. Returns the
// status and sets *reached when the call made fewer than n + 1 allocations.
pq_status armed(const Operation& op, Fixture& f, long long n, bool* reached) {
  t_seen = 0;
  t_fail_at = n;
  pq_status st = op.call(f);
  *reached = t_seen <= n;
  t_fail_at = -1;
  return st;
}

TEST(AllocationFailures, EveryAllocationOfEveryCallFailsCleanly) {
  t_is_test_thread = true;
  int sites_total = 0;
  for (const Operation& op : operations()) {
    int sites = 0;
    for (long long n = 0;; ++n) {
      const size_t heap_before = heap_in_use();
      {
        Fixture f(op.selector);
        const std::vector<float> bystander = contents(f.ctx, 2, 0);
        const std::vector<float> own = contents(f.ctx, 1, 0);
        const uint64_t held = stats(f.ctx).host_bytes;
        int64_t length_before = 0;
        pq_sequence_length(f.ctx, 1, 0, &length_before);
        bool all_done = false;
        const pq_status st = armed(op, f, n, &all_done);
        if (all_done) {  // every allocation of the call had its turn
          EXPECT_EQ(st, PQ_OK) << op.name << ": " << pq_last_error();
          break;
        }
        ++sites;
        ASSERT_EQ(st, PQ_ERR_OUT_OF_MEMORY)
            << op.name << ", allocation " << n << ": " << pq_last_error();
        EXPECT_NE(std::string(pq_last_error()), "") << op.name;
        // Nothing held, nothing changed, and the call works now.
        EXPECT_EQ(stats(f.ctx).host_bytes, held) << op.name << ", allocation " << n;
        int64_t length_after = 0;
        pq_sequence_length(f.ctx, 1, 0, &length_after);
        EXPECT_EQ(length_after, length_before) << op.name << ", allocation " << n;
        EXPECT_EQ(contents(f.ctx, 2, 0), bystander) << op.name << ", allocation " << n;
        EXPECT_EQ(contents(f.ctx, 1, 0), own) << op.name << ", allocation " << n;
        EXPECT_EQ(f.sel.positions, f.positions) << op.name << ": outputs written on failure";
        EXPECT_EQ(f.sel.counts, f.counts) << op.name << ": outputs written on failure";
        for (float x : f.k_out) ASSERT_EQ(x, 0.f) << op.name << ": outputs written on failure";
        for (float x : f.v_out) ASSERT_EQ(x, 0.f) << op.name << ": outputs written on failure";
        EXPECT_EQ(op.call(f), PQ_OK) << op.name << " after allocation " << n << " failed: "
                                     << pq_last_error();
        EXPECT_EQ(pq_wait_builds(f.ctx), PQ_OK) << pq_last_error();
      }
      // The context is gone: nothing it allocated may remain. glibc's
      // per-thread cache keeps a few freed blocks counted as in use, hence
      // the slack; LeakSanitizer (the sanitizer build) checks exactly.
      if (!kSanitizerHeap)
        EXPECT_LE(heap_in_use(), heap_before + (64u << 10))
            << op.name << ", allocation " << n << " leaked";
      ASSERT_LT(n, 10000) << op.name << " never finished";
    }
    if (!op.may_allocate_nothing) EXPECT_GT(sites, 0) << op.name << " allocated nothing?";
    std::printf("[          ] %s: %d allocation sites failed in turn\n", op.name, sites);
    sites_total += sites;
  }
  std::printf("[          ] %d allocations injected in all\n", sites_total);
}

TEST(AllocationFailures, AFailingIndexBuildIsReportedAndARebuildRecovers) {
  // The build runs on a worker thread: its allocations fail there, the
  // layer reports it at the next call, and a new prefill rebuilds.
  t_is_test_thread = true;
  pq_config c = config(PQ_SELECTOR_PQ);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  HostTensor prompt = make_tensor(random_normal(300 * kKv * kDim, 5), 300, kKv, kDim, PQ_DTYPE_F32);
  HostTensor q = make_tensor(random_normal(kQ * kDim, 6), 1, kQ, kDim, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  g_worker_failures.store(1);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, prompt.get(), prompt.get()));
  Sel sel(kKv, selection_capacity(ctx, 1, 0));
  const pq_status st = pq_decode_select(ctx, 1, 0, q.get(), sel.get());
  g_worker_failures.store(0);
  PQ_EXPECT_ERR(st, PQ_ERR_OUT_OF_MEMORY, "build", "memory");
  PQ_EXPECT_ERR(pq_decode_select(ctx, 1, 0, q.get(), sel.get()), PQ_ERR_BAD_STATE, "build",
                "memory");
  HostTensor more = make_tensor(random_normal(20 * kKv * kDim, 7), 20, kKv, kDim, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, more.get(), more.get()));  // rebuilds
  PQ_EXPECT_OK(pq_decode_select(ctx, 1, 0, q.get(), sel.get()));
}

}  // namespace
