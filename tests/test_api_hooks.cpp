// The integration hooks (pq_hooks, pq_pool): the log receives failed
// calls, builds and sequence events at the levels asked; the host store's
// K/V comes from the caller's allocator, whose failure fails the call and
// changes nothing; build_done reports every finished build once, and may
// call into the layer it names; build_progress rises through each build's
// K-Means iterations and encode slices, before its build_done; contexts on one pool run one set of
// threads, and each destroy waits for its own builds only.
#include <gtest/gtest.h>

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 16;

pq_config hooks_config(int32_t worker_threads = 2) {
  pq_config c = make_config(kLayers, kQ, kKv, kDim);
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 24;
  c.pq_bits = 4;
  c.kmeans_iterations = 4;
  c.worker_threads = worker_threads;
  return c;
}

void prefill(pq_context* ctx, uint64_t id, int64_t tokens, uint64_t seed = 1) {
  ASSERT_EQ(pq_sequence_add(ctx, id), PQ_OK) << pq_last_error();
  HostTensor t = make_tensor(random_normal(size_t(tokens) * kKv * kDim, seed), tokens, kKv, kDim,
                             PQ_DTYPE_F32);
  for (int32_t l = 0; l < kLayers; ++l)
    ASSERT_EQ(pq_prefill_layer(ctx, id, l, t.get(), t.get()), PQ_OK) << pq_last_error();
}

// ---------------------------------------------------------------------------
// Log
// ---------------------------------------------------------------------------

struct LogRecord {
  std::mutex mutex;
  std::vector<std::pair<int32_t, std::string>> lines;
  static void hook(void* user, int32_t level, const char* message) {
    auto* self = static_cast<LogRecord*>(user);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->lines.emplace_back(level, message);
  }
  // Lines of that level that contain `text`.
  size_t count(int32_t level, const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [&](const auto& l) {
      return l.first == level && l.second.find(text) != std::string::npos;
    }));
  }
  int32_t most_verbose() {
    std::lock_guard<std::mutex> lock(mutex);
    int32_t m = -1;
    for (const auto& l : lines) m = std::max(m, l.first);
    return m;
  }
};

pq_hooks log_hooks(LogRecord* record, int32_t level) {
  pq_hooks h;
  pq_hooks_default(&h);
  h.log = &LogRecord::hook;
  h.log_user = record;
  h.log_level = level;
  return h;
}

