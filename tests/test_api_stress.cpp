// Concurrency stress: many sequences on many threads, prefill and decode
// interleaved, removes racing with calls on the same sequence, readers of
// statistics and layer info everywhere, and contexts destroyed with builds
// in flight. Meant for the ThreadSanitizer build (scripts/test.sh --tsan),
// where every data race fails it; in the other builds it checks the results:
// every status is PQ_OK or, for a sequence removed under the call,
// PQ_ERR_NOT_FOUND, and every fetched row is the row that was stored.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 16;

// The value of element d of (seq, position, kv head): known to every thread,
// so fetched rows can be checked without sharing buffers.
float value(uint64_t seq, int64_t position, int32_t head, int32_t d) {
  return static_cast<float>((seq * 131 + static_cast<uint64_t>(position) * 7 +
                             static_cast<uint64_t>(head) * 3 + static_cast<uint64_t>(d)) %
                            97) /
         16.f;
}

std::vector<float> rows(uint64_t seq, int64_t first, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count * kKv * kDim));
  for (int64_t t = 0; t < count; ++t)
    for (int32_t h = 0; h < kKv; ++h)
      for (int32_t d = 0; d < kDim; ++d)
        v[static_cast<size_t>((t * kKv + h) * kDim + d)] = value(seq, first + t, h, d);
  return v;
}

pq_config stress_config(int32_t selector) {
  pq_config c = make_config(kLayers, kQ, kKv, kDim, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 2;
  c.local_tokens = 16;
  c.topk_tokens = 8;
  c.pq_bits = 4;
  c.kmeans_iterations = 4;
  c.worker_threads = 2;
  c.cache_tokens = 64;
  c.cache_block_tokens = 16;
  return c;
}

bool ok_or_removed(pq_status st) { return st == PQ_OK || st == PQ_ERR_NOT_FOUND; }

// One decode worker: its own sequences, prefilled and decoded; a sequence
// may vanish under it (the remover thread), which it then adds again.
void decode_worker(pq_context* ctx, uint64_t first_seq, int sequences, int steps,
                   std::atomic<int>* errors, std::atomic<int>* fetches) {
  std::vector<float> q = random_normal(kQ * kDim, first_seq);
  HostTensor query = make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < sequences; ++i) {
      const uint64_t seq = first_seq + static_cast<uint64_t>(i);
      // Start the sequence anew (the remover may or may not have taken it).
      pq_status st = pq_sequence_remove(ctx, seq);
      if (!ok_or_removed(st)) ++*errors;
      st = pq_sequence_add(ctx, seq);
      if (st != PQ_OK) ++*errors;
      const int64_t prompt = 300 + 37 * i;
      std::vector<float> kv = rows(seq, 0, prompt);
      HostTensor k = make_tensor(kv, prompt, kKv, kDim, PQ_DTYPE_F32);
      bool alive = true;
      for (int32_t layer = 0; layer < kLayers && alive; ++layer) {
        st = pq_prefill_layer(ctx, seq, layer, k.get(), k.get());
        if (!ok_or_removed(st)) ++*errors;
        alive = st == PQ_OK;
      }
      for (int step = 0; step < steps && alive; ++step) {
        const int64_t pos = prompt + step;
        std::vector<float> one = rows(seq, pos, 1);
        HostTensor t = make_tensor(one, 1, kKv, kDim, PQ_DTYPE_F32);
        for (int32_t layer = 0; layer < kLayers && alive; ++layer) {
          st = pq_decode_append(ctx, seq, layer, t.get(), t.get());
          if (st != PQ_OK) {
            if (!ok_or_removed(st)) ++*errors;
            alive = false;
            break;
          }
          int64_t cap = 0;
          st = pq_selection_capacity(ctx, seq, layer, &cap);
          if (st != PQ_OK) {
            if (!ok_or_removed(st)) ++*errors;
            alive = false;
            break;
          }
          Sel sel(kKv, cap);
          st = pq_decode_select(ctx, seq, layer, query.get(), sel.get());
          if (st != PQ_OK) {
            if (!ok_or_removed(st)) ++*errors;
            alive = false;
            break;
          }
          std::vector<float> ko(static_cast<size_t>(kKv * cap * kDim)), vo(ko.size());
          pq_tensor kt, vt;
          pq_tensor_init(&kt, ko.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, cap, kKv, kDim);
          pq_tensor_init(&vt, vo.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, cap, kKv, kDim);
          st = pq_fetch_kv(ctx, seq, layer, sel.get(), &kt, &vt);
          if (st != PQ_OK) {
            if (!ok_or_removed(st)) ++*errors;
            alive = false;
            break;
          }
          ++*fetches;
          for (int32_t h = 0; h < kKv; ++h) {
            const std::vector<int32_t> r = sel.row(h);
            for (size_t j = 0; j < r.size(); ++j) {
              if (j > 0 && r[j] <= r[j - 1]) ++*errors;  // ascending, unique
              if (r[j] < 0 || r[j] > pos) ++*errors;
              for (int32_t d = 0; d < kDim; ++d)
                if (ko[(static_cast<size_t>(h) * cap + j) * kDim + d] != value(seq, r[j], h, d) ||
                    vo[(static_cast<size_t>(h) * cap + j) * kDim + d] != value(seq, r[j], h, d))
                  ++*errors;
            }
          }
        }
      }
    }
  }
}

