// The host K/V store on 2 MiB huge-page slabs (src/store/host_slabs.h),
// through the public API: config.host_memory_limit counts what the slabs
// reserve, slack of a partly used slab included, so a prompt that fits
// without slabs but not with their slack is refused (nothing held), one
// whose slabs fit (with one slab of room while a slab is cut) is accepted, and removing the sequences gives the slabs
// back (pq_stats.host_bytes returns to its baseline).
#include <gtest/gtest.h>

#include <cstdlib>

#include "api_test_util.h"

using namespace pqt;

namespace {

constexpr int64_t kChunkTokens = 256;

// 8 kv heads x 128 dims of f16: one chunk's K (or V) is 512 KiB, four to a
// slab. Five chunks: ten blocks on three slabs, the last half used.
pq_config slab_config() {
  pq_config c = make_config(1, 8, 8, 128, PQ_DTYPE_F16);
  c.selector = PQ_SELECTOR_EXACT;  // no index: the K/V is the whole story
  c.worker_threads = 2;
  return c;
}

HostTensor prompt(int64_t tokens, uint64_t seed) {
  return make_tensor(random_normal(static_cast<size_t>(tokens * 8 * 128), seed), tokens, 8, 128,
                     PQ_DTYPE_F16);
}

class HostSlabs : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("PQ_HOST_HUGE_PAGES"); }
  // host_bytes after a prefill of `tokens`, with slabs on or off.
  uint64_t held_after(int64_t tokens, bool slabs) {
    setenv("PQ_HOST_HUGE_PAGES", slabs ? "1" : "0", 1);
    Ctx ctx(slab_config());
    EXPECT_TRUE(ctx.ok()) << pq_last_error();
    EXPECT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
    HostTensor p = prompt(tokens, 3);
    EXPECT_EQ(pq_prefill_layer(ctx, 1, 0, p.get(), p.get()), PQ_OK) << pq_last_error();
    EXPECT_EQ(pq_wait_builds(ctx), PQ_OK);
    return stats(ctx).host_bytes;
  }
};

TEST_F(HostSlabs, TheLimitCountsSlabSlack) {
  const int64_t tokens = 5 * kChunkTokens;
  const uint64_t without = held_after(tokens, false);
  const uint64_t with = held_after(tokens, true);
  // Ten 512 KiB blocks on three 2 MiB slabs: two blocks of slack.
  EXPECT_EQ(with - without, uint64_t{1} << 20);

  setenv("PQ_HOST_HUGE_PAGES", "1", 1);
  pq_config c = slab_config();
  c.host_memory_limit = without;  // the chunks fit, their slabs do not
  {
    Ctx tight(c);
    ASSERT_TRUE(tight.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(tight, 1));
    const uint64_t before = stats(tight).host_bytes;
    HostTensor p = prompt(tokens, 3);
    pq_status st = pq_prefill_layer(tight, 1, 0, p.get(), p.get());
    if (st == PQ_OK) st = pq_wait_builds(tight);
    int64_t length = -1;
    if (st == PQ_OK) st = pq_sequence_length(tight, 1, 0, &length);
    EXPECT_EQ(st, PQ_ERR_OUT_OF_MEMORY) << pq_last_error();
    EXPECT_EQ(stats(tight).host_bytes, before);  // nothing held, slabs included
  }
  // Room for the slabs, and for the one transient slab: a prefill charges
  // its chunks first, then cuts each slab whole before handing its blocks
  // to those (already charged) chunks.
  c.host_memory_limit = with + (uint64_t{2} << 20);
  Ctx fits(c);
  ASSERT_TRUE(fits.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(fits, 1));
  HostTensor p = prompt(tokens, 3);
  PQ_EXPECT_OK(pq_prefill_layer(fits, 1, 0, p.get(), p.get()));
  PQ_EXPECT_OK(pq_wait_builds(fits));
  EXPECT_EQ(stats(fits).host_bytes, with);
}

TEST_F(HostSlabs, RemovedSequencesGiveTheirSlabsBack) {
  setenv("PQ_HOST_HUGE_PAGES", "1", 1);
  Ctx ctx(slab_config());
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  const uint64_t baseline = stats(ctx).host_bytes;
  HostTensor a = prompt(3 * kChunkTokens + 17, 5), b = prompt(2 * kChunkTokens + 1, 6);
  for (uint64_t s = 1; s <= 3; ++s) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, s));
    HostTensor& p = s == 2 ? b : a;
    PQ_ASSERT_OK(pq_prefill_layer(ctx, s, 0, p.get(), p.get()));
  }
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  EXPECT_GT(stats(ctx).host_bytes, baseline + (uint64_t{6} << 20));
  for (uint64_t s : {2u, 1u, 3u}) PQ_ASSERT_OK(pq_sequence_remove(ctx, s));
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  EXPECT_EQ(stats(ctx).host_bytes, baseline);
}

}  // namespace
