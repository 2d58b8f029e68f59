"""The decode step kept on the device (CUDA backend, added in 0.7).

    sel = pqcache.DeviceSelection(positions, counts)   # int32 device arrays
    ctx.select_device(seq, layer, query, sel)          # query: [q_heads][head_dim] on the device
    ctx.fetch_device(seq, layer, sel, keys, values)    # [kv_heads][capacity][head_dim] on the device

A batch of sequences at one layer (0.8): one launch chain for all of them
when they share a stream (pq_decode_select_device_batch,
pq_fetch_kv_device_batch):

    ctx.select_device_batch(layer, seqs, queries, sels)
    ctx.fetch_device_batch(layer, seqs, sels, keys, values)

Both calls are enqueued on the sequence's CUDA stream (Context.set_stream)
and return without waiting: the results are complete once that stream is
(torch.cuda.current_stream().synchronize(), or work queued after them on the
same stream sees them). Nothing crosses to the host. Device arrays are any
objects that describe device memory: PyTorch CUDA tensors (read through
data_ptr(), so bfloat16 works too), or anything with __cuda_array_interface__
(CuPy, Numba). Malformed arrays raise TypeError or ValueError before the
library sees them; the library's own refusals raise PQError (e.g.
PQ_ERR_UNSUPPORTED on the CPU backend or for host memory). Both are calls on
the context like any other: a Context.close() on another thread waits for
them to return, and on a closed context they raise PQ_ERR_BAD_STATE
"<C function>: the context is closed". A DeviceSelection holds no pointer into
the context.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

from . import pqcache_swig as _c

# __cuda_array_interface__ typestr -> element size and pq_dtype (or int32).
_TYPESTRS = {"<f4": (4, _c.PQ_DTYPE_F32), "<f2": (2, _c.PQ_DTYPE_F16),
             "<i4": (4, None), "<u2": (2, _c.PQ_DTYPE_BF16)}
_TORCH_DTYPES = {"torch.float32": (4, _c.PQ_DTYPE_F32), "torch.float16": (2, _c.PQ_DTYPE_F16),
                 "torch.bfloat16": (2, _c.PQ_DTYPE_BF16), "torch.int32": (4, None)}


class DeviceArray(NamedTuple):
    """What the library needs of a device array: its address, shape, strides
    in elements, element size and pq_dtype (None for int32)."""
    address: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    itemsize: int
    dtype: object


def device_array(obj, name: str, ndim: int) -> DeviceArray:
    """Describes `obj`, which must be device memory of `ndim` dimensions."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):  # a torch tensor
        if not obj.is_cuda:
            raise TypeError(f"{name} is a torch tensor on {obj.device}; the decode step on the "
                            "device takes CUDA tensors")
        kind = _TORCH_DTYPES.get(str(obj.dtype))
        if kind is None:
            raise TypeError(f"{name} has dtype {obj.dtype}; expected float32, float16, "
                            "bfloat16 or int32")
        shape, strides = tuple(obj.shape), tuple(obj.stride())
        address = obj.data_ptr()
    else:
        iface = getattr(obj, "__cuda_array_interface__", None)
        if iface is None:
            raise TypeError(f"{name} is a {type(obj).__name__}; the decode step on the device "
                            "takes device arrays (a CUDA torch tensor, or an object with "
                            "__cuda_array_interface__)")
        kind = _TYPESTRS.get(iface["typestr"])
        if kind is None:
            raise TypeError(f"{name} has typestr {iface['typestr']!r}; expected '<f4', '<f2', "
                            "'<u2' (bf16 bits) or '<i4'")
        shape = tuple(iface["shape"])
        address = iface["data"][0]
        byte_strides = iface.get("strides")
        if byte_strides is None:  # C-contiguous
            byte_strides, step = [], kind[0]
            for extent in reversed(shape):
                byte_strides.insert(0, step)
                step *= extent
        if any(s % kind[0] for s in byte_strides):
            raise ValueError(f"{name}: strides {tuple(byte_strides)} are not whole elements")
        strides = tuple(s // kind[0] for s in byte_strides)
    if len(shape) != ndim:
        raise ValueError(f"{name} has shape {shape}; expected {ndim} dimensions")
    if shape and shape[-1] > 1 and strides[-1] != 1:
        raise ValueError(f"{name}: the last axis must be contiguous (stride {strides[-1]})")
    return DeviceArray(address, shape, strides, kind[0], kind[1])


class DeviceSelection:
    """A selection in device memory: positions [kv_heads][capacity] and
    counts [kv_heads], int32, rows contiguous (the caller owns both)."""

    def __init__(self, positions, counts):
        p = device_array(positions, "positions", 2)
        c = device_array(counts, "counts", 1)
        for a, name in ((p, "positions"), (c, "counts")):
            if a.dtype is not None or a.itemsize != 4:
                raise TypeError(f"{name} must be int32")
        if c.shape[0] != p.shape[0]:
            raise ValueError(f"counts has {c.shape[0]} entries for {p.shape[0]} rows of positions")
        if p.shape[0] > 1 and p.strides[0] != p.shape[1]:
            raise ValueError("positions: rows must follow each other (a contiguous "
                             "[kv_heads][capacity] array)")
        self.positions, self.counts = positions, counts  # kept alive with the selection
        self.capacity = p.shape[1]
        self.kv_heads = p.shape[0]
        self._addresses = (p.address, c.address)


def _query_args(query):
    q = device_array(query, "query", len(getattr(query, "shape", ())) or 2)
    shape, strides = (q.shape[1:], q.strides[1:]) if len(q.shape) == 3 else (q.shape, q.strides)
    if len(shape) != 2:
        raise ValueError(f"query has shape {q.shape}; expected [q_heads][head_dim]")
    if q.dtype is None:
        raise TypeError("query must be float32, float16 or bfloat16")
    return q.address, q.dtype, shape[0], shape[1], strides[0]


def _output_args(keys, values):
    k = device_array(keys, "keys", 3)
    v = device_array(values, "values", 3)
    if k.shape != v.shape or k.strides != v.strides or k.dtype != v.dtype:
        raise ValueError(f"keys {k.shape} (strides {k.strides}) and values {v.shape} (strides "
                         f"{v.strides}) must have one shape, layout and dtype")
    if k.dtype is None:
        raise TypeError("keys and values must be float32, float16 or bfloat16")
    heads, tokens, head_dim = k.shape
    return k.address, v.address, k.dtype, tokens, heads, head_dim, k.strides[1], k.strides[0]


def _same_length(**named):
    lengths = {name: len(v) for name, v in named.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"one entry per sequence in each argument; got lengths {lengths}")


def select_device_batch(ctx, layer: int, seqs, queries, outs) -> None:
    """pq_decode_select_device_batch: select_device for every seqs[i] with
    queries[i] into outs[i] (DeviceSelection), one launch chain when the
    sequences share a stream. Raises BatchError-like PQError with .statuses
    when items failed (the others' selections are written)."""
    seqs, queries, outs = list(seqs), list(queries), list(outs)
    _same_length(seqs=seqs, queries=queries, outs=outs)
    rows = []
    for i, (seq, query, out) in enumerate(zip(seqs, queries, outs)):
        if not isinstance(out, DeviceSelection):
            raise TypeError(f"outs[{i}] is a {type(out).__name__}; expected DeviceSelection")
        rows.append((int(seq), *_query_args(query), out._addresses[0], out._addresses[1],
                     out.capacity))
    ctx._call("pq_decode_select_device_batch", _c.pq_decode_select_device_batch, layer, rows)


def fetch_device_batch(ctx, layer: int, seqs, selections, keys, values) -> None:
    """pq_fetch_kv_device_batch: fetch_device for every seqs[i], selections[i]
    into keys[i] and values[i], one gather when the sequences share a stream."""
    seqs, selections, keys, values = list(seqs), list(selections), list(keys), list(values)
    _same_length(seqs=seqs, selections=selections, keys=keys, values=values)
    rows = []
    for i, (seq, sel, k, v) in enumerate(zip(seqs, selections, keys, values)):
        if not isinstance(sel, DeviceSelection):
            raise TypeError(f"selections[{i}] is a {type(sel).__name__}; expected DeviceSelection")
        rows.append((int(seq), sel._addresses[0], sel._addresses[1], sel.capacity,
                     *_output_args(k, v)))
    ctx._call("pq_fetch_kv_device_batch", _c.pq_fetch_kv_device_batch, layer, rows)


def select_device(ctx, seq: int, layer: int, query, out: DeviceSelection) -> DeviceSelection:
    """pq_decode_select_device: the selection of one decode step written into
    `out` on the device. query: [q_heads][head_dim] (or [1][q_heads][head_dim])
    in the context's dtype, device memory."""
    ctx._call("pq_decode_select_device", _c.pq_decode_select_device, seq, layer,
              *_query_args(query), out._addresses[0], out._addresses[1], out.capacity)
    return out


def select_multi_device(ctx, seq: int, layer: int, queries, rows: int,
                        out: DeviceSelection) -> DeviceSelection:
    """pq_decode_select_multi_device (0.10): the rows of several query tokens'
    selection written into `out` (positions [rows][capacity], counts [rows],
    sized by Context.selection_capacity_multi) on the device. queries:
    [tokens][q_heads][head_dim] in device memory; rows: the pq_select_rows
    value."""
    q = device_array(queries, "queries", 3)
    if q.dtype is None:
        raise TypeError("queries must be float32, float16 or bfloat16")
    ctx._call("pq_decode_select_multi_device", _c.pq_decode_select_multi_device, seq, layer,
              q.address, q.dtype, q.shape[0], q.shape[1], q.shape[2], q.strides[0],
              q.strides[1], rows, out._addresses[0], out._addresses[1], out.capacity)
    return out


def fetch_device(ctx, seq: int, layer: int, selection: DeviceSelection, keys, values) -> None:
    """pq_fetch_kv_device: the selected rows gathered on the device into
    keys and values, [kv_heads][>= capacity][head_dim] device arrays in the
    context's dtype, row i of head h being the token positions[h][i]."""
    ctx._call("pq_fetch_kv_device", _c.pq_fetch_kv_device, seq, layer,
              selection._addresses[0], selection._addresses[1], selection.capacity,
              *_output_args(keys, values))
