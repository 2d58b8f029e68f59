// The plug-in's kernels of ABI version 5 against the CPU code they replace:
// the row-table scan and top-k (pq_scan_rows, topk_rows), which score and
// select every kv head of a whole batch of sequences in one launch per pass,
// and the kernels of a decode step kept on the device (pq_lut,
// fill_selection, gather_selected); and the synchronous copy's promise that
// its bytes have landed for work on any stream (the ordering defect the
// copy_rows test showed on a GPU). Without a GPU every device test reports
// SKIPPED with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "pq/codebook.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "plugin_test_util.h"
#include "pqcache.h"
#include "base/scratch.h"
#include "base/dtype.h"
#include "base/topk.h"
#include "base/vector_math.h"

namespace {

// A pageable host-to-device copy must have landed when `copy` returns:
// cudaMemcpy alone returns with its DMA still queued on the legacy stream,
// which a non-blocking stream does not wait for, so a read on such a stream
// right after it could see the old bytes (before the fix, copy_rows' rows
// were overwritten by the late DMA of a test's sentinel upload).
TEST(CudaMemory, SynchronousCopyHasLandedForNonBlockingStreams) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const size_t bytes = size_t{256} << 20;  // long enough for the DMA to lag
  DeviceBuffer device(bytes);
  PinnedBuffer back(bytes);
  Stream stream;
  char err[256] = "";
  for (int round = 0; round < 4; ++round) {
    const char fill = static_cast<char>(0x11 * (round + 1));
    upload(device, std::vector<char>(bytes, fill));
    // At once, on a non-blocking stream: the whole buffer must be the fill.
    ASSERT_EQ(p->copy_async(back.get(), device.get(), bytes, stream.get(), err, sizeof err), 0)
        << err;
    stream.sync();
    const char* got = back.get();
    const size_t wrong = static_cast<size_t>(
        std::find_if(got, got + bytes, [&](char c) { return c != fill; }) - got);
    ASSERT_EQ(wrong, bytes) << "round " << round << ": byte " << wrong << " of " << bytes
                            << " had not landed";
  }
}

// ---------------------------------------------------------------------------
// topk_rows
// ---------------------------------------------------------------------------

struct TopkRowCase {
  int64_t n, k, first;
};

TEST(CudaTopKRows, RowsOfEveryLengthAndBudgetMatchTheCpu) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  // Lengths across chunk boundaries (4096 keys), k from 0 to past n, and
  // rows with nothing to do among them.
  const std::vector<TopkRowCase> cases = {
      {1000, 200, 0},   {0, 5, 7},          {4097, 819, 4},   {1, 1, 9},    {70000, 14000, 132},
      {300, 0, 4},      {50, 60, 100},      {8192, 8191, 4},  {4096, 1, 3}, {123457, 2048, 4},
      {65536, 65535, 0}, {9000, 4500, 1000}};
  const int32_t rows = static_cast<int32_t>(cases.size());
  int64_t max_n = 0, score_floats = 0, out_ints = 0;
  for (const TopkRowCase& c : cases) {
    max_n = std::max(max_n, c.n);
    score_floats += c.n;
    out_ints += c.k + 1;  // one sentinel after each row's output
  }
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> scores(static_cast<size_t>(score_floats));
  for (float& x : scores) x = std::round(u(rng) * 64.f) / 64.f;  // ties in every row
  DeviceBuffer d_scores(std::max<size_t>(scores.size(), 1) * sizeof(float));
  DeviceBuffer d_out(static_cast<size_t>(out_ints) * sizeof(int32_t));
  upload(d_scores, scores);
  const int32_t kSentinel = -77;
  upload(d_out, std::vector<int32_t>(static_cast<size_t>(out_ints), kSentinel));

  std::vector<pq_topk_row> table;
  std::vector<int64_t> score_at, out_at;
  int64_t s_at = 0, o_at = 0;
  for (const TopkRowCase& c : cases) {
    table.push_back({d_scores.as<float>() + s_at, d_out.as<int32_t>() + o_at, c.n, c.k, c.first});
    score_at.push_back(s_at);
    out_at.push_back(o_at);
    s_at += c.n;
    o_at += c.k + 1;
  }
  DeviceBuffer d_table(table.size() * sizeof(pq_topk_row));
  upload(d_table, table);
  const size_t ws = p->topk_rows_workspace_size(rows, max_n);
  DeviceBuffer d_ws(std::max<size_t>(ws, 1));
  Stream stream;
  char err[256] = "";
  ASSERT_EQ(p->topk_rows(d_table.as<pq_topk_row>(), rows, max_n, d_ws.get(), ws, stream.get(),
                         err, sizeof err),
            0)
      << err;
  stream.sync();
  const std::vector<int32_t> got = download<int32_t>(d_out, static_cast<size_t>(out_ints));

  pq::SelectScratch scratch;
  for (size_t r = 0; r < cases.size(); ++r) {
    const TopkRowCase& c = cases[r];
    const int64_t written = std::min(c.n, c.k);
    std::vector<int32_t> expected(static_cast<size_t>(written));
    if (c.k >= c.n)
      for (int64_t i = 0; i < c.n; ++i) expected[static_cast<size_t>(i)] = static_cast<int32_t>(c.first + i);
    else if (written > 0)
      pq::select_top_k(scores.data() + score_at[r], c.n, c.k, c.first, expected.data(), scratch);
    const auto row = got.begin() + out_at[r];
    EXPECT_EQ(std::vector<int32_t>(row, row + written), expected)
        << "row " << r << ": n " << c.n << ", k " << c.k;
    for (int64_t i = written; i <= c.k; ++i)
      EXPECT_EQ(row[i], kSentinel) << "row " << r << " wrote past its " << written << " positions";
  }
}

