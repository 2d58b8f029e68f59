// The plug-in's row-table kernels (ABI version 5: pq_scan_rows, topk_rows),
// which score and select every kv head of a whole batch of sequences in one
// launch per pass, against the CPU code they replace; and the synchronous
// copy's promise that its bytes have landed for work on any stream (the
// ordering defect the copy_rows test showed on a GPU). Without a GPU every
// test reports SKIPPED with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda_plugin_abi.h"
#include "plugin_test_util.h"
#include "pqcache.h"
#include "scratch.h"
#include "topk.h"

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
  std::unique_ptr<pq::Backend> cpu = pq::make_cpu_backend();
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
      cpu->pq_scores(luts[i].data() + lut_floats * h, group, m, C,
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

}  // namespace
