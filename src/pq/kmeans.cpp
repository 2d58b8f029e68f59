// K-Means for product quantization, batched over every (kv head x subspace)
// group of one layer.
//
// Numerics live in nearest_centroid.cpp: the assignment scores points with
// the GEMM form and re-checks near ties exactly, so the chosen centroid is
// always the argmin of squared_distance() (ties: lowest index). The encoding
// (PqCodebook::encode) therefore agrees bit for bit with nearest_centroid, equal sub-vectors get
// distance exactly 0 (the exact regime), and the objective is the true Lloyd
// objective, so it never rises.
//
// Determinism. All randomness comes from splitmix64/xoshiro256** streams
// seeded from (seed, layer, head or group). Parallel tasks write disjoint
// outputs; sums over tasks are reduced in task order, and the centroid means
// are accumulated per group in point order, so results do not depend on the
// pool size.
#include "pq/kmeans.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "base/error.h"
#include "pq/nearest_centroid.h"
#include "base/rng.h"

namespace pq {
namespace {

constexpr int64_t kAssignChunk = 1024;  // training points per assignment task
constexpr int64_t kGatherRows = 256;    // rows fetched through KeyGather at once

// Domain tags keep the sample and the per-group streams independent.
constexpr uint64_t kSampleDomain = 0x73616d706c65ULL;  // "sample"
constexpr uint64_t kGroupDomain = 0x67726f7570ULL;     // "group"

// ---------------------------------------------------------------------------
// Training.
// ---------------------------------------------------------------------------

// One (head, subspace) group during training.
struct Group {
  std::vector<float> points;       // [n][dim] training sub-vectors
  std::vector<float> point_norms;  // [n]
  float* centroids = nullptr;      // [k][dim], inside the codebook
  PreparedCentroids prepared;
  std::vector<uint8_t> assignment;  // [n]
  std::vector<float> distance;      // [n], squared distance to the assigned centroid
  uint64_t seed = 0;
  bool active = true;               // false once converged (frozen)
};

// `count` distinct rows of [0, tokens), ascending, drawn by a partial
// Fisher-Yates shuffle (count < tokens).
std::vector<int64_t> sample_rows(int64_t tokens, int64_t count, uint64_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) all[i] = i;
  Rng rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(tokens - i)));
    std::swap(all[i], all[j]);
  }
  all.resize(static_cast<size_t>(count));
  std::sort(all.begin(), all.end());  // sequential reads through the gather
  return all;
}

// k-means++ seeds from at most this many points per centroid.
constexpr int64_t kSeedPointsPerCentroid = 32;

// Chooses the initial centroids of one group from its n > 0 points.
void init_centroids(Group& group, int64_t n, int32_t k, int32_t dim, int32_t init) {
  const float* points = group.points.data();
  float* centroids = group.centroids;
  auto copy_point = [&](int32_t centroid, int64_t point) {
    std::memcpy(centroids + static_cast<size_t>(centroid) * dim,
                points + static_cast<size_t>(point) * dim, sizeof(float) * dim);
  };
  if (n <= k) {  // every point is a centroid; pad by repeating them
    for (int32_t c = 0; c < k; ++c) copy_point(c, c % n);
    return;
  }
  Rng rng(group.seed);
  if (init == PQ_KMEANS_INIT_RANDOM) {
    std::vector<int64_t> chosen = sample_rows(n, k, rng.next());
    // sample_rows sorts; shuffle back deterministically so the order carries
    // no positional bias (it does not matter for correctness).
    for (int32_t c = k - 1; c > 0; --c) std::swap(chosen[c], chosen[rng.below(c + 1)]);
    for (int32_t c = 0; c < k; ++c) copy_point(c, chosen[c]);
    return;
  }
  // k-means++: D^2 sampling. Once every remaining weight is 0 (fewer
  // distinct points than k), the rest are copies of the centroids chosen so
  // far, so every distinct point is a centroid (the exact regime).
  // Seeding reads every point once per centroid, as much as a Lloyd
  // iteration: above kSeedPointsPerCentroid points per centroid it seeds
  // from a seeded sample of that many (the iterations then use them all).
  std::vector<float> sampled;
  if (n > kSeedPointsPerCentroid * k) {
    const std::vector<int64_t> rows = sample_rows(n, kSeedPointsPerCentroid * k, rng.next());
    sampled.resize(rows.size() * static_cast<size_t>(dim));
    for (size_t r = 0; r < rows.size(); ++r)
      std::memcpy(sampled.data() + r * dim, points + rows[r] * dim, sizeof(float) * dim);
    points = sampled.data();
    n = static_cast<int64_t>(rows.size());
  }
  std::vector<float> weight(static_cast<size_t>(n));
  int64_t first = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
  copy_point(0, first);
  std::fill(weight.begin(), weight.end(), FLT_MAX);
  update_min_distances(points, n, dim, centroids, weight.data());
  int32_t chosen_count = 1;
  for (; chosen_count < k; ++chosen_count) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += weight[i];
    if (!(total > 0.0)) break;
    const double target = rng.unit() * total;
    double running = 0.0;
    int64_t pick = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (weight[i] <= 0.0f) continue;
      pick = i;  // the last positive weight, if rounding leaves running <= target
      running += weight[i];
      if (running > target) break;
    }
    copy_point(chosen_count, pick);
    const float* centroid = centroids + static_cast<size_t>(chosen_count) * dim;
    update_min_distances(points, n, dim, centroid, weight.data());
  }
  for (int32_t c = chosen_count; c < k; ++c)
    std::memcpy(centroids + static_cast<size_t>(c) * dim,
                centroids + static_cast<size_t>(c % chosen_count) * dim, sizeof(float) * dim);
}

