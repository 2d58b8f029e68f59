// The adaptive K-Means iteration budget (PQCache section 3.3): a timed
// self-profile fits eq. 1, and eq. 3 turns the caller's compute time into
// the number of iterations that can hide behind it.
#include "pq/adaptive_budget.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace pq {
namespace {

// Synthetic keys: a fixed splitmix64 stream mapped to [-1, 1), so profiles
// are reproducible and need no caller data.
std::vector<float> synthetic_keys(int32_t heads, int64_t tokens, int32_t head_dim, uint64_t seed) {
  std::vector<float> keys(static_cast<size_t>(heads) * tokens * head_dim);
  uint64_t state = seed;
  for (float& value : keys) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    value = static_cast<float>(static_cast<double>(z >> 40) * 0x1.0p-23 - 1.0);
  }
  return keys;
}

struct ProfileSample {
  double work = 0.0;     // s_train * T
  double seconds = 0.0;
};

}  // namespace

ClusterTimeModel profile_cluster_time(int32_t heads, int32_t head_dim, const KMeansParams& params,
                                      ThreadPool& pool) {
  const int32_t k = 1 << std::clamp(params.bits, 1, 8);
  // Training sizes a few times the centroid count (at least a few hundred),
  // small enough that the whole profile stays in the tens of milliseconds.
  const int64_t small_size = std::max<int64_t>(256, 2 * static_cast<int64_t>(k));
  const int64_t sizes[] = {small_size, 2 * small_size};
  const int32_t iteration_counts[] = {2, 6};

  const std::vector<float> keys = synthetic_keys(heads, sizes[1], head_dim, params.seed ^ 0x70726f66ULL);
  const int64_t tokens_per_head = sizes[1];
  KeyGather gather = [&](int32_t head, const int64_t* rows, int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i) {
      const float* source =
          keys.data() + (static_cast<size_t>(head) * tokens_per_head + rows[i]) * head_dim;
      std::copy(source, source + head_dim, out + i * head_dim);
    }
  };

  KMeansParams profile = params;
  profile.tolerance = 0.0f;  // run every requested iteration
  // Train on all the synthetic tokens: the model is per training point.
  profile.max_points_per_centroid =
      static_cast<int32_t>(std::max<int64_t>(params.max_points_per_centroid, sizes[1] / k + 1));

  PqCodebook codebook;
  // Warm-up (page faults, pool threads); not timed.
  profile.max_iterations = 1;
  train_codebook(heads, head_dim, sizes[0], gather, profile, pool, nullptr, &codebook);

  std::vector<ProfileSample> samples;
  for (int64_t size : sizes) {
    for (int32_t iterations : iteration_counts) {
      profile.max_iterations = iterations;
      const auto start = std::chrono::steady_clock::now();
      const KMeansReport report =
          train_codebook(heads, head_dim, size, gather, profile, pool, nullptr, &codebook);
      const auto stop = std::chrono::steady_clock::now();
      ProfileSample sample;
      sample.work = static_cast<double>(report.training_points) * report.iterations;
      sample.seconds = std::chrono::duration<double>(stop - start).count();
      samples.push_back(sample);
    }
  }

  // Least-squares line seconds = alpha1 + beta1 * work.
  double mean_work = 0.0, mean_seconds = 0.0;
  for (const ProfileSample& s : samples) {
    mean_work += s.work;
    mean_seconds += s.seconds;
  }
  mean_work /= samples.size();
  mean_seconds /= samples.size();
  double covariance = 0.0, variance = 0.0;
  for (const ProfileSample& s : samples) {
    covariance += (s.work - mean_work) * (s.seconds - mean_seconds);
    variance += (s.work - mean_work) * (s.work - mean_work);
  }
  ClusterTimeModel model;
  model.beta1 = variance > 0.0 ? covariance / variance : 0.0;
  model.alpha1 = mean_seconds - model.beta1 * mean_work;
  if (model.beta1 > 0.0 && !(model.alpha1 >= 0.0)) model.alpha1 = 0.0;
  if (!(model.beta1 > 0.0)) {
    // Timer noise gave a useless slope: fall back to the steepest line
    // through the origin, which is never optimistic about T.
    double ratio = 0.0;
    for (const ProfileSample& s : samples)
      if (s.work > 0.0) ratio = std::max(ratio, s.seconds / s.work);
    model.alpha1 = 0.0;
    model.beta1 = ratio > 0.0 ? ratio : 1e-9;
  }
  model.fitted = true;
  return model;
}

int32_t adaptive_iterations(const ClusterTimeModel& cluster, const ComputeTimeModel& compute,
                            int64_t tokens, int64_t training_points, int32_t min_iters,
                            int32_t max_iters) {
  max_iters = std::max(max_iters, 0);
  min_iters = std::clamp(min_iters, 0, max_iters);
  const bool empty_compute = compute.alpha2 == 0.0 && compute.beta2 == 0.0 && compute.gamma2 == 0.0;
  if (empty_compute && !(compute.layer_budget > 0.0)) return max_iters;
  if (!cluster.fitted || !(cluster.beta1 > 0.0) || training_points <= 0) return max_iters;

  const double s = static_cast<double>(tokens);
  const double compute_seconds =
      empty_compute ? compute.layer_budget
                    : compute.alpha2 + compute.beta2 * s + compute.gamma2 * s * s;  // eq. 2
  const double iterations =
      std::floor((compute_seconds - cluster.alpha1) /
                 (cluster.beta1 * static_cast<double>(training_points)));  // eq. 3
  if (std::isnan(iterations)) return max_iters;
  if (iterations <= min_iters) return min_iters;
  if (iterations >= max_iters) return max_iters;
  return static_cast<int32_t>(iterations);
}

}  // namespace pq
