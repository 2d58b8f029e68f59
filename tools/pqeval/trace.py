"""Reading and writing .pqtrace attention traces (docs/trace-format.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

MAGIC = "PQTRACE 1"


def _align64(x: int) -> int:
    return (x + 63) & ~63


@dataclass
class Trace:
    model: str
    text: str
    token_ids: np.ndarray              # int32 [N]
    layers: List[int]                  # model layer indices
    queries: Dict[int, np.ndarray]     # layer -> [N - q_first][q_heads][head_dim]
    keys: Dict[int, np.ndarray]        # layer -> [N][kv_heads][head_dim]
    values: Dict[int, np.ndarray]      # layer -> [N][kv_heads][head_dim]
    q_first: int = 0
    model_layers: int = 0              # the model's depth (0: unknown)

    @property
    def tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def geometry(self):
        k = self.keys[self.layers[0]]
        q = self.queries[self.layers[0]]
        return q.shape[1], k.shape[1], k.shape[2]  # q_heads, kv_heads, head_dim


def write(path: str | Path, trace: Trace, dtype: str = "f16") -> None:
    np_dtype = {"f16": np.float16, "f32": np.float32}[dtype]
    q_heads, kv_heads, head_dim = trace.geometry
    for name in (trace.model, trace.text):
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"model and text names must be non-empty without spaces: {name!r}")
    lines = [
        MAGIC, f"model {trace.model}", f"text {trace.text}", f"dtype {dtype}",
        f"tokens {trace.tokens}", f"q_first {trace.q_first}", f"q_heads {q_heads}",
        f"kv_heads {kv_heads}", f"head_dim {head_dim}",
        "layers " + " ".join(str(l) for l in trace.layers),
    ]
    if trace.model_layers:
        lines.append(f"model_layers {trace.model_layers}")
    header = "\n".join(lines) + "\n"
    # data_offset must itself appear in the header: size it with a fixed width.
    offset = _align64(len(header) + len("data_offset 0000000000\nend\n"))
    header += f"data_offset {offset:010d}\nend\n"
    arrays = [np.ascontiguousarray(trace.token_ids, dtype="<i4")]
    n, f = trace.tokens, trace.q_first
    for layer in trace.layers:
        q = np.ascontiguousarray(trace.queries[layer], dtype=np_dtype)
        k = np.ascontiguousarray(trace.keys[layer], dtype=np_dtype)
        v = np.ascontiguousarray(trace.values[layer], dtype=np_dtype)
        if q.shape != (n - f, q_heads, head_dim) or k.shape != (n, kv_heads, head_dim) or \
                v.shape != k.shape:
            raise ValueError(f"layer {layer}: shapes {q.shape} {k.shape} {v.shape} do not match")
        arrays += [q, k, v]
    with open(path, "wb") as out:
        out.write(header.encode("ascii"))
        out.write(b"\0" * (offset - len(header)))
        at = offset
        for a in arrays:
            pad = _align64(at) - at
            out.write(b"\0" * pad)
            at += pad
            out.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
            at += a.nbytes


def read(path: str | Path) -> Trace:
    raw = Path(path).read_bytes()
    end = raw.index(b"end\n")
    header = raw[:end].decode("ascii").splitlines()
    if not header or header[0] != MAGIC:
        raise ValueError(f"{path}: not a {MAGIC} file")
    meta: Dict[str, str] = {}
    for line in header[1:]:
        key, _, value = line.partition(" ")
        meta[key] = value
    dtype = {"f16": np.dtype("<f2"), "f32": np.dtype("<f4")}[meta["dtype"]]
    n, f = int(meta["tokens"]), int(meta["q_first"])
    qh, kvh, hd = int(meta["q_heads"]), int(meta["kv_heads"]), int(meta["head_dim"])
    layers = [int(x) for x in meta["layers"].split()]
    at = int(meta["data_offset"])

    def take(count: int, dt: np.dtype, shape: Sequence[int]) -> np.ndarray:
        nonlocal at
        at = _align64(at)
        a = np.frombuffer(raw, dtype=dt, count=count, offset=at).reshape(shape)
        at += a.nbytes
        return a

    ids = take(n, np.dtype("<i4"), (n,))
    queries, keys, values = {}, {}, {}
    for layer in layers:
        queries[layer] = take((n - f) * qh * hd, dtype, (n - f, qh, hd))
        keys[layer] = take(n * kvh * hd, dtype, (n, kvh, hd))
        values[layer] = take(n * kvh * hd, dtype, (n, kvh, hd))
    depth = int(meta.get("model_layers", max(layers) + 1))
    return Trace(meta.get("model", ""), meta.get("text", ""), ids, layers, queries, keys,
                 values, f, depth)
