// Several query tokens in one select on the device
// (pq_decode_select_multi_device; issue 42), through the host fake of the
// CUDA plug-in: for every row form (per token, the union per kv head, the
// union per request), host-tier and index-only contexts, rotate-half, a
// middle shorter than k and re-ranking, the rows (padding and counts
// included) are the CPU backend's pq_decode_select_multi, in one launch
// chain and one multi_rows launch on the sequence's stream, with no host
// wait. Then the refusals, each by name.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

// Rows in fake device memory, every entry first set to `fill`.
struct DeviceRows {
  DeviceBuffer positions, counts;
  pq_selection s{};
  int64_t rows, capacity;
  DeviceRows(int64_t r, int64_t cap, int32_t fill = 0x5A5A5A5A)
      : positions(static_cast<size_t>(std::max<int64_t>(r * cap, 1)) * 4),
        counts(static_cast<size_t>(r) * 4),
        rows(r),
        capacity(cap) {
    Fake::get().synchronize_all();
    for (int64_t i = 0; i < std::max<int64_t>(r * cap, 1); ++i)
      static_cast<int32_t*>(positions.get())[i] = fill;
    for (int64_t i = 0; i < r; ++i) static_cast<int32_t*>(counts.get())[i] = fill;
    s.positions = static_cast<int32_t*>(positions.get());
    s.counts = static_cast<int32_t*>(counts.get());
    s.capacity = cap;
  }
  // What the device holds once the streams ran ("device" memory is host
  // memory in the fake).
  std::vector<int32_t> all_positions() const {
    const auto* p = static_cast<const int32_t*>(positions.get());
    return std::vector<int32_t>(p, p + rows * capacity);
  }
  std::vector<int32_t> all_counts() const {
    const auto* c = static_cast<const int32_t*>(counts.get());
    return std::vector<int32_t>(c, c + rows);
  }
};

struct Setting {
  int32_t tier;
  float rerank;
  int32_t dtype;
  int64_t prompt;
};

pq_config setting_config(const Setting& s) {
  pq_config c = base_config(s.dtype);
  c.cache_tokens = 0;
  c.key_rotary = PQ_ROTARY_HALF;
  c.kv_tier = s.tier;
  c.pq_rerank = s.rerank;
  return c;
}

const int32_t kForms[] = {PQ_ROWS_PER_TOKEN, PQ_ROWS_PER_HEAD, PQ_ROWS_PER_REQUEST};

// A CPU and a fake CUDA context of one config, sequence 1 prefilled alike.
struct Both {
  Ctx cpu, cuda;
  bool ok() const { return cpu.ok() && cuda.ok() && !::testing::Test::HasFatalFailure(); }
};
Both prefilled(const pq_config& c, int64_t prompt, uint64_t seed) {
  Both b{Ctx(c), make_fake_cuda_ctx(c)};
  EXPECT_TRUE(b.cpu.ok() && b.cuda.ok()) << pq_last_error();
  if (b.cpu.ok() && b.cuda.ok())
    for (pq_context* ctx : {b.cpu.get(), b.cuda.get()}) add_prefilled(ctx, 1, prompt, c.dtype, seed);
  return b;
}

