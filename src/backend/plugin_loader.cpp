// Finds and opens the CUDA plug-in, and wraps it as a Backend.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "base/error.h"

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
  // Exactly this library's version: the packages pin the plug-in to the
  // same release, so anything else is a stale or foreign file.
  const pq_cuda_plugin* plugin = entry(PQ_CUDA_PLUGIN_ABI_VERSION);
  if (plugin == nullptr || plugin->abi_version != PQ_CUDA_PLUGIN_ABI_VERSION ||
      plugin->struct_size != sizeof(pq_cuda_plugin)) {
    const pq_cuda_plugin* any = entry(0);  // a plug-in of 0.3 or older answers NULL
    fail(PQ_ERR_NOT_FOUND,
         "the CUDA plug-in speaks plug-in ABI " +
             (any != nullptr ? std::to_string(any->abi_version) + " (table of " +
                                   std::to_string(any->struct_size) + " bytes)"
                             : std::string("1-3 (from libpqcache 0.3 or older)")) +
             "; this libpqcache " PQ_VERSION_STRING " needs ABI " +
             std::to_string(PQ_CUDA_PLUGIN_ABI_VERSION) + " (" +
             std::to_string(sizeof(pq_cuda_plugin)) +
             " bytes): install the plug-in of the same release");
  }
  int count = plugin->device_count();
  if (count <= 0)
    fail(PQ_ERR_NOT_FOUND, "the CUDA plug-in loaded but found no usable CUDA device "
                           "(no GPU, or no driver)");
  if (device_id < 0 || device_id >= count)
    fail(PQ_ERR_INVALID_ARGUMENT, "device_id is " + std::to_string(device_id) + "; " +
                                      std::to_string(count) + " CUDA device(s) present");
  return make_cuda_backend(plugin, device_id);
}

}  // namespace pq