TEST(Hooks, LogReceivesFailuresBuildsAndSequenceEventsAtTheLevelsAsked) {
  LogRecord debug_log;
  std::string failure;
  {
    Ctx ctx(hooks_config(), log_hooks(&debug_log, PQ_LOG_DEBUG));
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    prefill(ctx, 1, 300);
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
    ASSERT_EQ(pq_sequence_fork(ctx, 1, 2), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_sequence_truncate(ctx, 2, 290), PQ_OK) << pq_last_error();
    uint64_t size = 0;
    ASSERT_EQ(pq_sequence_state_size(ctx, 1, &size), PQ_OK);
    std::vector<uint8_t> bytes(size);
    uint64_t written = 0;
    ASSERT_EQ(pq_sequence_save_buffer(ctx, 1, bytes.data(), size, &written), PQ_OK);
    ASSERT_EQ(pq_sequence_restore(ctx, 3, bytes.data(), written), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_sequence_remove(ctx, 2), PQ_OK);
    EXPECT_EQ(pq_sequence_remove(ctx, 99), PQ_ERR_NOT_FOUND);
    failure = pq_last_error();
  }
  // After pq_destroy, which waits for the builds' reports (pq_wait_builds
  // returns once the indexes are ready, maybe before their log lines).
  {
    EXPECT_EQ(debug_log.count(PQ_LOG_ERROR, failure), 1u)
        << "the failed call's message, as pq_last_error gives it";
    EXPECT_EQ(debug_log.count(PQ_LOG_INFO, "context created"), 1u);
    for (int32_t l = 0; l < kLayers; ++l)
      EXPECT_EQ(debug_log.count(PQ_LOG_INFO, "index built: seq_id 1 layer " + std::to_string(l)), 1u);
    for (const char* event : {"sequence added: seq_id 1", "sequence forked: seq_id 2 from 1",
                              "sequence truncated: seq_id 2 to 290", "sequence saved: seq_id 1",
                              "sequence restored: seq_id 3", "sequence removed: seq_id 2"})
      EXPECT_EQ(debug_log.count(PQ_LOG_DEBUG, event), 1u) << event;
  }

  // The default level, WARN: the failure, none of the rest.
  LogRecord warn_log;
  {
    Ctx ctx(hooks_config(), log_hooks(&warn_log, PQ_LOG_WARN));
    ASSERT_TRUE(ctx.ok());
    prefill(ctx, 1, 300);
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
    EXPECT_EQ(pq_sequence_fork(ctx, 1, 1), PQ_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(warn_log.count(PQ_LOG_ERROR, "exists"), 1u);
  EXPECT_EQ(warn_log.most_verbose(), PQ_LOG_ERROR);

  // A context that cannot be created says why through the log it was given.
  LogRecord create_log;
  pq_config bad = hooks_config();
  bad.pq_subspaces = 3;  // does not divide head_dim 16
  Ctx failed(bad, log_hooks(&create_log, PQ_LOG_ERROR));
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(create_log.count(PQ_LOG_ERROR, "pq_subspaces"), 1u);
}

TEST(Hooks, BadHooksAreNamed) {
  const pq_config c = hooks_config();
  pq_context* ctx = nullptr;
  pq_hooks h;
  pq_hooks_default(&h);
  EXPECT_EQ(h.struct_size, sizeof(pq_hooks));
  EXPECT_EQ(h.log_level, PQ_LOG_WARN);
  pq_hooks bad = h;
  bad.struct_size = 4;
  EXPECT_TRUE(IsError(pq_create_with_hooks(&c, &bad, &ctx), PQ_ERR_INVALID_ARGUMENT,
                      {"struct_size", "pq_hooks_default"}));
  bad = h;
  bad.log_level = 7;
  EXPECT_TRUE(IsError(pq_create_with_hooks(&c, &bad, &ctx), PQ_ERR_INVALID_ARGUMENT,
                      {"log_level", "7"}));
  bad = h;
  bad.host_alloc = [](void*, size_t, size_t) -> void* { return nullptr; };
  EXPECT_TRUE(IsError(pq_create_with_hooks(&c, &bad, &ctx), PQ_ERR_INVALID_ARGUMENT,
                      {"host_free", "both"}));
  EXPECT_EQ(ctx, nullptr);
  ASSERT_EQ(pq_create_with_hooks(&c, nullptr, &ctx), PQ_OK) << "NULL hooks: as pq_create";
  pq_destroy(ctx);
}

// ---------------------------------------------------------------------------
// Host allocator
// ---------------------------------------------------------------------------

struct CountingAllocator {
  std::mutex mutex;
  std::map<void*, size_t> live;
  uint64_t allocations = 0;
  int64_t fail_after = -1;  // allocations to allow before returning NULL; -1: never
  size_t misalign = 0;      // bytes added to what is returned (a broken allocator)
  bool misaligned_free = false;

  static void* alloc(void* user, size_t bytes, size_t alignment) {
    auto* self = static_cast<CountingAllocator*>(user);
    std::lock_guard<std::mutex> lock(self->mutex);
    if (self->fail_after == 0) return nullptr;
    if (self->fail_after > 0) --self->fail_after;
    void* p = std::aligned_alloc(alignment,
                                 (bytes + self->misalign + alignment - 1) / alignment * alignment);
    if (p == nullptr) return nullptr;
    p = static_cast<char*>(p) + self->misalign;
    self->live[p] = bytes;
    ++self->allocations;
    return p;
  }
  static void release(void* user, void* p, size_t bytes) {
    auto* self = static_cast<CountingAllocator*>(user);
    std::lock_guard<std::mutex> lock(self->mutex);
    auto it = self->live.find(p);
    if (it == self->live.end() || it->second != bytes) self->misaligned_free = true;
    if (it != self->live.end()) self->live.erase(it);
    std::free(static_cast<char*>(p) - self->misalign);
  }
  uint64_t live_bytes() {
    std::lock_guard<std::mutex> lock(mutex);
    uint64_t b = 0;
    for (const auto& e : live) b += e.second;
    return b;
  }
};

pq_hooks alloc_hooks(CountingAllocator* a) {
  pq_hooks h;
  pq_hooks_default(&h);
  h.host_alloc = &CountingAllocator::alloc;
  h.host_free = &CountingAllocator::release;
  h.alloc_user = a;
  return h;
}

TEST(Hooks, HostStoreMemoryComesFromTheCallersAllocator) {
  CountingAllocator a;
  {
    Ctx ctx(hooks_config(), alloc_hooks(&a));
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    prefill(ctx, 1, 700);  // 3 chunks per layer
    EXPECT_EQ(a.live_bytes(), stats(ctx).kv_bytes) << "every K/V byte held comes from the hook";
    EXPECT_EQ(a.allocations, 2u * 3 * kLayers) << "a K and a V block per chunk and layer";
    ASSERT_EQ(pq_sequence_fork(ctx, 1, 2), PQ_OK);
    EXPECT_EQ(a.allocations, 2u * 3 * kLayers + 2u * kLayers)
        << "a fork allocates only the copies of the partial chunks";
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
    ASSERT_EQ(pq_sequence_remove(ctx, 1), PQ_OK);
    ASSERT_EQ(pq_sequence_remove(ctx, 2), PQ_OK);
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
    EXPECT_EQ(a.live_bytes(), 0u) << "removed sequences give every block back";
  }
  EXPECT_FALSE(a.misaligned_free) << "a block was freed with another size or twice";
}

TEST(Hooks, ARestoreAllocatesEachLayersKeysAndValuesWhenTheyArrive) {
  // A description claims the tokens; only bytes given may be allocated
  // (a state resealed with a huge token count once made restore_begin
  // allocate gigabytes: tests/fuzz/regressions/oom-restore-huge-token-count).
  CountingAllocator a;
  Ctx ctx(hooks_config(), alloc_hooks(&a));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 700);  // 3 chunks per layer
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  uint64_t size = 0, written = 0;
  ASSERT_EQ(pq_sequence_state_size(ctx, 1, &size), PQ_OK);
  std::vector<uint8_t> bytes(size);
  ASSERT_EQ(pq_sequence_save_buffer(ctx, 1, bytes.data(), size, &written), PQ_OK);
  const uint64_t held = a.live_bytes(), per_layer = held / kLayers;
  ASSERT_GT(per_layer, 0u);

  uint64_t used = 0;
  ASSERT_EQ(pq_sequence_restore_begin(ctx, 2, bytes.data(), size, &used), PQ_OK) << pq_last_error();
  EXPECT_EQ(a.live_bytes(), held) << "the description allocates no K/V";
  int64_t n = 0;
  ASSERT_EQ(pq_sequence_length(ctx, 2, 0, &n), PQ_OK);
  EXPECT_EQ(n, 700);
  uint64_t at = used;

  // The allocator refuses layer 0's second block: out of memory, the
  // section is not consumed and may come again.
  a.fail_after = 1;
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(ctx, 2, bytes.data() + at, size - at, &used),
                      PQ_ERR_OUT_OF_MEMORY, {"host_alloc"}));
  a.fail_after = -1;
  EXPECT_EQ(a.live_bytes(), held) << "the block that was allocated went back";
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(pq_sequence_restore_kv(ctx, 2, bytes.data() + at, size - at, &used), PQ_OK)
        << "layer " << l << ": " << pq_last_error();
    at += used;
    EXPECT_EQ(a.live_bytes(), held + per_layer * static_cast<uint64_t>(l + 1))
        << "layer " << l << "'s K/V allocated with its section";
  }
  ASSERT_EQ(pq_sequence_restore_kv(ctx, 2, bytes.data() + at, size - at, &used), PQ_OK);
  EXPECT_EQ(at + used, size);
  EXPECT_EQ(a.live_bytes(), stats(ctx).kv_bytes);
  ASSERT_EQ(pq_sequence_remove(ctx, 2), PQ_OK);
  EXPECT_EQ(a.live_bytes(), held);
}

