#include "pq/tail_estimate.h"

#include <algorithm>
#include <cmath>

#include "base/dtype.h"
#include "base/flush_subnormals.h"

namespace pq {

void CodeValueSums::clear() {
  codebook_.reset();
  begin_ = end_ = 0;
  std::vector<float>().swap(sums_);
  std::vector<uint32_t>().swap(counts_);
}

void CodeValueSums::update(const PqIndex& index, int32_t head_dim, int32_t dtype, int64_t begin,
                           int64_t end, const ValueRuns& values) {
  const PqCodebook& cb = *index.codebook;
  end = std::max(begin, std::min(end, index.coded_tokens));
  if (codebook_ != index.codebook || begin != begin_ || end < end_ || head_dim != head_dim_) {
    codebook_ = index.codebook;
    begin_ = end_ = begin;
    centroids_ = cb.centroids;
    head_dim_ = head_dim;
    sums_.assign(static_cast<size_t>(cb.heads) * cb.centroids * head_dim, 0.f);
    counts_.assign(static_cast<size_t>(cb.heads) * cb.centroids, 0u);
  }
  if (end == end_) return;
  std::vector<float> row(static_cast<size_t>(head_dim));
  for (int32_t h = 0; h < cb.heads; ++h) {
    float* sums = sums_.data() + static_cast<size_t>(h) * centroids_ * head_dim;
    uint32_t* counts = counts_.data() + static_cast<size_t>(h) * centroids_;
    const CodeColumn& codes = index.codes[static_cast<size_t>(h)];
    int64_t t = end_;
    values(h, end_, end, [&](const uint8_t* rows, int64_t count) {
      const size_t row_bytes = static_cast<size_t>(head_dim) * dtype_size(dtype);
      for (int64_t i = 0; i < count; ++i, ++t) {
        const uint8_t code = codes.at(t)[0];
        to_float(rows + static_cast<size_t>(i) * row_bytes, dtype, head_dim, row.data());
        float* s = sums + static_cast<size_t>(code) * head_dim;
        for (int32_t d = 0; d < head_dim; ++d) s[d] += row[static_cast<size_t>(d)];
        ++counts[code];
      }
    });
  }
  end_ = end;
}

namespace {

// Four query heads' floats: the scan multiplies table rows of four lanes.
typedef float Lanes __attribute__((vector_size(16)));

// One block of four query heads (a group of at most four) and M subspaces,
// both known at compile time: the default index's scan (4 x 8 bits, or 2 x
// 8 at head_dim 64) with no loop but the tokens'. A chosen token's product
// is multiplied by 0 rather than skipped: which tokens are chosen is data,
// and a branch on it mispredicts.
template <int M>
void scan_one_block(const Lanes* table, int32_t k, const CodeColumn& codes, int64_t begin,
                    int64_t end, const uint64_t* chosen, Lanes* w) {
  codes.for_each_run(begin, end, [&](int64_t first, int64_t count, const uint8_t* data) {
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t t = static_cast<uint64_t>(first + i - begin);
      const float keep = static_cast<float>(((chosen[t >> 6] >> (t & 63)) & 1u) ^ 1u);
      const uint8_t* code = data + i * M;
      Lanes p = table[code[0]];
      for (int j = 1; j < M; ++j) p *= table[static_cast<size_t>(j) * k + code[j]];
      w[code[0]] += p * keep;
    }
  });
}

// Any group and any number of subspaces.
void scan_blocks(const Lanes* table, int32_t m, int32_t k, int32_t blocks, const CodeColumn& codes,
                 int64_t begin, int64_t end, const uint64_t* chosen, Lanes* w) {
  codes.for_each_run(begin, end, [&](int64_t first, int64_t count, const uint8_t* data) {
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t t = static_cast<uint64_t>(first + i - begin);
      const float keep = static_cast<float>(((chosen[t >> 6] >> (t & 63)) & 1u) ^ 1u);
      const uint8_t* code = data + i * m;
      const size_t c0 = code[0];
      for (int32_t b = 0; b < blocks; ++b) {
        Lanes p = table[c0 * blocks + b];
        for (int32_t j = 1; j < m; ++j)
          p *= table[(static_cast<size_t>(j) * k + code[j]) * blocks + b];
        w[c0 * blocks + b] += p * keep;
      }
    }
  });
}

}  // namespace

void tail_weights(const PqCodebook& codebook, const float* lut, int32_t group, float scale,
                  const CodeColumn& codes, int64_t begin, int64_t end, const uint64_t* chosen,
                  float* weights, float* shift) {
  const int32_t m = codebook.subspaces, k = codebook.centroids;
  const int32_t blocks = (group + 3) / 4;  // of four query heads
  // table[(j * k + c) * blocks + b][l] = exp(scale x (lut[g][j][c] - top))
  // for query head g = 4b + l, top the row's largest entry: in (0, 1].
  std::vector<Lanes> table(static_cast<size_t>(m) * k * blocks, Lanes{0.f, 0.f, 0.f, 0.f});
  for (int32_t g = 0; g < group; ++g) {
    double sum_top = 0.0;
    for (int32_t j = 0; j < m; ++j) {
      const float* row = lut + (static_cast<size_t>(g) * m + j) * k;
      const float top = *std::max_element(row, row + k);
      sum_top += top;
      for (int32_t c = 0; c < k; ++c)
        table[(static_cast<size_t>(j) * k + c) * blocks + g / 4][g % 4] =
            std::exp(scale * (row[c] - top));
    }
    shift[g] = static_cast<float>(scale * sum_top);
  }
  std::vector<Lanes> w(static_cast<size_t>(k) * blocks, Lanes{0.f, 0.f, 0.f, 0.f});
  FlushSubnormals flush;
  if (blocks == 1 && m == 4)
    scan_one_block<4>(table.data(), k, codes, begin, end, chosen, w.data());
  else if (blocks == 1 && m == 2)
    scan_one_block<2>(table.data(), k, codes, begin, end, chosen, w.data());
  else
    scan_blocks(table.data(), m, k, blocks, codes, begin, end, chosen, w.data());
  for (int32_t c = 0; c < k; ++c)
    for (int32_t g = 0; g < group; ++g)
      weights[static_cast<size_t>(c) * group + g] = w[static_cast<size_t>(c) * blocks + g / 4][g % 4];
}

}  // namespace pq
