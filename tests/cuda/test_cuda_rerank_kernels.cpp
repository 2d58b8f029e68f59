// The plug-in's kernels of ABI version 7 against the host code they stand
// for: the lookup table of a device query in the codebook's dimension order
// (pq_lut_ordered, pq_lut_rows_ordered; PqCodebook::lut with the
// rotate-half order) and the exact re-ranking of candidates whose keys the
// device reads from mapped pinned chunks (pq_rerank, pq_rerank_rows;
// PqSelector::rerank's exact logits, combine_group_scores and select_top_k),
// both bit for bit. Without a GPU every device test reports SKIPPED with the
// reason (the same algorithm runs on every build in the host fake:
// tests/cuda_fake/test_cuda_fake_rotary_rerank.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_plugin_abi.h"
#include "base/dtype.h"
#include "base/scratch.h"
#include "base/topk.h"
#include "base/vector_math.h"
#include "plugin_test_util.h"
#include "pq/codebook.h"
#include "pqcache.h"

namespace {

// `count` values of `dtype` at a row stride of `stride` bytes, and the same
// as float (f16 and bf16 convert exactly).
struct Elements {
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};
Elements random_rows(int32_t rows, int32_t dim, int64_t stride, int32_t dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t es = pq::dtype_size(dtype);
  Elements e{std::vector<uint8_t>(static_cast<size_t>(rows) * stride),
             std::vector<float>(static_cast<size_t>(rows) * dim)};
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t d = 0; d < dim; ++d) {
      const float x = normal(rng);
      uint8_t* at = e.bytes.data() + r * stride + d * es;
      if (dtype == PQ_DTYPE_F32) {
        std::memcpy(at, &x, 4);
      } else {
        const uint16_t bits = dtype == PQ_DTYPE_F16 ? pq::float_to_half(x) : pq::float_to_bf16(x);
        std::memcpy(at, &bits, 2);
      }
      pq::to_float(at, dtype, 1, &e.floats[static_cast<size_t>(r) * dim + d]);
    }
  return e;
}

// Under PQ_ROTARY_HALF the table is the host codebook's, which reads each
// query in rotary_dim_order: one call (pq_lut_ordered) and a table of two
// items (pq_lut_rows_ordered), every dtype.
TEST(CudaRotaryLut, RotateHalfTableIsTheHostCodebooksBitForBit) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t kv = 2, group = 3, m = 4, C = 32, sd = 36;  // sd: 4 lanes of 8, then 4
  const int32_t head_dim = m * sd, q_heads = kv * group;
  std::mt19937 rng(43);
  pq::PqCodebook cb;
  cb.heads = kv, cb.subspaces = m, cb.centroids = C, cb.sub_dim = sd;
  cb.dim_order = pq::rotary_dim_order(head_dim, PQ_ROTARY_HALF);
  cb.data = random_rows(kv * m * C, sd, sd * 4, PQ_DTYPE_F32, rng).floats;
  DeviceBuffer d_centroids(cb.data.size() * sizeof(float));
  upload(d_centroids, cb.data);
  const size_t lut_floats = static_cast<size_t>(q_heads) * m * C;
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    SCOPED_TRACE("dtype " + std::to_string(dtype));
    const int64_t stride = static_cast<int64_t>(head_dim + 8) * pq::dtype_size(dtype);
    const Elements q = random_rows(q_heads, head_dim, stride, dtype, rng);
    std::vector<float> want(lut_floats);
    for (int32_t h = 0; h < kv; ++h)
      cb.lut(h, q.floats.data() + static_cast<size_t>(h) * group * head_dim, group, head_dim,
             want.data() + cb.lut_floats(group) * h);
    DeviceBuffer d_query(q.bytes.size()), d_lut(2 * lut_floats * sizeof(float));
    upload(d_query, q.bytes);
    char err[256] = "";
    ASSERT_EQ(p->pq_lut_ordered(d_query.get(), dtype, stride, kv, group, d_centroids.as<float>(),
                                m, C, sd, PQ_ROTARY_HALF, d_lut.as<float>(), nullptr, err,
                                sizeof err),
              0)
        << err;
    sync();
    std::vector<float> got = download<float>(d_lut, lut_floats);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), lut_floats * sizeof(float)), 0)
        << "pq_lut_ordered differs from the host's table";
    const std::vector<pq_lut_row> rows = {
        {d_query.get(), d_centroids.as<float>(), d_lut.as<float>() + lut_floats},
        {d_query.get(), d_centroids.as<float>(), d_lut.as<float>()}};
    DeviceBuffer d_rows(rows.size() * sizeof(pq_lut_row));
    upload(d_rows, rows);
    upload(d_lut, std::vector<float>(2 * lut_floats, -1.f));
    ASSERT_EQ(p->pq_lut_rows_ordered(d_rows.as<pq_lut_row>(), 2, dtype, stride, kv, group, m, C,
                                     sd, PQ_ROTARY_HALF, nullptr, err, sizeof err),
              0)
        << err;
    sync();
    got = download<float>(d_lut, 2 * lut_floats);
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(std::memcmp(got.data() + r * lut_floats, want.data(), lut_floats * sizeof(float)),
                0)
          << "pq_lut_rows_ordered item " << r << " differs from the host's table";
  }
  // An odd head_dim has no rotate-half pairs: refused before any launch.
  char err[256] = "";
  DeviceBuffer d_lut(lut_floats * sizeof(float));
  EXPECT_NE(p->pq_lut_ordered(d_centroids.get(), PQ_DTYPE_F32, 0, 1, 1, d_centroids.as<float>(),
                              1, C, 7, PQ_ROTARY_HALF, d_lut.as<float>(), nullptr, err, sizeof err),
            0);
  EXPECT_NE(std::string(err).find("PQ_ROTARY_HALF"), std::string::npos) << err;
}