TEST(Hooks, AllocatorFailureFailsTheCallAndChangesNothing) {
  CountingAllocator a;
  Ctx ctx(hooks_config(), alloc_hooks(&a));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 200);
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  const uint64_t held = a.live_bytes();
  a.fail_after = 1;  // the next append needs two blocks (K and V of a new chunk)
  HostTensor more = make_tensor(random_normal(size_t(100) * kKv * kDim, 5), 100, kKv, kDim,
                                PQ_DTYPE_F32);
  EXPECT_TRUE(IsError(pq_decode_append(ctx, 1, 0, more.get(), more.get()), PQ_ERR_OUT_OF_MEMORY,
                      {"host_alloc", "NULL"}));
  int64_t n = 0;
  ASSERT_EQ(pq_sequence_length(ctx, 1, 0, &n), PQ_OK);
  EXPECT_EQ(n, 200) << "no token of the failed append stayed";
  EXPECT_EQ(a.live_bytes(), held) << "the block that was allocated went back";
  // Memory aligned to less than asked goes back, and the call fails too.
  a.fail_after = -1;
  a.misalign = 8;
  EXPECT_TRUE(IsError(pq_decode_append(ctx, 1, 0, more.get(), more.get()), PQ_ERR_BACKEND,
                      {"host_alloc", "aligned"}));
  ASSERT_EQ(pq_sequence_length(ctx, 1, 0, &n), PQ_OK);
  EXPECT_EQ(n, 200);
  EXPECT_EQ(a.live_bytes(), held);
  a.misalign = 0;
  EXPECT_EQ(pq_decode_append(ctx, 1, 0, more.get(), more.get()), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_sequence_length(ctx, 1, 0, &n), PQ_OK);
  EXPECT_EQ(n, 300);
  EXPECT_FALSE(a.misaligned_free);
}