// Gives every empty cluster the point farthest from its centroid among
// clusters with at least two members (skipped when that distance is 0); the
// cluster's centroid becomes that point. Points closer to it than to their
// own centroid (its duplicates, above all) follow it, so the next empty
// cluster takes a different value. Every move lowers a point's distance, so
// the objective cannot rise. Returns (cluster, point) per repair.
std::vector<std::pair<int32_t, int64_t>> repair_empty_clusters(Group& group, int64_t n, int32_t k,
                                                               int32_t dim,
                                                               std::vector<int64_t>& counts) {
  std::vector<std::pair<int32_t, int64_t>> repairs;
  // A move can empty another cluster, so scan again until nothing changes;
  // each repair strictly lowers the objective, and 2k rounds bound the work.
  for (int32_t round = 0; round < 2 * k; ++round) {
    int32_t empty = 0;
    while (empty < k && counts[empty] != 0) ++empty;
    if (empty == k) break;
    int64_t farthest = -1;
    float farthest_distance = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      if (counts[group.assignment[i]] >= 2 && group.distance[i] > farthest_distance) {
        farthest = i;
        farthest_distance = group.distance[i];
      }
    }
    if (farthest < 0) break;  // every shared point sits on its centroid
    const float* seed_point = group.points.data() + static_cast<size_t>(farthest) * dim;
    --counts[group.assignment[farthest]];
    group.assignment[farthest] = static_cast<uint8_t>(empty);
    group.distance[farthest] = 0.0f;
    counts[empty] = 1;
    for (int64_t i = 0; i < n; ++i) {
      if (group.assignment[i] == empty) continue;
      const float distance =
          squared_distance(group.points.data() + static_cast<size_t>(i) * dim, seed_point, dim);
      if (distance < group.distance[i]) {
        --counts[group.assignment[i]];
        group.assignment[i] = static_cast<uint8_t>(empty);
        group.distance[i] = distance;
        ++counts[empty];
      }
    }
    repairs.emplace_back(empty, farthest);
  }
  return repairs;
}

// The Lloyd update: repair empty clusters, then move every non-empty
// centroid to the mean of its points (summed in double, in point order).
void update_centroids(Group& group, int64_t n, int32_t k, int32_t dim) {
  std::vector<int64_t> counts(k, 0);
  for (int64_t i = 0; i < n; ++i) ++counts[group.assignment[i]];
  repair_empty_clusters(group, n, k, dim, counts);
  std::vector<double> sums(static_cast<size_t>(k) * dim, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double* sum = sums.data() + static_cast<size_t>(group.assignment[i]) * dim;
    const float* x = group.points.data() + static_cast<size_t>(i) * dim;
    for (int32_t d = 0; d < dim; ++d) sum[d] += x[d];
  }
  for (int32_t c = 0; c < k; ++c) {
    if (counts[c] == 0) continue;  // nothing to move it to; keep it
    const double count = static_cast<double>(counts[c]);
    float* centroid = group.centroids + static_cast<size_t>(c) * dim;
    const double* sum = sums.data() + static_cast<size_t>(c) * dim;
    // Dividing (not multiplying by the inverse) keeps the mean of equal
    // values exact, which the exact regime relies on.
    for (int32_t d = 0; d < dim; ++d) centroid[d] = static_cast<float>(sum[d] / count);
  }
}