// ---------------------------------------------------------------------------
// pq_scan_rows
// ---------------------------------------------------------------------------

// Several "sequences", each with its own codes buffer (one misaligned: the
// byte path), token range and LUT, scored in one call and compared with the
// CPU's scan and combine of each row.
void check_scan_rows(int32_t group, int32_t m, int32_t bits, int32_t combine, uint32_t seed) {
  const pq_cuda_plugin* p = plugin();
  const int32_t C = 1 << bits;
  const int32_t kv_heads = 3;
  struct Sequence {
    int64_t tokens, begin, end;
    size_t offset;  // bytes before its codes: 16-byte aligned or not
  };
  const std::vector<Sequence> sequences = {
      {9000, 4, 7100, 0}, {300, 4, 172, 3}, {70001, 4, 69873, 0}, {140, 4, 12, 16}, {2, 1, 1, 0}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_int_distribution<int> code(0, C - 1);
  const float scale = 1.0f / std::sqrt(128.0f);
  const size_t lut_floats = static_cast<size_t>(group) * m * C;

  std::vector<std::vector<float>> luts;
  std::vector<std::vector<uint8_t>> codes;
  std::vector<std::unique_ptr<DeviceBuffer>> d_luts, d_codes;
  int64_t max_n = 0, score_floats = 0;
  for (const Sequence& q : sequences) {
    luts.emplace_back(lut_floats * kv_heads);
    for (float& x : luts.back()) x = normal(rng);
    codes.emplace_back(static_cast<size_t>(kv_heads * q.tokens * m));
    for (uint8_t& x : codes.back()) x = static_cast<uint8_t>(code(rng));
    d_luts.push_back(std::make_unique<DeviceBuffer>(luts.back().size() * sizeof(float)));
    d_codes.push_back(std::make_unique<DeviceBuffer>(codes.back().size() + q.offset));
    upload(*d_luts.back(), luts.back());
    upload(*d_codes.back(), codes.back(), q.offset);
    max_n = std::max(max_n, q.end - q.begin);
    score_floats += kv_heads * (q.end - q.begin);
  }
  DeviceBuffer d_scores(static_cast<size_t>(score_floats) * sizeof(float));
  std::vector<pq_scan_row> table;
  std::vector<float> expected;
  pq::SelectScratch scratch;
  int64_t at = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Sequence& q = sequences[i];
    const int64_t n = q.end - q.begin;
    for (int32_t h = 0; h < kv_heads; ++h) {
      const uint8_t* head_codes = d_codes[i]->as<uint8_t>() + q.offset +
                                  static_cast<size_t>(h) * q.tokens * m;
      table.push_back({d_luts[i]->as<float>() + lut_floats * h, head_codes,
                       d_scores.as<float>() + at, q.begin, q.end});
      std::vector<float> raw(static_cast<size_t>(group * n)), combined(static_cast<size_t>(n));
      pq::PqCodebook::pq_scores(luts[i].data() + lut_floats * h, group, m, C,
                     codes[i].data() + (static_cast<size_t>(h) * q.tokens + q.begin) * m, n,
                     raw.data(), n);
      pq::combine_group_scores(raw.data(), group, n, combine, scale, combined.data(), scratch);
      expected.insert(expected.end(), combined.begin(), combined.end());
      at += n;
    }
  }
  DeviceBuffer d_table(table.size() * sizeof(pq_scan_row));
  upload(d_table, table);
  const int32_t rows = static_cast<int32_t>(table.size());
  const size_t ws = p->pq_scan_rows_workspace_size(rows, group, m, max_n, combine);
  DeviceBuffer d_ws(std::max<size_t>(ws, 1));
  char err[256] = "";
  ASSERT_EQ(p->pq_scan_rows(d_table.as<pq_scan_row>(), rows, max_n, group, m, C, combine, scale,
                            d_ws.get(), ws, nullptr, err, sizeof err),
            0)
      << err;
  sync();
  const std::vector<float> got = download<float>(d_scores, expected.size());
  const bool exact = combine != PQ_GQA_SUM_SOFTMAX || group == 1;
  int reported = 0;
  for (size_t i = 0; i < expected.size() && reported < 5; ++i) {
    const bool ok = exact ? got[i] == expected[i]
                          : std::fabs(got[i] - expected[i]) <= 3e-5 * std::fabs(expected[i]) + 1e-37;
    if (!ok) {
      ADD_FAILURE() << "group " << group << ", m " << m << ", b " << bits << ", combine "
                    << combine << ": score " << i << " is " << got[i] << ", CPU " << expected[i];
      ++reported;
    }
  }
}

