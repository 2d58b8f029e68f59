// The seam between the backend-agnostic core and a compute backend. The CPU
// backend is always built in; the CUDA backend lives in a plug-in
// (libpqcache_cuda.so) that plugin_loader.cpp opens at run time, so that
// libpqcache.so never links the CUDA libraries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pqcache.h"

namespace pq {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual pq_backend kind() const = 0;
  virtual const char* name() const = 0;

  // Whether pq_sequence_set_stream may name a device stream.
  virtual bool supports_streams() const { return false; }

  // Whether tensors in this memory kind can be read and written.
  virtual bool supports_memory(int32_t memory) const = 0;

  // Copies bytes between the caller's memory (host or device, by kind) and
  // host memory. Throws pq::Error on failure.
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes, int32_t src_memory) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes,
                              int32_t dst_memory) = 0;

  // Approximate raw scores through PQ codes: for each of `queries` query
  // heads q, out[q * tokens + t] = sum_j lut[q][j][codes[t * m + j]], where
  // lut is [queries][m][centroids]. The hot loop of PQ selection.
  virtual void pq_scores(const float* lut, int32_t queries, int32_t subspaces,
                         int32_t centroids, const uint8_t* codes, int64_t tokens,
                         float* out) const = 0;

  // The whole PQ selection of one kv head on the backend's device, when it
  // has one: scores through the LUT ([queries][m][centroids]), the GQA
  // combine (pq_gqa_combine, logits raw * scale) and the top k, positions
  // first + i written ascending into out. Returns false when the backend
  // has no such path (the caller then runs the host code), throws on
  // failure. Same semantics as the host path (ties to the larger position).
  virtual bool pq_select(const float* lut, int32_t queries, int32_t subspaces,
                         int32_t centroids, const uint8_t* codes, int64_t tokens, int32_t combine,
                         float scale, int64_t k, int64_t first, int32_t* out) const {
    return false;
  }
};

// The built-in host backend.
std::unique_ptr<Backend> make_cpu_backend();

// Opens the CUDA plug-in and returns a backend that uses device `device_id`.
// Throws PQ_ERR_NOT_FOUND with the reason (file missing, dlopen error, no
// device) when it cannot. plugin_path may be null (search order in pqcache.h).
std::unique_ptr<Backend> load_cuda_backend(const char* plugin_path, int32_t device_id);

}  // namespace pq
