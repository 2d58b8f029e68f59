// The device capability of running a host call's work on the device (the
// CUDA backend): the PQ selection of a layer, or of the same layer of a
// batch, whose positions come back to the host, and pq_fetch_kv into device
// tensors in one gather launch. Each returns false where the backend or the
// items do not allow it, and the caller then runs the host path: the
// results are the same either way (ties to the larger position). The core
// asks Backend::device_kernels() (null on the CPU backend).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/layer_context.h"
#include "pq/codebook.h"
#include "pqcache.h"
#include "store/block_cache.h"
#include "store/code_column.h"

namespace pq {

class KvTier;

// The PQ selection of every kv head of one layer, set by name:
//   PqLayerSelectArgs a{context, codebook}; a.lut = ...; a.middle = {b, e};
struct PqLayerSelectArgs {
  const LayerContext& context;        // kv heads, group, combine, scale; device, stream
  const PqCodebook& codebook;         // subspaces and centroids of the codes
  const float* lut = nullptr;         // [kv_heads][group_size][subspaces][centroids]
  const CodeColumn* codes = nullptr;  // per kv head: host codes of tokens [0, coded_tokens)
  int64_t coded_tokens = 0;
  TokenRange middle{};                // the tokens to score, middle.end <= coded_tokens
  int64_t k = 0;                      // per kv head, 0 < k < middle.size()

  int32_t kv_heads() const { return context.kv_heads(); }
  int32_t group_size() const { return context.group_size(); }
  int32_t combine() const { return context.combine(); }  // logits raw * scale()
  float scale() const { return context.scale(); }
  int32_t subspaces() const { return codebook.subspaces; }
  int32_t centroids() const { return codebook.centroids; }
  DeviceLayer* device() const { return context.device; }
  uint64_t index_generation() const { return context.index_generation; }
  void* stream() const { return context.stream; }
};

struct DeviceFetchArgs {
  LayerContext context;          // the layer's device state, the stream, the pool for staging
  const KvTier& store;
  const pq_selection& selection;
  const pq_tensor& out_keys;     // device memory
  const pq_tensor& out_values;   // device memory
  const BlockCache* cache = nullptr;  // null when off; lookups only
  TokenRange middle{};           // only middle tokens can be cache hits
  uint64_t* staged_bytes = nullptr;   // += bytes the CPU copied to stage rows; may be null
};

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;

  // The whole PQ selection of one layer on the device: scores through the
  // LUT, the GQA combine and the top k of every kv head, in one upload, one
  // scan, one top-k and one wait; the positions of head h written ascending
  // into out[h * k]. Returns false when the backend takes no such path (the
  // caller then runs the host code), throws on failure. Same semantics as
  // the host path (ties to the larger position).
  virtual bool pq_select_layer(const PqLayerSelectArgs& args, int32_t* out) const = 0;

  // pq_select_layer for the same layer of several sequences at once
  // (pq_decode_select_batch): one upload, one scan and one top-k over every
  // kv head of every item, one download and one wait, where each item's
  // positions go to outs[i] as pq_select_layer writes them. Items share the
  // configuration (group size, subspaces, centroids, combine, scale). Returns
  // false when the items do not allow it (different streams); nothing is
  // written then.
  virtual bool pq_select_batch(const std::vector<PqLayerSelectArgs>& items,
                               const std::vector<int32_t*>& outs) const = 0;

  // pq_fetch_kv into device tensors on the device, in one gather launch:
  // block-cache hits and the window from device memory, the rest read from
  // the host store across PCIe by the kernel (staged through pinned memory
  // when the store is not device-readable). Returns false when it takes no
  // such path (the caller stages through host memory).
  virtual bool fetch_to_device(const DeviceFetchArgs& args) const = 0;
  // fetch_to_device for the items of a batch (pq_fetch_kv_batch) in one
  // launch; false, with nothing done, when the items do not allow it
  // (different streams).
  virtual bool fetch_batch_to_device(const std::vector<DeviceFetchArgs>& items) const = 0;
};

}  // namespace pq