TEST(CudaPqScanRows, RowsOfSeveralSequencesMatchTheCpu) {
  REQUIRE_DEVICE();
  uint32_t seed = 300;
  for (int32_t m : {2, 3, 4})
    for (int32_t group : {1, 4})
      for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN}) {
        check_scan_rows(group, m, 6, combine, seed++);
        if (HasFailure()) return;
      }
}

TEST(CudaPqScanRows, EmptyTablesAndBadArgumentsAreRefusedOrNoOps) {
  const pq_cuda_plugin* p = plugin();
  ASSERT_NE(p, nullptr);
  char err[256] = "";
  // No rows, or rows of no tokens: nothing to launch (no device needed).
  EXPECT_EQ(p->pq_scan_rows(nullptr, 0, 100, 4, 2, 64, PQ_GQA_MAX, 1.f, nullptr, 0, nullptr, err,
                            sizeof err),
            0)
      << err;
  EXPECT_EQ(p->topk_rows(nullptr, 0, 100, nullptr, 0, nullptr, err, sizeof err), 0) << err;
  EXPECT_NE(p->pq_scan_rows(nullptr, 2, 100, 4, 2, 64, PQ_GQA_MAX, 1.f, nullptr, 0, nullptr, err,
                            sizeof err),
            0);
  EXPECT_NE(p->pq_scan_rows(nullptr, 2, 100, 4, 2, 63, PQ_GQA_MAX, 1.f, nullptr, 0, nullptr, err,
                            sizeof err),
            0);
  EXPECT_NE(std::string(err).find("power of two"), std::string::npos) << err;
  EXPECT_NE(p->topk_rows(nullptr, 70000, 100, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_NE(p->topk_rows(nullptr, 2, int64_t{1} << 40, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->topk_rows_workspace_size(0, 100), 0u);
  EXPECT_GT(p->topk_rows_workspace_size(3, 100000), 3u * 4 * 256 * sizeof(uint32_t));
  EXPECT_EQ(p->pq_scan_rows_workspace_size(8, 4, 2, 1 << 17, PQ_GQA_MAX), 0u);
  EXPECT_GT(p->pq_scan_rows_workspace_size(8, 4, 2, 1 << 17, PQ_GQA_SUM_SOFTMAX), 0u);
}

// ---------------------------------------------------------------------------
// The decode step kept on the device
// ---------------------------------------------------------------------------

// The LUT built on the device from a query in each dtype is bit for bit the
// host's: the same float inputs (f16 and bf16 convert exactly) and the same
// operations in the same order as the CPU's dot().
TEST(CudaDeviceStep, LutFromADeviceQueryIsTheHostLutBitForBit) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t kv = 4, group = 3, m = 4, C = 64, sd = 36;  // sd: 4 lanes of 8, then a tail of 4
  const int32_t head_dim = m * sd, q_heads = kv * group;
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> centroids(static_cast<size_t>(kv) * m * C * sd);
  for (float& x : centroids) x = normal(rng);
  DeviceBuffer d_centroids(centroids.size() * sizeof(float));
  upload(d_centroids, centroids);
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    const size_t es = pq::dtype_size(dtype);
    const int64_t head_stride = static_cast<int64_t>(head_dim + 8) * es;  // padded heads
    std::vector<uint8_t> query(static_cast<size_t>(q_heads) * head_stride);
    std::vector<float> as_float(static_cast<size_t>(q_heads) * head_dim);
    for (int32_t q = 0; q < q_heads; ++q)
      for (int32_t d = 0; d < head_dim; ++d) {
        const float x = normal(rng);
        uint8_t* at = query.data() + q * head_stride + d * es;
        if (dtype == PQ_DTYPE_F32) {
          std::memcpy(at, &x, 4);
        } else {
          const uint16_t bits = dtype == PQ_DTYPE_F16 ? pq::float_to_half(x) : pq::float_to_bf16(x);
          std::memcpy(at, &bits, 2);
        }
        pq::to_float(at, dtype, 1, &as_float[static_cast<size_t>(q) * head_dim + d]);
      }
    std::vector<float> expected(static_cast<size_t>(q_heads) * m * C);
    for (int32_t q = 0; q < q_heads; ++q)
      for (int32_t j = 0; j < m; ++j)
        for (int32_t c = 0; c < C; ++c)
          expected[(static_cast<size_t>(q) * m + j) * C + c] =
              pq::dot(as_float.data() + static_cast<size_t>(q) * head_dim + j * sd,
                      centroids.data() + ((static_cast<size_t>(q / group) * m + j) * C + c) * sd, sd);
    DeviceBuffer d_query(query.size());
    DeviceBuffer d_lut(expected.size() * sizeof(float));
    upload(d_query, query);
    char err[256] = "";
    ASSERT_EQ(p->pq_lut(d_query.get(), dtype, head_stride, kv, group, d_centroids.as<float>(), m, C,
                        sd, d_lut.as<float>(), nullptr, err, sizeof err),
              0)
        << err;
    sync();
    const std::vector<float> got = download<float>(d_lut, expected.size());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), expected.size() * sizeof(float)), 0)
        << "dtype " << dtype << ": the device LUT differs from the host's";
  }
}