TEST(Stress, ManySequencesOnManyThreadsWithRacingRemoves) {
  for (int32_t selector : {PQ_SELECTOR_PQ, PQ_SELECTOR_H2O}) {
    Ctx ctx(stress_config(selector));
    ASSERT_TRUE(ctx.ok());
    std::atomic<int> errors{0}, fetches{0};
    std::atomic<bool> done{false};
    std::vector<std::thread> workers;
    for (int w = 0; w < 3; ++w)
      workers.emplace_back(decode_worker, ctx.get(), 1000 * (w + 1), 4, 40, &errors, &fetches);
    // Removes sequences under the workers' calls: one per 40 fetches, so
    // the share of work cut short does not depend on the machine's speed.
    std::thread remover([&] {
      uint64_t n = 0;
      while (!done.load()) {
        if (fetches.load() < 40 * static_cast<int>(n + 1)) {
          std::this_thread::yield();
          continue;
        }
        const uint64_t seq = 1000 * (1 + n % 3) + (n / 3) % 4;
        const pq_status st = pq_sequence_remove(ctx, seq);
        if (!ok_or_removed(st)) ++errors;
        ++n;
      }
    });
    // Reads statistics, layer info and waits for builds all along.
    std::thread reader([&] {
      while (!done.load()) {
        pq_stats s = stats(ctx);
        if (s.sequences < 0) ++errors;
        for (uint64_t seq : {1000, 2001, 3003}) {
          pq_status st = PQ_OK;
          layer_info(ctx, seq, 1, &st);
          if (!ok_or_removed(st)) ++errors;
          pq_stats one;
          std::memset(&one, 0, sizeof one);
          one.struct_size = sizeof one;
          if (!ok_or_removed(pq_sequence_stats_get(ctx, seq, &one))) ++errors;
        }
        const pq_status st = pq_wait_builds(ctx);
        if (st != PQ_OK && st != PQ_ERR_BAD_STATE) ++errors;  // a cancelled build may report
      }
    });
    for (auto& t : workers) t.join();
    done.store(true);
    remover.join();
    reader.join();
    EXPECT_EQ(errors.load(), 0) << "selector " << selector;
    // Most steps ran (a removed sequence ends its steps early).
    EXPECT_GT(fetches.load(), 3 * 2 * 4 * 40 * kLayers / 4) << "selector " << selector;
  }
}

TEST(Stress, DestroyWithBuildsAndIngestsInFlight) {
  HostTensor k = make_tensor(rows(1, 0, 2048), 2048, kKv, kDim, PQ_DTYPE_F32);
  const pq_tensor* kt = k.get();  // shared read-only by the threads below
  for (int round = 0; round < 20; ++round) {
    Ctx ctx(stress_config(PQ_SELECTOR_PQ));
    ASSERT_TRUE(ctx.ok());
    std::vector<std::thread> threads;
    for (uint64_t seq = 1; seq <= 2; ++seq)
      threads.emplace_back([&, seq] {
        ASSERT_EQ(pq_sequence_add(ctx, seq), PQ_OK);
        for (int32_t layer = 0; layer < kLayers; ++layer)
          ASSERT_EQ(pq_prefill_layer(ctx, seq, layer, kt, kt), PQ_OK);
      });
    for (auto& t : threads) t.join();
    ctx.reset();  // builds queued and running
  }
}

// pq_sequence_length and pq_selection_capacity once read their layer through
// a reference that outlived the sequence's last owner: a remove between the
// lookup and the read freed the layer under them (found by TSan in the test
// above). Here the race is the whole loop, so ASan and TSan see it at once.
TEST(Stress, LengthAndCapacityRaceTheRemoveOfTheirSequence) {
  Ctx ctx(stress_config(PQ_SELECTOR_WINDOW));
  ASSERT_TRUE(ctx.ok());
  HostTensor k = make_tensor(rows(7, 0, 64), 64, kKv, kDim, PQ_DTYPE_F32);
  std::atomic<bool> done{false};
  std::atomic<int> errors{0};
  std::thread reader([&] {
    while (!done.load()) {
      int64_t n = 0;
      pq_status st = pq_sequence_length(ctx, 7, 0, &n);
      if (st == PQ_OK && n != 0 && n != 64) ++errors;  // before or after the prefill
      if (!ok_or_removed(st) && st != PQ_ERR_BAD_STATE) ++errors;
      st = pq_selection_capacity(ctx, 7, 1, &n);
      if (!ok_or_removed(st) && st != PQ_ERR_BAD_STATE) ++errors;
    }
  });
  for (int round = 0; round < 400; ++round) {
    ASSERT_EQ(pq_sequence_add(ctx, 7), PQ_OK);
    for (int32_t layer = 0; layer < kLayers; ++layer)
      ASSERT_EQ(pq_prefill_layer(ctx, 7, layer, k.get(), k.get()), PQ_OK);
    ASSERT_EQ(pq_sequence_remove(ctx, 7), PQ_OK);
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(errors.load(), 0);
}

}  // namespace