// ---------------------------------------------------------------------------
// Build notification
// ---------------------------------------------------------------------------

struct BuildRecord {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::pair<uint64_t, int32_t>> done;
  std::vector<pq_status> statuses;
  pq_context* ctx = nullptr;
  int64_t selected_inside = 0;  // selections the hook made on the layer it was told of

  static void hook(void* user, uint64_t seq, int32_t layer, pq_status status) {
    auto* self = static_cast<BuildRecord*>(user);
    // A selection on the layer just built: it installs the index of the
    // build whose future is ready, so nothing waits.
    bool ready = false;
    if (status == PQ_OK && self->ctx != nullptr) {
      HostTensor q = make_tensor(random_normal(size_t(kQ) * kDim, seq * 10 + layer), 1, kQ, kDim,
                                 PQ_DTYPE_F32);
      Sel sel(kKv, selection_capacity(self->ctx, seq, layer));
      pq_layer_info info{};
      info.struct_size = sizeof info;
      ready = pq_decode_select(self->ctx, seq, layer, q.get(), sel.get()) == PQ_OK &&
              pq_layer_info_get(self->ctx, seq, layer, &info) == PQ_OK && info.index_ready == 1;
    }
    std::lock_guard<std::mutex> lock(self->mutex);
    self->done.emplace_back(seq, layer);
    self->statuses.push_back(status);
    self->selected_inside += ready;
    self->cv.notify_all();
  }
  // Waits for `n` reports (a guard against a hang, not a timing).
  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(120), [&] { return done.size() >= n; });
  }
};

