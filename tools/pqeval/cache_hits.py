"""Block-cache hit rates on a real attention trace.

Replays the decode steps of a .pqtrace through libpqcache with the PQ
selector (select + fetch, as a server does) and reports the share of fetched
middle tokens the block cache (paper section 3.4) held, for several cache
sizes, block sizes and both eviction policies. The cache's bookkeeping is the
same on every backend, so these hit rates hold for the CUDA backend's device
cache of the same size; on the CPU backend the data comes from host memory
either way.

    python3 -m pqeval.cache_hits tests/data/smollm2_sotu_2k.pqtrace
"""

from __future__ import annotations

import argparse
from typing import Dict, Iterable, List, Optional

import numpy as np

import pqcache

from . import trace as trace_io


def hit_rate(t: trace_io.Trace, cache_tokens: int, block_tokens: int, policy: str,
             fraction: float = 0.2, steps: Optional[int] = None,
             layers: Optional[Iterable[int]] = None, update_blocks: int = 0) -> Dict[str, float]:
    """Hit rate of one cache configuration, over the traced layers' decode
    steps (one context per layer, the prompt prefilled, then append + select
    + fetch per step)."""
    q_heads, kv_heads, head_dim = t.geometry
    last = t.tokens if steps is None else min(t.tokens, t.q_first + steps)
    hits = misses = 0
    for layer in (layers if layers is not None else t.layers):
        K = np.asarray(t.keys[layer])
        V = np.asarray(t.values[layer])
        Q = np.asarray(t.queries[layer])
        dtype = "f16" if K.dtype == np.float16 else "f32"
        with pqcache.Context(layer + 1, q_heads, kv_heads, head_dim, dtype, selector="pq",
                             topk_fraction=fraction, cache_tokens=cache_tokens,
                             cache_block_tokens=block_tokens, cache_policy=policy,
                             cache_update_blocks=update_blocks) as ctx:
            ctx.add_sequence(0)
            ctx.prefill(0, layer, K[:t.q_first], V[:t.q_first])
            for p in range(t.q_first, last):
                ctx.append(0, layer, K[p:p + 1], V[p:p + 1])
                sel = ctx.select(0, layer, Q[p - t.q_first])
                ctx.fetch(0, layer, sel)
            s = ctx.stats()
            hits += s["cache_hits"]
            misses += s["cache_misses"]
    return {"hits": hits, "misses": misses, "rate": hits / max(hits + misses, 1)}


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--cache-tokens", default="128,256,512,1024")
    ap.add_argument("--block-tokens", default="16,32,64")
    ap.add_argument("--update-blocks", default="0",
                    help="k_cache values, blocks ranked per update (0: all slots)")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--steps", type=int, default=None, help="decode steps per layer (default all)")
    args = ap.parse_args(argv)
    t = trace_io.read(args.trace)
    print(f"trace {args.trace}: {t.model}, {t.tokens} tokens ({t.q_first} prompt), "
          f"layers {t.layers}, top-k 1/{round(1 / args.fraction)}")
    print("| cache tokens | block tokens | k_cache | LRU hit rate | LFU hit rate |")
    print("|---:|---:|---:|---:|---:|")
    for cache in (int(c) for c in args.cache_tokens.split(",")):
        for block in (int(b) for b in args.block_tokens.split(",")):
            if block > cache:
                continue
            for k_cache in (int(k) for k in args.update_blocks.split(",")):
                if k_cache > cache // block:
                    continue
                lru = hit_rate(t, cache, block, "lru", args.fraction, args.steps,
                               update_blocks=k_cache)
                lfu = hit_rate(t, cache, block, "lfu", args.fraction, args.steps,
                               update_blocks=k_cache)
                shown = k_cache or cache // block
                print(f"| {cache} | {block} | {shown} | {lru['rate']:.3f} | {lfu['rate']:.3f} |")


if __name__ == "__main__":
    main()