// After the last assignment: clusters that ended up empty are repaired as
// above and become exactly their seed point, so no centroid is wasted.
// Other centroids stay as they are.
void final_repair(Group& group, int64_t n, int32_t k, int32_t dim) {
  std::vector<int64_t> counts(k, 0);
  for (int64_t i = 0; i < n; ++i) ++counts[group.assignment[i]];
  if (std::find(counts.begin(), counts.end(), 0) == counts.end()) return;
  for (const auto& [cluster, point] : repair_empty_clusters(group, n, k, dim, counts)) {
    std::memcpy(group.centroids + static_cast<size_t>(cluster) * dim,
                group.points.data() + static_cast<size_t>(point) * dim, sizeof(float) * dim);
  }
}

bool is_cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

void validate_geometry(int32_t head_dim, int32_t subspaces, int32_t bits) {
  if (bits > 8)
    fail(PQ_ERR_UNSUPPORTED, "K-Means: bits = " + std::to_string(bits) + " (at most 8)");
  if (bits < 1) fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: bits = " + std::to_string(bits) + " (at least 1)");
  if (subspaces < 1)
    fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: subspaces = " + std::to_string(subspaces));
  if (head_dim < 1 || head_dim % subspaces != 0)
    fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: head_dim " + std::to_string(head_dim) +
                                      " is not a positive multiple of subspaces " +
                                      std::to_string(subspaces));
}

}  // namespace


