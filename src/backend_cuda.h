// The CUDA backend over the plug-in's C table (see backend_cuda.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "backend.h"
#include "cuda_plugin_abi.h"

namespace pq {

// kernels may be null (a plug-in older than ABI v3): device memory then
// works through `plugin`'s copies and everything else runs on the host.
std::unique_ptr<Backend> make_cuda_backend(const pq_cuda_plugin_v1* plugin,
                                           const pq_cuda_plugin_v3* kernels, int32_t device);

}  // namespace pq