TEST(CudaDeviceStep, FillSelectionWritesSinksMiddleAndLocal) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t heads = 3;
  const int64_t capacity = 20, sinks = 4, k = 5, mid_end = 90, n = 100;
  std::vector<int32_t> middle(static_cast<size_t>(heads * k));
  for (size_t i = 0; i < middle.size(); ++i) middle[i] = static_cast<int32_t>(10 + 7 * i);
  DeviceBuffer d_middle(middle.size() * 4), d_positions(heads * capacity * 4), d_counts(heads * 4);
  upload(d_middle, middle);
  upload(d_positions, std::vector<int32_t>(static_cast<size_t>(heads * capacity), -5));
  char err[256] = "";
  ASSERT_EQ(p->fill_selection(d_positions.as<int32_t>(), d_counts.as<int32_t>(), heads, capacity,
                              sinks, d_middle.as<int32_t>(), k, mid_end, n, nullptr, err,
                              sizeof err),
            0)
      << err;
  sync();
  const std::vector<int32_t> positions = download<int32_t>(d_positions, heads * capacity);
  const std::vector<int32_t> counts = download<int32_t>(d_counts, heads);
  for (int32_t h = 0; h < heads; ++h) {
    std::vector<int32_t> want = {0, 1, 2, 3};
    for (int64_t i = 0; i < k; ++i) want.push_back(middle[static_cast<size_t>(h * k + i)]);
    for (int64_t q = mid_end; q < n; ++q) want.push_back(static_cast<int32_t>(q));
    want.push_back(-5);  // the rest of the row untouched
    EXPECT_EQ(counts[static_cast<size_t>(h)], 19);
    EXPECT_EQ(std::vector<int32_t>(positions.begin() + h * capacity,
                                   positions.begin() + h * capacity + 20),
              want)
        << "head " << h;
  }
  // A selection longer than the capacity is refused before any launch.
  EXPECT_NE(p->fill_selection(d_positions.as<int32_t>(), d_counts.as<int32_t>(), heads, 18, sinks,
                              d_middle.as<int32_t>(), k, mid_end, n, nullptr, err, sizeof err),
            0);
}

