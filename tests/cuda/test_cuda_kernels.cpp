// The plug-in's kernels against the CPU code they replace: PQ scoring and
// top-k against select_top_k and combine_group_scores (src/base/topk.cpp)
// and the CPU backend's pq_scores; the row gather and the per-run copies
// against a host memcpy gather; PQ encoding against the
// CPU's PqCodebook::encode and nearest_centroid (src/pq/codebook.cpp). The plug-in is opened with dlopen from the path
// the build passes in PQ_CUDA_PLUGIN_FILE, exactly as libpqcache.so opens it,
// and device memory goes through the plug-in's own helpers. Without a GPU
// every device test reports SKIPPED with the reason; the ABI tests run
// everywhere (the entry point needs no device).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdlib>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "pq/codebook.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "pq/kmeans.h"
#include "pq/nearest_centroid.h"
#include "plugin_test_util.h"
#include "pqcache.h"
#include "base/scratch.h"
#include "base/topk.h"

namespace {

// ---------------------------------------------------------------------------
// ABI: runs without a GPU.
// ---------------------------------------------------------------------------

TEST(CudaPluginAbi, ServesExactlyItsOwnVersion) {
  pq_cuda_plugin_entry_fn entry = plugin_entry();
  ASSERT_NE(entry, nullptr) << dlerror();
  const pq_cuda_plugin* p = entry(PQ_CUDA_PLUGIN_ABI_VERSION);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->abi_version, PQ_CUDA_PLUGIN_ABI_VERSION);
  EXPECT_EQ(p->struct_size, sizeof(pq_cuda_plugin));
  // Every entry is filled (a null one would crash the backend, not fail).
  const auto* fields = reinterpret_cast<void* const*>(reinterpret_cast<const char*>(p) +
                                                      offsetof(pq_cuda_plugin, device_count));
  const size_t count = (sizeof(pq_cuda_plugin) - offsetof(pq_cuda_plugin, device_count)) /
                       sizeof(void*);
  for (size_t i = 0; i < count; ++i) EXPECT_NE(fields[i], nullptr) << "field " << i;
  EXPECT_GE(p->device_count(), 0);  // callable without a device: 0 there
  int stack_value = 0;
  EXPECT_EQ(p->is_device_pointer(&stack_value), 0);
  // 0 asks for whatever it speaks (the loader names it when refusing);
  // older and newer versions are not served.
  EXPECT_EQ(entry(0), p);
  for (uint32_t v : {1u, 2u, 3u, PQ_CUDA_PLUGIN_ABI_VERSION + 1}) EXPECT_EQ(entry(v), nullptr) << v;
}

