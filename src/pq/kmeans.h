// Product-quantization training for one layer: K-Means batched over all
// (kv head x subspace) groups (the codebook and its uses: codebook.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/thread_pool.h"
#include "pq/codebook.h"

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
  // The model's index of head 0 (config.kv_head_offset): seeds take the
  // model's head, so a tensor-parallel rank trains what one context would.
  int32_t head_offset = 0;
  // Train on tokens [first_token, tokens) only: the sinks, always selected,
  // are left out so that no centroid is spent on them (the official
  // PQCache code clusters the tokens after the sinks). All tokens when
  // fewer than one remains.
  int64_t first_token = 0;
  // The codebook's dimension order (rotary_dim_order); kept in the codebook.
  std::vector<int32_t> dim_order;
  // Called on the calling thread after each Lloyd iteration with the
  // iterations run so far (a build's progress); empty: not called.
  std::function<void(int32_t iterations)> on_iteration;
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

}  // namespace pq
