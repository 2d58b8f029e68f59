// Reusable working memory for selection. A decode step at 128K tokens needs
// megabytes of temporaries per kv head; allocating them per call goes
// through mmap and page faults on every step, so the context keeps a pool.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace pq {

struct SelectScratch {
  std::vector<float> raw;           // group_size x middle raw scores (AdaKV: kv heads x middle)
  std::vector<float> combined;      // middle combined scores
  std::vector<float> exp_tmp;       // middle, softmax numerators; fused scan: its table of exps
  std::vector<float> head_sums;     // fused scan: lanes, largest and 1 / sum per query head
  std::vector<uint32_t> keys;       // top-k: order-preserving keys of the scores
  std::vector<uint8_t> chosen;      // top-k: 1 for selected positions
  std::vector<int32_t> tied;        // top-k: candidates of the threshold bucket
  std::vector<int32_t> next;        // top-k: the next pass's candidates; ClusterKV: cluster order
  std::vector<uint32_t> survivor_keys;  // top-k (AVX-512): keys at or above the sampled threshold
  std::vector<int32_t> survivors;       // top-k (AVX-512): their positions, ascending
  std::vector<float> weighted_scores;   // top-k of weighted rows: the sums, where written
  std::vector<uint32_t> sample_bucket;  // top-k: the sample's keys in one bucket of its histogram
  std::vector<uint32_t> histogram;  // top-k: radix histograms; tuple path: tuple counts
  std::vector<uint32_t> weights;    // tuple path: tokens per present tuple
  std::vector<int32_t> candidates;  // tuple path: threshold candidates; AdaKV, ClusterKV: the kept
  // Tuple path, two subspaces: the classes of the code pairs, zero between
  // calls (pq/pq_tuple_emit.h's PairClassTable).
  std::vector<uint8_t> pair_classes;
  // PQ with pq_outliers: each query head's log normaliser of the code
  // scores, and the outliers' exact logits [group][outliers].
  std::vector<double> log_norms;
  std::vector<float> outlier_logits;
  // config.top_p (base/top_p.h): the k best, each its order key (score,
  // then position) and its mass; the mass of each bucket of keys; the
  // bucket that crosses the goal.
  std::vector<std::pair<uint64_t, double>> ranked;
  std::vector<double> bucket_mass;
  std::vector<std::pair<uint64_t, double>> crossing;
};

class ScratchPool {
 public:
  std::unique_ptr<SelectScratch> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return std::make_unique<SelectScratch>();
    std::unique_ptr<SelectScratch> s = std::move(free_.back());
    free_.pop_back();
    return s;
  }
  void give(std::unique_ptr<SelectScratch> s) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(s));
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<SelectScratch>> free_;
};

// Takes a scratch from the pool for the lifetime of the lease.
class ScratchLease {
 public:
  explicit ScratchLease(ScratchPool& pool) : pool_(pool), scratch_(pool.take()) {}
  ~ScratchLease() { pool_.give(std::move(scratch_)); }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  SelectScratch& operator*() { return *scratch_; }

 private:
  ScratchPool& pool_;
  std::unique_ptr<SelectScratch> scratch_;
};

}  // namespace pq
