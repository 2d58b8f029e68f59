// The adaptive K-Means iteration budget of PQCache section 3.3.
//   clustering time  = alpha1 + beta1 * s_train * T      (eq. 1)
//   caller's compute = alpha2 + beta2 * s + gamma2 * s^2  (eq. 2)
//   T_max = (gamma2 s^2 + beta2 s + alpha2 - alpha1) / (beta1 s_train)  (eq. 3)
// clipped to [min, max]. s is the layer's token count; s_train the training
// points per group (capped by max_points_per_centroid * 2^b).
#pragma once

#include <cstdint>

#include "pq/kmeans.h"
#include "base/thread_pool.h"

namespace pq {

struct ClusterTimeModel {
  double alpha1 = 0.0;  // seconds
  double beta1 = 0.0;   // seconds per (training point x iteration)
  bool fitted = false;
};

struct ComputeTimeModel {
  double alpha2 = 0.0, beta2 = 0.0, gamma2 = 0.0;  // seconds
  double layer_budget = 0.0;                       // seconds; used if all three are 0
};

// Fits alpha1/beta1 by timing train_codebook on synthetic keys of the given
// geometry at a few sizes (a least-squares line through the points). Takes a
// few tens of milliseconds.
ClusterTimeModel profile_cluster_time(int32_t heads, int32_t head_dim,
                                      const KMeansParams& params, ThreadPool& pool);

// The iteration budget for a layer of `tokens` tokens. Returns max_iters when
// the compute model is empty (all zero), else eq. 3 clipped to
// [min_iters, max_iters].
int32_t adaptive_iterations(const ClusterTimeModel& cluster, const ComputeTimeModel& compute,
                            int64_t tokens, int64_t training_points, int32_t min_iters,
                            int32_t max_iters);

}  // namespace pq
