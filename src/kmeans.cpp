// K-Means for product quantization, batched over every (kv head x subspace)
// group of one layer.
//
// Numerics. The hot loop scores a block of points against all centroids with
// the expanded form ||c||^2 - 2 x.c (a small GEMM: centroids transposed to
// [sub_dim][k], vectorised over k, with an AVX2+FMA kernel picked at run
// time). The expanded form is fast but can misorder near ties, so every
// centroid whose score lies within a rigorous rounding-error margin of the
// best one is re-checked with the plain squared difference, which also gives
// the distance that is recorded. The chosen centroid is therefore always the
// argmin of squared_distance() (ties: lowest index), whichever kernel ran:
// encode_tokens agrees bit for bit with nearest_centroid, equal sub-vectors
// get distance exactly 0 (the exact regime), and the objective is the true
// Lloyd objective, so it never rises.
//
// Determinism. All randomness comes from splitmix64/xoshiro256** streams
// seeded from (seed, layer, head or group). Parallel tasks write disjoint
// outputs; sums over tasks are reduced in task order, and the centroid means
// are accumulated per group in point order, so results do not depend on the
// pool size.
#include "kmeans.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PQ_KMEANS_HAVE_AVX2 1
#endif

namespace pq {
namespace {

constexpr int64_t kAssignChunk = 1024;  // training points per assignment task
constexpr int64_t kScoreBlock = 64;     // points scored at once (scores buffer rows)
constexpr int64_t kGatherRows = 256;    // rows fetched through KeyGather at once
constexpr int32_t kLaneWidth = 16;      // centroid padding of the transposed layout

// ---------------------------------------------------------------------------
// Random numbers.
// ---------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Folds `value` into `seed`; different (seed, value) pairs give unrelated
// results.
uint64_t mix_seed(uint64_t seed, uint64_t value) {
  uint64_t state = seed ^ (value * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL);
  splitmix64(state);
  return splitmix64(state);
}

// Domain tags keep the sample and the per-group streams independent.
constexpr uint64_t kSampleDomain = 0x73616d706c65ULL;  // "sample"
constexpr uint64_t kGroupDomain = 0x67726f7570ULL;     // "group"

// xoshiro256**: small, fast, and fully determined by its seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& word : state_) word = splitmix64(seed);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound >= 1, without modulo bias.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

  // Uniform in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

// ---------------------------------------------------------------------------
// Distances.
// ---------------------------------------------------------------------------

// The reference squared distance: eight partial sums (lane l takes the
// dimensions l, l + 8, ...), combined in a fixed order, then the tail. Every
// caller (nearest_centroid, the tie re-check, k-means++) runs this one
// function, so they all get bit-identical values; the AVX2 clone computes
// the same lanes in the same order (no FMA), so results do not depend on
// the CPU either. It is exactly 0 for equal vectors.
__attribute__((noinline, target_clones("avx2", "default"))) float squared_distance(
    const float* a, const float* b, int32_t dim) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    for (int32_t l = 0; l < 8; ++l) {
      const float diff = a[d + l] - b[d + l];
      lanes[l] += diff * diff;
    }
  }
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; d < dim; ++d) {
    const float diff = a[d] - b[d];
    sum += diff * diff;
  }
  return sum;
}

