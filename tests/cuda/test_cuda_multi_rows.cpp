// The plug-in's kernel of ABI version 8, multi_rows (the rows of a
// multi-token select), against the host's rows (layer_select_multi.cpp:
// a row copied, or the rows sorted, made unique, padded with -1): every
// form, rows of random counts (empty ones, full ones), n not a multiple of
// 32 and of a million positions (many tiles of the compaction), an output
// capacity that cuts a union, a workspace left dirty by an earlier call,
// and the refusals. Without a GPU every test reports SKIPPED with the
// reason (the same rows come from the host fake on every build:
// tests/cuda_fake/test_cuda_fake_multi.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_plugin_abi.h"
#include "plugin_test_util.h"
#include "pqcache.h"

namespace {

struct Input {
  int32_t tokens, kv;
  int64_t n, in_cap;
  std::vector<int32_t> positions;  // [tokens * kv][in_cap], garbage past the counts
  std::vector<int32_t> counts;
};

Input random_input(int32_t tokens, int32_t kv, int64_t n, int64_t in_cap, std::mt19937& rng) {
  Input in{tokens, kv, n, in_cap, {}, {}};
  const int64_t rows = int64_t{tokens} * kv;
  in.positions.assign(static_cast<size_t>(rows * in_cap), -7);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t most = std::min(in_cap, n);
    // Empty and full rows among random ones.
    const int64_t count = r % 5 == 0 ? 0 : r % 5 == 1 ? most
                                         : std::uniform_int_distribution<int64_t>(0, most)(rng);
    std::vector<int32_t> row;
    if (count * 2 > n) {  // dense: a shuffled prefix of every position
      std::vector<int32_t> all(static_cast<size_t>(n));
      for (int64_t p = 0; p < n; ++p) all[static_cast<size_t>(p)] = static_cast<int32_t>(p);
      std::shuffle(all.begin(), all.end(), rng);
      row.assign(all.begin(), all.begin() + count);
    } else {
      std::set<int32_t> chosen;
      while (static_cast<int64_t>(chosen.size()) < count) chosen.insert(static_cast<int32_t>(pick(rng)));
      row.assign(chosen.begin(), chosen.end());
    }
    std::sort(row.begin(), row.end());
    std::copy(row.begin(), row.end(), in.positions.begin() + r * in_cap);
    in.counts.push_back(static_cast<int32_t>(count));
  }
  return in;
}

// The host's rows for `form` at `out_cap`: [rows][out_cap] and counts.
void host_rows(const Input& in, int32_t form, int64_t out_cap, std::vector<int32_t>* positions,
               std::vector<int32_t>* counts) {
  const int64_t rows = int64_t{in.tokens} * in.kv;
  const int64_t out_rows = form == PQ_ROWS_PER_TOKEN ? rows : form == PQ_ROWS_PER_HEAD ? in.kv : 1;
  positions->assign(static_cast<size_t>(out_rows * out_cap), -1);
  counts->assign(static_cast<size_t>(out_rows), 0);
  for (int64_t o = 0; o < out_rows; ++o) {
    std::vector<int32_t> merged;
    for (int64_t r = 0; r < rows; ++r) {
      const bool mine = form == PQ_ROWS_PER_TOKEN ? r == o
                        : form == PQ_ROWS_PER_HEAD ? r % in.kv == o
                                                   : true;
      if (!mine) continue;
      merged.insert(merged.end(), in.positions.begin() + r * in.in_cap,
                    in.positions.begin() + r * in.in_cap + in.counts[static_cast<size_t>(r)]);
    }
    std::sort(merged.begin(), merged.end());
    merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
    const int64_t c = std::min<int64_t>(static_cast<int64_t>(merged.size()), out_cap);
    std::copy(merged.begin(), merged.begin() + c, positions->begin() + o * out_cap);
    (*counts)[static_cast<size_t>(o)] = static_cast<int32_t>(c);
  }
}

