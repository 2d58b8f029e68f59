// The CUDA backend over the plug-in's C table (see backend_cuda.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "backend.h"
#include "cuda_plugin_abi.h"

namespace pq {

// The backend over a plug-in table of this library's ABI version, on
// device `device`.
std::unique_ptr<Backend> make_cuda_backend(const pq_cuda_plugin* plugin, int32_t device);

}  // namespace pq
