// PQ scoring on the GPU (paper section 3.4): for every kv head of a layer,
// the raw score of query head g for token t is sum_j LUT[g][j][code[t][j]],
// and the group's raw scores are combined into one score per token exactly
// as the CPU's combine_group_scores (src/base/topk.cpp) does.
//
// Layout of the work: grid (blocks_per_head, rows), 256 threads; a row is
// one kv head of one sequence (pq_scan: the kv heads of one layer, laid out
// uniformly; pq_scan_rows: a table of rows, e.g. every sequence of a batch,
// each with its own LUT, codes and token range). A block
// copies the LUT of its row into shared memory once, then walks "slots"
// of 16 bytes of codes (16/m tokens; m = 2 gives 8 tokens per uint4 load)
// with a grid-stride loop, so the LUT copy is amortised over several slots
// per thread. Slots are aligned to 16 bytes of the codes array, so the first
// and last slot of a head may be partial: those are read byte by byte, and
// only tokens inside [begin, end) are ever read or written.
//
// MAX and MEAN need one pass (the group folds in registers). SUM_SOFTMAX
// needs, per (kv head, query head), the max and the sum of exp over the
// middle tokens before the final pass, so it runs three launches of the same
// kernel: (1) per-block max -> workspace, (2) every block reduces the
// per-block maxima of its head, then per-block sums of exp -> workspace,
// (3) every block reduces maxima and sums, then writes the combined score.
// Recomputing the raw scores from the codes (m bytes per token, L2-resident)
// is cheaper than storing them (4 bytes per token and query head), and the
// partial reductions are in a fixed order, so results are deterministic.
//
// Floating point: the operations, their order and their rounding follow the
// CPU code one for one (__fadd_rn / __fmul_rn keep nvcc from contracting
// into FMAs, which the CPU build never uses), so MAX and MEAN are
// bit-identical to the CPU; SUM_SOFTMAX differs only in the order of the
// sum of exp (a block tree here, eight lanes there).
#include <algorithm>
#include <cmath>

#include "pq_scan_kernel.cuh"

