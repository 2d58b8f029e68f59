"""ctypes binding of libpqcache for Python and numpy.

A thin layer over the C API in include/pqcache.h, for the evaluation tools and
for ML users who prototype in Python. Arrays are passed to the library without
copies: a numpy array becomes a pq_tensor with its own strides, so the last
axis (head_dim) must be contiguous. Every failing call raises PQError with the
library's status and message.

The library is found through $PQCACHE_LIB (a path to libpqcache.so), then the
repository's build/ directory, then the dynamic loader's search path.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

# --- enums (mirror pqcache.h) ------------------------------------------------

DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
MEMORY_HOST, MEMORY_DEVICE = 0, 1
LAYOUT_TOKEN_MAJOR, LAYOUT_HEAD_MAJOR = 0, 1
SELECTORS = {
    "pq": 0, "exact": 1, "window": 2, "sparq": 3, "infllm": 4, "quest": 5,
    "random": 6, "h2o": 7, "scope": 8, "snapkv": 9, "pyramidkv": 10,
}
GQA_COMBINE = {"sum_softmax": 0, "max": 1, "mean": 2}
BACKENDS = {"cpu": 0, "cuda": 1, "auto": 2}
STATUS_NAMES = {
    0: "PQ_OK", -1: "PQ_ERR_INVALID_ARGUMENT", -2: "PQ_ERR_OUT_OF_MEMORY",
    -3: "PQ_ERR_BAD_STATE", -4: "PQ_ERR_NOT_FOUND", -5: "PQ_ERR_UNSUPPORTED",
    -6: "PQ_ERR_BACKEND", -7: "PQ_ERR_INTERNAL",
}

# --- structs (mirror pqcache.h; tests/test_ctypes.py checks the layout) ------


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("memory", ctypes.c_int32),
        ("tokens", ctypes.c_int64), ("heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("token_stride", ctypes.c_int64), ("head_stride", ctypes.c_int64),
    ]


class Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_layers", ctypes.c_int32), ("num_q_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("dtype", ctypes.c_int32),
        ("pq_subspaces", ctypes.c_int32), ("pq_bits", ctypes.c_int32),
        ("kmeans_iterations", ctypes.c_int32), ("kmeans_min_iterations", ctypes.c_int32),
        ("kmeans_max_iterations", ctypes.c_int32), ("kmeans_tolerance", ctypes.c_float),
        ("kmeans_init", ctypes.c_int32), ("kmeans_max_points_per_centroid", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("compute_alpha", ctypes.c_double), ("compute_beta", ctypes.c_double),
        ("compute_gamma", ctypes.c_double), ("layer_time_budget", ctypes.c_double),
        ("worker_threads", ctypes.c_int32),
        ("selector", ctypes.c_int32), ("sink_tokens", ctypes.c_int32),
        ("local_tokens", ctypes.c_int32), ("topk_tokens", ctypes.c_int32),
        ("topk_fraction", ctypes.c_float), ("gqa_combine", ctypes.c_int32),
        ("host_memory_limit", ctypes.c_uint64), ("backend", ctypes.c_int32),
        ("device_id", ctypes.c_int32), ("cuda_plugin_path", ctypes.c_char_p),
        ("sparq_dims", ctypes.c_int32), ("block_tokens", ctypes.c_int32),
        ("block_representatives", ctypes.c_int32), ("observation_window", ctypes.c_int32),
        ("pooling_kernel", ctypes.c_int32), ("pyramid_ratio", ctypes.c_float),
        ("scope_decode_share", ctypes.c_float),
        ("cache_tokens", ctypes.c_int64), ("cache_block_tokens", ctypes.c_int32),
        ("cache_policy", ctypes.c_int32),
    ]


class Selection(ctypes.Structure):
    _fields_ = [
        ("positions", ctypes.POINTER(ctypes.c_int32)),
        ("counts", ctypes.POINTER(ctypes.c_int32)),
        ("capacity", ctypes.c_int64),
    ]


class LayerInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("tokens", ctypes.c_int64),
        ("prefill_tokens", ctypes.c_int64), ("middle_tokens", ctypes.c_int64),
        ("coded_tokens", ctypes.c_int64), ("build_pending", ctypes.c_int32),
        ("kmeans_iterations", ctypes.c_int32), ("kmeans_budget", ctypes.c_int32),
        ("index_ready", ctypes.c_int32), ("build_seconds", ctypes.c_double),
        ("last_select_bytes", ctypes.c_uint64),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("sequences", ctypes.c_int64),
        ("tokens", ctypes.c_int64), ("kv_bytes", ctypes.c_uint64),
        ("index_bytes", ctypes.c_uint64), ("builds_finished", ctypes.c_uint64),
        ("builds_cancelled", ctypes.c_uint64), ("kmeans_iterations", ctypes.c_uint64),
        ("select_calls", ctypes.c_uint64), ("fetch_calls", ctypes.c_uint64),
        ("build_seconds", ctypes.c_double), ("select_seconds", ctypes.c_double),
        ("fetch_seconds", ctypes.c_double), ("bytes_scored", ctypes.c_uint64),
        ("bytes_fetched", ctypes.c_uint64),
        ("cache_hits", ctypes.c_uint64), ("cache_misses", ctypes.c_uint64),
    ]


STRUCTS = {"pq_tensor": Tensor, "pq_config": Config, "pq_selection": Selection,
           "pq_layer_info": LayerInfo, "pq_stats": Stats}


# --- loading -----------------------------------------------------------------

def _find_library() -> str:
    env = os.environ.get("PQCACHE_LIB")
    if env:
        return env
    repo_build = Path(__file__).resolve().parents[2] / "build" / "libpqcache.so"
    if repo_build.exists():
        return str(repo_build)
    return "libpqcache.so.0"


def load(path: Optional[str] = None) -> ctypes.CDLL:
    lib = ctypes.CDLL(path or _find_library())
    P, u64, i32, i64 = ctypes.POINTER, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
    sigs = {
        "pq_version_string": ([], ctypes.c_char_p),
        "pq_status_string": ([i32], ctypes.c_char_p),
        "pq_last_error": ([], ctypes.c_char_p),
        "pq_config_default": ([P(Config)], None),
        "pq_create": ([P(Config), P(ctypes.c_void_p)], i32),
        "pq_destroy": ([ctypes.c_void_p], None),
        "pq_get_backend": ([ctypes.c_void_p, P(i32)], i32),
        "pq_sequence_add": ([ctypes.c_void_p, u64], i32),
        "pq_sequence_remove": ([ctypes.c_void_p, u64], i32),
        "pq_sequence_length": ([ctypes.c_void_p, u64, i32, P(i64)], i32),
        "pq_prefill_layer": ([ctypes.c_void_p, u64, i32, P(Tensor), P(Tensor)], i32),
        "pq_decode_append": ([ctypes.c_void_p, u64, i32, P(Tensor), P(Tensor)], i32),
        "pq_prefill_queries": ([ctypes.c_void_p, u64, i32, P(Tensor)], i32),
        "pq_selection_capacity": ([ctypes.c_void_p, u64, i32, P(i64)], i32),
        "pq_decode_select": ([ctypes.c_void_p, u64, i32, P(Tensor), P(Selection)], i32),
        "pq_observe_attention": ([ctypes.c_void_p, u64, i32, P(Selection),
                                  P(ctypes.c_float)], i32),
        "pq_fetch_kv": ([ctypes.c_void_p, u64, i32, P(Selection), P(Tensor), P(Tensor)], i32),
        "pq_layer_info_get": ([ctypes.c_void_p, u64, i32, P(LayerInfo)], i32),
        "pq_index_codes": ([ctypes.c_void_p, u64, i32, i32, i64, i64, P(ctypes.c_uint8)], i32),
        "pq_index_centroids": ([ctypes.c_void_p, u64, i32, i32, P(ctypes.c_float), i64], i32),
        "pq_stats_get": ([ctypes.c_void_p, P(Stats)], i32),
        "pq_wait_builds": ([ctypes.c_void_p], i32),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


_LIB: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = load()
    return _LIB


class PQError(RuntimeError):
    """A libpqcache call failed: .status (int), .name, .message."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.name = STATUS_NAMES.get(status, "unknown pq_status")
        self.message = message
        super().__init__(f"{self.name}: {message}")


