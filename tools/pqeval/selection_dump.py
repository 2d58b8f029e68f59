"""A selector's selections over a trace, saved to compare two builds of the
library on the same real keys and queries.

    PYTHONPATH=build/python:tools python3 -m pqeval.selection_dump TRACE OUT.npz \\
        [--layers 3,15,27] [--steps 128] [--fraction 0.2]
    python3 -m pqeval.selection_dump --compare A.npz B.npz

Each layer is prefilled with the trace's keys and values up to the decode
steps, then every step appends its token and selects with the trace's query.
Run it once per build (LD_LIBRARY_PATH picks the libpqcache.so.0 the binding
loads); --compare prints, per layer, the share of selected middle positions
both builds chose and the steps whose selections differ at all. Used to
measure what the tuple path of PQ selection (src/pq/pq_tuple_select.cpp)
changes on real data: its group-softmax combine rounds differently from the
per-token pipeline (docs/perf.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import List

import numpy as np

from pqeval import trace as trace_io


def dump(trace_path: str, out: str, layers: List[int], steps: int, fraction: float) -> None:
    import pqcache

    t = trace_io.read(trace_path)
    q_heads, kv_heads, head_dim = t.geometry
    first = t.tokens - steps
    if first < 0 or first < t.q_first:
        sys.exit(f"the trace has queries for {t.tokens - t.q_first} positions; asked {steps} steps")
    saved = {"version": np.array(pqcache.version())}
    for layer in layers:
        K, V, Q = (np.asarray(a[layer]) for a in (t.keys, t.values, t.queries))
        dtype = "f16" if K.dtype == np.float16 else "f32"
        with pqcache.Context(max(t.model_layers, layer + 1), q_heads, kv_heads, head_dim, dtype,
                             selector="pq", topk_fraction=fraction) as ctx:
            cfg = ctx.config()
            sink, local = cfg["sink_tokens"], cfg["local_tokens"]
            ctx.add_sequence(0)
            ctx.prefill(0, layer, K[:first], V[:first])
            rows = []
            for p in range(first, t.tokens):
                ctx.append(0, layer, K[p:p + 1], V[p:p + 1])
                sel = ctx.select(0, layer, Q[p - t.q_first])
                # the middle only: sinks and the local window are the same in any build
                heads = [np.sort(np.asarray(h)) for h in sel.heads()]
                rows.append([h[(h >= sink) & (h < p + 1 - local)] for h in heads])
        saved[f"layer{layer}"] = np.array(
            [np.concatenate([np.full(1, len(h)), h]) for step in rows for h in step], dtype=object)
        saved[f"layer{layer}_shape"] = np.array([len(rows), kv_heads])
    np.savez(out, **saved)
    print(f"wrote {out}: libpqcache {saved['version']}, {len(layers)} layers x {steps} steps")


def compare(a_path: str, b_path: str) -> None:
    a, b = np.load(a_path, allow_pickle=True), np.load(b_path, allow_pickle=True)
    print(f"A: libpqcache {a['version']}   B: libpqcache {b['version']}")
    total = shared = 0
    for key in sorted(k for k in a.files if k.startswith("layer") and not k.endswith("shape")):
        steps, kv_heads = a[f"{key}_shape"]
        diff_steps = set()
        lt = ls = 0
        for i, (x, y) in enumerate(zip(a[key], b[key])):
            x, y = x[1:], y[1:]
            common = len(np.intersect1d(x, y))
            lt += max(len(x), len(y))
            ls += common
            if common != len(x) or len(x) != len(y):
                diff_steps.add(i // kv_heads)
        total += lt
        shared += ls
        print(f"{key}: {ls} of {lt} selected positions shared ({ls / max(lt, 1):.6f}); "
              f"{len(diff_steps)} of {steps} steps differ")
    print(f"all: {shared} of {total} ({shared / max(total, 1):.6f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs=2)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--layers", default="")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--fraction", type=float, default=0.2)
    args = ap.parse_args()
    if args.compare:
        compare(*args.paths)
        return
    t = trace_io.read(args.paths[0])
    layers = [int(x) for x in args.layers.split(",")] if args.layers else list(t.layers)
    dump(args.paths[0], args.paths[1], layers, args.steps, args.fraction)


if __name__ == "__main__":
    main()
