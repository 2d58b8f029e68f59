// Exact re-ranking on the device (config.pq_rerank; plug-in ABI 7): the
// host's PqSelector::rerank for every row (one kv head of one sequence) of
// a selection kept on the device. Three steps, no host wait:
//
//   scores  grid (rows), 256 threads: raw[g][i] = q_g . key(candidate i),
//           the keys read from the store's chunks (mapped pinned memory,
//           across PCIe) as the fetch's gather reads them; then the group
//           combined over the row's candidates as combine_group_scores does
//           it; the row's top-k table entry written for the next step.
//   top-k   topk_rows (topk.cu) over those tables: the best k indices,
//           ties to the larger index (the larger position: candidates are
//           ascending), written ascending.
//   pick    out[i] = candidates[index i]: ascending positions.
//
// Floating point: the dot products, the combine and SUM_SOFTMAX's sums
// follow the CPU code operation for operation (cpu_float.cuh; the sum of
// exp in the CPU's eight lanes, eight threads each summing one lane in
// order), so the scores, and the selection, are the host's bit for bit.
// The candidate rows are few ((1 + r) * k per kv head), so one block per
// row keeps every reduction in one fixed order.
#include <cub/block/block_reduce.cuh>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_plugin_abi.h"
#include "cpu_float.cuh"
#include "kernels.h"
#include "pqcache.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 8;  // the CPU's lanes (src/base/topk.cpp)

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Byte offsets of the workspace: raw [rows][group][max_count], exp terms,
// combined scores and the top-k's indices [rows][max_count], the top-k row
// tables [rows], then topk_rows' own workspace.
struct Layout {
  size_t raw = 0, tmp, scores, index, table, topk, bytes;
  Layout(int32_t rows, int64_t max_count, int32_t group) {
    const size_t per_row = static_cast<size_t>(rows) * static_cast<size_t>(max_count);
    tmp = aligned(raw + per_row * static_cast<size_t>(group) * sizeof(float));
    scores = aligned(tmp + per_row * sizeof(float));
    index = aligned(scores + per_row * sizeof(float));
    table = aligned(index + per_row * sizeof(int32_t));
    topk = aligned(table + static_cast<size_t>(rows) * sizeof(pq_topk_row));
    bytes = topk + topk_rows_workspace_size(rows, max_count);
  }
};

struct Params {
  const pq_rerank_row* rows;  // a DEVICE table, or null: uniform rows from row0
  pq_rerank_row row0;
  pq_rerank_shape shape;
  float* raw;
  float* tmp;
  float* scores;
  int32_t* index;
  pq_topk_row* table;
};

__device__ pq_rerank_row row_of(const Params& p, int32_t r) {
  if (p.rows != nullptr) return p.rows[r];
  pq_rerank_row x = p.row0;
  x.query = static_cast<const uint8_t*>(x.query) +
            static_cast<int64_t>(r) * p.shape.group_size * p.shape.query_head_stride;
  x.candidates += static_cast<int64_t>(r) * x.count;
  x.out += static_cast<int64_t>(r) * x.k;
  x.head += r;
  return x;
}