namespace pqcuda {

namespace {

template <int M>
int launch(const ScanParams& p, int32_t kv_heads, int32_t bph, cudaStream_t stream, char* err,
           size_t err_len) {
  constexpr int kPad = tokens_per_slot(M) > 1 ? tokens_per_slot(M) + 1 : 1;
  const size_t smem =
      sizeof(float) * (static_cast<size_t>(p.lut_floats) + kThreads * kPad + 2 * p.group);
  if (smem > 48 * 1024) {  // above 48 KB a kernel must opt in to dynamic shared memory
    cudaError_t s = cudaFuncSetAttribute(pq_scan_kernel<M>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (s != cudaSuccess) return cuda_fail(err, err_len, "pq_scan: cudaFuncSetAttribute", s);
  }
  const dim3 grid(static_cast<unsigned>(bph), static_cast<unsigned>(kv_heads));
  const int stages[3] = {kStageMax, kStageSum, kStageFinal};
  const char* names[3] = {"pq_scan softmax max pass", "pq_scan softmax sum pass",
                          "pq_scan final pass"};
  for (int i = p.mode == kModeSoftmax ? 0 : 2; i < 3; ++i) {
    pq_scan_kernel<M><<<grid, kThreads, smem, stream>>>(p, stages[i]);
    cudaError_t s = cudaGetLastError();
    if (s != cudaSuccess) return cuda_fail(err, err_len, names[i], s);
  }
  return 0;
}

// The checks both entry points share; 0 or the error.
int check_shared(const char* fn, int32_t group_size, int32_t subspaces, int32_t centroids,
                 int32_t combine, float scale, char* err, size_t err_len) {
  if (group_size < 1 || group_size > kMaxGroup)
    return set_error(err, err_len, "%s: group_size is %d; expected 1..%d", fn, group_size,
                     kMaxGroup);
  if (subspaces < 1)
    return set_error(err, err_len, "%s: subspaces is %d; expected >= 1", fn, subspaces);
  if (centroids < 1 || centroids > 256 || (centroids & (centroids - 1)) != 0)
    return set_error(err, err_len, "%s: centroids is %d; expected a power of two <= 256", fn,
                     centroids);
  if (combine != PQ_GQA_SUM_SOFTMAX && combine != PQ_GQA_MAX && combine != PQ_GQA_MEAN)
    return set_error(err, err_len, "%s: combine is %d; not a pq_gqa_combine", fn, combine);
  if (!(scale > 0.f) || !std::isfinite(scale))
    return set_error(err, err_len, "%s: scale is %g; expected finite and > 0", fn,
                     static_cast<double>(scale));
  return 0;
}

size_t workspace_size(int32_t rows, int32_t group_size, int32_t subspaces, int64_t n,
                      int32_t combine) {
  if (combine != PQ_GQA_SUM_SOFTMAX || group_size <= 1 || rows <= 0 || subspaces <= 0 || n <= 0)
    return 0;
  return 2 * sizeof(float) * static_cast<size_t>(rows) * static_cast<size_t>(group_size) *
         static_cast<size_t>(blocks_per_head(subspaces, n));
}

// Fills the shared parameters, checks the workspace and launches every pass
// over `rows` rows of at most n tokens.
int run(ScanParams& p, int32_t rows, int64_t n, int32_t group_size, int32_t subspaces,
        int32_t centroids, int32_t combine, float scale, void* d_workspace,
        size_t workspace_bytes, void* stream, const char* fn, char* err, size_t err_len) {
  const size_t need = workspace_size(rows, group_size, subspaces, n, combine);
  if (need > 0 && (d_workspace == nullptr || workspace_bytes < need))
    return set_error(err, err_len, "%s: workspace of %zu bytes at %p; SUM_SOFTMAX needs %zu", fn,
                     workspace_bytes, d_workspace, need);
  p.group = group_size;
  p.m = subspaces;
  p.C = centroids;
  const int64_t mC = static_cast<int64_t>(subspaces) * centroids;
  p.smem_lut = mC <= kLutBudget;
  p.heads_per_chunk = p.smem_lut ? static_cast<int32_t>(std::min<int64_t>(group_size, kLutBudget / mC))
                                 : group_size;
  p.chunks = (group_size + p.heads_per_chunk - 1) / p.heads_per_chunk;
  p.lut_floats = p.smem_lut ? static_cast<int32_t>(p.heads_per_chunk * mC) : 0;
  // A single head's softmax is its logit order (combine_group_scores does the same).
  p.mode = combine == PQ_GQA_MAX ? kModeMax
           : (combine == PQ_GQA_MEAN || group_size == 1) ? kModeMean
                                                         : kModeSoftmax;
  p.scale = scale;
  p.mean_scale = scale / static_cast<float>(group_size);
  const int32_t bph = blocks_per_head(subspaces, n);
  if (p.mode == kModeSoftmax) {
    p.part_max = static_cast<float*>(d_workspace);
    p.part_sum = p.part_max + static_cast<size_t>(rows) * group_size * bph;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (vector_width(subspaces)) {
    case 1: return launch<1>(p, rows, bph, s, err, err_len);
    case 2: return launch<2>(p, rows, bph, s, err, err_len);
    case 4: return launch<4>(p, rows, bph, s, err, err_len);
    case 8: return launch<8>(p, rows, bph, s, err, err_len);
    case 16: return launch<16>(p, rows, bph, s, err, err_len);
    default: return launch<0>(p, rows, bph, s, err, err_len);
  }
}

}  // namespace

size_t pq_scan_workspace_size(int32_t kv_heads, int32_t group_size, int32_t subspaces, int64_t n,
                              int32_t combine) {
  return workspace_size(kv_heads, group_size, subspaces, n, combine);
}

int pq_scan(const float* d_lut, const uint8_t* d_codes, int32_t kv_heads, int32_t group_size,
            int32_t subspaces, int32_t centroids, int64_t codes_stride, int64_t begin, int64_t end,
            int32_t combine, float scale, float* d_scores, void* d_workspace,
            size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  if (kv_heads < 1 || kv_heads > 65535)
    return set_error(err, err_len, "pq_scan: kv_heads is %d; expected 1..65535", kv_heads);
  if (const int rc = check_shared("pq_scan", group_size, subspaces, centroids, combine, scale,
                                  err, err_len))
    return rc;
  if (begin < 0 || end < begin || end > codes_stride)
    return set_error(err, err_len,
                     "pq_scan: token range [%lld, %lld) is not inside [0, codes_stride = %lld)",
                     static_cast<long long>(begin), static_cast<long long>(end),
                     static_cast<long long>(codes_stride));
  if (end - begin > INT32_MAX)
    return set_error(err, err_len, "pq_scan: %lld tokens; at most INT32_MAX",
                     static_cast<long long>(end - begin));
  const int64_t n = end - begin;
  if (n == 0) return 0;
  if (d_lut == nullptr || d_codes == nullptr || d_scores == nullptr)
    return set_error(err, err_len, "pq_scan: d_lut, d_codes and d_scores must not be NULL");
  ScanParams p{};
  p.lut = d_lut;
  p.codes = d_codes;
  p.out = d_scores;
  p.stride = codes_stride;
  p.begin = begin;
  p.n = n;
  return run(p, kv_heads, n, group_size, subspaces, centroids, combine, scale, d_workspace,
             workspace_bytes, stream, "pq_scan", err, err_len);
}

size_t pq_scan_rows_workspace_size(int32_t rows, int32_t group_size, int32_t subspaces,
                                   int64_t max_n, int32_t combine) {
  return workspace_size(rows, group_size, subspaces, max_n, combine);
}

int pq_scan_rows(const pq_scan_row* d_rows, int32_t rows, int64_t max_n, int32_t group_size,
                 int32_t subspaces, int32_t centroids, int32_t combine, float scale,
                 void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                 size_t err_len) {
  if (rows < 0 || rows > 65535)
    return set_error(err, err_len, "pq_scan_rows: rows is %d; expected 0..65535", rows);
  if (max_n < 0 || max_n > INT32_MAX)
    return set_error(err, err_len, "pq_scan_rows: max_n is %lld; expected 0..INT32_MAX",
                     static_cast<long long>(max_n));
  if (const int rc = check_shared("pq_scan_rows", group_size, subspaces, centroids, combine,
                                  scale, err, err_len))
    return rc;
  if (rows == 0 || max_n == 0) return 0;
  if (d_rows == nullptr) return set_error(err, err_len, "pq_scan_rows: d_rows is NULL");
  ScanParams p{};
  p.rows = d_rows;
  return run(p, rows, max_n, group_size, subspaces, centroids, combine, scale, d_workspace,
             workspace_bytes, stream, "pq_scan_rows", err, err_len);
}

}  // namespace pqcuda
