"""PQCache as an SGLang sparse-attention algorithm, backed by libpqcache.

SGLang's sparse framework (python/sglang/srt/mem_cache/sparsity/ of
sgl-project/sglang; the shapes here are those of sglang 0.5.23 from PyPI,
algorithms/base_algorithm.py and core/sparse_coordinator.py) calls an
algorithm object at four points:

- initialize_representation_pool(start_layer, end_layer, token_to_kv_pool,
  req_to_token_pool, states), once: the KV pool (get_key_buffer(layer) is
  [pool_slots, kv_heads, head_dim]), the request table (req_to_token
  [max_requests, max_context] int32: slot of each position of a request)
  and the request states (repr_constructed, prompt_lens,
  last_constructed_page: tensors indexed by request pool index);
- construct_representations(layer_id, req_pool_indices, seq_lens, k_buffer,
  forward_batch) after each layer's attention of a prefill (extend) forward;
- update_representations(...) the same after each layer of a decode forward;
- retrieve_topk(queries, layer_id, req_pool_indices, sparse_mask,
  forward_batch=..., ...) before each layer's attention: queries
  [bs, q_heads, head_dim] (or [bs, q_heads * head_dim]), returning
  (selected_indices [bs, max_selected] int32 padded with -1, valid_lengths
  [bs] int32), request-relative positions (pages when page_size > 1) that
  the backend adaptor maps to slots through req_to_token.

PQCacheAlgorithm keeps one index-only context (kv_tier="caller": the index
only; K/V stay in SGLang's pool) for the model's layers [start_layer,
end_layer) and one sequence per request. A prefill builds each layer's index
from k_buffer through the request's req_to_token row
(pq_prefill_layer_paged, slots = req_to_token[idx, :seq_len]); a decode step
appends the new token's key the same way (pq_decode_append_paged); and
retrieve_topk selects, per request, the union over kv heads of the sink
tokens, the top-k middle tokens and the local window
(pq_decode_select_multi, PQ_ROWS_PER_REQUEST), plus the positions the
index has not seen yet: SGLang retrieves before a layer's attention and
updates after it, so a decode step's own token is appended after its
select, and it is always attended (it is the newest). A pool on a device is
read by gathering the request's new rows to the host (k_buffer[slots].cpu());
a pool in host memory is read in place.

SGLang imports only with its GPU packages (sgl_kernel, triton, flashinfer);
where it imports, PQCacheAlgorithm subclasses its BaseSparseAlgorithm,
otherwise a stand-in with the same constructor and attributes, so the class
works and is tested without SGLang. torch is optional as well: without it
(or with numpy inputs) retrieve_topk returns numpy arrays.

Configuration (SparseConfig.sparse_extra_config, the JSON SGLang takes):
num_q_heads (this rank's query heads; required: the KV pool does not say),
kv_head_offset (this tensor-parallel rank's first kv head in the model;
default 0), and any pq_config field (topk_tokens, topk_fraction,
sink_tokens, local_tokens, pq_subspaces, pq_bits, worker_threads, ...).
Keyword arguments of the constructor take precedence. register() adds
"pqcache" to SGLang's algorithm registry. docs/engines.md has the details.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from . import _CONFIG_FIELDS, Context, PagedKeys

__all__ = ["PQCacheAlgorithm", "register", "SGLANG_BASE"]

# Context fields the algorithm sets itself (from the pool's geometry).
_OWN_FIELDS = {"num_layers", "num_q_heads", "num_kv_heads", "head_dim", "dtype", "kv_tier",
               "selector", "kv_head_offset"}
_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_NUMPY_DTYPES = {"float32": "f32", "float16": "f16"}


def _sglang_base():
    """SGLang's BaseSparseAlgorithm where SGLang imports, else None."""
    try:
        if importlib.util.find_spec("sglang") is None:
            return None
        from sglang.srt.mem_cache.sparsity.algorithms.base_algorithm import (
            BaseSparseAlgorithm)
    except Exception:  # installed without its GPU packages, or broken: the stand-in
        return None
    return BaseSparseAlgorithm


class _StandIn:
    """BaseSparseAlgorithm's constructor and attributes, for use without
    SGLang (sglang 0.5.23, algorithms/base_algorithm.py)."""

    def __init__(self, config, device, **kwargs):
        self.config = config
        self.device = device
        self.req_to_token_pool = None
        self.states = None


SGLANG_BASE = _sglang_base()