__device__ bool row_valid(const pq_rerank_row& x, int64_t max_count) {
  return x.k >= 1 && x.k <= x.count && x.count <= max_count && x.candidates != nullptr &&
         x.out != nullptr && x.key_chunks != nullptr && x.query != nullptr;
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__global__ void __launch_bounds__(kThreads) scores_kernel(Params p) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage reduce_tmp;
  __shared__ float lane_sum[kLanes];
  __shared__ float stat;  // max logit, then 1 / sum of exp
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  const int tid = threadIdx.x;
  const pq_rerank_shape& s = p.shape;
  const pq_rerank_row x = row_of(p, r);
  const int64_t C = s.max_count;
  float* scores = p.scores + r * C;
  const bool valid = row_valid(x, C);
  const int64_t n = valid ? x.count : 0;
  if (tid == 0) p.table[r] = {scores, p.index + r * C, n, valid ? x.k : 0, 0};
  if (!valid) return;
  const int32_t G = s.group_size, D = s.head_dim;
  const int64_t qes = s.query_dtype == PQ_DTYPE_F32 ? 4 : 2;
  const int64_t kes = s.key_dtype == PQ_DTYPE_F32 ? 4 : 2;
  float* raw = p.raw + r * C * G;  // [g][n], as the host's
  for (int64_t i = tid; i < n; i += kThreads) {
    const int64_t pos = x.candidates[i];
    const uint8_t* key = x.key_chunks[pos / s.chunk_tokens] +
                         (static_cast<int64_t>(x.head) * s.chunk_tokens + pos % s.chunk_tokens) *
                             D * kes;
    for (int32_t g = 0; g < G; ++g) {
      const uint8_t* q = static_cast<const uint8_t*>(x.query) + g * s.query_head_stride;
      raw[g * n + i] = cpu_dot([&](int32_t d) { return load_element(q + d * qes, s.query_dtype); },
                               [&](int32_t d) { return load_element(key + d * kes, s.key_dtype); },
                               D);
    }
  }
  __syncthreads();
  if (s.combine == PQ_GQA_SUM_SOFTMAX && G > 1) {
    // CPU: out = 0; per query head, out += exp(raw * scale - max_logit) / sum.
    float* tmp = p.tmp + r * C;
    for (int64_t i = tid; i < n; i += kThreads) scores[i] = 0.f;
    const int64_t whole = n - n % kLanes;
    for (int32_t g = 0; g < G; ++g) {
      const float* v = raw + g * n;
      float m = -INFINITY;  // as std::max: NaN ignored; a zero's sign never reaches exp
      for (int64_t i = tid; i < n; i += kThreads) m = fmaxf(m, v[i]);
      m = Reduce(reduce_tmp).Reduce(m, MaxOp());
      if (tid == 0) stat = __fmul_rn(m, s.scale);  // CPU: max_raw * scale
      __syncthreads();
      const float max_logit = stat;
      for (int64_t i = tid; i < n; i += kThreads)
        tmp[i] = exp_nonpositive(__fsub_rn(__fmul_rn(v[i], s.scale), max_logit));
      __syncthreads();
      if (tid < kLanes) {  // lane l: tmp[l], tmp[l + 8], ... in order
        float l = 0.f;
        for (int64_t i = tid; i < whole; i += kLanes) l = __fadd_rn(l, tmp[i]);
        lane_sum[tid] = l;
      }
      __syncthreads();
      if (tid == 0) {
        float sum = 0.f;
        for (int l = 0; l < kLanes; ++l) sum = __fadd_rn(sum, lane_sum[l]);
        for (int64_t i = whole; i < n; ++i) sum = __fadd_rn(sum, tmp[i]);
        stat = __fdiv_rn(1.0f, sum);
      }
      __syncthreads();
      const float inv = stat;
      for (int64_t i = tid; i < n; i += kThreads)
        scores[i] = __fadd_rn(scores[i], __fmul_rn(tmp[i], inv));
      __syncthreads();  // tmp, stat and reduce_tmp are the next head's
    }
  } else if (s.combine == PQ_GQA_MAX) {
    // CPU: out = raw * scale; out = std::max(out, r * scale).
    for (int64_t i = tid; i < n; i += kThreads) {
      float o = __fmul_rn(raw[i], s.scale);
      for (int32_t g = 1; g < G; ++g) {
        const float v = __fmul_rn(raw[g * n + i], s.scale);
        o = o < v ? v : o;
      }
      scores[i] = o;
    }
  } else {
    // MEAN, and SUM_SOFTMAX of one head: out = raw; out += r; out *= scale / group.
    const float mean_scale = __fdiv_rn(s.scale, static_cast<float>(G));
    for (int64_t i = tid; i < n; i += kThreads) {
      float o = raw[i];
      for (int32_t g = 1; g < G; ++g) o = __fadd_rn(o, raw[g * n + i]);
      scores[i] = __fmul_rn(o, mean_scale);
    }
  }
}

// The best k indices of each row as its positions (grid: (blocks, rows)).
__global__ void __launch_bounds__(kThreads) pick_kernel(Params p) {
  const int32_t r = static_cast<int32_t>(blockIdx.y);
  const pq_rerank_row x = row_of(p, r);
  if (!row_valid(x, p.shape.max_count)) return;
  const int32_t* index = p.index + r * p.shape.max_count;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < x.k;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    x.out[i] = x.candidates[index[i]];
}

