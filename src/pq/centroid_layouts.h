// A codebook's centroids laid out for the kernels (PreparedCentroids,
// nearest_centroid.h): one set per kv head and subspace, made on first use
// and then kept for the codebook's life. Every select's lookup table and
// every appended token's codes read them; laying them out again in each
// call cost about 0.1 ms of a decode step's select at 8 kv heads, 4 x 8
// bits (docs/perf.md, "The decode step's fixed costs").
//
// Made once, under std::call_once, so concurrent first users wait for one
// maker. A copy of the holder starts empty: a copied codebook lays out its
// own centroids, never points into another's. The centroids must not
// change once laid out (a codebook is trained or restored, then shared as
// const); whoever rewrites them assigns a fresh holder first.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pq/nearest_centroid.h"

namespace pq {

class CentroidLayouts {
 public:
  CentroidLayouts() : state_(std::make_unique<State>()) {}
  CentroidLayouts(const CentroidLayouts&) : CentroidLayouts() {}
  CentroidLayouts& operator=(const CentroidLayouts&) {
    state_ = std::make_unique<State>();
    return *this;
  }

  // The sets `make` returns, made on the first call (a throw leaves none,
  // and the next call tries again).
  template <typename Make>
  const std::vector<PreparedCentroids>& get(Make&& make) const {
    std::call_once(state_->once, [&] {
      state_->sets = make();
      uint64_t bytes = 0;
      for (const PreparedCentroids& p : state_->sets)
        bytes += (p.transposed.capacity() + p.norms.capacity()) * sizeof(float);
      state_->bytes.store(bytes);
    });
    return state_->sets;
  }

  // The bytes the laid-out sets hold; 0 until made.
  uint64_t bytes() const { return state_->bytes.load(); }

  // Upper bound of bytes() for `sets` sets of `centroids` centroids of
  // `dim` floats (the memory limit counts it before any set is made).
  static uint64_t bytes_for(uint64_t sets, int64_t centroids, int64_t dim) {
    return sets * static_cast<uint64_t>(padded_centroids(centroids)) *
           static_cast<uint64_t>(dim + 1) * sizeof(float);
  }

 private:
  struct State {
    std::once_flag once;
    std::vector<PreparedCentroids> sets;
    std::atomic<uint64_t> bytes{0};
  };
  std::unique_ptr<State> state_;
};

}  // namespace pq