// The host's re-ranking of one kv head: exact logits, the GQA combine over
// the candidates, the best k, ascending positions.
std::vector<int32_t> host_rerank(const float* queries, int32_t group, int32_t dim,
                                 const std::vector<std::vector<float>>& keys,
                                 const int32_t* candidates, int64_t count, int64_t k,
                                 int32_t combine, float scale) {
  std::vector<float> raw(static_cast<size_t>(group) * count), scores(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    for (int32_t g = 0; g < group; ++g)
      raw[static_cast<size_t>(g) * count + i] =
          pq::dot(queries + static_cast<size_t>(g) * dim,
                  keys[static_cast<size_t>(candidates[i])].data(), dim);
  pq::SelectScratch scratch;
  pq::combine_group_scores(raw.data(), group, count, combine, scale, scores.data(), scratch);
  std::vector<int32_t> best(static_cast<size_t>(k));
  pq::select_top_k(scores.data(), count, k, 0, best.data(), scratch);
  for (int32_t& b : best) b = candidates[b];
  return best;
}

// Candidates spread over three mapped pinned chunks (two kv heads): every
// combine, the three dtypes, a count not a multiple of eight (the softmax
// sum's tail) and one of thousands; uniform rows (pq_rerank) and a table
// (pq_rerank_rows) whose rows differ in count and k.
TEST(CudaReRank, ReRankingIsTheHostsBitForBit) {
  REQUIRE_DEVICE();
  const pq_cuda_plugin* p = plugin();
  const int32_t kv = 2, group = 4, dim = 72;  // 9 lanes of 8
  const int64_t chunk_tokens = 256, tokens = 3 * chunk_tokens;
  const float scale = 1.f / std::sqrt(static_cast<float>(dim));
  std::mt19937 rng(7);
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    const int64_t rb = dim * static_cast<int64_t>(pq::dtype_size(dtype));
    // keys[h][t] as float; chunk c holds [head][chunk_tokens][dim] elements.
    std::vector<std::vector<std::vector<float>>> keys(kv);
    std::vector<std::unique_ptr<PinnedBuffer>> chunks;
    std::vector<const uint8_t*> table;
    for (int64_t c = 0; c < 3; ++c) {
      chunks.push_back(std::make_unique<PinnedBuffer>(kv * chunk_tokens * rb));
      for (int32_t h = 0; h < kv; ++h) {
        const Elements e = random_rows(static_cast<int32_t>(chunk_tokens), dim, rb, dtype, rng);
        std::memcpy(chunks.back()->get() + h * chunk_tokens * rb, e.bytes.data(), e.bytes.size());
        for (int64_t t = 0; t < chunk_tokens; ++t)
          keys[h].emplace_back(e.floats.begin() + t * dim, e.floats.begin() + (t + 1) * dim);
      }
      table.push_back(reinterpret_cast<const uint8_t*>(chunks.back()->get()));
    }
    DeviceBuffer d_table(table.size() * sizeof(void*));
    upload(d_table, table);
    const int64_t q_stride = rb + 16;  // padded heads
    const Elements q = random_rows(kv * group, dim, q_stride, dtype, rng);
    DeviceBuffer d_query(q.bytes.size());
    upload(d_query, q.bytes);
    for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN})
      for (const int64_t count : {int64_t{61}, int64_t{700}}) {
        SCOPED_TRACE("dtype " + std::to_string(dtype) + " combine " + std::to_string(combine) +
                     " count " + std::to_string(count));
        const int64_t k = count / 3;
        // Ascending candidates of each head, as the top-k writes them.
        std::vector<int32_t> candidates;
        for (int32_t h = 0; h < kv; ++h) {
          std::vector<int32_t> all(static_cast<size_t>(tokens));
          for (int64_t t = 0; t < tokens; ++t) all[static_cast<size_t>(t)] = static_cast<int32_t>(t);
          std::shuffle(all.begin(), all.end(), rng);
          all.resize(static_cast<size_t>(count));
          std::sort(all.begin(), all.end());
          candidates.insert(candidates.end(), all.begin(), all.end());
        }
        std::vector<int32_t> want;
        for (int32_t h = 0; h < kv; ++h) {
          const std::vector<int32_t> w = host_rerank(
              q.floats.data() + static_cast<size_t>(h) * group * dim, group, dim, keys[h],
              candidates.data() + h * count, count, k, combine, scale);
          want.insert(want.end(), w.begin(), w.end());
        }
        DeviceBuffer d_candidates(candidates.size() * 4), d_out(want.size() * 4);
        upload(d_candidates, candidates);
        pq_rerank_shape shape{};
        shape.group_size = group, shape.head_dim = dim, shape.query_dtype = dtype;
        shape.key_dtype = dtype, shape.combine = combine, shape.scale = scale;
        shape.query_head_stride = q_stride, shape.chunk_tokens = chunk_tokens;
        shape.max_count = count;
        const size_t ws = p->pq_rerank_workspace_size(kv, count, group);
        DeviceBuffer d_ws(std::max<size_t>(ws, 1));
        pq_rerank_row row{};
        row.query = d_query.get();
        row.candidates = d_candidates.as<int32_t>();
        row.out = d_out.as<int32_t>();
        row.key_chunks = d_table.as<const uint8_t*>();
        row.head = 0, row.count = count, row.k = k;
        char err[256] = "";
        ASSERT_EQ(p->pq_rerank(&row, kv, &shape, d_ws.get(), ws, nullptr, err, sizeof err), 0)
            << err;
        sync();
        EXPECT_EQ(download<int32_t>(d_out, want.size()), want) << "pq_rerank";
        // The table: head 1 then head 0, head 0 with a smaller count and k.
        const int64_t count0 = count - 5, k0 = k - 2;
        const std::vector<int32_t> want0 =
            host_rerank(q.floats.data(), group, dim, keys[0], candidates.data(), count0, k0,
                        combine, scale);
        std::vector<pq_rerank_row> rows(2, row);
        rows[0].query = static_cast<const uint8_t*>(d_query.get()) + group * q_stride;
        rows[0].candidates += count, rows[0].out += k, rows[0].head = 1;
        rows[1].count = count0, rows[1].k = k0;
        DeviceBuffer d_rows(rows.size() * sizeof(pq_rerank_row));
        upload(d_rows, rows);
        upload(d_out, std::vector<int32_t>(want.size(), -7));
        ASSERT_EQ(p->pq_rerank_rows(d_rows.as<pq_rerank_row>(), 2, &shape, d_ws.get(), ws, nullptr,
                                    err, sizeof err),
                  0)
            << err;
        sync();
        const std::vector<int32_t> got = download<int32_t>(d_out, want.size());
        EXPECT_EQ(std::vector<int32_t>(got.begin() + k, got.end()),
                  std::vector<int32_t>(want.begin() + k, want.end()))
            << "pq_rerank_rows, head 1";
        EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + k0), want0)
            << "pq_rerank_rows, head 0 (fewer candidates)";
        EXPECT_EQ(std::vector<int32_t>(got.begin() + k0, got.begin() + k),
                  std::vector<int32_t>(static_cast<size_t>(k - k0), -7))
            << "written past the row's k";
      }
  }
}