// Steps of one sequence on both backends; at each, for 1, 3 and 6 query
// tokens and every form, the device rows equal the CPU's.
void expect_multi_matches(const Setting& s, uint64_t seed) {
  SCOPED_TRACE("tier " + std::to_string(s.tier) + " rerank " + std::to_string(s.rerank) +
               " dtype " + std::to_string(s.dtype) + " prompt " + std::to_string(s.prompt));
  Both both = prefilled(setting_config(s), s.prompt, seed);
  ASSERT_TRUE(both.ok());
  const Ctx &cpu = both.cpu, &cuda = both.cuda;
  const bool scored = s.prompt - 4 - 16 > 24;  // the middle is longer than k
  const uint64_t chain = scored ? (s.rerank > 0.f ? 5 : 4) : 1;  // + the re-ranking; fill only
  const pq_fake_cuda_counters start = Fake::get().counters();
  for (int64_t step = 0; step < 3; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      Step d = step_data(l, step, s.dtype, seed);
      for (pq_context* ctx : {cpu.get(), cuda.get()})
        ASSERT_EQ(pq_decode_append(ctx, 1, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
      for (int64_t q : {1, 3, 6}) {
        HostTensor queries = make_tensor(random_normal(q * kQHeads * kDim, seed + 100 * step + q),
                                         q, kQHeads, kDim, s.dtype);
        DeviceTensor dq(queries);
        for (int32_t form : kForms) {
          SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(step) + " q " +
                       std::to_string(q) + " form " + std::to_string(form));
          int64_t rows = 0, cap = 0, rows_d = 0, cap_d = 0;
          ASSERT_EQ(pq_selection_capacity_multi(cpu, 1, l, q, form, &rows, &cap), PQ_OK);
          ASSERT_EQ(pq_selection_capacity_multi(cuda, 1, l, q, form, &rows_d, &cap_d), PQ_OK);
          ASSERT_EQ(rows_d, rows);
          ASSERT_EQ(cap_d, cap);
          Sel want(static_cast<int32_t>(rows), cap);
          ASSERT_EQ(pq_decode_select_multi(cpu, 1, l, queries.get(), form, nullptr, want.get()),
                    PQ_OK)
              << pq_last_error();
          DeviceRows got(rows, cap);
          const pq_fake_cuda_counters before = Fake::get().counters();
          ASSERT_EQ(pq_decode_select_multi_device(cuda, 1, l, &dq.t, form, &got.s), PQ_OK)
              << pq_last_error();
          const pq_fake_cuda_counters used = counters_since(before);
          EXPECT_EQ(used.host_waits, 0u) << "the rows stay on the device";
          EXPECT_EQ(used.kernel_launches, chain + 1) << "the tokens' chain, then multi_rows";
          EXPECT_GT(Fake::get().pending(), 0u) << "enqueued, not run";
          Fake::get().synchronize_all();
          ASSERT_EQ(got.all_counts(), want.counts);
          ASSERT_EQ(got.all_positions(),
                    std::vector<int32_t>(want.positions.begin(),
                                         want.positions.begin() + rows * cap))
              << "rows, then -1 to the capacity";
        }
      }
    }
  if (s.tier == PQ_KV_TIER_CALLER) EXPECT_EQ(counters_since(start).rows_copied, 0u);
  // Each token counts as a select, as on the host.
  EXPECT_EQ(pqt::stats(cuda).select_calls, pqt::stats(cpu).select_calls);
}

TEST(FakeCudaSelectMulti, EveryRowFormIsTheHostsOnHostTierAndIndexOnly) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  const Setting settings[] = {
      {PQ_KV_TIER_HOST, 0.f, PQ_DTYPE_F32, 700},
      {PQ_KV_TIER_CALLER, 0.f, PQ_DTYPE_F16, 700},
      {PQ_KV_TIER_CALLER, 0.f, PQ_DTYPE_BF16, 40},  // a middle shorter than k: taken whole
      {PQ_KV_TIER_HOST, 1.5f, PQ_DTYPE_BF16, 600},  // re-ranked from the host store
  };
  for (const Setting& s : settings)
    for (uint64_t seed : {3u, 4u}) {
      expect_multi_matches(s, seed);
      if (HasFatalFailure()) return;
    }
}

// On the sequence's stream: nothing runs until the stream is waited for.
TEST(FakeCudaSelectMulti, RunsOnTheSequencesStream) {
  ASSERT_NE(Fake::get().table, nullptr);
  Both both = prefilled(setting_config({PQ_KV_TIER_CALLER, 0.f, PQ_DTYPE_F32, 500}), 500, 9);
  ASSERT_TRUE(both.ok());
  const Ctx &cpu = both.cpu, &cuda = both.cuda;
  void* stream = nullptr;
  char err[256] = {0};
  ASSERT_EQ(Fake::get().table->stream_create(&stream, err, sizeof err), 0) << err;
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, stream), PQ_OK);
  HostTensor queries = make_tensor(random_normal(4 * kQHeads * kDim, 5), 4, kQHeads, kDim,
                                   PQ_DTYPE_F32);
  DeviceTensor dq(queries);
  int64_t rows = 0, cap = 0;
  ASSERT_EQ(pq_selection_capacity_multi(cpu, 1, 1, 4, PQ_ROWS_PER_HEAD, &rows, &cap), PQ_OK);
  Sel want(static_cast<int32_t>(rows), cap);
  ASSERT_EQ(pq_decode_select_multi(cpu, 1, 1, queries.get(), PQ_ROWS_PER_HEAD, nullptr,
                                   want.get()),
            PQ_OK);
  DeviceRows got(rows, cap, 7);
  ASSERT_EQ(pq_decode_select_multi_device(cuda, 1, 1, &dq.t, PQ_ROWS_PER_HEAD, &got.s), PQ_OK)
      << pq_last_error();
  EXPECT_EQ(got.all_counts(), std::vector<int32_t>(static_cast<size_t>(rows), 7))
      << "nothing written before the stream runs";
  ASSERT_EQ(Fake::get().table->stream_synchronize(stream, err, sizeof err), 0) << err;
  EXPECT_EQ(got.all_counts(), want.counts);
  EXPECT_EQ(got.all_positions(), want.positions);
  ASSERT_EQ(pq_sequence_set_stream(cuda, 1, nullptr), PQ_OK);
  ASSERT_EQ(Fake::get().table->stream_destroy(stream, err, sizeof err), 0) << err;
}

