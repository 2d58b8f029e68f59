"""pqcache.transformers' parts: torch tensors to and from the binding's host
arrays, and the geometry every part of a Session shares. Imported by
pqcache.transformers after it checked that torch is installed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import SelectionResult

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}


@dataclass(frozen=True)
class _Geometry:
    """The shape of a Session's library layers: what its contexts are made
    with, and what its attention and speculation read and write."""
    layers: int           # library layers (the model's selecting layers)
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype    # the model's, and the library store's

    def context_args(self) -> tuple:
        """Context(*geometry.context_args(), **fields)."""
        return (self.layers, self.num_q_heads, self.num_kv_heads, self.head_dim,
                _DTYPES[self.dtype])


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a tensor on the host (a copy only for device tensors);
    bf16 as its uint16 bits, the binding's convention."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _from_host(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def _all_positions(kv_heads: int, n: int) -> SelectionResult:
    sel = SelectionResult(kv_heads, n)
    sel.positions[:] = np.arange(n, dtype=np.int32)
    sel.counts[:] = n
    return sel


def _fetch_all(row, layer: int, n: int, geometry: _Geometry, dtype, device):
    """Every stored token's K and V of (row, layer): [kv_heads, n, D] each."""
    k, v = row.ctx.fetch(row.seq, layer, _all_positions(geometry.num_kv_heads, n))
    return (_from_host(k, geometry.dtype).to(device=device, dtype=dtype),
            _from_host(v, geometry.dtype).to(device=device, dtype=dtype))
