// Finds and opens the CUDA plug-in, and wraps it as a Backend.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda_plugin_abi.h"
#include "error.h"

namespace pq {

namespace {

constexpr const char* kPluginFile = "libpqcache_cuda.so";

// Directory holding libpqcache.so itself (or the executable it is linked into).
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr)
    return "";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::vector<std::string> candidate_paths(const char* configured) {
  std::vector<std::string> paths;
  if (configured != nullptr && configured[0] != '\0') {
    paths.emplace_back(configured);  // an explicit path is the only candidate
    return paths;
  }
  const char* env = std::getenv("PQCACHE_CUDA_PLUGIN");
  if (env != nullptr && env[0] != '\0') {
    paths.emplace_back(env);
    return paths;
  }
  std::string dir = own_directory();
  if (!dir.empty()) {
    paths.push_back(dir + "/" + kPluginFile);
    paths.push_back(dir + "/pqcache/" + kPluginFile);
  }
  paths.emplace_back(kPluginFile);  // the dynamic loader's search path
  return paths;
}

// Device buffers the GPU selection reuses across calls, grown on demand.
class DeviceArena {
 public:
  explicit DeviceArena(const pq_cuda_plugin_v2* p) : plugin_(p) {}
  ~DeviceArena() {
    char err[256];
    for (auto& b : buffers_) plugin_->device_free(b.ptr, err, sizeof err);
  }
  void* get(size_t slot, size_t bytes) {
    if (buffers_.size() <= slot) buffers_.resize(slot + 1);
    Buffer& b = buffers_[slot];
    if (b.bytes < bytes) {
      char err[512] = {0};
      plugin_->device_free(b.ptr, err, sizeof err);
      b = Buffer{};
      if (plugin_->device_alloc(&b.ptr, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, std::string("device allocation failed: ") + err);
      b.bytes = bytes;
    }
    return b.ptr;
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  const pq_cuda_plugin_v2* plugin_;
  std::vector<Buffer> buffers_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const pq_cuda_plugin_v1* plugin, const pq_cuda_plugin_v2* kernels, int32_t device)
      : plugin_(plugin), kernels_(kernels), device_(device), host_(make_cpu_backend()) {
    if (kernels_) arena_ = std::make_unique<DeviceArena>(kernels_);
  }

  // PQ selection on the GPU (plug-in ABI v2): the LUT and the codes go up,
  // the scan with the GQA combine and the radix top-k run there, k positions
  // come back. Calls are serialised on the device buffers; the index still
  // lives on the host (device-resident codes are the next step).
  bool pq_select(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                 const uint8_t* codes, int64_t tokens, int32_t combine, float scale, int64_t k,
                 int64_t first, int32_t* out) const override {
    if (!kernels_) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    char err[512] = {0};
    auto check = [&](int rc, const char* what) {
      if (rc != 0) fail(PQ_ERR_BACKEND, std::string(what) + ": " + err);
    };
    check(plugin_->set_device(device_, err, sizeof err), "cudaSetDevice");
    const size_t lut_bytes = static_cast<size_t>(queries) * subspaces * centroids * sizeof(float);
    const size_t code_bytes = static_cast<size_t>(tokens) * subspaces;
    const size_t scan_ws = kernels_->pq_scan_workspace_size(1, queries, subspaces, tokens, combine);
    const size_t topk_ws = kernels_->topk_workspace_size(1, tokens, k);
    void* d_lut = arena_->get(0, lut_bytes);
    void* d_codes = arena_->get(1, code_bytes);
    void* d_scores = arena_->get(2, static_cast<size_t>(tokens) * sizeof(float));
    void* d_out = arena_->get(3, static_cast<size_t>(k) * sizeof(int32_t));
    void* d_scan_ws = scan_ws ? arena_->get(4, scan_ws) : nullptr;
    void* d_topk_ws = topk_ws ? arena_->get(5, topk_ws) : nullptr;
    check(plugin_->copy(d_lut, lut, lut_bytes, PQ_COPY_HOST_TO_DEVICE, err, sizeof err), "LUT upload");
    check(plugin_->copy(d_codes, codes, code_bytes, PQ_COPY_HOST_TO_DEVICE, err, sizeof err),
          "codes upload");
    check(kernels_->pq_scan(static_cast<const float*>(d_lut), static_cast<const uint8_t*>(d_codes),
                            1, queries, subspaces, centroids, tokens, 0, tokens, combine, scale,
                            static_cast<float*>(d_scores), d_scan_ws, scan_ws, nullptr, err,
                            sizeof err),
          "pq_scan");
    check(kernels_->topk(static_cast<const float*>(d_scores), 1, tokens, k, first,
                         static_cast<int32_t*>(d_out), d_topk_ws, topk_ws, nullptr, err,
                         sizeof err),
          "topk");
    check(plugin_->copy(out, d_out, static_cast<size_t>(k) * sizeof(int32_t),
                        PQ_COPY_DEVICE_TO_HOST, err, sizeof err),
          "positions download");
    return true;
  }

  pq_backend kind() const override { return PQ_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }
  bool supports_streams() const override { return true; }

  bool supports_memory(int32_t memory) const override {
    return memory == PQ_MEMORY_HOST || memory == PQ_MEMORY_DEVICE;
  }

  void copy_to_host(void* dst, const void* src, size_t bytes, int32_t src_memory) override {
    if (src_memory == PQ_MEMORY_HOST) {
      std::memcpy(dst, src, bytes);
      return;
    }
    device_copy(dst, src, bytes, PQ_COPY_DEVICE_TO_HOST);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, int32_t dst_memory) override {
    if (dst_memory == PQ_MEMORY_HOST) {
      std::memcpy(dst, src, bytes);
      return;
    }
    device_copy(dst, src, bytes, PQ_COPY_HOST_TO_DEVICE);
  }

  // Scoring still runs on the host; the kernels come with the CUDA issue.
  void pq_scores(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                 const uint8_t* codes, int64_t tokens, float* out) const override {
    host_->pq_scores(lut, queries, subspaces, centroids, codes, tokens, out);
  }

 private:
  void device_copy(void* dst, const void* src, size_t bytes, int direction) {
    char err[512] = {0};
    const void* device_ptr = direction == PQ_COPY_DEVICE_TO_HOST ? src : dst;
    if (!plugin_->is_device_pointer(device_ptr))
      fail(PQ_ERR_INVALID_ARGUMENT,
           "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device memory");
    if (plugin_->set_device(device_, err, sizeof err) != 0)
      fail(PQ_ERR_BACKEND, std::string("cudaSetDevice failed: ") + err);
    if (plugin_->copy(dst, src, bytes, direction, err, sizeof err) != 0)
      fail(PQ_ERR_BACKEND, std::string("device copy failed: ") + err);
  }

  const pq_cuda_plugin_v1* plugin_;
  const pq_cuda_plugin_v2* kernels_;  // null for a plug-in that serves only v1
  int32_t device_;
  std::unique_ptr<Backend> host_;
  std::unique_ptr<DeviceArena> arena_;
  mutable std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Backend> load_cuda_backend(const char* plugin_path, int32_t device_id) {
  std::string reasons;
  // The plug-in is never dlclose'd: CUDA's runtime cannot be unloaded safely.
  void* handle = nullptr;
  for (const std::string& path : candidate_paths(plugin_path)) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* e = dlerror();
    reasons += "\n  " + path + ": " + (e ? e : "dlopen failed");
  }
  if (handle == nullptr)
    fail(PQ_ERR_NOT_FOUND, "the CUDA plug-in " + std::string(kPluginFile) +
                               " could not be loaded:" + reasons);
  auto entry = reinterpret_cast<pq_cuda_plugin_entry_fn>(dlsym(handle, PQ_CUDA_PLUGIN_ENTRY));
  if (entry == nullptr)
    fail(PQ_ERR_NOT_FOUND, std::string("the CUDA plug-in has no symbol ") + PQ_CUDA_PLUGIN_ENTRY);
  // Version 2 adds the kernels; a plug-in that serves only version 1 still
  // works for device memory.
  const pq_cuda_plugin_v1* v2 = entry(PQ_CUDA_PLUGIN_ABI_VERSION_2);
  const pq_cuda_plugin_v2* kernels =
      v2 != nullptr && v2->abi_version == PQ_CUDA_PLUGIN_ABI_VERSION_2 &&
              v2->struct_size >= sizeof(pq_cuda_plugin_v2)
          ? reinterpret_cast<const pq_cuda_plugin_v2*>(v2)
          : nullptr;
  const pq_cuda_plugin_v1* plugin = entry(PQ_CUDA_PLUGIN_ABI_VERSION);
  if (plugin == nullptr || plugin->abi_version != PQ_CUDA_PLUGIN_ABI_VERSION ||
      plugin->struct_size < sizeof(pq_cuda_plugin_v1))
    fail(PQ_ERR_NOT_FOUND, "the CUDA plug-in speaks another plug-in ABI version than " +
                               std::to_string(PQ_CUDA_PLUGIN_ABI_VERSION));
  int count = plugin->device_count();
  if (count <= 0)
    fail(PQ_ERR_NOT_FOUND, "the CUDA plug-in loaded but found no usable CUDA device "
                           "(no GPU, or no driver)");
  if (device_id < 0 || device_id >= count)
    fail(PQ_ERR_INVALID_ARGUMENT, "device_id is " + std::to_string(device_id) + "; " +
                                      std::to_string(count) + " CUDA device(s) present");
  return std::make_unique<CudaBackend>(plugin, kernels, device_id);
}

}  // namespace pq
