"""Why PQ's middle mass on a layer can be all or nothing: tokens that share
one code tuple share one PQ score, so a group that draws much of the
attention is selected whole or dropped whole. For one decode step of a trace
this lists the code-tuple groups that hold the most middle mass, where the
exact scores and PQ's scores rank them, and whether the library selected them.

    python3 -m pqeval.code_groups TRACE --layers 11 --iterations 10 25

Scores are the library's default GQA combine (the sum over the group's query
heads of each head's softmax over the middle tokens), from the exact keys
and from the keys PQ reconstructs out of its codes and centroids; "selected"
is the library's own selection at the same step. Over the coded middle
tokens (neither sink nor local, and coded at prefill): "middle mass" is a
group's share of the exact combined score, "rank" the median 1-based rank of
its tokens, "logit gap" their mean logit (over query heads) above the mean.
"""

from __future__ import annotations

import argparse
import math
from typing import Dict, List, Optional

import numpy as np

import pqcache
from pqeval import replay, trace as trace_io


def _combined(logits: np.ndarray) -> np.ndarray:
    """Sum over query heads of each head's softmax: logits [g][n]."""
    return replay._softmax_rows(logits).sum(axis=0)


def _median_rank(scores: np.ndarray, members: np.ndarray) -> float:
    """Median 1-based rank of `members` when `scores` are sorted descending."""
    ranks = np.empty(len(scores), np.int64)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return float(np.median(ranks[members]))


def groups(t: trace_io.Trace, layer: int, kv_head: int = 0, step: int = 0,
           fraction: float = 0.2, top: int = 5, **config) -> Dict:
    """The `top` code-tuple groups by middle mass at decode step `step` of
    `layer`. `config` sets further pq_config fields (e.g. kmeans_iterations)."""
    q_heads, kv_heads, head_dim = t.geometry
    group = q_heads // kv_heads
    if layer not in t.layers:
        raise ValueError(f"layer {layer} is not in the trace (it holds {list(t.layers)})")
    if not 0 <= kv_head < kv_heads:
        raise ValueError(f"kv_head {kv_head} is outside [0, {kv_heads})")
    window = min(replay.OBSERVATION_WINDOW, t.tokens - t.q_first - 1)
    prompt = t.q_first + window
    if not 0 <= step < t.tokens - prompt:
        raise ValueError(f"step {step} is outside the trace's {t.tokens - prompt} decode steps")
    opts = dict(selector="pq", topk_fraction=fraction, observation_window=window, **config)
    keys = np.asarray(t.keys[layer])
    dtype = "f16" if keys.dtype == np.float16 else "f32"
    ctx = pqcache.Context(max(t.model_layers, layer + 1), q_heads, kv_heads, head_dim, dtype,
                          **opts)
    try:
        ctx.add_sequence(0)
        ctx.prefill(0, layer, keys[:prompt], np.asarray(t.values[layer])[:prompt])
        for p in range(prompt, prompt + step + 1):
            ctx.append(0, layer, keys[p:p + 1], np.asarray(t.values[layer])[p:p + 1])
        p = prompt + step
        query = np.asarray(t.queries[layer])[p - t.q_first]
        selected = ctx.select(0, layer, query).heads()[kv_head]
        codes = ctx.codes(0, layer, kv_head, 0, prompt).astype(np.int64)
        centroids = ctx.centroids(0, layer, kv_head)
        iterations = int(ctx.layer_info(0, layer)["kmeans_iterations"])
    finally:
        ctx.close()
    m = centroids.shape[0]
    sink = replay.ctx_sink(opts)
    mid_end = min(prompt, p + 1 - replay.ctx_local(opts, p + 1, sink))  # coded middle tokens
    q = query.astype(np.float32).reshape(kv_heads, group, head_dim)[kv_head]
    exact_keys = keys[sink:mid_end, kv_head].astype(np.float32)
    pq_keys = np.concatenate([centroids[s][codes[sink:mid_end, s]] for s in range(m)], axis=1)
    scale = 1.0 / math.sqrt(head_dim)
    exact_by_head = (q @ exact_keys.T) * scale           # [g][middle]
    pq_by_head = (q @ pq_keys.T) * scale
    exact = _combined(exact_by_head)
    approx = _combined(pq_by_head)
    ids, inverse = np.unique(codes[sink:mid_end], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    mass = np.bincount(inverse, weights=exact / exact.sum())
    exact_logits = exact_by_head.mean(axis=0)
    pq_logits = pq_by_head.mean(axis=0)
    out: List[Dict] = []
    for g in np.argsort(-mass)[:top]:
        members = np.nonzero(inverse == g)[0]
        out.append({
            "codes": [int(c) for c in codes[sink + members[0]]],
            "tokens": int(len(members)),
            "middle_mass": float(mass[g]),
            "exact_rank": _median_rank(exact, members),
            "pq_rank": _median_rank(approx, members),
            "selected": int(np.isin(members + sink, selected).sum()),
            "exact_logit_gap": float(exact_logits[members].mean() - exact_logits.mean()),
            "pq_logit_gap": float(pq_logits[members].mean() - pq_logits.mean()),
        })
    k = int(np.count_nonzero((selected >= sink) & (selected < mid_end)))
    return {"layer": layer, "position": p, "middle_tokens": int(mid_end - sink),
            "selected_middle": k, "distinct_tuples": int(len(ids)),
            "kmeans_iterations": iterations, "groups": out}


def format_groups(r: Dict) -> str:
    lines = [f"layer {r['layer']}, position {r['position']}, {r['kmeans_iterations']} K-Means "
             f"iterations run: {r['distinct_tuples']} code tuples over {r['middle_tokens']} coded "
             f"middle tokens, {r['selected_middle']} selected",
             "| codes | tokens | middle mass | exact rank | PQ rank | selected | logit gap exact | "
             "logit gap PQ |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for g in r["groups"]:
        lines.append(f"| {g['codes']} | {g['tokens']} | {g['middle_mass']:.3f} | "
                     f"{g['exact_rank']:.0f} | {g['pq_rank']:.0f} | {g['selected']} | "
                     f"{g['exact_logit_gap']:+.2f} | {g['pq_logit_gap']:+.2f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python3 -m pqeval.code_groups", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a .pqtrace file (tools/pqeval/trace.py)")
    ap.add_argument("--layers", type=int, nargs="+", help="default: every layer of the trace")
    ap.add_argument("--iterations", type=int, nargs="+", default=[None],
                    help="K-Means iterations to compare (default: the library's)")
    ap.add_argument("--step", type=int, default=0, help="decode step (default 0)")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                    help="a further pq_config field, e.g. --set pq_bits=8 (repeatable)")
    ap.add_argument("--pairs", action="store_true",
                    help="reorder each head's dimensions into rotary pairs first (longtrace.py)")
    args = ap.parse_args(argv)
    fields = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            fields[name] = int(value)
        except ValueError:
            ap.error(f"--set {item!r}: expected FIELD=INT")
    t = trace_io.read(args.trace)
    if args.pairs:
        from pqeval.longtrace import rotary_pairs
        t = rotary_pairs(t)
    for layer in args.layers or t.layers:
        for it in args.iterations:
            config = dict(fields) if it is None else {**fields, "kmeans_iterations": it}
            try:
                r = groups(t, layer, step=args.step, fraction=args.fraction, top=args.top, **config)
            except (ValueError, pqcache.PQError) as e:
                ap.error(str(e))
            print(format_groups(r), end="\n\n")


if __name__ == "__main__":
    main()
