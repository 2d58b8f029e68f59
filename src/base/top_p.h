// Top-p budgets (config.top_p): of the k best-scored tokens, the fewest
// whose estimated attention mass reaches a share p of all the tokens'.
#pragma once

#include <cstdint>

#include "base/scratch.h"

namespace pq {

// How combined scores stand for attention mass.
enum class ScoreMass {
  kLogits,     // each score is a logit: the mass is its softmax over the n
  kMassSums,   // each score is a (sum of) softmax mass(es): the mass is its share of the n's sum
};

// Writes the positions (first + i) of the fewest of the k highest scores[i]
// whose masses reach p of the n's mass, at least min(floor, k) of them, into
// out, ascending; returns how many. Taken in order of score (ties: the
// larger position, as select_top_k). p >= 1 takes all k.
int64_t select_top_p(const float* scores, int64_t n, int64_t k, int64_t first, ScoreMass kind,
                     double p, int64_t floor, int32_t* out, SelectScratch& scratch);

}  // namespace pq