def _check(status: int) -> None:
    if status != 0:
        raise PQError(status, (lib().pq_last_error() or b"").decode(errors="replace"))


def version() -> str:
    return lib().pq_version_string().decode()


# --- tensors -----------------------------------------------------------------

def _dtype_code(array: np.ndarray, dtype: Optional[str]) -> int:
    if dtype == "bf16":
        if array.dtype != np.uint16:
            raise TypeError("bf16 data must be passed as a uint16 array of the raw bits")
        return DTYPE_BF16
    if array.dtype == np.float32:
        return DTYPE_F32
    if array.dtype == np.float16:
        return DTYPE_F16
    raise TypeError(f"unsupported array dtype {array.dtype}; use float32, float16 or "
                    "uint16 with dtype='bf16'")


def tensor(array: np.ndarray, layout: str = "token_major", dtype: Optional[str] = None) -> Tensor:
    """A pq_tensor view of a 3-D array, [tokens][heads][dim] ("token_major") or
    [heads][tokens][dim] ("head_major"). The array must stay alive while used."""
    if array.ndim != 3:
        raise ValueError(f"expected a 3-D array, got shape {array.shape}")
    if array.strides[2] != array.itemsize:
        raise ValueError("the last axis (head_dim) must be contiguous")
    item = array.itemsize
    if layout == "token_major":
        tokens, heads, dim = array.shape
        ts, hs = array.strides[0] // item, array.strides[1] // item
    elif layout == "head_major":
        heads, tokens, dim = array.shape
        hs, ts = array.strides[0] // item, array.strides[1] // item
    else:
        raise ValueError(f"unknown layout {layout!r}")
    return Tensor(array.ctypes.data, _dtype_code(array, dtype), MEMORY_HOST, tokens, heads, dim,
                  ts, hs)