def _torch_module(x):
    """torch when x is a torch tensor, else None (torch is not imported
    unless the caller's objects are torch's)."""
    if type(x).__module__.split(".")[0] != "torch":
        return None
    import torch
    return torch


def _ints(x) -> np.ndarray:
    """A 1-D int64 numpy copy of a tensor, array or list (on the host)."""
    if _torch_module(x) is not None:
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.int64).reshape(-1)


def _flag(states, name: str, idx: int):
    """states.<name>[idx] as a Python value, or None without it."""
    values = getattr(states, name, None) if states is not None else None
    if values is None:
        return None
    value = values[idx]
    return value.item() if hasattr(value, "item") else value


def _set_state(states, name: str, idx: int, value) -> None:
    values = getattr(states, name, None) if states is not None else None
    if values is not None:
        values[idx] = value


def _mode(forward_batch, test: str) -> Optional[bool]:
    """forward_batch.forward_mode.<test>(), or None when the batch does not
    say (no forward_batch, or no forward_mode)."""
    mode = getattr(forward_batch, "forward_mode", None)
    check = getattr(mode, test, None)
    return None if check is None else bool(check())


@dataclass
class _Request:
    """One request (a req_to_token row) and its sequence in the context."""
    seq: int
    lengths: List[int]                  # tokens indexed per layer
    constructed: bool = False           # every layer prefilled once
    selected: List[bool] = field(default_factory=list)  # per layer: a select ran