KMeansReport train_codebook(int32_t heads, int32_t head_dim, int64_t tokens,
                            const KeyGather& gather, const KMeansParams& params,
                            ThreadPool& pool, const std::atomic<bool>* cancel,
                            PqCodebook* codebook) {
  validate_geometry(head_dim, params.subspaces, params.bits);
  if (heads < 1) fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: heads = " + std::to_string(heads));
  if (tokens < 1) fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: no tokens to train on");
  if (params.max_iterations < 0)
    fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: max_iterations < 0");
  if (std::isnan(params.tolerance)) fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: tolerance is NaN");
  if (params.init != PQ_KMEANS_INIT_RANDOM && params.init != PQ_KMEANS_INIT_KMEANSPP)
    fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: unknown init " + std::to_string(params.init));
  if (params.max_points_per_centroid < 1)
    fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: max_points_per_centroid < 1");
  if (!gather || codebook == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: null gather or codebook");

  const int32_t m = params.subspaces;
  const int32_t k = 1 << params.bits;
  const int32_t dim = head_dim / m;
  const int32_t group_count = heads * m;

  if (!params.dim_order.empty() && params.dim_order.size() != static_cast<size_t>(head_dim))
    fail(PQ_ERR_INVALID_ARGUMENT, "K-Means: the dimension order does not match head_dim");
  codebook->dim_order = params.dim_order;
  const KeyGather ordered = in_dim_order(gather, params.dim_order, head_dim);
  // The training tokens: [first, tokens).
  const int64_t first =
      params.first_token > 0 && params.first_token < tokens ? params.first_token : 0;
  const int64_t span = tokens - first;

  codebook->heads = heads;
  codebook->subspaces = m;
  codebook->centroids = k;
  codebook->sub_dim = dim;
  codebook->data.assign(static_cast<size_t>(group_count) * k * dim, 0.0f);
  codebook->layouts = CentroidLayouts();  // laid out again from the new centroids

  KMeansReport report;
  if (is_cancelled(cancel)) {
    report.cancelled = true;
    return report;
  }

  const int64_t cap = static_cast<int64_t>(params.max_points_per_centroid) * k;
  const int64_t n = std::min(span, cap);
  report.training_points = n;

  // Training rows per head (all rows, or the same seeded sample for every
  // subspace of the head).
  std::vector<std::vector<int64_t>> head_rows(heads);
  for (int32_t h = 0; h < heads; ++h) {
    if (n == span) {
      head_rows[h].resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) head_rows[h][i] = first + i;
    } else {
      uint64_t seed = mix_seed(params.seed, kSampleDomain);
      seed = mix_seed(seed, static_cast<uint64_t>(static_cast<int64_t>(params.layer)));
      seed = mix_seed(seed, static_cast<uint64_t>(h + params.head_offset));
      seed = mix_seed(seed, static_cast<uint64_t>(tokens));
      head_rows[h] = sample_rows(span, n, seed);
      for (int64_t& row : head_rows[h]) row += first;
    }
  }

  std::vector<Group> groups(group_count);
  for (int32_t g = 0; g < group_count; ++g) {
    Group& group = groups[g];
    group.points.resize(static_cast<size_t>(n) * dim);
    group.point_norms.resize(static_cast<size_t>(n));
    group.centroids = codebook->data.data() + static_cast<size_t>(g) * k * dim;
    uint64_t seed = mix_seed(params.seed, kGroupDomain);
    seed = mix_seed(seed, static_cast<uint64_t>(static_cast<int64_t>(params.layer)));
    group.seed = mix_seed(seed, static_cast<uint64_t>(g + params.head_offset * m));
  }

  // Fetch the training sub-vectors, kGatherRows rows of one head per task.
  const int64_t gather_chunks = (n + kGatherRows - 1) / kGatherRows;
  pool.parallel_for(static_cast<int64_t>(heads) * gather_chunks, [&](int64_t task) {
    const int32_t h = static_cast<int32_t>(task / gather_chunks);
    const int64_t start = (task % gather_chunks) * kGatherRows;
    const int64_t rows = std::min(kGatherRows, n - start);
    std::vector<float> buffer(static_cast<size_t>(rows) * head_dim);
    ordered(h, head_rows[h].data() + start, rows, buffer.data());
    for (int32_t j = 0; j < m; ++j) {
      Group& group = groups[static_cast<size_t>(h) * m + j];
      for (int64_t r = 0; r < rows; ++r) {
        const float* source = buffer.data() + r * head_dim + static_cast<size_t>(j) * dim;
        float* target = group.points.data() + (start + r) * dim;
        std::memcpy(target, source, sizeof(float) * dim);
        group.point_norms[start + r] = squared_norm(target, dim);
      }
    }
  });
  head_rows.clear();
  head_rows.shrink_to_fit();

  pool.parallel_for(group_count, [&](int64_t g) {
    init_centroids(groups[g], n, k, dim, params.init);
  });

  report.objective.assign(group_count, std::vector<double>());
  if (n <= k) {  // the centroids are the points: every code is exact
    for (auto& objective : report.objective) objective.push_back(0.0);
    return report;
  }

  for (Group& group : groups) {
    group.assignment.resize(static_cast<size_t>(n));
    group.distance.resize(static_cast<size_t>(n));
  }
  const int64_t chunks_per_group = (n + kAssignChunk - 1) / kAssignChunk;
  std::vector<int32_t> active;               // groups still iterating
  std::vector<double> chunk_objective;       // one partial per assignment task
  std::vector<int32_t> iterations(group_count, 0);

  for (int32_t t = 0;; ++t) {
    active.clear();
    for (int32_t g = 0; g < group_count; ++g)
      if (groups[g].active) active.push_back(g);

    pool.parallel_for(static_cast<int64_t>(active.size()), [&](int64_t a) {
      Group& group = groups[active[a]];
      prepare_centroids(group.centroids, k, dim, &group.prepared);
    });

    // Assignment step: one task per (active group, chunk of points).
    chunk_objective.assign(active.size() * chunks_per_group, 0.0);
    pool.parallel_for(static_cast<int64_t>(chunk_objective.size()), [&](int64_t task) {
      Group& group = groups[active[task / chunks_per_group]];
      const int64_t start = (task % chunks_per_group) * kAssignChunk;
      const int64_t count = std::min(kAssignChunk, n - start);
      std::vector<float> scores(static_cast<size_t>(kScoreBlock) * group.prepared.padded);
      chunk_objective[task] = assign_points(
          group.prepared, group.points.data() + start * dim, count, dim,
          group.point_norms.data() + start, group.assignment.data() + start, 1,
          group.distance.data() + start, scores.data());
    });

    // Reduce in chunk order and test convergence.
    for (size_t a = 0; a < active.size(); ++a) {
      const int32_t g = active[a];
      double objective = 0.0;
      for (int64_t c = 0; c < chunks_per_group; ++c)
        objective += chunk_objective[a * chunks_per_group + c];
      std::vector<double>& history = report.objective[g];
      history.push_back(objective);
      bool converged = objective == 0.0;  // a fixed point: nothing can move
      if (t > 0 && params.tolerance > 0.0f) {
        const double previous = history[history.size() - 2];
        converged = converged || (previous - objective) <= params.tolerance * previous;
      }
      if (converged || t == params.max_iterations) groups[g].active = false;
    }

    bool any_active = false;
    for (const Group& group : groups) any_active = any_active || group.active;
    if (!any_active) break;
    if (is_cancelled(cancel)) {
      report.cancelled = true;
      return report;
    }

    // Update step for the groups still running.
    active.clear();
    for (int32_t g = 0; g < group_count; ++g)
      if (groups[g].active) active.push_back(g);
    pool.parallel_for(static_cast<int64_t>(active.size()), [&](int64_t a) {
      update_centroids(groups[active[a]], n, k, dim);
      ++iterations[active[a]];
    });
    if (params.on_iteration) params.on_iteration(t + 1);
  }

  for (int32_t g = 0; g < group_count; ++g)
    report.iterations = std::max(report.iterations, iterations[g]);

  pool.parallel_for(group_count, [&](int64_t g) { final_repair(groups[g], n, k, dim); });
  return report;
}

}  // namespace pq
