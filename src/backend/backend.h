// The seam between the backend-agnostic core and a compute backend. The CPU
// backend is always built in; the CUDA backend lives in a plug-in
// (libpqcache_cuda.so) that plugin_loader.cpp opens at run time, so that
// libpqcache.so never links the CUDA libraries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <vector>

#include "store/block_cache.h"
#include "store/code_column.h"
#include "backend/layer_context.h"
#include "base/hooks.h"
#include "pq/codebook.h"
#include "store/kv_store.h"
#include "pqcache.h"
#include "base/thread_pool.h"

namespace pq {

// Device-side state of one (sequence, layer): the resident PQ codes and the
// block cache's slots. Opaque to the core; owned by the Layer.
class DeviceLayer {
 public:
  virtual ~DeviceLayer() = default;
};

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

// pq_decode_select_device of one layer: the whole selection written into
// device memory on the stream, the LUT built there from the device query.
struct DeviceSelectArgs {
  PqLayerSelectArgs pq;        // lut unused; k may be 0 or the whole middle;
                               // the codebook's centroids go up once per index
  const pq_tensor& query;      // device memory, 1 token x q heads
  int64_t tokens;              // sinks [0, layer.begin), local [layer.end, tokens)
  const pq_selection& out;     // device arrays
};

// pq_fetch_kv_device of one layer: a selection in device memory gathered
// on the device.
struct DeviceSelectionFetchArgs {
  LayerContext context;           // the layer's device state and the stream
  const KvTier& store;
  const pq_selection& selection;  // device arrays
  const pq_tensor& out_keys;      // device memory, >= selection.capacity tokens
  const pq_tensor& out_values;
};

// A device-to-host copy in flight into page-locked memory it owns.
class HostCopy {
 public:
  virtual ~HostCopy() = default;
  // Blocks until the copy has landed; throws PQ_ERR_BACKEND if it failed.
  virtual void wait() = 0;
  virtual const void* data() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual pq_backend kind() const = 0;
  virtual const char* name() const = 0;

  // Starts copying `bytes` of device memory at `src` to the host on
  // `stream`, or returns null when the backend copies synchronously only.
  virtual std::unique_ptr<HostCopy> copy_to_host_async(const void* src, size_t bytes,
                                                       void* stream) const {
    return nullptr;
  }

  // Whether pq_sequence_set_stream may name a device stream.
  virtual bool supports_streams() const { return false; }

  // Whether tensors in this memory kind can be read and written.
  virtual bool supports_memory(int32_t memory) const = 0;

  // Where the K/V store's chunks come from when the caller's hooks give no
  // host_alloc: memory this backend's device can read itself (the CUDA
  // backend's page-locked, mapped pool, so a fetch gathers rows straight
  // from the store), or the default allocator (operator new).
  virtual HostAllocator store_allocator() const { return HostAllocator{}; }

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


  // The whole PQ selection of one layer on the backend's device, when it has
  // one: scores through the LUT, the GQA combine and the top k of every kv
  // head, in one upload, one scan, one top-k and one wait; the positions of
  // head h written ascending into out[h * k]. Returns false when the backend
  // has no such path (the caller then runs the host code), throws on
  // failure. Same semantics as the host path (ties to the larger position).
  virtual bool pq_select_layer(const PqLayerSelectArgs& args, int32_t* out) const {
    return false;
  }

  // pq_select_layer for the same layer of several sequences at once
  // (pq_decode_select_batch): one upload, one scan and one top-k over every
  // kv head of every item, one download and one wait, where each item's
  // positions go to outs[i] as pq_select_layer writes them. Items share the
  // configuration (group size, subspaces, centroids, combine, scale). Returns
  // false when the backend has no such path or the items do not allow it
  // (different streams); nothing is written then.
  virtual bool pq_select_batch(const std::vector<PqLayerSelectArgs>& items,
                               const std::vector<int32_t*>& outs) const {
    return false;
  }

  // The decode step kept on the device (pq_decode_select_device,
  // pq_fetch_kv_device): enqueued on the stream, no host wait. False when
  // the backend has no such path; throws PQ_ERR_UNSUPPORTED for memory the
  // device does not know, or a store it cannot read.
  virtual bool select_to_device(const DeviceSelectArgs& args) const { return false; }
  virtual bool fetch_device_selection(const DeviceSelectionFetchArgs& args) const {
    return false;
  }
  // The same for the sequences of a batch at one layer, each kind in one
  // launch chain (pq_decode_select_device_batch, pq_fetch_kv_device_batch):
  // false, with nothing done, when the items do not allow it (streams or
  // stores differ); the caller then runs them one by one.
  virtual bool select_batch_to_device(const std::vector<const DeviceSelectArgs*>& items) const {
    return false;
  }
  virtual bool fetch_batch_device_selection(
      const std::vector<const DeviceSelectionFetchArgs*>& items) const {
    return false;
  }