TEST(Hooks, BuildDoneReportsEachFinishedBuildOnceAndMayCallTheLayer) {
  BuildRecord record;
  pq_hooks h;
  pq_hooks_default(&h);
  h.build_done = &BuildRecord::hook;
  h.build_done_user = &record;
  Ctx ctx(hooks_config(), h);
  ASSERT_TRUE(ctx.ok());
  record.ctx = ctx;
  prefill(ctx, 1, 500);
  prefill(ctx, 2, 400, 2);
  ASSERT_TRUE(record.wait_for(2 * kLayers)) << "reports: " << record.done.size();
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  std::lock_guard<std::mutex> lock(record.mutex);
  auto done = record.done;
  std::sort(done.begin(), done.end());
  const std::vector<std::pair<uint64_t, int32_t>> expected{{1, 0}, {1, 1}, {2, 0}, {2, 1}};
  EXPECT_EQ(done, expected) << "one report per (sequence, layer) build";
  for (pq_status s : record.statuses) EXPECT_EQ(s, PQ_OK);
  EXPECT_EQ(record.selected_inside, 2 * kLayers) << "the layer had its index when told";
}

// Every build_progress call of one context, in order, and the build_done
// reports interleaved with them.
struct ProgressRecord {
  struct Event {
    bool done;  // a build_done report, not a progress call
    pq_build_progress progress;
  };
  std::mutex mutex;
  std::vector<Event> events;
  static void progress(void* user, const pq_build_progress* p) {
    auto* self = static_cast<ProgressRecord*>(user);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->events.push_back({false, *p});
  }
  static void done(void* user, uint64_t seq, int32_t layer, pq_status) {
    auto* self = static_cast<ProgressRecord*>(user);
    pq_build_progress p{};
    p.seq_id = seq;
    p.layer = layer;
    std::lock_guard<std::mutex> lock(self->mutex);
    self->events.push_back({true, p});
  }
};

TEST(Hooks, BuildProgressRisesThroughKMeansAndEachEncodeSliceBeforeBuildDone) {
  ProgressRecord record;
  pq_hooks h;
  pq_hooks_default(&h);
  h.build_progress = &ProgressRecord::progress;
  h.build_progress_user = &record;
  h.build_done = &ProgressRecord::done;
  h.build_done_user = &record;
  pq_config config = hooks_config();
  config.kmeans_tolerance = 0.f;  // every iteration of the budget runs
  Ctx ctx(config, h);
  ASSERT_TRUE(ctx.ok());
  const int64_t tokens = 150000;  // three encode slices of 65,536 tokens
  prefill(ctx, 7, tokens);
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK) << pq_last_error();
  ctx.reset();  // waits for the hooks of its builds
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<ProgressRecord::Event> mine;
    for (const auto& e : record.events)
      if (e.progress.layer == layer) mine.push_back(e);
    ASSERT_FALSE(mine.empty());
    ASSERT_TRUE(mine.back().done) << "build_done comes after the last progress call";
    mine.pop_back();
    std::vector<int64_t> kmeans, encoded;
    double last = 0.0;
    for (const auto& e : mine) {
      const pq_build_progress& p = e.progress;
      ASSERT_FALSE(e.done) << "one build_done per build";
      EXPECT_EQ(p.struct_size, sizeof(pq_build_progress));
      EXPECT_EQ(p.seq_id, 7u);
      EXPECT_GE(p.fraction, last) << "the fraction never goes back";
      EXPECT_LE(p.fraction, 1.0);
      last = p.fraction;
      if (p.stage == PQ_BUILD_STAGE_KMEANS) {
        EXPECT_TRUE(encoded.empty()) << "K-Means comes before the encode";
        EXPECT_EQ(p.total, config.kmeans_iterations);
        kmeans.push_back(p.done);
      } else {
        ASSERT_EQ(p.stage, PQ_BUILD_STAGE_ENCODE);
        EXPECT_EQ(p.total, tokens);
        encoded.push_back(p.done);
      }
    }
    const std::vector<int64_t> iterations{1, 2, 3, 4};
    EXPECT_EQ(kmeans, iterations) << "one call per Lloyd iteration of the budget";
    const std::vector<int64_t> slices{65536, 131072, tokens};
    EXPECT_EQ(encoded, slices) << "one call per encode slice";
    EXPECT_EQ(last, 1.0);
  }
}

