// attend_rows and merge_attention (src/backend/attention.h) at the kernel
// level PQ_CPU_LEVEL asks (tests/kernel_level.h), against an attention in
// double computed here: every dtype, groups 1-8, head dims that are and are
// not multiples of 16 (the AVX-512 kernel's masked tail) or of 8 (the
// portable kernel below avx512), row counts around the 32-row block,
// ascending and shuffled positions, and logits large enough that the
// online softmax's rescale and underflow are exercised. The rows live in a
// RowTable built here, chunk by chunk, as the store lays them out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/attention.h"
#include "base/cpu_dispatch.h"
#include "base/dtype.h"
#include "kernel_level.h"
#include "pqcache.h"
#include "store/row_table.h"

namespace {

constexpr int32_t kHeads = 3, kHead = 1;  // rows of head 1 between others

// K and V of `tokens` tokens of kHeads heads in the store's chunk layout
// ([chunk][head][256 tokens][row]), and each element's value as a float.
struct Rows {
  int32_t dtype, d;
  size_t elem, row_bytes;
  std::vector<std::vector<uint8_t>> kchunks, vchunks;
  std::vector<float> kf, vf;  // [token][d] of kHead
  pq::RowTable table;

  Rows(int32_t dtype_, int32_t d_, int64_t tokens, float key_gain, std::mt19937& rng)
      : dtype(dtype_), d(d_), elem(pq::dtype_size(dtype_)), row_bytes(elem * d_) {
    const int64_t chunks = (tokens + pq::RowTable::kChunkTokens - 1) / pq::RowTable::kChunkTokens;
    const size_t chunk_bytes = row_bytes * pq::RowTable::kChunkTokens * kHeads;
    kf.resize(static_cast<size_t>(tokens) * d);
    vf.resize(kf.size());
    for (int64_t c = 0; c < chunks; ++c) {
      kchunks.emplace_back(chunk_bytes + 64);  // + 64: a guard the kernels must not need
      vchunks.emplace_back(chunk_bytes + 64);
      fill(kchunks.back(), rng);
      fill(vchunks.back(), rng);
      table.keys.push_back(kchunks.back().data());
      table.values.push_back(vchunks.back().data());
    }
    table.row_bytes = row_bytes;
    table.head_bytes = row_bytes * pq::RowTable::kChunkTokens;
    table.head_dim = d;
    table.dtype = dtype;
    for (int64_t t = 0; t < tokens; ++t) {
      if (key_gain != 1.f) scale_key(t, key_gain);
      pq::to_float(table.key_row(static_cast<int32_t>(t), kHead), dtype, d, &kf[t * d]);
      pq::to_float(table.value_row(static_cast<int32_t>(t), kHead), dtype, d, &vf[t * d]);
    }
  }

  // Random finite elements: normal floats rounded to the dtype, fp8 codes
  // of magnitude at most 4 (not NaN or infinite).
  void fill(std::vector<uint8_t>& bytes, std::mt19937& rng) const {
    std::normal_distribution<float> normal(0.f, 1.f);
    const size_t n = bytes.size() / elem;
    for (size_t i = 0; i < n; ++i) {
      const float f = normal(rng);
      uint8_t* p = bytes.data() + i * elem;
      if (dtype == PQ_DTYPE_F32) {
        std::memcpy(p, &f, 4);
      } else if (dtype == PQ_DTYPE_F16 || dtype == PQ_DTYPE_BF16) {
        const uint16_t h = dtype == PQ_DTYPE_F16 ? pq::float_to_half(f) : pq::float_to_bf16(f);
        std::memcpy(p, &h, 2);
      } else {
        uint8_t code;
        do code = static_cast<uint8_t>(rng()); while (!(std::fabs(fp8(code)) <= 4.f));
        *p = code;
      }
    }
  }
  float fp8(uint8_t code) const {
    return dtype == PQ_DTYPE_FP8_E4M3 ? pq::kE4m3ToFloat[code] : pq::kE5m2ToFloat[code];
  }