# --- the context -------------------------------------------------------------

class Context:
    """A libpqcache context. Keyword arguments set pq_config fields by name;
    selector, gqa_combine and backend also accept their names ("pq", "max", ...)."""

    def __init__(self, num_layers: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: str = "f16", **options):
        cfg = Config()
        lib().pq_config_default(ctypes.byref(cfg))
        cfg.num_layers, cfg.num_q_heads = num_layers, num_q_heads
        cfg.num_kv_heads, cfg.head_dim = num_kv_heads, head_dim
        cfg.dtype = {"f32": DTYPE_F32, "f16": DTYPE_F16, "bf16": DTYPE_BF16}[dtype]
        names = {"selector": SELECTORS, "gqa_combine": GQA_COMBINE, "backend": BACKENDS}
        for key, value in options.items():
            if key in names and isinstance(value, str):
                value = names[key][value]
            if not hasattr(cfg, key) or key == "struct_size":
                raise TypeError(f"unknown pq_config field {key!r}")
            setattr(cfg, key, value)
        self._dtype = dtype
        self.num_kv_heads, self.num_q_heads, self.head_dim = num_kv_heads, num_q_heads, head_dim
        handle = ctypes.c_void_p()
        _check(lib().pq_create(ctypes.byref(cfg), ctypes.byref(handle)))
        self._ctx = handle

    def close(self) -> None:
        if self._ctx:
            lib().pq_destroy(self._ctx)
            self._ctx = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _t(self, array: np.ndarray, layout: str) -> Tensor:
        return tensor(array, layout, "bf16" if self._dtype == "bf16" else None)

    # sequences
    def add_sequence(self, seq: int) -> None:
        _check(lib().pq_sequence_add(self._ctx, seq))

    def remove_sequence(self, seq: int) -> None:
        _check(lib().pq_sequence_remove(self._ctx, seq))

    def length(self, seq: int, layer: int) -> int:
        out = ctypes.c_int64()
        _check(lib().pq_sequence_length(self._ctx, seq, layer, ctypes.byref(out)))
        return out.value

    # prefill and decode
    def prefill(self, seq: int, layer: int, keys: np.ndarray, values: np.ndarray,
                layout: str = "token_major") -> None:
        k, v = self._t(keys, layout), self._t(values, layout)
        _check(lib().pq_prefill_layer(self._ctx, seq, layer, ctypes.byref(k), ctypes.byref(v)))

    def append(self, seq: int, layer: int, keys: np.ndarray, values: np.ndarray,
               layout: str = "token_major") -> None:
        k, v = self._t(keys, layout), self._t(values, layout)
        _check(lib().pq_decode_append(self._ctx, seq, layer, ctypes.byref(k), ctypes.byref(v)))

    def prefill_queries(self, seq: int, layer: int, queries: np.ndarray) -> None:
        q = self._t(queries, "token_major")
        _check(lib().pq_prefill_queries(self._ctx, seq, layer, ctypes.byref(q)))

    def capacity(self, seq: int, layer: int) -> int:
        out = ctypes.c_int64()
        _check(lib().pq_selection_capacity(self._ctx, seq, layer, ctypes.byref(out)))
        return out.value

    def select(self, seq: int, layer: int, query: np.ndarray) -> "SelectionResult":
        """query: [num_q_heads][head_dim]. Returns the selection per kv head."""
        q = self._t(query.reshape(1, *query.shape), "token_major")
        cap = self.capacity(seq, layer)
        result = SelectionResult(self.num_kv_heads, cap)
        _check(lib().pq_decode_select(self._ctx, seq, layer, ctypes.byref(q),
                                      ctypes.byref(result.c)))
        return result

    def observe_attention(self, seq: int, layer: int, selection: "SelectionResult",
                          probs: np.ndarray) -> None:
        """probs: [num_kv_heads][capacity] float32, aligned with selection.positions."""
        probs = np.ascontiguousarray(probs, dtype=np.float32)
        if probs.shape != (self.num_kv_heads, selection.capacity):
            raise ValueError(f"probs must be {(self.num_kv_heads, selection.capacity)}")
        _check(lib().pq_observe_attention(
            self._ctx, seq, layer, ctypes.byref(selection.c),
            probs.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))

    def fetch(self, seq: int, layer: int, selection: "SelectionResult"):
        """Returns (keys, values), each [num_kv_heads][capacity][head_dim]; rows past
        selection.counts[h] are zero."""
        np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[self._dtype]
        shape = (self.num_kv_heads, max(selection.capacity, 1), self.head_dim)
        keys, values = np.zeros(shape, np_dtype), np.zeros(shape, np_dtype)
        k, v = self._t(keys, "head_major"), self._t(values, "head_major")
        _check(lib().pq_fetch_kv(self._ctx, seq, layer, ctypes.byref(selection.c),
                                 ctypes.byref(k), ctypes.byref(v)))
        return keys, values

    # introspection
    def layer_info(self, seq: int, layer: int) -> Dict[str, float]:
        info = LayerInfo()
        info.struct_size = ctypes.sizeof(LayerInfo)
        _check(lib().pq_layer_info_get(self._ctx, seq, layer, ctypes.byref(info)))
        return {name: getattr(info, name) for name, _ in LayerInfo._fields_[1:]}

    def stats(self) -> Dict[str, float]:
        st = Stats()
        st.struct_size = ctypes.sizeof(Stats)
        _check(lib().pq_stats_get(self._ctx, ctypes.byref(st)))
        return {name: getattr(st, name) for name, _ in Stats._fields_[1:]}

    def codes(self, seq: int, layer: int, kv_head: int, first: int, count: int,
              subspaces: int) -> np.ndarray:
        out = np.zeros((count, subspaces), np.uint8)
        _check(lib().pq_index_codes(self._ctx, seq, layer, kv_head, first, count,
                                    out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))))
        return out

    def wait_builds(self) -> None:
        _check(lib().pq_wait_builds(self._ctx))


class SelectionResult:
    """Caller-owned selection buffers: positions [kv_heads][capacity], counts [kv_heads]."""

    def __init__(self, kv_heads: int, capacity: int):
        self.capacity = capacity
        self.positions = np.full((kv_heads, max(capacity, 1)), -1, np.int32)
        self.counts = np.zeros(kv_heads, np.int32)
        self.c = Selection(self.positions.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                           self.counts.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), capacity)

    def heads(self) -> List[np.ndarray]:
        return [self.positions[h, : self.counts[h]] for h in range(len(self.counts))]