TEST(Hooks, HooksOfAnEarlierSizeHaveNoBuildProgress) {
  ProgressRecord record;
  pq_hooks h;
  pq_hooks_default(&h);
  h.struct_size = offsetof(pq_hooks, build_progress);  // a 0.13 caller's struct
  h.build_progress = &ProgressRecord::progress;         // past its end: never read
  h.build_progress_user = &record;
  Ctx ctx(hooks_config(), h);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  prefill(ctx, 1, 500);
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  ctx.reset();
  EXPECT_TRUE(record.events.empty());
}

// ---------------------------------------------------------------------------
// Shared pool
// ---------------------------------------------------------------------------

int threads_of_this_process() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

TEST(Hooks, ContextsOnOnePoolRunOneSetOfThreads) {
  pq_pool* pool = nullptr;
  EXPECT_TRUE(IsError(pq_pool_create(-1, &pool), PQ_ERR_INVALID_ARGUMENT, {"threads", "-1"}));
  EXPECT_TRUE(IsError(pq_pool_create(2000, &pool), PQ_ERR_INVALID_ARGUMENT, {"2000"}));
  EXPECT_TRUE(IsError(pq_pool_create(2, nullptr), PQ_ERR_INVALID_ARGUMENT, {"out"}));
  // A sanitizer runtime (TSan) starts a thread of its own at the process's
  // first pthread_create: let that happen before counting.
  ASSERT_EQ(pq_pool_create(1, &pool), PQ_OK);
  pq_pool_destroy(pool);
  const int before = threads_of_this_process();
  ASSERT_EQ(pq_pool_create(3, &pool), PQ_OK) << pq_last_error();
  int32_t threads = 0;
  ASSERT_EQ(pq_pool_threads(pool, &threads), PQ_OK);
  EXPECT_EQ(threads, 3);
  pq_hooks h;
  pq_hooks_default(&h);
  h.pool = pool;
  std::vector<Ctx> contexts;
  for (int i = 0; i < 4; ++i) {
    contexts.emplace_back(hooks_config(8), h);  // worker_threads ignored: the pool's
    ASSERT_TRUE(contexts.back().ok()) << pq_last_error();
  }
  EXPECT_EQ(threads_of_this_process() - before, 3) << "4 contexts, one pool of 3 threads";
  pq_config got;
  pq_config_default(&got);
  ASSERT_EQ(pq_get_config(contexts[0], &got), PQ_OK);
  EXPECT_EQ(got.worker_threads, 3);

  // The caller lets go of its reference: the contexts keep the pool.
  pq_pool_destroy(pool);
  for (size_t i = 0; i < contexts.size(); ++i) prefill(contexts[i], 1, 600, i + 1);
  // Destroying one context cancels and waits for its own builds only.
  contexts[1].reset();
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}}) {
    ASSERT_EQ(pq_wait_builds(contexts[i]), PQ_OK) << pq_last_error();
    pq_layer_info info = layer_info(contexts[i], 1, 0);
    EXPECT_TRUE(info.index_ready) << "context " << i;
  }
  contexts.clear();
  EXPECT_EQ(threads_of_this_process(), before) << "the last context stopped the pool";
}

}  // namespace
