// Product quantization's one home, as faiss's ProductQuantizer: the
// codebook of one layer (m subspaces of sub_dim dimensions, 2^b centroids
// each, for every kv head) and what is done with it: the inner-product table
// of a query, scores of codes through that table, the codes of keys.
// Training is K-Means (kmeans.h: train_codebook); the index that holds a
// codebook with the codes of a layer is pq_index.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/thread_pool.h"
#include "pq/centroid_layouts.h"

namespace pq {

// Writes the keys of kv head `head` at the given token rows as float, one
// row of head_dim floats after another: out[i * head_dim + d]. Must be safe to
// call from several threads at once.
using KeyGather =
    std::function<void(int32_t head, const int64_t* rows, int64_t count, float* out)>;

// The order in which the codebook reads a head's dimensions under a
// pq_key_rotary layout: codebook position p holds the caller's dimension
// order[p], so that each subspace (sub_dim consecutive positions) holds
// whole rotary pairs. Empty when the caller's order already does (no
// rotary layout, or interleaved pairs with an even sub_dim).
std::vector<int32_t> rotary_dim_order(int32_t head_dim, int32_t key_rotary);

// `gather` with each row put in codebook order (as `order`); `gather` itself
// when the order is empty.
KeyGather in_dim_order(const KeyGather& gather, const std::vector<int32_t>& order,
                       int32_t head_dim);

// Where PqCodebook::pq_products_summed adds: lanes[q][kProductLanes] and
// tops[q].
constexpr int kProductLanes = 4;
struct ProductSums {
  int64_t first_index;  // the index of the first token passed
  int64_t whole;        // indices below it go to the lanes
  float* lanes;
  float* tops;
};

// The codebook of one layer: [head][subspace][centroid][sub_dim] floats,
// and what is done with it.
struct PqCodebook {
  int32_t heads = 0;
  int32_t subspaces = 0;
  int32_t centroids = 0;  // 2^bits
  int32_t sub_dim = 0;    // head_dim / subspaces
  std::vector<float> data;
  // rotary_dim_order(): the codebook's dimension order; empty = the
  // caller's. Queries (lut) and keys (encode, training) are read through it.
  std::vector<int32_t> dim_order;
  // The centroids laid out for the kernels, made on first use
  // (centroid_layouts.h); training assigns a fresh one.
  CentroidLayouts layouts;

  const float* at(int32_t head, int32_t subspace) const {
    return data.data() +
           (static_cast<size_t>(head) * subspaces + subspace) * centroids * sub_dim;
  }
  float* at(int32_t head, int32_t subspace) {
    return data.data() +
           (static_cast<size_t>(head) * subspaces + subspace) * centroids * sub_dim;
  }

  // The centroids of (head, subspace) as the kernels read them: every set
  // is laid out on the first call and kept (layouts).
  const PreparedCentroids& prepared(int32_t head, int32_t subspace) const;

  // The inner-product table of one kv head's group of queries
  // ([group][head_dim] floats): lut[g][j][c] = q_g[j * sub_dim ..] .
  // centroid[head][j][c] (paper section 3.4), lut_floats(group) floats,
  // each entry with the bits of dot() (base/vector_math.h) at every level.
  size_t lut_floats(int32_t group) const {
    return static_cast<size_t>(group) * subspaces * centroids;
  }
  void lut(int32_t head, const float* queries, int32_t group, int32_t head_dim, float* out) const;

  // The approximate raw scores of `tokens` tokens through such a table: for
  // each of `queries` query heads q, out[q * out_stride + t] = sum_j
  // lut[q][j][codes[t * subspaces + j]] (out_stride >= tokens, so that a run
  // of a fork's codes writes its part of a longer row). The hot loop of PQ
  // selection on the host.
  void scores(const float* lut, int32_t queries, const uint8_t* codes, int64_t tokens,
              float* out, int64_t out_stride) const {
    pq_scores(lut, queries, subspaces, centroids, codes, tokens, out, out_stride);
  }
  static void pq_scores(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                        const uint8_t* codes, int64_t tokens, float* out, int64_t out_stride);
  // The same walk with products, and their sums: out[q * out_stride + t] =
  // 1 x table[q][0][codes[t * subspaces]] x ... x table[q][m-1][..], left to
  // right; each query head's products are added into four lanes by index
  // mod 4 (in order of index, for the indices below sums.whole; codes[0] is
  // index sums.first_index) and sums.tops[q] is raised to the largest. With
  // table = exp(scale x lut - a shift per subspace) that is one pass for
  // the softmax numerators and their normalisers, without an exp per token
  // (pq_softmax_scan.h).
  static void pq_products_summed(const float* table, int32_t queries, int32_t subspaces,
                                 int32_t centroids, const uint8_t* codes, int64_t tokens,
                                 float* out, int64_t out_stride, const ProductSums& sums);

  // Encodes tokens [first, first + count) of every head: codes[head] points
  // to that head's code array at token `first` (count * subspaces bytes,
  // token-major). Each code is the index of the nearest centroid (ties: the
  // lowest index); spread over `pool` when given.
  void encode(int32_t head_dim, int64_t first, int64_t count, const KeyGather& gather,
              ThreadPool* pool, uint8_t* const* codes) const;
};

}  // namespace pq
