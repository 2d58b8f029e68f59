// Product-quantization training and encoding for one layer: K-Means batched
// over all (kv head x subspace) groups, then every token encoded with the
// index of its nearest centroid per subspace (one uint8 per subspace).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/thread_pool.h"

namespace pq {

struct KMeansParams {
  int32_t subspaces = 2;              // m; head_dim % m == 0
  int32_t bits = 6;                   // b in [1, 8]; 2^b centroids per subspace
  int32_t max_iterations = 25;        // Lloyd iterations at most (>= 0)
  float tolerance = 1e-4f;            // stop when the relative improvement is below
  int32_t init = 1;                   // pq_kmeans_init
  int32_t max_points_per_centroid = 256;
  uint64_t seed = 0x5eed;
  int32_t layer = 0;                  // mixed into the per-group seeds
};

// Writes the keys of kv head `head` at the given token rows as float, one
// row of head_dim floats after another: out[i * head_dim + d]. Must be safe to
// call from several threads at once.
using KeyGather =
    std::function<void(int32_t head, const int64_t* rows, int64_t count, float* out)>;

// Centroids of one layer: [head][subspace][centroid][sub_dim] floats.
struct PqCodebook {
  int32_t heads = 0;
  int32_t subspaces = 0;
  int32_t centroids = 0;  // 2^bits
  int32_t sub_dim = 0;    // head_dim / subspaces
  std::vector<float> data;

  const float* at(int32_t head, int32_t subspace) const {
    return data.data() +
           (static_cast<size_t>(head) * subspaces + subspace) * centroids * sub_dim;
  }
  float* at(int32_t head, int32_t subspace) {
    return data.data() +
           (static_cast<size_t>(head) * subspaces + subspace) * centroids * sub_dim;
  }
};

struct KMeansReport {
  int32_t iterations = 0;        // most Lloyd iterations any group ran
  int64_t training_points = 0;   // points per group actually trained on
  bool cancelled = false;        // *cancel was seen; the codebook is unusable
  // objective[g][t]: sum of squared distances of group g's training points
  // to their assigned centroid at the assignment step of iteration t
  // (t = 0 is the assignment to the initial centroids). Non-increasing.
  // Group g = head * subspaces + subspace.
  std::vector<std::vector<double>> objective;
};

// Trains the codebook of one layer on `tokens` keys per head. Deterministic
// for fixed inputs and params, whatever the pool size. Checks *cancel (may be
// null) between iterations and returns early with report.cancelled set.
KMeansReport train_codebook(int32_t heads, int32_t head_dim, int64_t tokens,
                            const KeyGather& gather, const KMeansParams& params,
                            ThreadPool& pool, const std::atomic<bool>* cancel,
                            PqCodebook* codebook);

// Encodes tokens [first, first + count) of every head: codes[head] points to
// that head's code array at token `first` (count * subspaces bytes,
// token-major). Each code is the index of the nearest centroid (ties: the
// lowest index).
void encode_tokens(const PqCodebook& codebook, int32_t head_dim, int64_t first,
                   int64_t count, const KeyGather& gather, ThreadPool* pool,
                   uint8_t* const* codes);

// Nearest centroid of one sub-vector (squared L2; ties: the lowest index).
int32_t nearest_centroid(const float* centroids, int32_t count, int32_t sub_dim,
                         const float* x);

}  // namespace pq