// weights[i] = min(weights[i], squared_distance(point i, centroid)) for the
// points with a positive weight: the k-means++ D^2 update. Four points at a
// time, each with squared_distance's exact lane order (bit-identical
// values), so the four dependency chains overlap.
__attribute__((target_clones("avx2", "default"))) void update_min_distances(
    const float* points, int64_t n, int32_t dim, const float* centroid, float* weights) {
  int64_t i = 0;
  if (dim % 8 == 0) {
    typedef float Lanes __attribute__((vector_size(32)));  // lane l = element l
    for (; i + 4 <= n; i += 4) {
      Lanes acc[4] = {};
      const float* first = points + i * dim;
      for (int32_t d = 0; d < dim; d += 8) {
        Lanes c;
        std::memcpy(&c, centroid + d, sizeof(c));
#pragma GCC unroll 4
        for (int32_t p = 0; p < 4; ++p) {
          Lanes x;
          std::memcpy(&x, first + p * dim + d, sizeof(x));
          const Lanes diff = x - c;
          acc[p] += diff * diff;
        }
      }
      for (int32_t p = 0; p < 4; ++p) {
        const Lanes& lane = acc[p];
        const float distance = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                               ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        if (weights[i + p] > 0.0f) weights[i + p] = std::min(weights[i + p], distance);
      }
    }
  }
  for (; i < n; ++i)
    if (weights[i] > 0.0f)
      weights[i] = std::min(weights[i], squared_distance(points + i * dim, centroid, dim));
}

// ||x||^2 with eight partial sums (vectorised); only feeds error margins and
// centroid norms, so its summation order is free.
float squared_norm(const float* x, int32_t dim) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8)
    for (int32_t l = 0; l < 8; ++l) lanes[l] += x[d + l] * x[d + l];
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; d < dim; ++d) sum += x[d] * x[d];
  return sum;
}

// The smallest of `padded` scores (a multiple of kLaneWidth; the padding is
// FLT_MAX), with kLaneWidth independent minima that vectorise. The minimum is
// exact, so the order does not matter.
float min_score(const float* scores, int32_t padded) {
  float lanes[kLaneWidth];
  for (int32_t l = 0; l < kLaneWidth; ++l) lanes[l] = scores[l];
  for (int32_t c = kLaneWidth; c < padded; c += kLaneWidth)
    for (int32_t l = 0; l < kLaneWidth; ++l)
      lanes[l] = scores[c + l] < lanes[l] ? scores[c + l] : lanes[l];
  float smallest = lanes[0];
  for (int32_t l = 1; l < kLaneWidth; ++l) smallest = lanes[l] < smallest ? lanes[l] : smallest;
  return smallest;
}

// Centroids of one group laid out for the scoring kernel.
struct PreparedCentroids {
  int32_t count = 0;                  // k
  int32_t padded = 0;                 // k rounded up to kLaneWidth
  int32_t dim = 0;                    // sub_dim
  const float* rows = nullptr;        // [k][dim], the centroids themselves
  std::vector<float> transposed;      // [dim][padded], zero padding
  std::vector<float> norms;           // [padded], padding = FLT_MAX (never wins)
  float max_norm = 0.0f;
};

void prepare_centroids(const float* centroids, int32_t count, int32_t dim,
                       PreparedCentroids* out) {
  out->count = count;
  out->padded = (count + kLaneWidth - 1) / kLaneWidth * kLaneWidth;
  out->dim = dim;
  out->rows = centroids;
  out->transposed.assign(static_cast<size_t>(dim) * out->padded, 0.0f);
  out->norms.assign(out->padded, FLT_MAX);
  out->max_norm = 0.0f;
  for (int32_t c = 0; c < count; ++c) {
    const float* row = centroids + static_cast<size_t>(c) * dim;
    for (int32_t d = 0; d < dim; ++d) out->transposed[static_cast<size_t>(d) * out->padded + c] = row[d];
    out->norms[c] = squared_norm(row, dim);
    out->max_norm = std::max(out->max_norm, out->norms[c]);
  }
}

