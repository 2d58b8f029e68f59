// AVX-512 builds of the nearest-centroid kernels (nearest_centroid.cpp
// chooses them at cpu_level() == kAvx512; the AVX2 and portable builds stay
// there). x86-64 GCC/clang only (PQ_X86_KERNELS).
#pragma once

#include <cstdint>

#include "base/cpu_dispatch.h"
#include "pq/nearest_centroid.h"

namespace pq {

#if PQ_X86_KERNELS
// score_against_centroids at 16 lanes: tiles of 4 points x up to 64
// centroids. Each score is the same FMA chain (over the dimensions in order,
// then norm - 2 acc) as the AVX2 build, so the scores agree bit for bit.
void score_block_avx512(const float* points, int64_t count, int64_t stride,
                        const PreparedCentroids& pc, float* scores);

// assign_points with the minimum and the candidate test as 16-lane masks;
// the exact re-check is squared_distance (the same values as every level),
// so codes and distances are those of the AVX2 and portable builds.
double assign_points_avx512(const PreparedCentroids& pc, const float* points, int64_t count,
                            int64_t stride, const float* point_norms, uint8_t* codes,
                            int64_t code_stride, float* distances, float* scores);
#endif

}  // namespace pq