  // Multiplies token t's key (of kHead) by gain, where the dtype can hold it.
  void scale_key(int64_t t, float gain) {
    uint8_t* p = const_cast<uint8_t*>(table.key_row(static_cast<int32_t>(t), kHead));
    for (int32_t k = 0; k < d; ++k) {
      float f = pq::load_element(p + k * elem, dtype) * gain;
      if (dtype == PQ_DTYPE_F32) {
        std::memcpy(p + k * elem, &f, 4);
      } else if (dtype == PQ_DTYPE_F16 || dtype == PQ_DTYPE_BF16) {
        const uint16_t h = dtype == PQ_DTYPE_F16 ? pq::float_to_half(f) : pq::float_to_bf16(f);
        std::memcpy(p + k * elem, &h, 2);
      }  // fp8: the queries carry the gain instead (see Case)
    }
  }
};

// The attention of each query head over pos, in double: out [group][d],
// the log-sum-exp of the logits, and spread [group][d] = sum_i softmax_i *
// |V_i[d]|, what rounding each weight by a relative e moves out by at most
// (times e).
void reference(const Rows& r, const std::vector<int32_t>& pos, const std::vector<float>& q,
               int32_t group, float scale, std::vector<double>& out, std::vector<double>& lse,
               std::vector<double>& spread) {
  const int32_t d = r.d;
  out.assign(static_cast<size_t>(group) * d, 0.0);
  spread.assign(out.size(), 0.0);
  lse.assign(group, 0.0);
  std::vector<double> logit(pos.size());
  for (int32_t g = 0; g < group; ++g) {
    double max = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < pos.size(); ++i) {
      double s = 0.0;
      for (int32_t k = 0; k < d; ++k)
        s += static_cast<double>(q[g * d + k]) * r.kf[static_cast<size_t>(pos[i]) * d + k];
      logit[i] = s * scale;
      max = std::max(max, logit[i]);
    }
    double sum = 0.0;
    for (size_t i = 0; i < pos.size(); ++i) {
      const double w = std::exp(logit[i] - max);
      sum += w;
      for (int32_t k = 0; k < d; ++k) {
        const double v = r.vf[static_cast<size_t>(pos[i]) * d + k];
        out[g * d + k] += w * v;
        spread[g * d + k] += w * std::fabs(v);
      }
    }
    for (int32_t k = 0; k < d; ++k) {
      out[g * d + k] /= sum;
      spread[g * d + k] /= sum;
    }
    lse[g] = max + std::log(sum);
  }
}

struct Part {
  std::vector<float> acc, max;
  std::vector<double> sum;
  Part(int32_t group, int32_t d) : acc(static_cast<size_t>(group) * d), max(group), sum(group) {}
  pq::AttentionPart view() { return {acc.data(), max.data(), sum.data()}; }
};

// Attends pos in `parts` pieces, merges them and compares with the
// reference: |out - ref| <= tol * max |ref| (plus what the weights'
// rounding may move each element by, weight_rounding x spread), lse within
// tol (absolute, it is a log) of the reference's.
// attend_rows or one of its variants.
using AttendFn = std::function<void(const pq::RowTable&, int32_t, const int32_t*, int64_t,
                                    const float*, int32_t, float, pq::AttentionPart)>;

void check(const Rows& r, const std::vector<int32_t>& pos, const std::vector<float>& q,
           int32_t group, float scale, int parts, double tol, const std::string& what,
           const AttendFn& attend = pq::attend_rows) {
  std::vector<double> want, want_lse, spread;
  reference(r, pos, q, group, scale, want, want_lse, spread);
  // The weights' relative rounding where the kernel in use takes them as
  // bf16 (round to nearest, 8 significant bits), else none.
  const double rounding =
      pq::attend_rounds_weights_to_bf16(r.dtype, group) ? std::ldexp(1.0, -8) : 0.0;
  std::vector<Part> p(static_cast<size_t>(parts), Part(group, r.d));
  std::vector<pq::AttentionPart> views;
  const int64_t n = static_cast<int64_t>(pos.size());
  for (int i = 0; i < parts; ++i) {
    const int64_t begin = n * i / parts, end = n * (i + 1) / parts;
    attend(r.table, kHead, pos.data() + begin, end - begin, q.data(), group, scale, p[i].view());
    views.push_back(p[i].view());
  }
  std::vector<float> out(static_cast<size_t>(group) * r.d), lse(group);
  pq::merge_attention(views.data(), parts, group, r.d, out.data(), lse.data());
  double peak = 0.0, worst = 0.0;  // worst: the largest excess over the rounding's share
  for (double w : want) peak = std::max(peak, std::fabs(w));
  for (size_t i = 0; i < out.size(); ++i)
    worst = std::max(worst, std::fabs(out[i] - want[i]) - rounding * spread[i]);
  EXPECT_LE(worst, tol * peak) << what << ": worst |out - ref| - weight rounding " << worst
                               << ", max |ref| " << peak;
  for (int32_t g = 0; g < group; ++g)
    EXPECT_NEAR(lse[g], want_lse[g], tol * std::max(1.0, std::fabs(want_lse[g]))) << what << " g " << g;
}

