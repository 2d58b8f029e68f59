// The fetch kernel of the plug-in ABI: gathers `rows` rows of row_bytes each,
// row i from srcs[i] to dsts[i], in one launch. A source may be device
// memory or mapped pinned host memory (read across PCIe by the kernel
// itself, UVA), so selected K/V rows scattered in the host store reach the
// device without one cudaMemcpyAsync per row (copy_rows in memory.cu does
// that; it is the baseline this kernel is measured against).
//
// Layout of the work: a row is cut into 16-byte chunks (the last one may be
// shorter) and one thread copies one chunk, with a grid-stride loop over all
// (row, chunk) pairs, so a 256-byte row keeps 16 threads and as many loads
// in flight. A chunk whose source and destination are both 16-byte aligned
// and that is a full 16 bytes moves as one uint4; otherwise 4-byte words when
// both addresses and the length allow it, else single bytes. Chunk offsets
// are multiples of 16, so a row with aligned pointers keeps every full chunk
// on the vector path whatever row_bytes is.
#include <cstdint>

#include "kernels.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = 16;
// A grid this large covers any realistic fetch with one chunk per thread;
// the grid-stride loop takes the rest.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const void* const* srcs, void* const* dsts, int64_t chunks,
                       int64_t chunks_per_row, int64_t row_bytes) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += step) {
    const int64_t row = c / chunks_per_row;
    const int64_t offset = (c - row * chunks_per_row) * kChunkBytes;
    const int64_t remaining = row_bytes - offset;
    const int bytes = static_cast<int>(remaining < kChunkBytes ? remaining : kChunkBytes);
    const char* src = static_cast<const char*>(srcs[row]) + offset;
    char* dst = static_cast<char*>(dsts[row]) + offset;
    const uintptr_t addresses = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
    if (bytes == kChunkBytes && addresses % 16 == 0) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else if ((addresses | static_cast<uintptr_t>(bytes)) % 4 == 0) {
      for (int i = 0; i < bytes; i += 4)
        *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(src + i);
    } else {
      for (int i = 0; i < bytes; ++i) dst[i] = src[i];
    }
  }
}

}  // namespace

int gather_rows(const void* const* d_srcs, void* const* d_dsts, int64_t rows, size_t row_bytes,
                void* stream, char* err, size_t err_len) {
  if (rows < 0)
    return set_error(err, err_len, "gather_rows: rows is %lld; expected >= 0",
                     static_cast<long long>(rows));
  if (row_bytes > static_cast<size_t>(INT64_MAX) - kChunkBytes)
    return set_error(err, err_len, "gather_rows: row_bytes %zu is too large", row_bytes);
  if (rows == 0 || row_bytes == 0) return 0;
  const int64_t chunks_per_row = (static_cast<int64_t>(row_bytes) + kChunkBytes - 1) / kChunkBytes;
  // Half of int64 leaves room for the grid-stride index to step past the end.
  if (rows > INT64_MAX / 2 / chunks_per_row)
    return set_error(err, err_len, "gather_rows: %lld rows of %zu bytes overflow int64",
                     static_cast<long long>(rows), row_bytes);
  if (d_srcs == nullptr || d_dsts == nullptr)
    return set_error(err, err_len, "gather_rows: d_srcs %p or d_dsts %p is NULL for %lld rows",
                     static_cast<const void*>(d_srcs), static_cast<const void*>(d_dsts),
                     static_cast<long long>(rows));
  const int64_t chunks = rows * chunks_per_row;
  int64_t blocks = (chunks + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  gather_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                       static_cast<cudaStream_t>(stream)>>>(d_srcs, d_dsts, chunks,
                                                            chunks_per_row,
                                                            static_cast<int64_t>(row_bytes));
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "gather_rows: launch", s);
}

}  // namespace pqcuda