// The largest row the form makes, uncut.
int64_t widest(const Input& in, int32_t form) {
  std::vector<int32_t> p, c;
  host_rows(in, form, int64_t{in.tokens} * in.kv * in.in_cap + 1, &p, &c);
  return c.empty() ? 0 : *std::max_element(c.begin(), c.end());
}

TEST(CudaMultiRows, EveryFormIsTheHostsRows) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  std::mt19937 rng(42);
  struct Case {
    int32_t tokens, kv;
    int64_t n, in_cap;
  };
  const Case cases[] = {{1, 1, 1, 1},       {3, 2, 100, 40},   {5, 8, 4097, 300},
                        {7, 1, 33, 33},     {2, 4, 1 << 20, 2500}, {16, 8, 70000, 1100}};
  Stream stream;
  DeviceBuffer workspace(p->multi_rows_workspace_size(PQ_ROWS_PER_HEAD, 8, 1 << 20) + 64);
  for (const Case& k : cases) {
    const Input in = random_input(k.tokens, k.kv, k.n, k.in_cap, rng);
    DeviceBuffer d_in(in.positions.size() * 4 + 4), d_counts(in.counts.size() * 4);
    upload(d_in, in.positions);
    upload(d_counts, in.counts);
    for (int32_t form : {PQ_ROWS_PER_TOKEN, PQ_ROWS_PER_HEAD, PQ_ROWS_PER_REQUEST}) {
      const int64_t wide = widest(in, form);
      // Room to spare, exactly enough, and a cut (half the widest row).
      for (int64_t out_cap : {wide + 5, wide, wide / 2}) {
        SCOPED_TRACE("tokens " + std::to_string(k.tokens) + " kv " + std::to_string(k.kv) +
                     " n " + std::to_string(k.n) + " form " + std::to_string(form) +
                     " capacity " + std::to_string(out_cap));
        std::vector<int32_t> want, want_counts;
        host_rows(in, form, out_cap, &want, &want_counts);
        const size_t ws = p->multi_rows_workspace_size(form, k.kv, k.n);
        ASSERT_LE(ws, workspace.bytes());
        if (form == PQ_ROWS_PER_TOKEN) EXPECT_EQ(ws, 0u);
        DeviceBuffer d_out(want.size() * 4 + 4), d_out_counts(want_counts.size() * 4);
        upload(d_out, std::vector<int32_t>(want.size(), 12345));  // dirty: every entry is written
        char err[256] = "";
        ASSERT_EQ(p->multi_rows(d_in.as<int32_t>(), d_counts.as<int32_t>(), k.in_cap, k.tokens,
                                k.kv, form, k.n, d_out.as<int32_t>(), d_out_counts.as<int32_t>(),
                                out_cap, workspace.get(), ws, stream.get(), err, sizeof err),
                  0)
            << err;
        stream.sync();
        EXPECT_EQ(download<int32_t>(d_out_counts, want_counts.size()), want_counts);
        ASSERT_EQ(download<int32_t>(d_out, want.size()), want);
      }
    }
  }
}

TEST(CudaMultiRows, RefusesBadShapesAndASmallWorkspace) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  DeviceBuffer d(4096);
  char err[256] = "";
  int32_t* a = d.as<int32_t>();
  EXPECT_NE(p->multi_rows(a, a, 1, 1, 1, 3, 10, a, a, 1, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("form"), std::string::npos) << err;
  EXPECT_NE(p->multi_rows(a, a, 1, 0, 1, PQ_ROWS_PER_TOKEN, 10, a, a, 1, nullptr, 0, nullptr, err,
                          sizeof err),
            0);
  EXPECT_NE(p->multi_rows(a, a, 1, 1, 1, PQ_ROWS_PER_HEAD, 1000, a, a, 1, d.get(), 4, nullptr,
                          err, sizeof err),
            0);
  EXPECT_NE(std::string(err).find("workspace"), std::string::npos) << err;
  EXPECT_EQ(p->multi_rows_workspace_size(PQ_ROWS_PER_REQUEST, 8, 33), 8u);  // one row, two words
  EXPECT_EQ(p->multi_rows_workspace_size(PQ_ROWS_PER_HEAD, 8, 33), 64u);
}

}  // namespace
