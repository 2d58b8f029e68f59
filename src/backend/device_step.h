// The device capability of keeping the decode step on the device (the CUDA
// backend; pq_decode_select_device, pq_fetch_kv_device): the selection is
// written into device memory and gathered from there, enqueued on the
// sequence's stream with no host wait, and a layer may keep the row tables
// of a step a CUDA graph captures. The core asks Backend::device_step()
// (null on the CPU backend: those calls are PQ_ERR_UNSUPPORTED there).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/device_kernels.h"
#include "backend/layer_context.h"
#include "pqcache.h"

namespace pq {

class DeviceLayer;
class KvTier;

// pq_decode_select_device of one layer: the whole selection written into
// device memory on the stream, the LUT built there from the device query
// (in the codebook's dimension order, config.key_rotary), and with
// config.pq_rerank the codes' candidates re-ranked there by their keys.
struct DeviceSelectArgs {
  PqLayerSelectArgs pq;        // lut unused; k may be 0 or the whole middle;
                               // the codebook's centroids go up once per index
  const pq_tensor& query;      // device memory, 1 token x q heads
  int64_t tokens;              // sinks [0, layer.begin), local [layer.end, tokens)
  const pq_selection& out;     // device arrays
  const KvTier& store;         // the keys a re-ranking reads (the device reads them in place)
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

// pq_decode_select_multi_device of one layer: each query token's selection
// made on the device as select_to_device would make it (tokens[t]: its
// query, one token; its `out` is not read, the backend selects into its
// own scratch of per_token entries per kv head), then the rows written
// into out's device arrays as `rows` (pq_select_rows) says, padded with -1.
struct DeviceMultiSelectArgs {
  const std::vector<DeviceSelectArgs>& tokens;  // one layer, one stream
  int32_t rows;
  int64_t per_token;
  const pq_selection& out;  // rows x out.capacity, capacity checked by the caller
};

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;

  // The decode step kept on the device: enqueued on the stream, no host
  // wait. False when the backend takes no such path; throws
  // PQ_ERR_UNSUPPORTED for memory the device does not know, or a store it
  // cannot read (a fetch, or a select that re-ranks).
  virtual bool select_to_device(const DeviceSelectArgs& args) const = 0;
  virtual bool fetch_device_selection(const DeviceSelectionFetchArgs& args) const = 0;
  // The same for the sequences of a batch at one layer, each kind in one
  // launch chain (pq_decode_select_device_batch, pq_fetch_kv_device_batch):
  // false, with nothing done, when the items do not allow it (streams or
  // stores differ); the caller then runs them one by one.
  virtual bool select_batch_to_device(const std::vector<const DeviceSelectArgs*>& items) const = 0;
  virtual bool fetch_batch_device_selection(
      const std::vector<const DeviceSelectionFetchArgs*>& items) const = 0;
  // Several query tokens of one sequence at one layer, enqueued, no host
  // wait; false when the backend takes no such path.
  virtual bool select_multi_to_device(const DeviceMultiSelectArgs& args) const = 0;

  // After an append or a truncate: whether the layer keeps the row tables
  // of a step a CUDA graph may capture, and their update to the new length
  // (codes of the tokens that left the window, lengths), enqueued by value.
  virtual bool keeps_device_step(const DeviceLayer* device) const = 0;
  virtual void refresh_device_step(DeviceLayer* device, const PqLayerSelectArgs& args,
                                   int64_t tokens, const KvTier& store, void* stream) const = 0;
};

}  // namespace pq