// Arguments are checked before any CUDA call, a too small workspace named,
// so this runs without a device.
TEST(CudaReRank, ArgumentChecksNeedNoDevice) {
  const pq_cuda_plugin* p = plugin();
  ASSERT_NE(p, nullptr);
  pq_rerank_shape shape{};
  shape.group_size = 2, shape.head_dim = 8, shape.query_dtype = PQ_DTYPE_F32;
  shape.key_dtype = PQ_DTYPE_F32, shape.combine = PQ_GQA_MAX, shape.chunk_tokens = 256;
  shape.max_count = 100;
  pq_rerank_row row{};
  char err[256] = "";
  EXPECT_NE(p->pq_rerank(&row, 1, &shape, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("workspace"), std::string::npos) << err;
  shape.combine = 9;
  EXPECT_NE(p->pq_rerank(&row, 1, &shape, nullptr, 0, nullptr, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("combine 9"), std::string::npos) << err;
  EXPECT_NE(p->pq_rerank_rows(nullptr, 70000, &shape, nullptr, 0, nullptr, err, sizeof err), 0);
  shape.combine = PQ_GQA_MAX;
  EXPECT_EQ(p->pq_rerank(&row, 0, &shape, nullptr, 0, nullptr, err, sizeof err), 0)
      << "no rows: nothing to do";
  EXPECT_EQ(p->pq_rerank_workspace_size(0, 100, 2), 0u);
  EXPECT_GT(p->pq_rerank_workspace_size(4, 100, 2), 0u);
}

}  // namespace