// scores[p * padded + c] = ||c||^2 - 2 x_p.c for `count` points of row stride
// `stride`. Portable version: tiles of kLaneWidth centroids with a constant
// trip count, which g++ vectorises even at -O2, accumulating in registers.
void score_block_generic(const float* points, int64_t count, int64_t stride,
                         const PreparedCentroids& pc, float* scores) {
  const int32_t padded = pc.padded;
  const float* __restrict transposed = pc.transposed.data();
  const float* __restrict norms = pc.norms.data();
  for (int64_t p = 0; p < count; ++p) {
    const float* __restrict x = points + p * stride;
    float* __restrict out = scores + p * padded;
    for (int32_t c = 0; c < padded; c += kLaneWidth) {
      float acc[kLaneWidth] = {};
      const float* __restrict column = transposed + c;
      for (int32_t d = 0; d < pc.dim; ++d) {
        const float xd = x[d];
        for (int32_t l = 0; l < kLaneWidth; ++l) acc[l] += xd * column[l];
        column += padded;
      }
      for (int32_t l = 0; l < kLaneWidth; ++l) out[c + l] = norms[c + l] - 2.0f * acc[l];
    }
  }
}

#if PQ_KMEANS_HAVE_AVX2
// AVX2+FMA version: a register tile of Points points x 16 centroids
// (2 * Points independent FMA chains, enough to cover the FMA latency), so
// the loop over dimensions loads two centroid vectors and Points broadcasts
// per 16 * Points multiply-adds.
template <int Points>
__attribute__((target("avx2,fma"), always_inline)) inline void score_tile_avx2(
    const float* points, int64_t stride, const PreparedCentroids& pc, float* scores) {
  const int32_t padded = pc.padded;
  const int32_t dim = pc.dim;
  const __m256 minus_two = _mm256_set1_ps(-2.0f);
  for (int32_t c = 0; c < padded; c += 16) {
    __m256 low[Points], high[Points];
#pragma GCC unroll 8
    for (int i = 0; i < Points; ++i) low[i] = high[i] = _mm256_setzero_ps();
    const float* column = pc.transposed.data() + c;
    for (int32_t d = 0; d < dim; ++d) {
      const __m256 r0 = _mm256_loadu_ps(column);
      const __m256 r1 = _mm256_loadu_ps(column + 8);
      column += padded;
#pragma GCC unroll 8
      for (int i = 0; i < Points; ++i) {
        const __m256 b = _mm256_broadcast_ss(points + i * stride + d);
        low[i] = _mm256_fmadd_ps(b, r0, low[i]);
        high[i] = _mm256_fmadd_ps(b, r1, high[i]);
      }
    }
    const __m256 n0 = _mm256_loadu_ps(pc.norms.data() + c);
    const __m256 n1 = _mm256_loadu_ps(pc.norms.data() + c + 8);
#pragma GCC unroll 8
    for (int i = 0; i < Points; ++i) {
      float* out = scores + i * padded + c;
      _mm256_storeu_ps(out, _mm256_fmadd_ps(minus_two, low[i], n0));
      _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(minus_two, high[i], n1));
    }
  }
}

__attribute__((target("avx2,fma"))) void score_block_avx2(const float* points, int64_t count,
                                                           int64_t stride,
                                                           const PreparedCentroids& pc,
                                                           float* scores) {
  constexpr int kTile = 4;  // 6 measured no faster
  int64_t p = 0;
  for (; p + kTile <= count; p += kTile)
    score_tile_avx2<kTile>(points + p * stride, stride, pc, scores + p * pc.padded);
  for (; p < count; ++p)
    score_tile_avx2<1>(points + p * stride, stride, pc, scores + p * pc.padded);
}

bool cpu_has_avx2_fma() {
  // Pure function of the CPU: evaluated once, never written afterwards.
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}
#endif

void score_block(const float* points, int64_t count, int64_t stride, const PreparedCentroids& pc,
                 float* scores) {
#if PQ_KMEANS_HAVE_AVX2
  if (cpu_has_avx2_fma()) {
    score_block_avx2(points, count, stride, pc, scores);
    return;
  }
#endif
  score_block_generic(points, count, stride, pc, scores);
}