const int32_t kDtypes[] = {PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16, PQ_DTYPE_FP8_E4M3,
                           PQ_DTYPE_FP8_E5M2};

std::vector<float> queries(int32_t group, int32_t d, float gain, bool as_bf16, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(group) * d);
  for (float& x : q) {
    x = normal(rng) * gain;
    if (as_bf16) x = pq::bf16_to_float(pq::float_to_bf16(x));  // the VDPBF16PS path's queries
  }
  return q;
}

TEST(KernelsAttend, EveryDtypeGroupHeadDimAndRowCountMatchesDouble) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(43);
  for (int32_t dtype : kDtypes)
    for (int32_t d : {64, 128, 72, 36}) {
      Rows r(dtype, d, 1300, 1.f, rng);
      for (int32_t group = 1; group <= 8; ++group)
        for (int64_t count : {1, 31, 33, 1000})
          for (bool shuffled : {false, true}) {
            std::vector<int32_t> pos(1300);
            std::iota(pos.begin(), pos.end(), 0);
            std::shuffle(pos.begin(), pos.end(), rng);
            pos.resize(static_cast<size_t>(count));
            if (!shuffled) std::sort(pos.begin(), pos.end());
            const bool bf16_q = dtype == PQ_DTYPE_BF16 && (group % 2 == 0);
            const auto q = queries(group, d, 1.f, bf16_q, rng);
            const std::string what = std::string(pq::dtype_name(dtype)) + " d " + std::to_string(d) +
                                     " group " + std::to_string(group) + " rows " +
                                     std::to_string(count) + (shuffled ? " shuffled" : " ascending");
            check(r, pos, q, group, 1.f / std::sqrt(static_cast<float>(d)), 1, 1e-5, what);
          }
    }
}

// Logits of magnitude ~100-1000: most weights underflow, each block's
// maximum may overtake the last (keys growing along the positions), and the
// rescale of what was accumulated must be exact enough.
TEST(KernelsAttend, ExtremeLogitsRescaleTheRunningSum) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(7);
  for (int32_t dtype : kDtypes)
    for (int32_t d : {128, 72}) {
      Rows r(dtype, d, 1100, 1.f, rng);
      // Keys growing with the position (fp8: the query's gain instead).
      const bool fp8 = pq::dtype_is_fp8(dtype);
      for (int64_t t = 0; t < 1100; t += 37) r.scale_key(t, 1.f + t / 64.f);
      for (int64_t t = 0; t < 1100; ++t)
        pq::to_float(r.table.key_row(static_cast<int32_t>(t), kHead), dtype, d, &r.kf[t * d]);
      for (int32_t group : {1, 4, 8}) {
        std::vector<int32_t> pos(1000);
        std::iota(pos.begin(), pos.end(), 50);
        const auto q = queries(group, d, fp8 ? 40.f : 8.f, dtype == PQ_DTYPE_BF16, rng);
        const std::string what = std::string(pq::dtype_name(dtype)) + " d " + std::to_string(d) +
                                 " group " + std::to_string(group);
        // Float logits of ~1e3 carry ~1e-4 absolute error, which exp
        // turns into a relative one of the same size.
        check(r, pos, q, group, 1.f / std::sqrt(static_cast<float>(d)), 1, 2e-4, what + " extreme");
      }
    }
}

// A head's rows cut into parts (as layer_attend.cpp does across threads)
// and merged: the same attention, including parts with one row.
TEST(KernelsAttend, PartsMergeIntoTheWholeAttention) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(11);
  for (int32_t dtype : kDtypes) {
    Rows r(dtype, 128, 2100, 1.f, rng);
    for (int parts : {2, 3, 7})
      for (int64_t count : {7, 33, 2000}) {
        std::vector<int32_t> pos(2100);
        std::iota(pos.begin(), pos.end(), 0);
        std::shuffle(pos.begin(), pos.end(), rng);
        pos.resize(static_cast<size_t>(count));
        const auto q = queries(4, 128, 2.f, false, rng);
        check(r, pos, q, 4, 0.0884f, parts, 1e-5,
              std::string(pq::dtype_name(dtype)) + " parts " + std::to_string(parts) + " rows " +
                  std::to_string(count));
      }
  }
}

