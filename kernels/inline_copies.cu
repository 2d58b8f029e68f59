// inline_copies of the plug-in ABI: the small copies of a decode step (the
// new token's window rows, the codes of the token leaving the window, a new
// chunk's entry in the chunk tables) passed by value as kernel parameters.
// A copy through pinned staging would need the staging fenced (a wait when
// the previous copy has not run) and a plan uploaded first; a pageable
// cudaMemcpyAsync is refused in a CUDA graph capture. One block does it all:
// these are a few KiB at most.
#include <cstdint>

#include "kernels.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr uint64_t kMaxRowBytes = 4096;

__global__ void __launch_bounds__(kThreads) inline_copies_kernel(const pq_inline_copies args) {
  // Rows: 4-byte words where both ends and the length allow it, else bytes.
  const uint64_t rb = args.row_bytes;
  for (int32_t r = 0; r < args.rows; ++r) {
    const char* src = static_cast<const char*>(args.srcs[r]);
    char* dst = static_cast<char*>(args.dsts[r]);
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | rb) & 3) == 0) {
      for (uint64_t i = threadIdx.x * 4; i < rb; i += kThreads * 4)
        *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(src + i);
    } else {
      for (uint64_t i = threadIdx.x; i < rb; i += kThreads) dst[i] = src[i];
    }
  }
  for (int32_t p = 0; p < args.pieces; ++p) {
    char* dst = static_cast<char*>(args.piece_dst[p]);
    const uint8_t* src = args.payload + args.piece_at[p];
    for (uint32_t i = threadIdx.x; i < args.piece_bytes[p]; i += kThreads) dst[i] = src[i];
  }
}

}  // namespace

int inline_copies(const pq_inline_copies* args, void* stream, char* err, size_t err_len) {
  if (args == nullptr) return set_error(err, err_len, "inline_copies: args is NULL");
  if (args->rows < 0 || args->rows > PQ_INLINE_ROWS || args->pieces < 0 ||
      args->pieces > PQ_INLINE_PIECES)
    return set_error(err, err_len, "inline_copies: %d rows and %d pieces; at most %d and %d",
                     args->rows, args->pieces, PQ_INLINE_ROWS, PQ_INLINE_PIECES);
  if (args->rows > 0 && (args->row_bytes == 0 || args->row_bytes > kMaxRowBytes))
    return set_error(err, err_len, "inline_copies: row_bytes is %llu; expected 1..%llu",
                     static_cast<unsigned long long>(args->row_bytes),
                     static_cast<unsigned long long>(kMaxRowBytes));
  for (int32_t p = 0; p < args->pieces; ++p)
    if (uint32_t{args->piece_at[p]} + args->piece_bytes[p] > PQ_INLINE_BYTES ||
        args->piece_dst[p] == nullptr)
      return set_error(err, err_len, "inline_copies: piece %d (%u bytes at %u) is outside the "
                       "%d-byte payload or has no destination", p, args->piece_bytes[p],
                       args->piece_at[p], PQ_INLINE_BYTES);
  if (args->rows == 0 && args->pieces == 0) return 0;
  inline_copies_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*args);
  const cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "inline_copies: launch", s);
}

int stream_capturing(void* stream, char* err, size_t err_len) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t s = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
  if (s != cudaSuccess) {
    cuda_fail(err, err_len, "cudaStreamIsCapturing", s);
    return -1;
  }
  return status == cudaStreamCaptureStatusActive ? 1 : 0;
}

}  // namespace pqcuda
