// The CUDA backend (cuda_backend.h): construction, copies between host and
// device memory on the sequence's stream, the per-stream working buffers.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "base/dtype.h"
#include "base/error.h"

namespace pq {
namespace cuda_detail {

CudaBackend::CudaBackend(const pq_cuda_plugin* plugin, int32_t device)
    : k_(plugin),
      device_(device),
      fences_(plugin),
      recycler_(plugin, &fences_),
      pinned_store_(
          [this](size_t bytes) -> void* {
            char err[512] = {0};
            void* p = nullptr;
            if (k_->set_device(device_, err, sizeof err) != 0 ||
                k_->host_alloc(&p, bytes, err, sizeof err) != 0)
              return nullptr;
            return p;
          },
          [this](void* p, size_t) {
            char err[512] = {0};
            k_->host_free(p, err, sizeof err);
          },
          "the CUDA backend's page-locked K/V pool (cudaHostAlloc)") {
  pinned_store_.set_fence(&fences_);
}

CudaBackend::Touch::~Touch() {
  try {
    b_.fences_.after_access(stream_);
  } catch (...) {
    // No event to fence with: the release that follows finds the stream's
    // previous fence, and the work of this call is ordered after it.
  }
}

void CudaBackend::grow(void*& ptr, size_t& bytes, size_t want, const char* what) const {
  recycler_.grow(&ptr, &bytes, want, false, what);
}

bool CudaBackend::reserve_store(size_t block_bytes, size_t blocks) const {
  return pinned_store_.reserve(block_bytes, blocks);
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes, int32_t src_memory,
                  void* stream) {
  if (src_memory == PQ_MEMORY_HOST) {
    std::memcpy(dst, src, bytes);
    return;
  }
  stream_copy(dst, src, bytes, src, stream);
}

void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes, int32_t dst_memory,
                    void* stream) {
  if (dst_memory == PQ_MEMORY_HOST) {
    std::memcpy(dst, src, bytes);
    return;
  }
  stream_copy(dst, src, bytes, dst, stream);
}

void CudaBackend::read_to_host(const std::vector<HostRead>& reads, void* stream) {
  size_t total = 0;
  for (const HostRead& r : reads) {
    if (!k_->is_device_pointer(r.src))
      fail(PQ_ERR_INVALID_ARGUMENT,
           "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device "
           "memory");
    total += r.bytes;
  }
  if (total == 0) return;
  use_device();
  char err[512] = {0};
  StreamScratch& scratch = scratch_for(stream);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, stream);
  uint8_t* pinned = scratch.reads.acquire(total);
  size_t at = 0;
  for (const HostRead& r : reads) {
    check(k_->copy_async(pinned + at, r.src, r.bytes, stream, err, sizeof err), "device read",
          err);
    at += r.bytes;
  }
  check(k_->stream_synchronize(stream, err, sizeof err), "device reads", err);
  at = 0;
  for (const HostRead& r : reads) {
    std::memcpy(r.host_dst, pinned + at, r.bytes);
    at += r.bytes;
  }
}


std::unique_ptr<HostCopy> CudaBackend::copy_to_host_async(const void* src, size_t bytes,
                                             void* stream) const {
  if (!k_->is_device_pointer(src))
    fail(PQ_ERR_INVALID_ARGUMENT,
         "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device memory");
  use_device();
  auto copy = std::make_unique<CudaHostCopy>(k_, bytes);
  copy->start(src, bytes, stream);
  return copy;
}

std::unique_ptr<DeviceLayer> CudaBackend::make_device_layer(const pq_config& c) const {
  return std::make_unique<CudaLayer>(k_, c, &recycler_);
}

void CudaBackend::require_device_memory(const void* p, const char* name) const {
  if (!k_->is_device_pointer(p))
    fail(PQ_ERR_UNSUPPORTED, std::string(name) + " is not memory CUDA knows as device memory "
                                                 "(a decode step on the device reads and "
                                                 "writes device arrays only)");
}

bool CudaBackend::device_reads(const KvStore& store) const {
  return store.allocator().user == pinned_store_.allocator().user;
}

void CudaBackend::use_device() const {
  char err[512] = {0};
  check(k_->set_device(device_, err, sizeof err), "cudaSetDevice", err);
}

StreamScratch& CudaBackend::scratch_for(void* stream) const {
  std::lock_guard<std::mutex> lock(scratch_mutex_);
  std::unique_ptr<StreamScratch>& slot = scratch_[stream];
  if (!slot) slot = std::make_unique<StreamScratch>(k_, &recycler_);
  return *slot;
}

void CudaBackend::stream_copy(void* dst, const void* src, size_t bytes, const void* device_side,
                 void* stream) {
  char err[512] = {0};
  if (!k_->is_device_pointer(device_side))
    fail(PQ_ERR_INVALID_ARGUMENT,
         "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device memory");
  use_device();
  check(k_->copy_async(dst, src, bytes, stream, err, sizeof err), "device copy", err);
}

}  // namespace cuda_detail

std::unique_ptr<Backend> make_cuda_backend(const pq_cuda_plugin* plugin, int32_t device) {
  return std::make_unique<cuda_detail::CudaBackend>(plugin, device);
}

}  // namespace pq