  // The device-side state of one (sequence, layer), or null for a backend
  // without a device. Created with the layer, destroyed with it.
  virtual std::unique_ptr<DeviceLayer> make_device_layer(const pq_config& config) const {
    return nullptr;
  }

  // pq_fetch_kv into device tensors on the device, in one gather launch:
  // block-cache hits and the window from device memory, the rest read from
  // the host store across PCIe by the kernel (staged through pinned memory
  // when the store is not device-readable). Returns false when the backend
  // has no such path (the caller stages through host memory).
  virtual bool fetch_to_device(const DeviceFetchArgs& args) const { return false; }
  // fetch_to_device for the items of a batch (pq_fetch_kv_batch) in one
  // launch; false, with nothing done, when the backend has no such path or
  // the items do not allow it (different streams).
  virtual bool fetch_batch_to_device(const std::vector<DeviceFetchArgs>& items) const {
    return false;
  }

  // Keeps the sink tokens and the local window of a layer on the device
  // (paper Algorithm 1: they stay on the GPU): called after tokens
  // [first, first + count) were stored, n tokens in all; the backend copies
  // the new ones that are sinks or among the last local tokens into its
  // window, stream-ordered. No-op without a device.
  // Returns the bytes the CPU copied to stage rows (0 when the device reads
  // the store itself).
  virtual uint64_t store_window(DeviceLayer* device, const KvTier& store, int64_t first,
                                int64_t count, void* stream) const {
    return 0;
  }

  // Copies the blocks the block cache just admitted into their device slots
  // (stream-ordered, after the fetch that decided them). No-op without a
  // device. Returns the bytes the CPU copied to stage rows.
  virtual uint64_t fill_cache_blocks(DeviceLayer* device, const KvTier& store,
                                     const std::vector<BlockCache::Admission>& admissions,
                                     int32_t block_tokens, void* stream) const {
    return 0;
  }

  // pq_decode_append of K/V in device memory: the rows of tokens [first,
  // first + keys.tokens), opened in `store` and not written, are written by
  // the device from the caller's tensors on the stream, and so are the
  // window's rows of them: no host round trip. False, with nothing done,
  // when the backend cannot (the caller stages the K/V through the host).
  // Until device_writes_landed() (never waits) or wait_device_writes(), the
  // host must not read those rows.
  virtual bool append_from_device(DeviceLayer* device, const KvTier& store, int64_t first,
                                  const pq_tensor& keys, const pq_tensor& values,
                                  void* stream) const {
    return false;
  }
  virtual bool device_writes_landed(DeviceLayer* device) const { return true; }
  virtual void wait_device_writes(DeviceLayer* device) const {}

  // Keeps what stays valid of a layer's device state when its store was cut
  // to `tokens` (pq_sequence_truncate), without waiting for the device.
  // The block cache's bookkeeping starts empty. No-op without a device.
  virtual void truncate_device(DeviceLayer* device, const KvTier& store, int64_t tokens,
                               void* stream) const {}

  // pq_sequence_reserve. reserve_store: `blocks` more store blocks of
  // `block_bytes` can be handed out without allocating (false: could not
  // allocate them; the CPU backend's malloc needs nothing). reserve_layer:
  // the layer's device buffers and its stream's working buffers for a
  // middle of up to args.middle tokens, k of them selected.
  virtual bool reserve_store(size_t block_bytes, size_t blocks) const { return true; }
  struct ReserveArgs {
    int64_t tokens;   // the sequence's length to make room for
    int64_t middle;   // the middle at that length
    int64_t k;        // tokens selected per kv head there
    int64_t count;    // a selection's entries per kv head there
    int32_t group_size, subspaces, centroids, combine;
    void* stream;
  };
  virtual void reserve_layer(DeviceLayer* device, const ReserveArgs& args) const {}

  // After an append or a truncate: whether the layer keeps the row tables
  // of a step a CUDA graph may capture, and their update to the new length
  // (codes of the tokens that left the window, lengths), enqueued by value.
  virtual bool keeps_device_step(const DeviceLayer* device) const { return false; }
  virtual void refresh_device_step(DeviceLayer* device, const PqLayerSelectArgs& args,
                                   int64_t tokens, const KvTier& store, void* stream) const {}
};

// The built-in host backend.
std::unique_ptr<Backend> make_cpu_backend();

// Opens the CUDA plug-in and returns a backend that uses device `device_id`.
// Throws PQ_ERR_NOT_FOUND with the reason (file missing, dlopen error, no
// device) when it cannot. plugin_path may be null (search order in pqcache.h).
std::unique_ptr<Backend> load_cuda_backend(const char* plugin_path, int32_t device_id);

}  // namespace pq