// Every finite fp8 code as a value, exactly: row 0 holds codes 0..127 and
// row 1 codes 128..255 (non-finite ones replaced by code 0), keys zero so
// both weigh 1. One row attends to itself, two rows to their mean, both
// exact in float whatever the kernel: the weights (1, and 1 / 2 after the
// division) are exact in bf16 as well, so this checks every code's value
// through each path's conversion (the random rows above hold magnitudes up
// to 4 only).
TEST(KernelsAttend, Fp8ValuesOfEveryCodeComeOutExactly) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(5);
  for (int32_t dtype : {PQ_DTYPE_FP8_E4M3, PQ_DTYPE_FP8_E5M2}) {
    Rows r(dtype, 128, 2, 1.f, rng);
    for (int32_t t = 0; t < 2; ++t) {
      auto* k = const_cast<uint8_t*>(r.table.key_row(t, kHead));
      auto* v = const_cast<uint8_t*>(r.table.value_row(t, kHead));
      for (int32_t j = 0; j < 128; ++j) {
        const uint8_t code = static_cast<uint8_t>(128 * t + j);
        k[j] = 0;
        v[j] = std::isfinite(r.fp8(code)) ? code : 0;
        r.kf[static_cast<size_t>(t) * 128 + j] = 0.f;
        r.vf[static_cast<size_t>(t) * 128 + j] = r.fp8(v[j]);
      }
    }
    for (int32_t group : {1, 4, 8})
      for (const std::vector<int32_t>& pos :
           {std::vector<int32_t>{0}, std::vector<int32_t>{1}, std::vector<int32_t>{0, 1}}) {
        const auto q = queries(group, 128, 1.f, false, rng);
        Part p(group, 128);
        pq::attend_rows(r.table, kHead, pos.data(), static_cast<int64_t>(pos.size()), q.data(),
                        group, 0.0884f, p.view());
        std::vector<float> out(static_cast<size_t>(group) * 128);
        pq::AttentionPart view = p.view();
        pq::merge_attention(&view, 1, group, 128, out.data(), nullptr);
        for (int32_t g = 0; g < group; ++g)
          for (int32_t j = 0; j < 128; ++j) {
            float want = 0.f;
            for (int32_t t : pos) want += r.vf[static_cast<size_t>(t) * 128 + j];
            want /= static_cast<float>(pos.size());
            ASSERT_EQ(out[static_cast<size_t>(g) * 128 + j], want)
                << pq::dtype_name(dtype) << " group " << group << " rows " << pos.size()
                << " element " << j;
          }
      }
  }
}

// The AVX-512 kernel with each of its variants (attention.h), called by
// name, so a variant the dispatch does not choose is checked as well: each
// against the double reference over the shapes it takes, and each refusing
// (false, nothing written) the shapes it does not take. A variant this
// process may not use is SKIPPED with the reason (tests/CMakeLists.txt also
// runs this program with PQ_CPU_FEATURES switching the extensions off).
void check_variant(int32_t dtype, pq::AttendLogits logits, pq::F16Conversion f16,
                   const std::vector<int32_t>& dims, std::function<bool(int32_t, int32_t)> takes) {
  std::mt19937 rng(17);
  const AttendFn variant = [&](const pq::RowTable& t, int32_t head, const int32_t* pos,
                               int64_t count, const float* q, int32_t group, float scale,
                               pq::AttentionPart part) {
    std::fill(part.acc, part.acc + static_cast<size_t>(group) * t.head_dim, 0.f);
    std::fill(part.max, part.max + group, pq::kNoRows);
    std::fill(part.sum, part.sum + group, 0.0);
    ASSERT_TRUE(pq::attend_rows_avx512_with(t, head, pos, count, q, group, scale, part, logits, f16));
  };
  for (int32_t d : dims) {
    Rows r(dtype, d, 1100, 1.f, rng);
    for (int32_t group = 1; group <= 9; ++group) {
      const auto q = queries(group, d, 1.f, true, rng);
      std::vector<int32_t> pos(1100);
      std::iota(pos.begin(), pos.end(), 0);
      if (!takes(group, d)) {
        Part p(group, d);
        EXPECT_FALSE(pq::attend_rows_avx512_with(r.table, kHead, pos.data(), 40, q.data(), group,
                                                 1.f, p.view(), logits, f16))
            << "d " << d << " group " << group;
        continue;
      }
      for (int64_t count : {1, 15, 16, 17, 31, 32, 33, 64, 1000}) {
        std::shuffle(pos.begin(), pos.end(), rng);
        std::vector<int32_t> some(pos.begin(), pos.begin() + count);
        if (count % 2 == 0) std::sort(some.begin(), some.end());
        check(r, some, q, group, 1.f / std::sqrt(static_cast<float>(d)), 1, 1e-5,
              std::string(pq::dtype_name(dtype)) + " d " + std::to_string(d) + " group " +
                  std::to_string(group) + " rows " + std::to_string(count),
              variant);
      }
    }
    // Logits of ~1e2-1e3: the online softmax's rescale through the variant.
    const auto q = queries(4, d, 8.f, true, rng);
    if (!takes(4, d)) continue;
    for (int64_t t = 0; t < 1100; t += 37) r.scale_key(t, 1.f + t / 64.f);
    for (int64_t t = 0; t < 1100; ++t)
      pq::to_float(r.table.key_row(static_cast<int32_t>(t), kHead), dtype, d, &r.kf[t * d]);
    std::vector<int32_t> pos(1000);
    std::iota(pos.begin(), pos.end(), 50);
    check(r, pos, q, 4, 1.f / std::sqrt(static_cast<float>(d)), 3, 2e-4,
          std::string(pq::dtype_name(dtype)) + " d " + std::to_string(d) + " extreme", variant);
  }
}

