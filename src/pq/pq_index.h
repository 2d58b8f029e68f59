// The PQ index of one (sequence, layer): centroids and per-token codes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "store/code_column.h"
#include "pq/codebook.h"
#include "pq/outliers.h"

namespace pq {

struct PqIndex {
  // Immutable once built: a fork shares it.
  std::shared_ptr<const PqCodebook> codebook;
  // codes[head]: token-major, subspaces bytes per token, for tokens
  // [0, coded_tokens); a fork shares the runs of its prefix (code_column.h).
  std::vector<CodeColumn> codes;
  int64_t coded_tokens = 0;
  // Tokens the codebook was built over (the build's snapshot; a restored
  // index: its coded tokens). Tokens past it were coded with a codebook
  // that never saw them: pq_rebuild_share compares the two.
  int64_t built_tokens = 0;
  // tuple_counts[head][t]: how many of tokens [0, coded_tokens) have the
  // code tuple t; kept for small tuple spaces only (pq_tuple_select.h).
  std::vector<std::vector<uint32_t>> tuple_counts;
  // outliers[head] (config.pq_outliers > 0): the kv head's threshold and
  // outlier positions; empty until found (outliers.h: a build finds them, a
  // restored index at its first coding).
  std::vector<OutlierList> outliers;
  int32_t iterations = 0;      // K-Means iterations the build ran
  int32_t budget = 0;          // iteration budget it was given
  int64_t training_points = 0;
  double seconds = 0.0;        // build wall time

  // Everything the index uses, shared parts included (as pq_stats counts
  // a fork's shared K/V chunks in each sequence).
  uint64_t bytes() const {
    uint64_t b = codebook ? codebook->data.size() * sizeof(float) + codebook->layouts.bytes() : 0;
    for (const auto& c : codes) b += c.own_bytes() + c.shared_bytes();
    for (const auto& t : tuple_counts) b += t.capacity() * sizeof(uint32_t);
    for (const auto& o : outliers) b += o.positions.capacity() * sizeof(int32_t);
    return b;
  }

  // A copy for a fork: the codebook and the codes' prefix shared, the tuple
  // counts (at most 16 KiB per kv head) and the outlier lists copied.
  PqIndex fork() {
    PqIndex copy;
    copy.codebook = codebook;
    copy.codes.reserve(codes.size());
    for (auto& c : codes) copy.codes.push_back(c.fork());
    copy.coded_tokens = coded_tokens;
    copy.built_tokens = built_tokens;
    copy.tuple_counts = tuple_counts;
    copy.outliers = outliers;
    copy.iterations = iterations;
    copy.budget = budget;
    copy.training_points = training_points;
    copy.seconds = seconds;
    return copy;
  }
};

}  // namespace pq