class PQCacheAlgorithm(SGLANG_BASE or _StandIn):
    """PQCache for SGLang's sparse attention: K-Means product quantization of
    each request's keys at prefill, PQ codes for every decode token, top-k by
    the query's approximate scores at decode; the index in libpqcache, the
    keys and values in SGLang's pool. See the module's docstring."""

    def __init__(self, config, device=None, **kwargs):
        super().__init__(config, device, **kwargs)
        extra = dict(getattr(config, "sparse_extra_config", None) or {})
        extra.update(kwargs)
        self.page_size = int(getattr(config, "page_size", None) or 1)
        self.num_q_heads = extra.get("num_q_heads")
        self.kv_head_offset = int(extra.get("kv_head_offset", 0))
        self.options = {k: v for k, v in extra.items()
                        if k in _CONFIG_FIELDS and k not in _OWN_FIELDS}
        self.ctx: Optional[Context] = None
        self.token_to_kv_pool = None
        self.start_layer, self.end_layer = 0, 0
        self._requests: Dict[int, _Request] = {}
        self._next_seq = 1

    # --- SGLang's calls ------------------------------------------------------

    def initialize_representation_pool(self, start_layer: int, end_layer: int,
                                       token_to_kv_pool, req_to_token_pool, states) -> None:
        """Makes the index-only context for layers [start_layer, end_layer),
        its geometry and dtype those of the key pool."""
        self.req_to_token_pool, self.token_to_kv_pool = req_to_token_pool, token_to_kv_pool
        self.states = states
        self.start_layer, self.end_layer = int(start_layer), int(end_layer)
        keys = token_to_kv_pool.get_key_buffer(start_layer)
        if len(keys.shape) != 3:
            raise ValueError(f"pqcache.sglang: the key pool of layer {start_layer} has shape "
                             f"{tuple(keys.shape)}; expected [slots, kv_heads, head_dim]")
        if self.num_q_heads is None:
            raise ValueError("pqcache.sglang: num_q_heads (this rank's query heads) is "
                             "needed: give it in sparse_extra_config or as a keyword")
        dtype = _TORCH_DTYPES.get(str(keys.dtype)) or _NUMPY_DTYPES.get(str(keys.dtype))
        if dtype is None:
            raise ValueError(f"pqcache.sglang: keys of dtype {keys.dtype} are not supported "
                             "(float32, float16, bfloat16)")
        if self.ctx is not None:
            self.close()
        self.ctx = Context(self.end_layer - self.start_layer, int(self.num_q_heads),
                           int(keys.shape[1]), int(keys.shape[2]), dtype, kv_tier="caller",
                           selector="pq", kv_head_offset=self.kv_head_offset, **self.options)

    def construct_representations(self, layer_id: int, req_pool_indices, seq_lens, k_buffer,
                                  forward_batch=None) -> None:
        """After a prefill (extend) forward's attention at layer_id: indexes
        each request's positions [indexed, seq_len) from k_buffer through
        req_to_token (a first prefill builds the layer's index; a later
        chunk of the prompt is added by the library's build rule)."""
        if _mode(forward_batch, "is_extend") is False:
            return
        self._index(layer_id, req_pool_indices, seq_lens, k_buffer, prefill=True)

    def update_representations(self, layer_id: int, req_pool_indices, seq_lens, k_buffer,
                               forward_batch=None) -> None:
        """After a decode forward's attention at layer_id: appends each
        request's new tokens (coded with the layer's centroids)."""
        if _mode(forward_batch, "is_decode_or_idle") is False:
            return
        self._index(layer_id, req_pool_indices, seq_lens, k_buffer, prefill=False)

    def retrieve_topk(self, queries, layer_id: int, req_pool_indices, sparse_mask=None,
                      **kwargs):
        """(selected_indices [bs, max_selected] int32 padded with -1,
        valid_lengths [bs] int32): request i's selection for its decode
        query, ascending; a request that is not sparse (sparse_mask False,
        not indexed yet, or a prefill forward) gets length 0. Torch tensors
        on the queries' device when the queries are torch's, else numpy."""
        forward_batch = kwargs.get("forward_batch")
        seq_lens = kwargs.get("seq_lens")
        if seq_lens is None and forward_batch is not None:
            seq_lens = getattr(forward_batch, "seq_lens", None)
        if seq_lens is None:
            raise ValueError("pqcache.sglang: retrieve_topk needs forward_batch with seq_lens")
        idxs, lens = _ints(req_pool_indices), _ints(seq_lens)
        bs = len(idxs)
        mask = np.ones(bs, bool) if sparse_mask is None else _ints(sparse_mask).astype(bool)
        layer = int(layer_id) - self.start_layer
        rows: List[np.ndarray] = [np.empty(0, np.int32)] * bs
        decode = _mode(forward_batch, "is_extend") is not True and queries.shape[0] == bs
        if decode and self.ctx is not None:
            host = self._host_queries(queries, bs)
            for i, idx in enumerate(idxs):
                request = self._requests.get(int(idx))
                if not mask[i] or request is None or request.lengths[layer] == 0:
                    continue
                rows[i] = self._select(request, layer, host[i], int(lens[i]))
        counts = np.array([len(r) for r in rows], np.int32)
        out = np.full((bs, max(int(counts.max(initial=0)), 1)), -1, np.int32)
        for i, row in enumerate(rows):
            out[i, :len(row)] = row
        torch = _torch_module(queries)
        if torch is None:
            return out, counts
        return (torch.from_numpy(out).to(queries.device),
                torch.from_numpy(counts).to(queries.device))

    # --- request lifetime ----------------------------------------------------

    def on_request_begin(self, req) -> None:
        """A request takes a req_to_token row: a sequence still held for that
        row (its request ended without on_request_end) is freed."""
        idx = _pool_index(req)
        if idx is not None:
            self.release(idx)

    def on_request_end(self, req) -> None:
        """A request finished or was aborted: its sequence is freed."""
        idx = _pool_index(req)
        if idx is not None:
            self.release(idx)

    def release(self, req_pool_idx: int) -> None:
        """Frees the sequence of the request in req_to_token row
        req_pool_idx (nothing if it has none)."""
        request = self._requests.pop(int(req_pool_idx), None)
        if request is not None and self.ctx is not None:
            self.ctx.remove_sequence(request.seq)

    def close(self) -> None:
        """Frees every sequence and the context."""
        self._requests.clear()
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None

    # --- the work ------------------------------------------------------------

    def _request(self, idx: int, seq_len: int, layer: int) -> _Request:
        """The request in row idx, a new one (with a new sequence) when the
        row has none or was taken by another request: SGLang's
        on_request_begin resets states.repr_constructed[idx], and a request
        shorter than what the row's sequence holds cannot be the same."""
        request = self._requests.get(idx)
        reused = request is not None and (
            (request.constructed and _flag(self.states, "repr_constructed", idx) is False)
            or seq_len < request.lengths[layer])
        if reused:
            self.release(idx)
            request = None
        if request is None:
            layers = self.end_layer - self.start_layer
            request = _Request(self._next_seq, [0] * layers, selected=[False] * layers)
            self._next_seq += 1
            self.ctx.add_sequence(request.seq)
            self._requests[idx] = request
        return request

    def _index(self, layer_id: int, req_pool_indices, seq_lens, k_buffer, prefill: bool) -> None:
        if self.ctx is None:
            raise RuntimeError("pqcache.sglang: initialize_representation_pool was not called")
        layer = int(layer_id) - self.start_layer
        table = self.req_to_token_pool.req_to_token
        on_host = _on_host(k_buffer)
        pool = _host_pool(k_buffer) if on_host else None
        for idx, seq_len in zip(_ints(req_pool_indices).tolist(), _ints(seq_lens).tolist()):
            if seq_len <= 0:
                continue
            if prefill or idx in self._requests:
                request = self._request(idx, seq_len, layer)
            else:
                continue  # a decode of a request this algorithm never saw prefilled
            have = request.lengths[layer]
            if seq_len > have:
                use_prefill = have == 0 or (prefill and not request.selected[layer])
                if on_host:
                    call = (self.ctx.prefill_layer_paged if use_prefill
                            else self.ctx.decode_append_paged)
                    call(request.seq, layer, pool, slots=_ints(table[idx, :seq_len]),
                         tokens=seq_len - have)
                else:
                    keys = k_buffer[table[idx, have:seq_len].long()]  # the new rows only
                    call = self.ctx.prefill if use_prefill else self.ctx.append
                    call(request.seq, layer, keys.detach().cpu())
                request.lengths[layer] = seq_len
            if prefill and layer == self.end_layer - self.start_layer - 1:
                request.constructed = True
                _set_state(self.states, "repr_constructed", idx, True)
                _set_state(self.states, "last_constructed_page", idx, seq_len // self.page_size)

    def _host_queries(self, queries, bs: int) -> np.ndarray:
        """The decode queries as a host array [bs, q_heads, head_dim] in the
        context's dtype (bf16 as uint16 bits)."""
        heads, dim = self.ctx.num_q_heads, self.ctx.head_dim
        torch = _torch_module(queries)
        if torch is None:
            want = {"f32": np.float32, "f16": np.float16}.get(self.ctx.dtype)
            host = np.asarray(queries)
            if want is not None:
                host = host.astype(want, copy=False)
            return host.reshape(bs, heads, dim)
        dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
        host = queries.detach().reshape(bs, heads, dim).to(dtype[self.ctx.dtype]).cpu()
        if host.dtype == torch.bfloat16:
            return host.view(torch.int16).numpy().view(np.uint16)
        return host.numpy()

    def _select(self, request: _Request, layer: int, query: np.ndarray,
                seq_len: int) -> np.ndarray:
        """Request-relative positions (pages for page_size > 1) of one
        request's selection: the library's union over kv heads, then the
        positions [indexed, seq_len) the index has not seen yet."""
        positions, counts = self.ctx.select_multi(request.seq, layer, query[np.newaxis],
                                                  rows="per_request")
        request.selected[layer] = True
        have = request.lengths[layer]
        row = positions[0, :counts[0]]
        if seq_len > have:
            row = np.concatenate([row, np.arange(have, seq_len, dtype=np.int32)])
        if self.page_size > 1:
            row = np.unique(row // self.page_size).astype(np.int32)
        return row


def _pool_index(req) -> Optional[int]:
    """A Req's req_to_token row: req.req_pool_idx, or req.kv.req_pool_idx
    (sglang 0.5.23), or an int as it is."""
    if isinstance(req, (int, np.integer)):
        return int(req)
    idx = getattr(req, "req_pool_idx", None)
    if idx is None and getattr(req, "kv", None) is not None:
        idx = getattr(req.kv, "req_pool_idx", None)
    return None if idx is None else int(idx)


def _on_host(k_buffer) -> bool:
    device = getattr(k_buffer, "device", None)
    return device is None or getattr(device, "type", "cpu") == "cpu"


def _host_pool(k_buffer):
    """The key pool as the binding takes it, without a copy."""
    if _torch_module(k_buffer) is None:
        return k_buffer
    k_buffer = k_buffer.detach()
    if str(k_buffer.dtype) == "torch.bfloat16":
        import torch
        return k_buffer.view(torch.int16).numpy().view(np.uint16)
    return k_buffer.numpy()


def register(name: str = "pqcache") -> None:
    """Adds PQCacheAlgorithm to SGLang's algorithm registry (the factory's
    _ALGORITHM_REGISTRY, a private dict of sglang 0.5.23's
    mem_cache/sparsity/factory.py) under `name`, so that a sparse config
    with "algorithm": name makes one. Raises ImportError without SGLang."""
    from sglang.srt.mem_cache.sparsity import factory

    factory._ALGORITHM_REGISTRY[name] = lambda config, device, **kw: PQCacheAlgorithm(
        config, device, **kw)
