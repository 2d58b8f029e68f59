// PQ encoding on the GPU (the plug-in ABI, src/backend/cuda/cuda_plugin_abi.h): the code of token t in subspace j
// is the index of the centroid nearest to the sub-vector
// keys[t][j * sub_dim, (j + 1) * sub_dim), exactly as the CPU's
// PqCodebook::encode / nearest_centroid (src/pq/codebook.cpp, src/pq/nearest_centroid.cpp)
// choose it: the argmin of squared_distance(), ties to the lowest index.
//
// Bit-identical codes need bit-identical distances: squared_distance below
// is the CPU's reference function operation for operation (eight lane sums,
// lane l over dimensions l, l + 8, ...; the lanes combined as
// ((0+1)+(2+3))+((4+5)+(6+7)); then the tail in order), with __fsub_rn /
// __fmul_rn / __fadd_rn so that nvcc cannot contract into FMAs, which the CPU
// build never uses. Then every distance compares exactly as on the CPU.
//
// Layout of the work: one warp per (token, subspace). Lane l computes the
// distances to centroids l, l + 32, ... and keeps the smallest (distance,
// index) pair in lexicographic order; a shuffle reduction takes the
// lexicographic minimum over the lanes. That is the CPU's sequential scan
// with strict <: the smallest distance, and among equal distances the lowest
// index. NaN distances never win (as in the CPU's assign_points, whose
// candidate test rejects NaN scores); if every distance is NaN the code is 0,
// as on the CPU. A single decode token still spreads over 32 lanes per
// subspace.
#include <cstdint>

#include "kernels.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int32_t kNoCentroid = INT32_MAX;  // above every index: loses every tie
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the grid-stride loop takes the rest

// The CPU's squared_distance (src/pq/nearest_centroid.cpp), operation for operation.
__device__ float squared_distance(const float* a, const float* b, int32_t dim) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      const float diff = __fsub_rn(a[d + l], b[d + l]);
      lanes[l] = __fadd_rn(lanes[l], __fmul_rn(diff, diff));
    }
  }
  float sum = __fadd_rn(__fadd_rn(__fadd_rn(lanes[0], lanes[1]), __fadd_rn(lanes[2], lanes[3])),
                        __fadd_rn(__fadd_rn(lanes[4], lanes[5]), __fadd_rn(lanes[6], lanes[7])));
  for (; d < dim; ++d) {
    const float diff = __fsub_rn(a[d], b[d]);
    sum = __fadd_rn(sum, __fmul_rn(diff, diff));
  }
  return sum;
}

// (distance, index) lexicographic order; false whenever `distance` is NaN.
__device__ __forceinline__ bool closer(float distance, int32_t index, float best_distance,
                                       int32_t best_index) {
  return distance < best_distance || (distance == best_distance && index < best_index);
}

__global__ void __launch_bounds__(kThreads)
    encode_kernel(const float* keys, int64_t tokens, int64_t key_stride, const float* centroids,
                  int32_t subspaces, int32_t count, int32_t sub_dim, uint8_t* codes,
                  int64_t code_stride) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t work = tokens * subspaces;
  const int64_t warp_step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // w depends on the warp only, so every lane of a warp runs the same
  // iterations and the shuffles below always see the full warp.
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
       w < work; w += warp_step) {
    const int64_t t = w / subspaces;
    const int32_t j = static_cast<int32_t>(w - t * subspaces);
    const float* x = keys + t * key_stride + static_cast<int64_t>(j) * sub_dim;
    const float* table = centroids + static_cast<int64_t>(j) * count * sub_dim;
    float best_distance = __int_as_float(0x7f800000);  // +infinity
    int32_t best_index = kNoCentroid;
    for (int32_t c = lane; c < count; c += kWarpSize) {
      const float distance = squared_distance(x, table + static_cast<int64_t>(c) * sub_dim, sub_dim);
      if (closer(distance, c, best_distance, best_index)) {
        best_distance = distance;
        best_index = c;
      }
    }
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const float other_distance = __shfl_down_sync(0xffffffffu, best_distance, offset);
      const int32_t other_index = __shfl_down_sync(0xffffffffu, best_index, offset);
      if (closer(other_distance, other_index, best_distance, best_index)) {
        best_distance = other_distance;
        best_index = other_index;
      }
    }
    if (lane == 0)
      codes[t * code_stride + j] = static_cast<uint8_t>(best_index == kNoCentroid ? 0 : best_index);
  }
}

}  // namespace

int encode(const float* d_keys, int64_t tokens, int64_t key_stride, const float* d_centroids,
           int32_t subspaces, int32_t centroids, int32_t sub_dim, uint8_t* d_codes,
           int64_t code_stride, void* stream, char* err, size_t err_len) {
  if (tokens < 0)
    return set_error(err, err_len, "encode: tokens is %lld; expected >= 0",
                     static_cast<long long>(tokens));
  if (subspaces < 1)
    return set_error(err, err_len, "encode: subspaces is %d; expected >= 1", subspaces);
  if (centroids < 1 || centroids > 256)
    return set_error(err, err_len, "encode: centroids is %d; expected 1..256", centroids);
  if (sub_dim < 1) return set_error(err, err_len, "encode: sub_dim is %d; expected >= 1", sub_dim);
  const int64_t head_dim = static_cast<int64_t>(subspaces) * sub_dim;
  if (key_stride < head_dim)
    return set_error(err, err_len,
                     "encode: key_stride is %lld floats; a key has subspaces * sub_dim = %lld",
                     static_cast<long long>(key_stride), static_cast<long long>(head_dim));
  if (code_stride < subspaces)
    return set_error(err, err_len, "encode: code_stride is %lld bytes; a token has %d codes",
                     static_cast<long long>(code_stride), subspaces);
  // Half of int64 leaves room for the grid-stride index to step past the end.
  if (tokens > INT64_MAX / 2 / key_stride || tokens > INT64_MAX / 2 / code_stride)
    return set_error(err, err_len, "encode: %lld tokens overflow the strides",
                     static_cast<long long>(tokens));
  if (tokens == 0) return 0;
  if (d_keys == nullptr || d_centroids == nullptr || d_codes == nullptr)
    return set_error(err, err_len, "encode: d_keys, d_centroids and d_codes must not be NULL");

  const int64_t work = tokens * subspaces;  // no overflow: subspaces <= code_stride
  int64_t blocks = (work + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  encode_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      d_keys, tokens, key_stride, d_centroids, subspaces, centroids, sub_dim, d_codes,
      code_stride);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "encode: launch", s);
}

}  // namespace pqcuda