// Assigns `count` points (row stride `stride`) to their nearest centroid:
// codes[p * code_stride] and, if non-null, distances[p]. Returns the sum of
// the distances. `scores` holds kScoreBlock * pc.padded floats.
double assign_points(const PreparedCentroids& pc, const float* points, int64_t count,
                     int64_t stride, const float* point_norms, uint8_t* codes,
                     int64_t code_stride, float* distances, float* scores) {
  const int32_t k = pc.count;
  const int32_t dim = pc.dim;
  // |expanded score - exact value| <= gamma_(dim+2) (||x|| + ||c||)^2 for any
  // summation order, with or without FMA; the squared difference is off by
  // at most gamma_(dim+1) times the distance. Both are below
  // (dim + 2) * FLT_EPSILON * (||x||^2 + ||c||^2) each, so a margin of four
  // times that (plus a tiny absolute term for subnormals) always keeps the
  // true nearest centroid among the candidates.
  const float margin_factor = 4.0f * static_cast<float>(dim + 2) * FLT_EPSILON;
  double total = 0.0;
  for (int64_t start = 0; start < count; start += kScoreBlock) {
    const int64_t block = std::min<int64_t>(kScoreBlock, count - start);
    const float* block_points = points + start * stride;
    score_block(block_points, block, stride, pc, scores);
    for (int64_t p = 0; p < block; ++p) {
      const float* x = block_points + p * stride;
      const float* s = scores + p * pc.padded;
      const float x_norm = point_norms ? point_norms[start + p] : squared_norm(x, dim);
      const float limit = min_score(s, pc.padded) + margin_factor * (x_norm + pc.max_norm) + FLT_MIN;
      int32_t chosen = -1;
      float chosen_distance = 0.0f;
      for (int32_t first = 0; first < k; first += kLaneWidth) {
        int32_t hits = 0;  // counted branch-free first: most blocks have none
        for (int32_t l = 0; l < kLaneWidth; ++l) hits += s[first + l] <= limit ? 1 : 0;
        if (hits == 0) continue;
        for (int32_t c = first; c < std::min(first + kLaneWidth, k); ++c) {
          if (!(s[c] <= limit)) continue;
          const float distance = squared_distance(x, pc.rows + static_cast<size_t>(c) * dim, dim);
          if (chosen < 0 || distance < chosen_distance) {
            chosen = c;
            chosen_distance = distance;
          }
        }
      }
      if (chosen < 0) {  // only with NaN or infinite inputs
        chosen = 0;
        chosen_distance = squared_distance(x, pc.rows, dim);
      }
      codes[(start + p) * code_stride] = static_cast<uint8_t>(chosen);
      if (distances) distances[start + p] = chosen_distance;
      total += chosen_distance;
    }
  }
  return total;
}

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