// Whether a variant applies: bf16 dot products take any head_dim up to
// 256 and groups up to 8; the AMX tiles head_dims of 32 to 128 in steps of
// 32; the f16 conversion anything the AVX-512 kernel takes.
bool up_to_8(int32_t group, int32_t d) { return group <= 8 && d <= 256; }
bool amx_shape(int32_t group, int32_t d) { return group <= 8 && d % 32 == 0 && d <= 128; }

#define PQ_REQUIRE_FEATURE(feature)                                                         \
  do {                                                                                      \
    PQ_REQUIRE_ASKED_KERNEL_LEVEL();                                                        \
    const std::string& why = pq::cpu_feature_missing(feature);                              \
    if (!why.empty()) GTEST_SKIP() << pq::cpu_feature_name(feature) << " not used: " << why; \
  } while (0)

TEST(KernelsAttend, Bf16DotProductLogitsMatchDouble) {
  PQ_REQUIRE_FEATURE(pq::CpuFeature::kAvx512Bf16);
  check_variant(PQ_DTYPE_BF16, pq::AttendLogits::kBf16Dot, pq::F16Conversion::kF16c,
                {128, 64, 72, 256}, up_to_8);
}

TEST(KernelsAttend, AmxBf16LogitsMatchDouble) {
  PQ_REQUIRE_FEATURE(pq::CpuFeature::kAvx512Bf16);  // the AMX variant's value sums
  PQ_REQUIRE_FEATURE(pq::CpuFeature::kAmxBf16);
  check_variant(PQ_DTYPE_BF16, pq::AttendLogits::kAmxBf16, pq::F16Conversion::kF16c,
                {128, 32, 64, 96, 72, 160, 256}, amx_shape);
}

TEST(KernelsAttend, Avx512Fp16ConversionMatchesDouble) {
  PQ_REQUIRE_FEATURE(pq::CpuFeature::kAvx512Fp16);
  check_variant(PQ_DTYPE_F16, pq::AttendLogits::kFma, pq::F16Conversion::kAvx512Fp16,
                {128, 72, 36}, up_to_8);
}

// No rows: the part is empty (max -inf, sum 0) and merging only empty
// parts gives zeros and an lse of -inf.
TEST(KernelsAttend, NoRowsGiveAnEmptyPart) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(3);
  Rows r(PQ_DTYPE_BF16, 128, 10, 1.f, rng);
  Part p(4, 128);
  std::fill(p.acc.begin(), p.acc.end(), 5.f);
  const auto q = queries(4, 128, 1.f, true, rng);
  pq::attend_rows(r.table, kHead, nullptr, 0, q.data(), 4, 1.f, p.view());
  for (float m : p.max) EXPECT_EQ(m, -std::numeric_limits<float>::infinity());
  for (double s : p.sum) EXPECT_EQ(s, 0.0);
  std::vector<float> out(4 * 128, 1.f), lse(4);
  pq::AttentionPart v = p.view();
  pq::merge_attention(&v, 1, 4, 128, out.data(), lse.data());
  for (float o : out) EXPECT_EQ(o, 0.f);
  for (float l : lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
}

}  // namespace
