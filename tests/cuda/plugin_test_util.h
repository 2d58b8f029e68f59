// What the tests of the plug-in's kernels share: the plug-in opened by path
// with dlopen, exactly as libpqcache.so opens it, the reason a device test
// skips, and device memory, pinned memory and streams through the plug-in's
// own table (the tests never call cudaMalloc themselves).
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_plugin_abi.h"

#ifndef PQ_CUDA_PLUGIN_FILE
#error "the build passes the plug-in's path as PQ_CUDA_PLUGIN_FILE"
#endif

namespace {

// $PQCACHE_CUDA_PLUGIN overrides the built path (a build tree copied to a GPU
// machine lives elsewhere).
const char* plugin_file() {
  const char* env = std::getenv("PQCACHE_CUDA_PLUGIN");
  return env != nullptr && env[0] != '\0' ? env : PQ_CUDA_PLUGIN_FILE;
}

pq_cuda_plugin_entry_fn plugin_entry() {
  static void* handle = dlopen(plugin_file(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  return reinterpret_cast<pq_cuda_plugin_entry_fn>(dlsym(handle, PQ_CUDA_PLUGIN_ENTRY));
}

// The table of this build's plug-in ABI version (the only one it serves).
const pq_cuda_plugin* plugin() {
  pq_cuda_plugin_entry_fn entry = plugin_entry();
  if (entry == nullptr) return nullptr;
  const pq_cuda_plugin* t = entry(PQ_CUDA_PLUGIN_ABI_VERSION);
  if (t == nullptr || t->abi_version != PQ_CUDA_PLUGIN_ABI_VERSION ||
      t->struct_size != sizeof(pq_cuda_plugin))
    return nullptr;
  return t;
}

// Why there is no device, or "" when there is one.
std::string no_device_reason() {
  const pq_cuda_plugin* p = plugin();
  if (p == nullptr) return std::string("cannot open the plug-in ") + plugin_file();
  if (p->device_count() > 0) return "";
  int n = 0;
  cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess)
    return std::string("no CUDA device: ") + cudaGetErrorName(s) + ": " + cudaGetErrorString(s);
  return "no CUDA device: cudaGetDeviceCount reports 0 devices";
}

#define REQUIRE_DEVICE()                                    \
  do {                                                      \
    std::string why_ = no_device_reason();                  \
    if (!why_.empty()) GTEST_SKIP() << why_;                \
  } while (0)

// Device memory through the plug-in (this test never calls cudaMalloc).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    char err[256] = "";
    EXPECT_EQ(plugin()->device_alloc(&ptr_, bytes, err, sizeof err), 0) << err;
  }
  ~DeviceBuffer() {
    char err[256] = "";
    EXPECT_EQ(plugin()->device_free(ptr_, err, sizeof err), 0) << err;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

template <typename T>
void upload(const DeviceBuffer& d, const std::vector<T>& h, size_t offset_bytes = 0) {
  char err[256] = "";
  ASSERT_LE(offset_bytes + h.size() * sizeof(T), d.bytes());
  ASSERT_EQ(plugin()->copy(static_cast<char*>(d.get()) + offset_bytes, h.data(),
                              h.size() * sizeof(T), PQ_COPY_HOST_TO_DEVICE, err, sizeof err),
            0)
      << err;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& d, size_t count) {
  char err[256] = "";
  std::vector<T> h(count);
  EXPECT_EQ(plugin()->copy(h.data(), d.get(), count * sizeof(T), PQ_COPY_DEVICE_TO_HOST, err,
                              sizeof err),
            0)
      << err;
  return h;
}

void sync() {
  char err[256] = "";
  ASSERT_EQ(plugin()->stream_synchronize(nullptr, err, sizeof err), 0) << err;
}

// Mapped pinned host memory through the plug-in.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    char err[256] = "";
    EXPECT_EQ(plugin()->host_alloc(&ptr_, bytes, err, sizeof err), 0) << err;
  }
  ~PinnedBuffer() {
    char err[256] = "";
    EXPECT_EQ(plugin()->host_free(ptr_, err, sizeof err), 0) << err;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// A non-blocking stream through the plug-in.
class Stream {
 public:
  Stream() {
    char err[256] = "";
    EXPECT_EQ(plugin()->stream_create(&stream_, err, sizeof err), 0) << err;
    EXPECT_NE(stream_, nullptr);
  }
  ~Stream() {
    char err[256] = "";
    EXPECT_EQ(plugin()->stream_destroy(stream_, err, sizeof err), 0) << err;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return stream_; }
  void sync() const {
    char err[256] = "";
    ASSERT_EQ(plugin()->stream_synchronize(stream_, err, sizeof err), 0) << err;
  }

 private:
  void* stream_ = nullptr;
};

}  // namespace