// Every argument check answers before any CUDA call, with a
// message naming the argument, so these run without a device.
TEST(CudaPluginAbi, ArgumentChecksNeedNoDevice) {
  const pq_cuda_plugin* p = plugin();
  ASSERT_NE(p, nullptr);
  char err[256] = "";
  auto says = [&err](const char* word) {
    return std::string(err).find(word) != std::string::npos;
  };

  // Nothing to do: success whatever the pointers.
  EXPECT_EQ(p->gather_rows(nullptr, nullptr, 0, 256, nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->gather_rows(nullptr, nullptr, 5, 0, nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->copy_rows(nullptr, nullptr, 0, 256, nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->copy_rows(nullptr, nullptr, 5, 0, nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->copy_async(nullptr, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->encode(nullptr, 0, 128, nullptr, 2, 64, 64, nullptr, 2, nullptr, err, sizeof err),
            0);
  EXPECT_EQ(p->host_free(nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->stream_destroy(nullptr, err, sizeof err), 0);
  EXPECT_EQ(p->event_destroy(nullptr, err, sizeof err), 0);

  EXPECT_NE(p->gather_rows(nullptr, nullptr, -1, 256, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("rows")) << err;
  EXPECT_NE(p->gather_rows(nullptr, nullptr, 3, 256, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("NULL")) << err;
  EXPECT_NE(p->gather_rows(nullptr, nullptr, INT64_MAX / 2, 256, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("overflow")) << err;
  EXPECT_NE(p->copy_rows(nullptr, nullptr, -1, 256, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("rows")) << err;
  EXPECT_NE(p->copy_rows(nullptr, nullptr, 3, 256, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("NULL")) << err;
  {
    char a[512], b[512];
    const void* srcs[3] = {a, nullptr, a + 256};
    void* dsts[3] = {b, b + 256, b};
    EXPECT_NE(p->copy_rows(srcs, dsts, 3, 256, nullptr, err, sizeof err), 0);
    EXPECT_TRUE(says("row 1")) << err;
  }
  EXPECT_NE(p->copy_async(nullptr, err, 16, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("NULL")) << err;

  float f = 0.f;
  uint8_t code = 0;
  struct EncodeCase {
    int64_t tokens, key_stride;
    int32_t subspaces, centroids, sub_dim;
    int64_t code_stride;
    const char* word;
  };
  const EncodeCase bad[] = {
      {-1, 128, 2, 64, 64, 2, "tokens"},       {1, 128, 0, 64, 64, 2, "subspaces"},
      {1, 128, 2, 0, 64, 2, "centroids"},      {1, 128, 2, 257, 64, 2, "centroids"},
      {1, 128, 2, 64, 0, 2, "sub_dim"},        {1, 127, 2, 64, 64, 2, "key_stride"},
      {1, 128, 2, 64, 64, 1, "code_stride"},   {INT64_MAX / 64, 128, 2, 64, 64, 2, "overflow"},
  };
  for (const EncodeCase& c : bad) {
    err[0] = '\0';
    EXPECT_NE(p->encode(&f, c.tokens, c.key_stride, &f, c.subspaces, c.centroids, c.sub_dim, &code,
                        c.code_stride, nullptr, err, sizeof err),
              0)
        << c.word;
    EXPECT_TRUE(says(c.word)) << "expected '" << c.word << "' in: " << err;
  }
  EXPECT_NE(p->encode(nullptr, 4, 128, &f, 2, 64, 64, &code, 2, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("NULL")) << err;
  EXPECT_NE(p->encode(&f, 4, 128, &f, 2, 64, 64, nullptr, 2, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("NULL")) << err;

  EXPECT_NE(p->host_alloc(nullptr, 16, err, sizeof err), 0);
  EXPECT_TRUE(says("ptr")) << err;
  EXPECT_NE(p->stream_create(nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("stream")) << err;
  EXPECT_NE(p->event_create(nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("event")) << err;
  EXPECT_NE(p->event_record(nullptr, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("event")) << err;
  EXPECT_NE(p->event_synchronize(nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("event")) << err;
  EXPECT_NE(p->stream_wait_event(nullptr, nullptr, err, sizeof err), 0);
  EXPECT_TRUE(says("event")) << err;
}

TEST(CudaPluginAbi, WorkspaceSizesAndArgumentChecksNeedNoDevice) {
  const pq_cuda_plugin* p = plugin();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->topk_workspace_size(4, 1000, 1000), 0u);  // k >= n: no select
  EXPECT_EQ(p->topk_workspace_size(4, 1000, 0), 0u);
  EXPECT_GE(p->topk_workspace_size(4, 1 << 20, 100), 4u * 4 * 256 * sizeof(uint32_t));
  EXPECT_EQ(p->pq_scan_workspace_size(8, 4, 2, 1 << 17, PQ_GQA_MAX), 0u);
  EXPECT_EQ(p->pq_scan_workspace_size(8, 1, 2, 1 << 17, PQ_GQA_SUM_SOFTMAX), 0u);
  EXPECT_GT(p->pq_scan_workspace_size(8, 4, 2, 1 << 17, PQ_GQA_SUM_SOFTMAX), 0u);

  // Argument errors come back before any CUDA call, with a message.
  char err[256] = "";
  int32_t out = 0;
  EXPECT_NE(p->topk(nullptr, -1, 10, 1, 0, &out, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("rows"), std::string::npos) << err;
  EXPECT_NE(p->topk(nullptr, 1, 10, 1, int64_t{INT32_MAX}, &out, nullptr, 0, nullptr, err,
                    sizeof err),
            0);
  EXPECT_NE(std::string(err).find("int32"), std::string::npos) << err;
  EXPECT_EQ(p->topk(nullptr, 0, 10, 1, 0, nullptr, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_NE(p->pq_scan(nullptr, nullptr, 1, 1, 2, 3, 10, 0, 10, PQ_GQA_MAX, 1.f, nullptr, nullptr,
                       0, nullptr, err, sizeof err),
            0);
  EXPECT_NE(std::string(err).find("centroids"), std::string::npos) << err;
  EXPECT_NE(p->pq_scan(nullptr, nullptr, 1, 1, 2, 4, 10, 5, 11, PQ_GQA_MAX, 1.f, nullptr, nullptr,
                       0, nullptr, err, sizeof err),
            0);
  EXPECT_NE(std::string(err).find("token range"), std::string::npos) << err;
  EXPECT_NE(p->pq_scan(nullptr, nullptr, 1, 4, 2, 4, 10, 0, 10, PQ_GQA_SUM_SOFTMAX, 1.f,
                       reinterpret_cast<float*>(16), nullptr, 0, nullptr, err, sizeof err),
            0);  // NULL lut
}

// ---------------------------------------------------------------------------
// Top-k
// ---------------------------------------------------------------------------

// Runs the GPU top-k over `rows` rows of n scores and compares every row
// with the CPU's select_top_k.
void check_topk(const std::vector<float>& scores, int32_t rows, int64_t n, int64_t k,
                int64_t first, const std::string& what) {
  const pq_cuda_plugin* p = plugin();
  const int64_t width = std::min(k, n);  // positions written per row
  DeviceBuffer d_scores(scores.size() * sizeof(float));
  DeviceBuffer d_out(static_cast<size_t>(rows) * static_cast<size_t>(std::max<int64_t>(k, 1)) *
                     sizeof(int32_t));
  DeviceBuffer d_ws(std::max<size_t>(p->topk_workspace_size(rows, n, k), 1));
  upload(d_scores, scores);
  char err[256] = "";
  ASSERT_EQ(p->topk(d_scores.as<float>(), rows, n, k, first, d_out.as<int32_t>(), d_ws.get(),
                    d_ws.bytes(), nullptr, err, sizeof err),
            0)
      << what << ": " << err;
  sync();
  std::vector<int32_t> gpu = download<int32_t>(d_out, static_cast<size_t>(rows) * std::max<int64_t>(k, 1));
  pq::SelectScratch scratch;
  for (int32_t r = 0; r < rows; ++r) {
    std::vector<int32_t> cpu(static_cast<size_t>(width));
    pq::select_top_k(scores.data() + static_cast<size_t>(r) * n, n, k, first, cpu.data(), scratch);
    std::vector<int32_t> row(gpu.begin() + static_cast<ptrdiff_t>(r * k),
                             gpu.begin() + static_cast<ptrdiff_t>(r * k + width));
    ASSERT_EQ(row, cpu) << what << ", row " << r << " of " << rows << ", n = " << n
                        << ", k = " << k;
  }
}

std::vector<int64_t> k_values(int64_t n) {
  std::vector<int64_t> ks = {1, 100, n / 10, n / 5, 65536, n - 1, n};
  std::vector<int64_t> out;
  for (int64_t k : ks)
    if (k >= 1 && k <= n && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  return out;
}

TEST(CudaTopK, MatchesCpuOnRandomRows) {
  REQUIRE_DEVICE();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{100}, int64_t{1000},
                    int64_t{4095}, int64_t{4097}, int64_t{65539}, int64_t{300001},
                    int64_t{1} << 20}) {
    const int32_t rows = n >= (1 << 20) ? 2 : 3;
    std::vector<float> s(static_cast<size_t>(rows * n));
    for (float& x : s) x = normal(rng);
    for (int64_t k : k_values(n))
      check_topk(s, rows, n, k, 1000, "random normal");
  }
}

TEST(CudaTopK, MassiveTiesGoToTheLargerPositions) {
  REQUIRE_DEVICE();
  std::mt19937 rng(12);
  const int64_t n = 200003;
  const int32_t rows = 4;
  std::vector<float> s(static_cast<size_t>(rows * n));
  for (int32_t r = 0; r < rows; ++r) {
    std::uniform_int_distribution<int> value(0, r);  // row 0: all equal; row 3: 4 values
    for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(r * n + i)] = static_cast<float>(value(rng));
  }
  for (int64_t k : k_values(n)) check_topk(s, rows, n, k, 0, "few distinct values");
  for (int64_t k : {int64_t{3}, int64_t{4096}, int64_t{4097}, n / 2}) check_topk(s, rows, n, k, 7, "few distinct values");
}

TEST(CudaTopK, NegativeZerosInfinitiesAndSignedZeroTies) {
  REQUIRE_DEVICE();
  std::mt19937 rng(13);
  const float inf = std::numeric_limits<float>::infinity();
  const float pool[] = {-0.0f, 0.0f, -1.0f, 1.0f, -1e-30f, 1e-30f, -3.0e38f, 3.0e38f,
                        -inf,  inf,  -2.5f, -1e-45f /* denormal */};
  std::uniform_int_distribution<int> pick(0, static_cast<int>(sizeof pool / sizeof pool[0]) - 1);
  std::normal_distribution<float> normal(-5.f, 1.f);  // all negative, mostly
  for (int64_t n : {int64_t{33}, int64_t{5000}, int64_t{70001}}) {
    const int32_t rows = 3;
    std::vector<float> s(static_cast<size_t>(rows * n));
    for (int64_t i = 0; i < n; ++i) {
      s[static_cast<size_t>(i)] = pool[pick(rng)];                            // row 0: the pool
      s[static_cast<size_t>(n + i)] = (i % 2) ? -0.0f : 0.0f;                // row 1: +-0 only
      s[static_cast<size_t>(2 * n + i)] = -std::fabs(normal(rng)) - 1e-3f;   // row 2: negative
    }
    for (int64_t k : k_values(n)) check_topk(s, rows, n, k, 5, "signed zeros and negatives");
  }
}

TEST(CudaTopK, ManyRowsPerLaunch) {
  REQUIRE_DEVICE();
  std::mt19937 rng(14);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t n = 9000;
  const int32_t rows = 37;
  std::vector<float> s(static_cast<size_t>(rows * n));
  for (float& x : s) x = std::round(u(rng) * 50.f) / 50.f;  // some ties inside each row
  for (int64_t k : {int64_t{1}, int64_t{900}, int64_t{4096}, int64_t{8999}})
    check_topk(s, rows, n, k, 123, "37 rows");
}

// ---------------------------------------------------------------------------
// PQ scoring
// ---------------------------------------------------------------------------

struct ScanCase {
  int32_t kv_heads, group, m, bits;
  int64_t stride, begin, end;
  int32_t combine;
  bool integer_lut;      // exact regime: integer LUT entries, power-of-two scale
  size_t codes_offset;   // bytes: a non-zero offset misaligns the codes (byte path)
};

std::string describe(const ScanCase& c) {
  return "kv_heads " + std::to_string(c.kv_heads) + ", group " + std::to_string(c.group) +
         ", m " + std::to_string(c.m) + ", b " + std::to_string(c.bits) + ", tokens [" +
         std::to_string(c.begin) + ", " + std::to_string(c.end) + ") of " +
         std::to_string(c.stride) + ", combine " + std::to_string(c.combine) +
         (c.integer_lut ? ", integer LUT" : "") +
         (c.codes_offset ? ", codes offset " + std::to_string(c.codes_offset) : "");
}

void check_scan(const ScanCase& c, uint32_t seed) {
  const pq_cuda_plugin* p = plugin();
  const std::string what = describe(c);
  const int32_t C = 1 << c.bits;
  const int64_t n = c.end - c.begin;
  std::mt19937 rng(seed);
  std::vector<float> lut(static_cast<size_t>(c.kv_heads) * c.group * c.m * C);
  if (c.integer_lut) {
    std::uniform_int_distribution<int> v(-8, 8);
    for (float& x : lut) x = static_cast<float>(v(rng));
  } else {
    std::normal_distribution<float> v(0.f, 2.f);
    for (float& x : lut) x = v(rng);
  }
  std::vector<uint8_t> codes(static_cast<size_t>(c.kv_heads * c.stride * c.m));
  std::uniform_int_distribution<int> code(0, C - 1);
  for (uint8_t& x : codes) x = static_cast<uint8_t>(code(rng));
  const float scale = c.integer_lut ? 0.5f : 1.0f / std::sqrt(128.0f);

  // CPU: the backend's LUT scan, then the combine, per kv head.
  pq::SelectScratch scratch;
  std::vector<float> expected(static_cast<size_t>(c.kv_heads * n));
  std::vector<float> raw(static_cast<size_t>(c.group * n));
  for (int32_t h = 0; h < c.kv_heads; ++h) {
    pq::PqCodebook::pq_scores(lut.data() + static_cast<size_t>(h) * c.group * c.m * C, c.group, c.m, C,
                   codes.data() + static_cast<size_t>(h * c.stride + c.begin) * c.m, n,
                   raw.data(), n);
    pq::combine_group_scores(raw.data(), c.group, n, c.combine, scale,
                             expected.data() + static_cast<size_t>(h) * n, scratch);
  }

  DeviceBuffer d_lut(lut.size() * sizeof(float));
  DeviceBuffer d_codes(codes.size() + c.codes_offset);
  DeviceBuffer d_scores(std::max<size_t>(expected.size(), 1) * sizeof(float));
  const size_t ws = p->pq_scan_workspace_size(c.kv_heads, c.group, c.m, n, c.combine);
  DeviceBuffer d_ws(std::max<size_t>(ws, 1));
  upload(d_lut, lut);
  upload(d_codes, codes, c.codes_offset);
  char err[256] = "";
  ASSERT_EQ(p->pq_scan(d_lut.as<float>(), d_codes.as<uint8_t>() + c.codes_offset, c.kv_heads,
                       c.group, c.m, C, c.stride, c.begin, c.end, c.combine, scale,
                       d_scores.as<float>(), d_ws.get(), ws, nullptr, err, sizeof err),
            0)
      << what << ": " << err;
  sync();
  std::vector<float> got = download<float>(d_scores, expected.size());

  // MAX and MEAN repeat the CPU's operations in its order: bit-identical.
  // SUM_SOFTMAX sums the exponentials in another order: float tolerance.
  const bool exact = c.combine != PQ_GQA_SUM_SOFTMAX || c.group == 1;
  // The CPU adds n exponentials in 8 sequential lanes; its own rounding grows
  // with n, so long rows get a little more room than 1e-5.
  const double rel = n > 20000 ? 3e-5 : 1e-5;
  int reported = 0;
  for (size_t i = 0; i < expected.size() && reported < 5; ++i) {
    if (exact) {
      if (got[i] != expected[i]) {
        ADD_FAILURE() << what << ": score " << i << " is " << got[i] << ", CPU " << expected[i];
        ++reported;
      }
    } else if (!(std::fabs(got[i] - expected[i]) <= rel * std::fabs(expected[i]) + 1e-37)) {
      ADD_FAILURE() << what << ": score " << i << " is " << got[i] << ", CPU " << expected[i]
                    << " (relative tolerance " << rel << ")";
      ++reported;
    }
  }
}

TEST(CudaPqScan, MatchesCpuOverSubspacesBitsGroupsAndModes) {
  REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (int32_t m : {1, 2, 4, 8})
    for (int32_t bits : {2, 6, 8})
      for (int32_t group : {1, 3, 4})
        for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN}) {
          // 3 kv heads, an odd begin (the first slot of each head is partial)
          // and a count that is not a multiple of any vector width.
          check_scan({3, group, m, bits, 1201, 3, 3 + 1001, combine, false, 0}, seed++);
          if (HasFatalFailure()) return;
        }
}

TEST(CudaPqScan, ExactRegimeIsBitIdenticalForMaxAndMean) {
  REQUIRE_DEVICE();
  uint32_t seed = 200;
  for (int32_t m : {1, 2, 4, 8})
    for (int32_t group : {1, 3, 4})
      for (int32_t combine : {PQ_GQA_MAX, PQ_GQA_MEAN, PQ_GQA_SUM_SOFTMAX})
        check_scan({2, group, m, 8, 5000, 17, 4990, combine, true, 0}, seed++);
}

TEST(CudaPqScan, LongRowsUseManyBlocksPerHead) {
  REQUIRE_DEVICE();
  uint32_t seed = 300;
  // Several blocks per head: the softmax partials are reduced across blocks.
  for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN}) {
    check_scan({8, 4, 2, 8, 70003, 5, 70003, combine, false, 0}, seed++);
    check_scan({2, 3, 1, 6, 140001, 0, 139999, combine, false, 0}, seed++);
  }
}

TEST(CudaPqScan, OtherShapesAndFallbackPaths) {
  REQUIRE_DEVICE();
  uint32_t seed = 400;
  for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN}) {
    // Misaligned codes: the byte path for a vector-friendly m.
    check_scan({3, 4, 2, 8, 3001, 1, 2999, combine, false, 3}, seed++);
    // m that does not divide 16 (byte path) and m = 16 (one token per uint4).
    check_scan({2, 3, 3, 8, 2000, 2, 1999, combine, false, 0}, seed++);
    check_scan({2, 4, 16, 4, 2000, 0, 1777, combine, false, 0}, seed++);
    // A group whose LUT does not fit in shared memory at once (8 x 8 x 256
    // floats): query heads in chunks.
    check_scan({2, 8, 8, 8, 9000, 9, 8999, combine, false, 0}, seed++);
    // One head's LUT above the shared budget (40 x 256 floats): global LUT.
    check_scan({2, 2, 40, 8, 600, 1, 555, combine, false, 0}, seed++);
    // A single token, and an empty range.
    check_scan({2, 4, 2, 8, 100, 50, 51, combine, false, 0}, seed++);
    check_scan({2, 4, 2, 8, 100, 50, 50, combine, false, 0}, seed++);
  }
}

// Scoring then top-k on the device gives the CPU's selection (MAX and MEAN
// scores are bit-identical, so the sets match exactly).
TEST(CudaPqScan, ScoreThenTopKSelectsWhatTheCpuSelects) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t kv = 8, group = 4, m = 2, C = 256;
  const int64_t stride = 32768, begin = 4, end = 32768 - 64, n = end - begin, k = n / 10;
  std::mt19937 rng(7);
  std::normal_distribution<float> v(0.f, 1.f);
  std::vector<float> lut(static_cast<size_t>(kv) * group * m * C);
  for (float& x : lut) x = v(rng);
  std::vector<uint8_t> codes(static_cast<size_t>(kv * stride * m));
  for (uint8_t& x : codes) x = static_cast<uint8_t>(rng() & 255u);
  const float scale = 1.0f / std::sqrt(128.0f);
  for (int32_t combine : {PQ_GQA_MAX, PQ_GQA_MEAN}) {
    DeviceBuffer d_lut(lut.size() * 4), d_codes(codes.size()), d_scores(kv * n * 4),
        d_out(kv * k * 4), d_ws(p->topk_workspace_size(kv, n, k));
    upload(d_lut, lut);
    upload(d_codes, codes);
    char err[256] = "";
    ASSERT_EQ(p->pq_scan(d_lut.as<float>(), d_codes.as<uint8_t>(), kv, group, m, C, stride, begin,
                         end, combine, scale, d_scores.as<float>(), nullptr, 0, nullptr, err,
                         sizeof err),
              0)
        << err;
    ASSERT_EQ(p->topk(d_scores.as<float>(), kv, n, k, begin, d_out.as<int32_t>(), d_ws.get(),
                      d_ws.bytes(), nullptr, err, sizeof err),
              0)
        << err;
    sync();
    std::vector<int32_t> got = download<int32_t>(d_out, static_cast<size_t>(kv * k));
    pq::SelectScratch scratch;
    std::vector<float> raw(static_cast<size_t>(group * n)), combined(static_cast<size_t>(n));
    std::vector<int32_t> want(static_cast<size_t>(k));
    for (int32_t h = 0; h < kv; ++h) {
      pq::PqCodebook::pq_scores(lut.data() + static_cast<size_t>(h) * group * m * C, group, m, C,
                     codes.data() + static_cast<size_t>(h * stride + begin) * m, n, raw.data(), n);
      pq::combine_group_scores(raw.data(), group, n, combine, scale, combined.data(), scratch);
      pq::select_top_k(combined.data(), n, k, begin, want.data(), scratch);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + h * k))
          << "kv head " << h << ", combine " << combine;
    }
  }
}

// ---------------------------------------------------------------------------
// Version 3: pinned host memory, streams and events
// ---------------------------------------------------------------------------

TEST(CudaMemory, PinnedMemoryStreamsAndEventsRoundTrip) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  char err[256] = "";
  void* empty = reinterpret_cast<void*>(16);
  ASSERT_EQ(p->host_alloc(&empty, 0, err, sizeof err), 0) << err;
  EXPECT_EQ(empty, nullptr);

  const size_t bytes = (size_t{3} << 20) + 5;  // not a multiple of anything
  PinnedBuffer in(bytes), out(bytes);
  DeviceBuffer middle(bytes);
  ASSERT_NE(in.get(), nullptr);
  ASSERT_NE(out.get(), nullptr);
  EXPECT_EQ(p->is_device_pointer(in.get()), 0);  // host memory, even though mapped
  std::mt19937 rng(21);
  for (size_t i = 0; i < bytes; ++i) in.get()[i] = static_cast<char>(rng());
  std::memset(out.get(), 0, bytes);

  // in -> device on stream a; stream b waits for it, then device -> out.
  Stream a, b;
  void* copied = nullptr;
  void* done = nullptr;
  ASSERT_EQ(p->event_create(&copied, err, sizeof err), 0) << err;
  ASSERT_EQ(p->event_create(&done, err, sizeof err), 0) << err;
  ASSERT_EQ(p->copy_async(middle.get(), in.get(), bytes, a.get(), err, sizeof err), 0) << err;
  ASSERT_EQ(p->event_record(copied, a.get(), err, sizeof err), 0) << err;
  ASSERT_EQ(p->stream_wait_event(b.get(), copied, err, sizeof err), 0) << err;
  ASSERT_EQ(p->copy_async(out.get(), middle.get(), bytes, b.get(), err, sizeof err), 0) << err;
  ASSERT_EQ(p->event_record(done, b.get(), err, sizeof err), 0) << err;
  ASSERT_EQ(p->event_synchronize(done, err, sizeof err), 0) << err;
  EXPECT_EQ(std::memcmp(in.get(), out.get(), bytes), 0);

  // Pinned -> pinned and device -> device go through the same entry (UVA).
  PinnedBuffer again(bytes);
  DeviceBuffer middle2(bytes);
  ASSERT_EQ(p->copy_async(middle2.get(), middle.get(), bytes, nullptr, err, sizeof err), 0) << err;
  ASSERT_EQ(p->copy_async(again.get(), middle2.get(), bytes, nullptr, err, sizeof err), 0) << err;
  sync();
  EXPECT_EQ(std::memcmp(in.get(), again.get(), bytes), 0);

  EXPECT_EQ(p->event_destroy(copied, err, sizeof err), 0) << err;
  EXPECT_EQ(p->event_destroy(done, err, sizeof err), 0) << err;
}

// ---------------------------------------------------------------------------
// Version 3: row gather (gather_rows kernel and copy_rows baseline)
// ---------------------------------------------------------------------------

enum class RowSource { kDevice, kPinned, kMixed };

struct GatherCase {
  RowSource source;
  size_t row_bytes;
  int64_t rows;
  size_t src_offset;   // bytes added to every source pool address (misalignment)
  size_t dst_offset;   // likewise for the destination
  bool scattered_dsts; // destinations in a random order instead of one after another
};

std::string describe(const GatherCase& c) {
  const char* source = c.source == RowSource::kDevice   ? "device"
                       : c.source == RowSource::kPinned ? "pinned host"
                                                        : "mixed device and pinned host";
  return std::string(source) + " sources, " + std::to_string(c.rows) + " rows of " +
         std::to_string(c.row_bytes) + " bytes, offsets " + std::to_string(c.src_offset) + "/" +
         std::to_string(c.dst_offset) + (c.scattered_dsts ? ", scattered destinations" : "");
}

// Gathers with gather_rows and with copy_rows and compares every byte of the
// destination buffer (the rows and what lies between and around them) with
// a host memcpy gather.
void check_gather(const GatherCase& c, uint32_t seed) {
  const pq_cuda_plugin* p = plugin();
  const std::string what = describe(c);
  std::mt19937 rng(seed);
  const int64_t pool_rows = c.rows * 3 + 5;
  const size_t pool_bytes = static_cast<size_t>(pool_rows) * c.row_bytes + c.src_offset;
  std::vector<char> pool(pool_bytes);
  for (char& x : pool) x = static_cast<char>(rng());
  PinnedBuffer pinned_pool(pool_bytes);
  DeviceBuffer device_pool(pool_bytes);
  std::memcpy(pinned_pool.get(), pool.data(), pool_bytes);
  upload(device_pool, pool);

  // Source rows: runs of consecutive rows (which copy_rows merges) between
  // random jumps; repeats are allowed.
  std::vector<int64_t> index(static_cast<size_t>(c.rows));
  std::uniform_int_distribution<int64_t> any_row(0, pool_rows - 1);
  for (int64_t i = 0; i < c.rows; ++i)
    index[i] = (i > 0 && index[i - 1] + 1 < pool_rows && rng() % 2 == 0) ? index[i - 1] + 1
                                                                          : any_row(rng);
  std::vector<int64_t> slot(static_cast<size_t>(c.rows));
  for (int64_t i = 0; i < c.rows; ++i) slot[i] = i;
  if (c.scattered_dsts) std::shuffle(slot.begin(), slot.end(), rng);

  // The destination has a sentinel row before and after the gathered rows.
  const size_t dst_bytes = c.dst_offset + static_cast<size_t>(c.rows + 2) * c.row_bytes;
  DeviceBuffer dst(dst_bytes);
  std::vector<char> expected(dst_bytes, static_cast<char>(0xA5));
  std::vector<const void*> srcs(static_cast<size_t>(c.rows));
  std::vector<void*> dsts(static_cast<size_t>(c.rows));
  for (int64_t i = 0; i < c.rows; ++i) {
    const size_t src_at = c.src_offset + static_cast<size_t>(index[i]) * c.row_bytes;
    const size_t dst_at = c.dst_offset + static_cast<size_t>(slot[i] + 1) * c.row_bytes;
    const bool from_pinned = c.source == RowSource::kPinned ||
                             (c.source == RowSource::kMixed && i % 2 == 1);
    srcs[i] = from_pinned ? static_cast<const void*>(pinned_pool.get() + src_at)
                          : static_cast<const void*>(device_pool.as<char>() + src_at);
    dsts[i] = dst.as<char>() + dst_at;
    std::memcpy(expected.data() + dst_at, pool.data() + src_at, c.row_bytes);
  }
  DeviceBuffer d_srcs(std::max<size_t>(srcs.size(), 1) * sizeof(void*));
  DeviceBuffer d_dsts(std::max<size_t>(dsts.size(), 1) * sizeof(void*));
  upload(d_srcs, srcs);
  upload(d_dsts, dsts);

  Stream stream;
  char err[256] = "";
  for (const char* method : {"gather_rows", "copy_rows"}) {
    upload(dst, std::vector<char>(dst_bytes, static_cast<char>(0xA5)));
    const int rc =
        std::strcmp(method, "gather_rows") == 0
            ? p->gather_rows(static_cast<const void* const*>(d_srcs.get()),
                             static_cast<void* const*>(d_dsts.get()), c.rows, c.row_bytes,
                             stream.get(), err, sizeof err)
            : p->copy_rows(srcs.data(), dsts.data(), c.rows, c.row_bytes, stream.get(), err,
                           sizeof err);
    ASSERT_EQ(rc, 0) << method << ", " << what << ": " << err;
    stream.sync();
    std::vector<char> got = download<char>(dst, dst_bytes);
    size_t first_difference = dst_bytes;
    for (size_t i = 0; i < dst_bytes && first_difference == dst_bytes; ++i)
      if (got[i] != expected[i]) first_difference = i;
    EXPECT_EQ(first_difference, dst_bytes)
        << method << ", " << what << ": first wrong byte at " << first_difference << " (row "
        << (first_difference - c.dst_offset) / c.row_bytes << " of the destination)";
  }
}

TEST(CudaGatherRows, MatchesHostGatherForAlignedAndUnalignedRows) {
  REQUIRE_DEVICE();
  // Source/destination misalignments: none, byte, byte, 8 (4-byte words,
  // no uint4), 4/12 (4-byte words).
  using Offsets = std::pair<size_t, size_t>;
  const Offsets kOffsets[] = {{0, 0}, {3, 0}, {0, 5}, {8, 8}, {4, 12}};
  uint32_t seed = 500;
  for (RowSource source : {RowSource::kDevice, RowSource::kPinned, RowSource::kMixed})
    for (size_t row_bytes : {size_t{256}, size_t{16}, size_t{4}, size_t{1}, size_t{7},
                             size_t{100}, size_t{260}, size_t{1000}})
      for (const Offsets& offsets : kOffsets)
        for (bool scattered : {false, true}) {
          check_gather({source, row_bytes, 777, offsets.first, offsets.second, scattered},
                       seed++);
          if (HasFatalFailure()) return;
        }
}

TEST(CudaGatherRows, OneRowAndManyRows) {
  REQUIRE_DEVICE();
  uint32_t seed = 600;
  for (RowSource source : {RowSource::kDevice, RowSource::kPinned}) {
    check_gather({source, 256, 1, 0, 0, false}, seed++);
    check_gather({source, 13, 1, 1, 2, false}, seed++);
    // A fetch of pq_fetch_kv's size: 8 kv heads x 25000 rows of 256 bytes.
    check_gather({source, 256, 200000, 0, 0, true}, seed++);
  }
}

TEST(CudaGatherRows, NoRowsIsANoOp) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  char err[256] = "";
  Stream stream;
  EXPECT_EQ(p->gather_rows(nullptr, nullptr, 0, 256, stream.get(), err, sizeof err), 0) << err;
  EXPECT_EQ(p->copy_rows(nullptr, nullptr, 0, 256, stream.get(), err, sizeof err), 0) << err;
  stream.sync();
}

// ---------------------------------------------------------------------------
// Version 3: PQ encoding
// ---------------------------------------------------------------------------

enum class KeyData { kNormal, kSmallIntegers, kDuplicateCentroids, kKeysAreCentroids, kTiny, kNaN };

struct EncodeCase {
  int64_t tokens;
  int32_t subspaces, centroids, sub_dim;
  int64_t key_padding;   // floats after head_dim in each key row
  int64_t code_padding;  // bytes after the codes of each token
  KeyData data;
};

std::string describe(const EncodeCase& c) {
  static const char* kData[] = {"normal",        "small integers (exact ties)",
                                "duplicate centroids", "keys equal to centroids",
                                "tiny (subnormal squares)", "some NaN keys"};
  return std::to_string(c.tokens) + " tokens, m " + std::to_string(c.subspaces) + ", " +
         std::to_string(c.centroids) + " centroids, sub_dim " + std::to_string(c.sub_dim) +
         ", key padding " + std::to_string(c.key_padding) + ", code padding " +
         std::to_string(c.code_padding) + ", " + kData[static_cast<int>(c.data)];
}

// Encodes on the GPU and compares every code with the CPU's PqCodebook::encode
// (the code path the GPU replaces) and with nearest_centroid; the padding
// bytes of the code rows must stay untouched.
void check_encode(const EncodeCase& c, uint32_t seed) {
  const pq_cuda_plugin* p = plugin();
  const std::string what = describe(c);
  const int32_t m = c.subspaces, k = c.centroids, dim = c.sub_dim;
  const int32_t head_dim = m * dim;
  const int64_t key_stride = head_dim + c.key_padding;
  const int64_t code_stride = m + c.code_padding;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> small(-2, 2);

  pq::PqCodebook book;
  book.heads = 1;
  book.subspaces = m;
  book.centroids = k;
  book.sub_dim = dim;
  book.data.resize(static_cast<size_t>(m) * k * dim);
  std::vector<float> keys(static_cast<size_t>(c.tokens * key_stride));
  switch (c.data) {
    case KeyData::kSmallIntegers:
      for (float& x : book.data) x = static_cast<float>(small(rng));
      for (float& x : keys) x = static_cast<float>(small(rng));
      break;
    case KeyData::kTiny:
      for (float& x : book.data) x = normal(rng) * 1e-21f;
      for (float& x : keys) x = normal(rng) * 1e-21f;
      break;
    default:
      for (float& x : book.data) x = normal(rng);
      for (float& x : keys) x = normal(rng);
  }
  if (c.data == KeyData::kDuplicateCentroids)  // centroid i + k/2 repeats centroid i
    for (int32_t j = 0; j < m; ++j)
      for (int32_t i = k / 2; i < k; ++i)
        std::memcpy(book.at(0, j) + static_cast<size_t>(i) * dim,
                    book.at(0, j) + static_cast<size_t>(i - k / 2) * dim, dim * sizeof(float));
  if (c.data == KeyData::kKeysAreCentroids || c.data == KeyData::kDuplicateCentroids)
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int32_t j = 0; j < m; ++j)
        if (t % 2 == 0)  // half the keys sit exactly on a (possibly repeated) centroid
          std::memcpy(&keys[static_cast<size_t>(t * key_stride + j * dim)],
                      book.at(0, j) + static_cast<size_t>(rng() % k) * dim, dim * sizeof(float));
  if (c.data == KeyData::kNaN)
    for (int64_t t = 0; t < c.tokens; t += 7)
      keys[static_cast<size_t>(t * key_stride + rng() % head_dim)] = std::nanf("");

  // CPU: PqCodebook::encode over a gather of the (strided) keys.
  std::vector<uint8_t> want(static_cast<size_t>(c.tokens * m));
  pq::KeyGather gather = [&](int32_t, const int64_t* rows, int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(out + i * head_dim, &keys[static_cast<size_t>(rows[i] * key_stride)],
                  head_dim * sizeof(float));
  };
  uint8_t* code_rows[1] = {want.data()};
  book.encode(head_dim, 0, c.tokens, gather, nullptr, code_rows);

  DeviceBuffer d_keys(std::max<size_t>(keys.size(), 1) * sizeof(float));
  DeviceBuffer d_book(book.data.size() * sizeof(float));
  const size_t code_bytes = static_cast<size_t>(c.tokens * code_stride);
  DeviceBuffer d_codes(std::max<size_t>(code_bytes, 1));
  upload(d_keys, keys);
  upload(d_book, book.data);
  upload(d_codes, std::vector<uint8_t>(code_bytes, 0xEE));
  char err[256] = "";
  Stream stream;
  ASSERT_EQ(p->encode(d_keys.as<float>(), c.tokens, key_stride, d_book.as<float>(), m, k, dim,
                      d_codes.as<uint8_t>(), code_stride, stream.get(), err, sizeof err),
            0)
      << what << ": " << err;
  stream.sync();
  std::vector<uint8_t> got = download<uint8_t>(d_codes, code_bytes);

  int reported = 0;
  for (int64_t t = 0; t < c.tokens && reported < 5; ++t) {
    for (int32_t j = 0; j < m; ++j) {
      const int gpu = got[static_cast<size_t>(t * code_stride + j)];
      const int cpu = want[static_cast<size_t>(t * m + j)];
      const int nearest = pq::nearest_centroid(
          book.at(0, j), k, dim, &keys[static_cast<size_t>(t * key_stride + j * dim)]);
      if (gpu != cpu || cpu != nearest) {
        ADD_FAILURE() << what << ": token " << t << ", subspace " << j << ": GPU " << gpu
                      << ", PqCodebook::encode " << cpu << ", nearest_centroid " << nearest;
        ++reported;
      }
    }
    for (int64_t b = m; b < code_stride; ++b)
      if (got[static_cast<size_t>(t * code_stride + b)] != 0xEE) {
        ADD_FAILURE() << what << ": token " << t << " padding byte " << b << " was written";
        ++reported;
      }
  }
}

TEST(CudaEncode, MatchesCpuCodesOverShapes) {
  REQUIRE_DEVICE();
  uint32_t seed = 700;
  const EncodeCase cases[] = {
      {1, 2, 64, 64, 0, 0, KeyData::kNormal},      // one decode token, the defaults
      {4096, 2, 64, 64, 0, 0, KeyData::kNormal},   // a prefill chunk
      {1000, 2, 256, 64, 0, 0, KeyData::kNormal},  // 8 bits
      {777, 4, 16, 32, 5, 3, KeyData::kNormal},    // padded key and code rows
      {500, 8, 256, 16, 0, 0, KeyData::kNormal},
      {300, 3, 5, 7, 1, 1, KeyData::kNormal},      // sub_dim < 8: the tail only; k not 2^b
      {300, 5, 33, 9, 0, 2, KeyData::kNormal},     // 8 lanes plus a tail of 1
      {300, 1, 256, 128, 0, 0, KeyData::kNormal},  // m = 1
      {100, 16, 2, 8, 0, 0, KeyData::kNormal},
      {200, 2, 1, 13, 0, 0, KeyData::kNormal},     // one centroid: every code is 0
      {20000, 2, 64, 64, 0, 0, KeyData::kNormal},  // many warps per block and blocks
  };
  for (const EncodeCase& c : cases) {
    check_encode(c, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaEncode, ExactTiesGoToTheLowestIndexAsOnTheCpu) {
  REQUIRE_DEVICE();
  uint32_t seed = 800;
  for (KeyData data : {KeyData::kSmallIntegers, KeyData::kDuplicateCentroids,
                       KeyData::kKeysAreCentroids}) {
    check_encode({2000, 2, 64, 4, 0, 0, data}, seed++);   // 4 small dims: ties everywhere
    check_encode({2000, 4, 256, 3, 1, 0, data}, seed++);
    check_encode({1000, 2, 64, 64, 0, 0, data}, seed++);
    check_encode({1000, 1, 256, 16, 0, 1, data}, seed++);
  }
}

TEST(CudaEncode, SubnormalAndNaNInputsAsOnTheCpu) {
  REQUIRE_DEVICE();
  check_encode({2000, 2, 64, 64, 0, 0, KeyData::kTiny}, 900);
  check_encode({2000, 4, 32, 8, 0, 0, KeyData::kNaN}, 901);
}

}  // namespace
