// The settings PQ's device selection does not serve (config.top_p and
// config.pq_outliers, issue 44), through the host fake of the CUDA plug-in:
// pq_decode_select selects on the host, what the CPU backend selects, with
// no scan or top-k launched; pq_decode_select_device is PQ_ERR_UNSUPPORTED
// naming the field; and the decode step's fetch still runs on the device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

struct HostOnly {
  const char* field;
  void (*set)(pq_config&);
};

const HostOnly kSettings[] = {
    {"top_p", [](pq_config& c) { c.top_p = 0.05f; }},
    {"pq_outliers", [](pq_config& c) { c.pq_outliers = 0.02f; }},
};

TEST(FakeCudaHostSelection, TopPAndOutliersSelectOnTheHost) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  for (const HostOnly& s : kSettings) {
    SCOPED_TRACE(s.field);
    pq_config c = base_config(PQ_DTYPE_F32);
    c.cache_tokens = 0;
    s.set(c);
    Ctx cpu(c);
    Ctx cuda = make_fake_cuda_ctx(c);
    ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
    for (pq_context* ctx : {cpu.get(), cuda.get()}) add_prefilled(ctx, 1, 700, PQ_DTYPE_F32, 3);
    if (HasFatalFailure()) return;
    bool fewer = false;  // top_p: some head kept fewer than k
    for (int64_t step = 0; step < 3; ++step)
      for (int32_t l = 0; l < kLayers; ++l) {
        Step d = step_data(l, step, PQ_DTYPE_F32, 3);
        for (pq_context* ctx : {cpu.get(), cuda.get()})
          ASSERT_EQ(pq_decode_append(ctx, 1, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
        const int64_t cap = selection_capacity(cpu, 1, l);
        Sel want(kKvHeads, cap), got(kKvHeads, cap);
        ASSERT_EQ(pq_decode_select(cpu, 1, l, d.q.get(), want.get()), PQ_OK) << pq_last_error();
        const pq_fake_cuda_counters before = Fake::get().counters();
        ASSERT_EQ(pq_decode_select(cuda, 1, l, d.q.get(), got.get()), PQ_OK) << pq_last_error();
        EXPECT_EQ(counters_since(before).kernel_launches, 0u) << "selected on the device";
        for (int32_t h = 0; h < kKvHeads; ++h) {
          ASSERT_EQ(got.row(h), want.row(h)) << "layer " << l << " head " << h;
          fewer = fewer || got.counts[h] < cap;
        }
        DeviceTensor dq(d.q);
        DeviceSel dsel(cap);
        EXPECT_TRUE(IsError(pq_decode_select_device(cuda, 1, l, &dq.t, &dsel.s),
                            PQ_ERR_UNSUPPORTED, {s.field}));
      }
    if (std::string(s.field) == "top_p") EXPECT_TRUE(fewer) << "top_p kept every k";
  }
}

}  // namespace
