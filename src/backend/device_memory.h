// The device capability of a backend with memory of its own (the CUDA
// backend): where the host store's chunks come from, copies from device
// memory that finish later, and the device's copy of each layer (its window
// of sink and local rows, the block cache's slots, K/V appended from device
// tensors) kept in step with the host store. Device work is ordered on the
// sequence's stream: a backend with DeviceMemory takes one
// (pq_sequence_set_stream). The core asks Backend::device_memory() once per
// call and skips these steps where it is null (the CPU backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/hooks.h"
#include "pqcache.h"
#include "store/block_cache.h"

namespace pq {

class KvTier;

// Device-side state of one (sequence, layer): the resident PQ codes and the
// block cache's slots. Opaque to the core; owned by the Layer.
class DeviceLayer {
 public:
  virtual ~DeviceLayer() = default;
};

// A device-to-host copy in flight into page-locked memory it owns.
class HostCopy {
 public:
  virtual ~HostCopy() = default;
  // Blocks until the copy has landed; throws PQ_ERR_BACKEND if it failed.
  virtual void wait() = 0;
  virtual const void* data() const = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // Where the K/V store's chunks come from when the caller's hooks give no
  // host_alloc: memory the device can read itself (the CUDA backend's
  // page-locked, mapped pool, so a fetch gathers rows straight from the
  // store).
  virtual HostAllocator store_allocator() const = 0;

  // Starts copying `bytes` of device memory at `src` to the host on
  // `stream`, or returns null when the backend copies synchronously only.
  virtual std::unique_ptr<HostCopy> copy_to_host_async(const void* src, size_t bytes,
                                                       void* stream) const = 0;

  // The device-side state of one (sequence, layer). Created with the layer,
  // destroyed with it.
  virtual std::unique_ptr<DeviceLayer> make_device_layer(const pq_config& config) const = 0;

  // Keeps the sink tokens and the local window of a layer on the device
  // (paper Algorithm 1: they stay on the GPU): called after tokens
  // [first, first + count) were stored, n tokens in all; the backend copies
  // the new ones that are sinks or among the last local tokens into its
  // window, stream-ordered. Returns the bytes the CPU copied to stage rows
  // (0 when the device reads the store itself).
  virtual uint64_t store_window(DeviceLayer* device, const KvTier& store, int64_t first,
                                int64_t count, void* stream) const = 0;

  // Copies the blocks the block cache just admitted into their device slots
  // (stream-ordered, after the fetch that decided them). Returns the bytes
  // the CPU copied to stage rows.
  virtual uint64_t fill_cache_blocks(DeviceLayer* device, const KvTier& store,
                                     const std::vector<BlockCache::Admission>& admissions,
                                     int32_t block_tokens, void* stream) const = 0;

  // pq_decode_append of K/V in device memory: the rows of tokens [first,
  // first + keys.tokens), opened in `store` and not written, are written by
  // the device from the caller's tensors on the stream, and so are the
  // window's rows of them: no host round trip. False, with nothing done,
  // when the backend cannot (the caller stages the K/V through the host).
  // Until device_writes_landed() (never waits) or wait_device_writes(), the
  // host must not read those rows.
  virtual bool append_from_device(DeviceLayer* device, const KvTier& store, int64_t first,
                                  const pq_tensor& keys, const pq_tensor& values,
                                  void* stream) const = 0;
  virtual bool device_writes_landed(DeviceLayer* device) const = 0;
  virtual void wait_device_writes(DeviceLayer* device) const = 0;

  // Keeps what stays valid of a layer's device state when its store was cut
  // to `tokens` (pq_sequence_truncate), without waiting for the device.
  // The block cache's bookkeeping starts empty.
  virtual void truncate_device(DeviceLayer* device, const KvTier& store, int64_t tokens,
                               void* stream) const = 0;

  // pq_sequence_reserve. reserve_store: `blocks` more store blocks of
  // `block_bytes` can be handed out without allocating (false: could not
  // allocate them; a backend without DeviceMemory needs nothing).
  // reserve_layer: the layer's device buffers and its stream's working
  // buffers for a middle of up to args.middle tokens, k of them selected.
  virtual bool reserve_store(size_t block_bytes, size_t blocks) const = 0;
  struct ReserveArgs {
    int64_t tokens;   // the sequence's length to make room for
    int64_t middle;   // the middle at that length
    int64_t k;        // tokens selected per kv head there
    int64_t count;    // a selection's entries per kv head there
    int32_t group_size, subspaces, centroids, combine;
    void* stream;
    int64_t candidates = 0;  // a re-ranking's per kv head there (rerank_candidates; k: none)
  };
  virtual void reserve_layer(DeviceLayer* device, const ReserveArgs& args) const = 0;
};

}  // namespace pq
