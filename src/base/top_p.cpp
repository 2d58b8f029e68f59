#include "base/top_p.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/topk.h"

namespace pq {

namespace {

// One of the k: first its score's order key above its position, so that
// one integer orders by score and then by position (ties to the larger, as
// select_top_k) and no two are equal; second its mass.
using Ranked = std::pair<uint64_t, double>;
uint64_t order_of(float score, int32_t position) {
  return (uint64_t{ordered_score_key(score)} << 32) | static_cast<uint32_t>(position);
}

// The n's mass in the units of each token's mass (below): the sum of the
// scores' masses, so that rounding in the scores cannot leave p unreached.
// Four sums: one would wait on each addition.
double total_mass(const float* scores, int64_t n, ScoreMass kind, double* top) {
  *top = kind == ScoreMass::kLogits ? static_cast<double>(*std::max_element(scores, scores + n))
                                    : 0.0;
  double sum[4] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t i = 0; i < n; ++i) {
    const double s = scores[i];
    sum[i % 4] += kind == ScoreMass::kLogits ? std::exp(s - *top) : s;
  }
  return (sum[0] + sum[1]) + (sum[2] + sum[3]);
}

// Buckets of the order keys' top bits: a radix pass finds the bucket where
// the running mass (or count), from the highest down, crosses its goal, and
// only that bucket is sorted. Two passes over the k, where a sort of them
// cost more than the scan at 128K.
constexpr int kBucketBits = 12;
size_t bucket_of(uint64_t order) { return static_cast<size_t>(order >> (64 - kBucketBits)); }

// The order key of the c-th highest item and c: for the fewest c whose mass
// reaches goal (by_mass; all k if rounding leaves it unreached), or c =
// count (not by_mass). counts and masses are the items' bucket histograms.
std::pair<uint64_t, int64_t> cut(const std::vector<Ranked>& items,
                                 const std::vector<uint32_t>& counts,
                                 const std::vector<double>& masses, bool by_mass, double goal,
                                 int64_t count, std::vector<Ranked>& crossing) {
  double held = 0.0;
  int64_t taken = 0;
  size_t b = counts.size();
  while (b-- > 0) {
    if (counts[b] > 0 && (by_mass ? held + masses[b] >= goal : taken + counts[b] >= count))
      break;
    held += masses[b];
    taken += counts[b];
  }
  if (b == static_cast<size_t>(-1)) {  // unreached: every item, cut at the lowest
    uint64_t lowest = ~uint64_t{0};
    for (const Ranked& r : items) lowest = std::min(lowest, r.first);
    return {lowest, static_cast<int64_t>(items.size())};
  }
  crossing.clear();
  for (const Ranked& r : items)
    if (bucket_of(r.first) == b) crossing.push_back(r);
  std::sort(crossing.begin(), crossing.end(),
            [](const Ranked& x, const Ranked& y) { return x.first > y.first; });
  for (const Ranked& r : crossing) {
    held += r.second;
    ++taken;
    if (by_mass ? held >= goal : taken >= count) return {r.first, taken};
  }
  return {crossing.back().first, taken};  // rounding inside the bucket: all of it
}

}  // namespace

int64_t select_top_p(const float* scores, int64_t n, int64_t k, int64_t first, ScoreMass kind,
                     double p, int64_t floor, int32_t* out, SelectScratch& scratch) {
  select_top_k(scores, n, k, first, out, scratch);
  if (k == 0 || p >= 1.0) return k;
  double top = 0.0;
  const double goal = p * total_mass(scores, n, kind, &top);
  std::vector<Ranked>& items = scratch.ranked;
  items.resize(static_cast<size_t>(k));
  std::vector<uint32_t>& counts = scratch.histogram;  // select_top_k's, free again
  std::vector<double>& masses = scratch.bucket_mass;
  counts.assign(size_t{1} << kBucketBits, 0);
  masses.assign(size_t{1} << kBucketBits, 0.0);
  for (int64_t i = 0; i < k; ++i) {
    const float s = scores[out[i] - first];
    const Ranked r{order_of(s, out[i]), kind == ScoreMass::kLogits
                                            ? std::exp(static_cast<double>(s) - top)
                                            : static_cast<double>(s)};
    items[static_cast<size_t>(i)] = r;
    ++counts[bucket_of(r.first)];
    masses[bucket_of(r.first)] += r.second;
  }
  std::pair<uint64_t, int64_t> at = cut(items, counts, masses, true, goal, 0, scratch.crossing);
  if (at.second < std::min(floor, k))  // the floor's highest instead
    at = cut(items, counts, masses, false, 0.0, std::min(floor, k), scratch.crossing);
  // Order keys are distinct: out, ascending from select_top_k (items[i] is
  // out[i]'s), keeps the positions at or above the cut, in order.
  int64_t w = 0;
  for (int64_t i = 0; i < k; ++i)
    if (items[static_cast<size_t>(i)].first >= at.first) out[w++] = out[i];
  return w;
}

}  // namespace pq