TEST(FakeCudaSelectMulti, RefusalsNameTheArgument) {
  ASSERT_NE(Fake::get().table, nullptr);
  const pq_config c = setting_config({PQ_KV_TIER_HOST, 0.f, PQ_DTYPE_F32, 400});
  Both both = prefilled(c, 400, 2);
  ASSERT_TRUE(both.ok());
  const Ctx &cpu = both.cpu, &cuda = both.cuda;
  HostTensor queries = make_tensor(random_normal(3 * kQHeads * kDim, 8), 3, kQHeads, kDim,
                                   PQ_DTYPE_F32);
  DeviceTensor dq(queries);
  int64_t rows = 0, cap = 0;
  ASSERT_EQ(pq_selection_capacity_multi(cuda, 1, 0, 3, PQ_ROWS_PER_REQUEST, &rows, &cap), PQ_OK);
  // Too small: the needed capacity in the message, nothing written.
  DeviceRows small(rows, cap - 1, 9);
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 1, 0, &dq.t, PQ_ROWS_PER_REQUEST, &small.s),
                PQ_ERR_BUFFER_TOO_SMALL, "pq_selection_capacity_multi");
  EXPECT_NE(std::string(pq_last_error()).find(std::to_string(cap)), std::string::npos);
  Fake::get().synchronize_all();
  EXPECT_EQ(small.all_counts(), std::vector<int32_t>(static_cast<size_t>(rows), 9));
  DeviceRows got(rows, cap);  // the rows of PQ_ROWS_PER_REQUEST: every call below asks for them
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 1, 0, &dq.t, 3, &got.s),
                PQ_ERR_INVALID_ARGUMENT, "rows");
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 1, 0, queries.get(), PQ_ROWS_PER_REQUEST,
                                              &got.s),
                PQ_ERR_UNSUPPORTED, "queries.memory");
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cpu, 1, 0, &dq.t, PQ_ROWS_PER_REQUEST, &got.s),
                PQ_ERR_UNSUPPORTED, "CUDA backend");
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 1, 0, &dq.t, PQ_ROWS_PER_REQUEST, nullptr),
                PQ_ERR_INVALID_ARGUMENT, "out");
  pq_selection overlap = got.s;
  overlap.counts = overlap.positions;
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 1, 0, &dq.t, PQ_ROWS_PER_REQUEST, &overlap),
                PQ_ERR_INVALID_ARGUMENT, "out->counts");
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 9, 0, &dq.t, PQ_ROWS_PER_REQUEST, &got.s),
                PQ_ERR_NOT_FOUND, "seq_id");
  // Host arrays are not the device's.
  Sel host_rows(static_cast<int32_t>(rows), cap);
  PQ_EXPECT_ERR(pq_decode_select_multi_device(cuda, 1, 0, &dq.t, PQ_ROWS_PER_REQUEST,
                                              host_rows.get()),
                PQ_ERR_UNSUPPORTED, "out->positions");
  // Another selector: the host call.
  pq_config w = c;
  w.selector = PQ_SELECTOR_WINDOW;
  Ctx window = make_fake_cuda_ctx(w);
  ASSERT_TRUE(window.ok()) << pq_last_error();
  add_prefilled(window, 1, 400, PQ_DTYPE_F32, 2);
  PQ_EXPECT_ERR(pq_decode_select_multi_device(window, 1, 0, &dq.t, PQ_ROWS_PER_REQUEST, &got.s),
                PQ_ERR_UNSUPPORTED, "PQ selector");
}

}  // namespace