int32_t nearest_centroid(const float* centroids, int32_t count, int32_t sub_dim, const float* x) {
  int32_t best = 0;
  float best_distance = 0.0f;
  for (int32_t c = 0; c < count; ++c) {
    const float distance = squared_distance(x, centroids + static_cast<size_t>(c) * sub_dim, sub_dim);
    if (c == 0 || distance < best_distance) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
}

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

  codebook->heads = heads;
  codebook->subspaces = m;
  codebook->centroids = k;
  codebook->sub_dim = dim;
  codebook->data.assign(static_cast<size_t>(group_count) * k * dim, 0.0f);

  KMeansReport report;
  if (is_cancelled(cancel)) {
    report.cancelled = true;
    return report;
  }

  const int64_t cap = static_cast<int64_t>(params.max_points_per_centroid) * k;
  const int64_t n = std::min(tokens, cap);
  report.training_points = n;

  // Training rows per head (all rows, or the same seeded sample for every
  // subspace of the head).
  std::vector<std::vector<int64_t>> head_rows(heads);
  for (int32_t h = 0; h < heads; ++h) {
    if (n == tokens) {
      head_rows[h].resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) head_rows[h][i] = i;
    } else {
      uint64_t seed = mix_seed(params.seed, kSampleDomain);
      seed = mix_seed(seed, static_cast<uint64_t>(static_cast<int64_t>(params.layer)));
      seed = mix_seed(seed, static_cast<uint64_t>(h));
      seed = mix_seed(seed, static_cast<uint64_t>(tokens));
      head_rows[h] = sample_rows(tokens, n, seed);
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
    group.seed = mix_seed(seed, static_cast<uint64_t>(g));
  }

  // Fetch the training sub-vectors, kGatherRows rows of one head per task.
  const int64_t gather_chunks = (n + kGatherRows - 1) / kGatherRows;
  pool.parallel_for(static_cast<int64_t>(heads) * gather_chunks, [&](int64_t task) {
    const int32_t h = static_cast<int32_t>(task / gather_chunks);
    const int64_t start = (task % gather_chunks) * kGatherRows;
    const int64_t rows = std::min(kGatherRows, n - start);
    std::vector<float> buffer(static_cast<size_t>(rows) * head_dim);
    gather(h, head_rows[h].data() + start, rows, buffer.data());
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
  }

  for (int32_t g = 0; g < group_count; ++g)
    report.iterations = std::max(report.iterations, iterations[g]);

  pool.parallel_for(group_count, [&](int64_t g) { final_repair(groups[g], n, k, dim); });
  return report;
}

void encode_tokens(const PqCodebook& codebook, int32_t head_dim, int64_t first, int64_t count,
                   const KeyGather& gather, ThreadPool* pool, uint8_t* const* codes) {
  const int32_t heads = codebook.heads;
  const int32_t m = codebook.subspaces;
  const int32_t k = codebook.centroids;
  const int32_t dim = codebook.sub_dim;
  if (heads < 1 || m < 1 || dim < 1 || k < 1 || k > 256 || head_dim != m * dim ||
      codebook.data.size() != static_cast<size_t>(heads) * m * k * dim)
    fail(PQ_ERR_INVALID_ARGUMENT, "encode_tokens: codebook does not match head_dim " +
                                      std::to_string(head_dim));
  if (first < 0 || count < 0) fail(PQ_ERR_INVALID_ARGUMENT, "encode_tokens: negative range");
  if (count == 0) return;
  if (!gather || codes == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "encode_tokens: null gather or codes");

  std::vector<PreparedCentroids> prepared(static_cast<size_t>(heads) * m);
  for (int32_t h = 0; h < heads; ++h)
    for (int32_t j = 0; j < m; ++j)
      prepare_centroids(codebook.at(h, j), k, dim, &prepared[static_cast<size_t>(h) * m + j]);

  const int64_t chunks = (count + kGatherRows - 1) / kGatherRows;
  auto encode_chunk = [&](int64_t task) {
    const int32_t h = static_cast<int32_t>(task / chunks);
    const int64_t start = (task % chunks) * kGatherRows;
    const int64_t rows = std::min(kGatherRows, count - start);
    std::vector<int64_t> row_ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) row_ids[r] = first + start + r;
    std::vector<float> buffer(static_cast<size_t>(rows) * head_dim);
    gather(h, row_ids.data(), rows, buffer.data());
    std::vector<float> scores(static_cast<size_t>(kScoreBlock) *
                              prepared[static_cast<size_t>(h) * m].padded);
    for (int32_t j = 0; j < m; ++j) {
      assign_points(prepared[static_cast<size_t>(h) * m + j],
                    buffer.data() + static_cast<size_t>(j) * dim, rows, head_dim, nullptr,
                    codes[h] + start * m + j, m, nullptr, scores.data());
    }
  };
  const int64_t tasks = static_cast<int64_t>(heads) * chunks;
  if (pool != nullptr) {
    pool->parallel_for(tasks, encode_chunk);
  } else {
    for (int64_t task = 0; task < tasks; ++task) encode_chunk(task);
  }
}

}  // namespace pq
