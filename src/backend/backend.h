// The seam between the backend-agnostic core and a compute backend. The CPU
// backend is always built in; the CUDA backend lives in a plug-in
// (libpqcache_cuda.so) that plugin_loader.cpp opens at run time, so that
// libpqcache.so never links the CUDA libraries.
//
// Backend is what every backend does: say what it is, which memory it can
// read, and copy between the caller's memory and the host. A backend with a
// device of its own opts into the device capabilities, each an interface of
// its own that the core asks for through one query (null: none):
//   DeviceMemory   the device's copy of each layer (device_memory.h)
//   DeviceKernels  a host call's PQ selection and fetch run on the device
//                  (device_kernels.h)
//   DeviceStep     the decode step kept on the device (device_step.h)
// The CUDA backend (cuda/cuda_backend.h) has all three; the CPU backend none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "pqcache.h"

namespace pq {

class DeviceKernels;
class DeviceMemory;
class DeviceStep;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual pq_backend kind() const = 0;
  virtual const char* name() const = 0;

  // Whether tensors in this memory kind can be read and written.
  virtual bool supports_memory(int32_t memory) const = 0;

  // Copies bytes between the caller's memory (host or device, by kind) and
  // host memory, in order on `stream` (the sequence's: device memory the
  // caller's kernels write on it is read after them); the host side is
  // complete when the call returns. Throws pq::Error on failure.
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes, int32_t src_memory,
                            void* stream) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes, int32_t dst_memory,
                              void* stream) = 0;
  // Several device-to-host reads on one stream with one wait in all (a
  // batch's device queries). The default reads them one by one.
  struct HostRead {
    void* host_dst;
    const void* src;
    size_t bytes;
  };
  virtual void read_to_host(const std::vector<HostRead>& reads, void* stream) {
    for (const HostRead& r : reads)
      copy_to_host(r.host_dst, r.src, r.bytes, PQ_MEMORY_DEVICE, stream);
  }

  // The device capabilities; a backend that has one returns itself.
  virtual const DeviceMemory* device_memory() const { return nullptr; }
  virtual const DeviceKernels* device_kernels() const { return nullptr; }
  virtual const DeviceStep* device_step() const { return nullptr; }
};

// The built-in host backend.
std::unique_ptr<Backend> make_cpu_backend();

// Opens the CUDA plug-in and returns a backend that uses device `device_id`.
// Throws PQ_ERR_NOT_FOUND with the reason (file missing, dlopen error, no
// device) when it cannot. plugin_path may be null (search order in pqcache.h).
std::unique_ptr<Backend> load_cuda_backend(const char* plugin_path, int32_t device_id);

}  // namespace pq