int launch(Params p, int32_t rows, void* d_workspace, size_t workspace_bytes, cudaStream_t stream,
           const char* name, char* err, size_t err_len) {
  const pq_rerank_shape& s = p.shape;
  if (rows < 0 || rows > 65535)
    return set_error(err, err_len, "%s: rows is %d; expected 0..65535", name, rows);
  const bool dtypes = (s.query_dtype == PQ_DTYPE_F32 || s.query_dtype == PQ_DTYPE_F16 ||
                       s.query_dtype == PQ_DTYPE_BF16) &&
                      (s.key_dtype == PQ_DTYPE_F32 || s.key_dtype == PQ_DTYPE_F16 ||
                       s.key_dtype == PQ_DTYPE_BF16);
  if (s.group_size < 1 || s.head_dim < 1 || !dtypes || s.combine < PQ_GQA_SUM_SOFTMAX ||
      s.combine > PQ_GQA_MEAN || s.query_head_stride < 0 || s.chunk_tokens < 1 ||
      s.max_count < 0 || s.max_count > INT32_MAX)
    return set_error(err, err_len,
                     "%s: group_size %d, head_dim %d, dtypes %d/%d, combine %d, chunk_tokens "
                     "%lld, max_count %lld: not a re-ranking shape",
                     name, s.group_size, s.head_dim, s.query_dtype, s.key_dtype, s.combine,
                     static_cast<long long>(s.chunk_tokens), static_cast<long long>(s.max_count));
  if (rows == 0 || s.max_count == 0) return 0;
  const Layout at(rows, s.max_count, s.group_size);
  if (d_workspace == nullptr || workspace_bytes < at.bytes)
    return set_error(err, err_len, "%s: workspace of %zu bytes at %p; needs %zu", name,
                     workspace_bytes, d_workspace, at.bytes);
  auto* ws = static_cast<uint8_t*>(d_workspace);
  p.raw = reinterpret_cast<float*>(ws + at.raw);
  p.tmp = reinterpret_cast<float*>(ws + at.tmp);
  p.scores = reinterpret_cast<float*>(ws + at.scores);
  p.index = reinterpret_cast<int32_t*>(ws + at.index);
  p.table = reinterpret_cast<pq_topk_row*>(ws + at.table);
  scores_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_fail(err, err_len, name, e);
  if (topk_rows(p.table, rows, s.max_count, ws + at.topk, at.bytes - at.topk, stream, err,
                err_len) != 0)
    return 1;
  int64_t blocks = (s.max_count + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks);
  pick_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)), kThreads, 0,
                stream>>>(p);
  e = cudaGetLastError();
  return e == cudaSuccess ? 0 : cuda_fail(err, err_len, name, e);
}

}  // namespace

size_t pq_rerank_workspace_size(int32_t rows, int64_t max_count, int32_t group_size) {
  if (rows <= 0 || max_count <= 0 || group_size < 1) return 0;
  return Layout(rows, max_count, group_size).bytes;
}

int pq_rerank(const pq_rerank_row* row, int32_t rows, const pq_rerank_shape* shape,
              void* d_workspace, size_t workspace_bytes, void* stream, char* err,
              size_t err_len) {
  if (row == nullptr || shape == nullptr)
    return set_error(err, err_len, "pq_rerank: row and shape must not be NULL");
  Params p{};
  p.row0 = *row;
  p.shape = *shape;
  return launch(p, rows, d_workspace, workspace_bytes, static_cast<cudaStream_t>(stream),
                "pq_rerank", err, err_len);
}

int pq_rerank_rows(const pq_rerank_row* d_rows, int32_t rows, const pq_rerank_shape* shape,
                   void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                   size_t err_len) {
  if (shape == nullptr) return set_error(err, err_len, "pq_rerank_rows: shape is NULL");
  if (rows > 0 && d_rows == nullptr)
    return set_error(err, err_len, "pq_rerank_rows: d_rows is NULL");
  Params p{};
  p.rows = d_rows;
  p.shape = *shape;
  return launch(p, rows, d_workspace, workspace_bytes, static_cast<cudaStream_t>(stream),
                "pq_rerank_rows", err, err_len);
}

}  // namespace pqcuda
