// Finds and opens the CUDA plug-in, and wraps it as a Backend.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
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

class CudaBackend final : public Backend {
 public:
  CudaBackend(const pq_cuda_plugin_v1* plugin, int32_t device)
      : plugin_(plugin), device_(device), host_(make_cpu_backend()) {}

  pq_backend kind() const override { return PQ_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }
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
  int32_t device_;
  std::unique_ptr<Backend> host_;
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
  return std::make_unique<CudaBackend>(plugin, device_id);
}

}  // namespace pq