// gather_selected over a store of three chunks in mapped pinned memory and a
// device window of 2 sinks + 3 local tokens: rows from either, positions
// outside the sequence zero-filled, counts above the capacity clamped.
TEST(CudaDeviceStep, GatherSelectedReadsChunksWindowAndZeroesOutsiders) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t heads = 2;
  const int64_t chunk_tokens = 256, tokens = 600, capacity = 6;
  const uint64_t rb = 40;  // not a multiple of 16: the byte path for the tail
  const int64_t sinks = 2, local = 3;
  auto key_byte = [](int64_t pos, int32_t h, uint64_t b, bool value) {
    return static_cast<uint8_t>(pos * 7 + h * 31 + b + (value ? 101 : 0));
  };
  std::vector<std::unique_ptr<PinnedBuffer>> chunks;
  std::vector<const uint8_t*> table;
  for (int v = 0; v < 2; ++v)
    for (int64_t c = 0; c < 3; ++c) {
      chunks.push_back(std::make_unique<PinnedBuffer>(heads * chunk_tokens * rb));
      uint8_t* base = reinterpret_cast<uint8_t*>(chunks.back()->get());
      for (int32_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < chunk_tokens; ++t)
          for (uint64_t b = 0; b < rb; ++b)
            base[(h * chunk_tokens + t) * rb + b] = key_byte(c * chunk_tokens + t, h, b, v == 1);
      table.push_back(base);
    }
  // The window says "window" in every byte, so a row read from it shows.
  std::vector<uint8_t> window((sinks + local) * 2 * heads * rb, 0xEE);
  DeviceBuffer d_window(window.size()), d_table(table.size() * sizeof(void*));
  upload(d_window, window);
  upload(d_table, table);
  const std::vector<int32_t> positions = {0, 300, 598, -1, 1, 700,  // head 0
                                          599, 1, 255, 256, 511, 512};  // head 1
  const std::vector<int32_t> counts = {6, 99};  // head 1's count is clamped to the capacity
  DeviceBuffer d_positions(positions.size() * 4), d_counts(8);
  upload(d_positions, positions);
  upload(d_counts, counts);
  const int64_t token_stride = heads * rb, head_stride = rb;
  DeviceBuffer d_keys(capacity * token_stride), d_values(capacity * token_stride);
  pq_selected_gather g{};
  g.positions = d_positions.as<int32_t>();
  g.counts = d_counts.as<int32_t>();
  g.capacity = capacity;
  g.heads = heads;
  g.key_chunks = d_table.as<const uint8_t*>();
  g.value_chunks = d_table.as<const uint8_t*>() + 3;
  g.chunk_tokens = chunk_tokens;
  g.tokens = tokens;
  g.row_bytes = rb;
  g.window = d_window.as<uint8_t>();
  g.sink_tokens = sinks;
  g.local_tokens = local;
  g.out_keys = d_keys.as<uint8_t>();
  g.out_values = d_values.as<uint8_t>();
  g.keys_token_stride = g.values_token_stride = token_stride;
  g.keys_head_stride = g.values_head_stride = head_stride;
  char err[256] = "";
  ASSERT_EQ(p->gather_selected(&g, nullptr, err, sizeof err), 0) << err;
  sync();
  for (int v = 0; v < 2; ++v) {
    const std::vector<uint8_t> got = download<uint8_t>(v ? d_values : d_keys, capacity * token_stride);
    for (int32_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < capacity; ++i) {
        const int64_t pos = positions[static_cast<size_t>(h * capacity + i)];
        const bool in_window = pos >= 0 && pos < tokens && (pos < sinks || pos >= tokens - local);
        for (uint64_t b = 0; b < rb; ++b) {
          const uint8_t want = pos < 0 || pos >= tokens ? 0
                               : in_window             ? 0xEE
                                                       : key_byte(pos, h, b, v == 1);
          ASSERT_EQ(got[static_cast<size_t>(i * token_stride + h * head_stride + b)], want)
              << (v ? "V" : "K") << " head " << h << " row " << i << " (position " << pos
              << ") byte " << b;
        }
      }
  }
}

// gather_selected_rows: two selections of one store, with their own
// positions, capacities and outputs, in one launch.
TEST(CudaDeviceStep, GatherSelectedRowsGathersEveryItem) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t heads = 2;
  const int64_t chunk_tokens = 256, tokens = 300;
  const uint64_t rb = 32;
  auto byte_of = [](int64_t pos, int32_t h, uint64_t b, bool value) {
    return static_cast<uint8_t>(pos * 3 + h * 17 + b + (value ? 50 : 0));
  };
  std::vector<std::unique_ptr<PinnedBuffer>> chunks;
  std::vector<const uint8_t*> table;
  for (int v = 0; v < 2; ++v)
    for (int64_t c = 0; c < 2; ++c) {
      chunks.push_back(std::make_unique<PinnedBuffer>(heads * chunk_tokens * rb));
      uint8_t* base = reinterpret_cast<uint8_t*>(chunks.back()->get());
      for (int32_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < chunk_tokens; ++t)
          for (uint64_t b = 0; b < rb; ++b)
            base[(h * chunk_tokens + t) * rb + b] = byte_of(c * chunk_tokens + t, h, b, v == 1);
      table.push_back(base);
    }
  DeviceBuffer d_table(table.size() * sizeof(void*));
  upload(d_table, table);
  const std::vector<std::vector<int32_t>> positions = {{5, 260, 7, 299}, {1, 2, 3, 0, 0, 0}};
  const std::vector<int64_t> capacity = {2, 3};
  const std::vector<std::vector<int32_t>> counts = {{2, 2}, {3, 1}};
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<pq_selected_gather> items;
  std::vector<DeviceBuffer*> outs;
  for (size_t i = 0; i < 2; ++i) {
    keep.push_back(std::make_unique<DeviceBuffer>(positions[i].size() * 4));
    upload(*keep.back(), positions[i]);
    const int32_t* d_positions = keep.back()->as<int32_t>();
    keep.push_back(std::make_unique<DeviceBuffer>(8));
    upload(*keep.back(), counts[i]);
    const int32_t* d_counts = keep.back()->as<int32_t>();
    pq_selected_gather g{};
    g.positions = d_positions;
    g.counts = d_counts;
    g.capacity = capacity[i];
    g.heads = heads;
    g.key_chunks = d_table.as<const uint8_t*>();
    g.value_chunks = d_table.as<const uint8_t*>() + 2;
    g.chunk_tokens = chunk_tokens;
    g.tokens = tokens;
    g.row_bytes = rb;
    for (int v = 0; v < 2; ++v) {
      keep.push_back(std::make_unique<DeviceBuffer>(capacity[i] * heads * rb));
      upload(*keep.back(), std::vector<uint8_t>(capacity[i] * heads * rb, 0x77));
      outs.push_back(keep.back().get());
    }
    g.out_keys = outs[2 * i]->as<uint8_t>();
    g.out_values = outs[2 * i + 1]->as<uint8_t>();
    g.keys_token_stride = g.values_token_stride = heads * rb;
    g.keys_head_stride = g.values_head_stride = rb;
    items.push_back(g);
  }
  DeviceBuffer d_items(items.size() * sizeof(pq_selected_gather));
  upload(d_items, items);
  char err[256] = "";
  ASSERT_EQ(p->gather_selected_rows(d_items.as<pq_selected_gather>(), 2, 3 * heads * 2 * 2,
                                    nullptr, err, sizeof err),
            0)
      << err;
  sync();
  for (size_t i = 0; i < 2; ++i)
    for (int v = 0; v < 2; ++v) {
      const std::vector<uint8_t> got =
          download<uint8_t>(*outs[2 * i + v], capacity[i] * heads * rb);
      for (int32_t h = 0; h < heads; ++h)
        for (int64_t r = 0; r < capacity[i]; ++r)
          for (uint64_t b = 0; b < rb; ++b) {
            const bool written = r < counts[i][h];
            const uint8_t want =
                written ? byte_of(positions[i][h * capacity[i] + r], h, b, v == 1) : 0x77;
            ASSERT_EQ(got[(r * heads + h) * rb + b], want)
                << "item " << i << (v ? " V" : " K") << " head " << h << " row " << r;
          }
    }
}

}  // namespace
