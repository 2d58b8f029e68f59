"""Issue 44's question about lost needles: when the exact top-k holds a
needle's tokens and PQ's selection at the same budget does not, why not, and
would keeping the keys the codebook represents worst (the largest
quantization residuals) exact bring them back?

For each task prompt (pqeval.tasks, the shipped texts) the prompt and its
reference answer, teacher-forced, are traced through the transformers model
(pqeval.capture.capture_transformers, every layer). At each answer step,
layer and kv head, two libpqcache contexts select from the step's query at
the budget: PQ as the transformers Session configures it (the default
setting, rotary pairs declared) and the exact top-k. For each token of the
needle's value in the middle (a "cell"), the study records whether each
selection holds it, its rank by exact and by PQ score, the rank of its
quantization residual |k - centroids(codes)| among the middle's, and its
exact attention mass (the GQA group's softmax, summed and divided by the
group).

Then it replays, in numpy, PQ with outliers scored exactly as
config.pq_outliers defines it (the tokens whose residual reaches the share's
threshold over the prompt's coded tokens weigh their exact logits against
the code logits' softmax normaliser): `outliers 0` is PQ itself recomputed
from the index (it must agree with the library's selection, which the report
shows), each share says which of the oracle's needle cells it keeps, and the
last column is the library's own selection with pq_outliers 0.01.

    python3 -m pqeval.needle_study --model smollm2-135m --length 4096 \\
        --tasks niah_single,niah_multikey --seeds 0,1,2 --fraction 0.2 \\
        > ../docs/quality-data/needle-study-4k.md
"""
from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

SHARES = (0.0, 0.01, 0.02, 0.05)
LIB_SHARE = 0.01   # the library's own pq_outliers row
SINK, LOCAL = 4, 128   # the Session's (and the library's) defaults


@dataclass
class Cell:
    layer: int
    step: int           # answer token index
    kv_head: int
    token: int          # position of the needle token
    in_exact: bool
    in_pq: bool
    exact_rank: int     # 0 = the middle's highest exact score (GQA-combined)
    pq_rank: int
    residual_share: float  # rank of its residual / middle tokens (0 = largest)
    mass: float         # exact attention mass, per query head of the group
    kept_by: Tuple[bool, ...]  # in the numpy selection with SHARES[i] kept exact
    in_lib_outliers: bool  # in the library's selection with pq_outliers = LIB_SHARE


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def outlier_threshold(residuals: np.ndarray, share: float) -> float:
    """The residual that `share` of `residuals` reach (pq_outliers: the
    ceil(share x n)-th largest); +inf for share 0."""
    if share <= 0 or residuals.size == 0:
        return math.inf
    wanted = min(residuals.size, max(1, math.ceil(share * residuals.size)))
    return float(np.sort(residuals)[::-1][wanted - 1])


def outlier_exact_selection(exact: np.ndarray, approx: np.ndarray, outliers: np.ndarray,
                            k: int) -> np.ndarray:
    """The top k of the middle (indices, unordered) as pq_outliers selects:
    each token's GQA sum of softmaxes of its `approx` logits [group][n],
    except the `outliers` (a boolean mask [n]), whose exact logits weigh
    exp(exact - L_g) against the code logits' log normaliser L_g."""
    top = approx.max(axis=1, keepdims=True)
    log_norm = top + np.log(np.exp(approx - top).sum(axis=1, keepdims=True))
    combined = np.exp(approx - log_norm).sum(axis=0)
    combined[outliers] = np.exp(exact[:, outliers] - log_norm).sum(axis=0)
    return np.argsort(-combined, kind="stable")[:k]


def _ranks(scores: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(-scores, kind="stable"), kind="stable")


def study_trace(t, n_prompt: int, answer_tokens: int, needle: Sequence[int], fraction: float,
                shares: Sequence[float] = SHARES) -> Tuple[List[Cell], int]:
    """The cells of one traced prompt and the number of needle cells in which
    numpy's PQ (share 0) and the library's disagree."""
    import pqcache

    q_heads, kv_heads, dim = t.geometry
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(dim)
    # The codebook reads rotary-half keys in pairs (pq_key_rotary).
    order = np.array([x for i in range(dim // 2) for x in (i, i + dim // 2)])
    cells: List[Cell] = []
    disagree = 0
    for layer in t.layers:
        K = np.asarray(t.keys[layer], np.float32)
        V = np.asarray(t.values[layer], np.float32)
        Q = np.asarray(t.queries[layer], np.float32)
        opts = dict(topk_fraction=fraction, key_rotary="half")
        ctx = {name: pqcache.Context(t.model_layers, q_heads, kv_heads, dim, "f32",
                                     selector=name, **opts) for name in ("pq", "exact")}
        ctx["pq-outliers"] = pqcache.Context(t.model_layers, q_heads, kv_heads, dim, "f32",
                                             selector="pq", pq_outliers=LIB_SHARE, **opts)
        try:
            for c in ctx.values():
                c.add_sequence(0)
                c.prefill(0, layer, K[:n_prompt - 1], V[:n_prompt - 1])
            centroids = [ctx["pq"].centroids(0, layer, h) for h in range(kv_heads)]
            m = centroids[0].shape[0]
            sub = dim // m

            def residuals_of(h: int, first: int, end: int) -> np.ndarray:
                codes = ctx["pq"].codes(0, layer, h, first, end - first).astype(np.int64)
                rebuilt = centroids[h][np.arange(m)[None, :], codes]
                keys = K[first:end, h][:, order].reshape(end - first, m, sub)
                return np.linalg.norm((keys - rebuilt).reshape(end - first, -1), axis=1) ** 2

            # The build's thresholds: over the prompt's tokens coded past the sinks.
            thresholds = [[outlier_threshold(residuals_of(h, SINK, n_prompt - 1), s)
                           for s in shares] for h in range(kv_heads)]
            for step in range(answer_tokens):
                pos = n_prompt - 1 + step
                for c in ctx.values():
                    c.append(0, layer, K[pos:pos + 1], V[pos:pos + 1])
                q = Q[pos - t.q_first]
                chosen = {name: c.select(0, layer, q).heads() for name, c in ctx.items()}
                mid_end = pos + 1 - min(LOCAL, pos + 1 - SINK)
                n = mid_end - SINK
                for h in range(kv_heads):
                    codes = ctx["pq"].codes(0, layer, h, SINK, n).astype(np.int64)
                    rebuilt = centroids[h][np.arange(m)[None, :], codes]       # [n][m][sub]
                    residual = residuals_of(h, SINK, mid_end)
                    qh = Q[pos - t.q_first, h * group:(h + 1) * group]
                    exact = (qh @ K[SINK:mid_end, h].T) * scale
                    approx = np.einsum("gms,nms->gn", qh[:, order].reshape(group, m, sub),
                                       rebuilt) * scale
                    exact_mass = _softmax_rows(exact).sum(axis=0)
                    pq_sel = {x for x in chosen["pq"][h] if SINK <= x < mid_end}
                    exact_sel = set(chosen["exact"][h])
                    lib_outliers = set(chosen["pq-outliers"][h])
                    kept = [set((outlier_exact_selection(exact, approx, residual >= thr,
                                                         len(pq_sel)) + SINK).tolist())
                            for thr in thresholds[h]]
                    ex_rank, pq_rank = _ranks(exact_mass), _ranks(_softmax_rows(approx).sum(0))
                    res_rank = _ranks(residual)
                    for token in needle:
                        if not SINK <= token < mid_end:
                            continue
                        j = token - SINK
                        in_pq = token in pq_sel
                        disagree += int(in_pq != (token in kept[0]))
                        cells.append(Cell(layer, step, h, token, token in exact_sel, in_pq,
                                          int(ex_rank[j]), int(pq_rank[j]),
                                          float(res_rank[j]) / n, float(exact_mass[j]) / group,
                                          tuple(token in s for s in kept),
                                          token in lib_outliers))
        finally:
            for c in ctx.values():
                c.close()
    return cells, disagree


def prompt(model_name: str, length: int, task: str, seed: int, placement: str = "last"):
    """(model, prompt ids, answer ids, needle positions, sample) of one task
    prompt as pqeval.longctx builds it; the needle is the first reference's
    tokens where they occur in the prompt."""
    from pqeval import hf, tasks

    spec = hf.MODELS[model_name]
    model, tok = hf.load(model_name)

    def text(s):
        return hf.format_prompt(spec, tok, s.prompt, s.answer_prefix)

    sample = tasks.make_sample(task, placement, seed, length, tasks.Corpus(),
                               lambda s: len(hf.encode(spec, tok, text(s))))
    ids = hf.encode(spec, tok, text(sample))
    answer = tok(sample.references[0], add_special_tokens=False).input_ids
    needle = [p for start in range(len(ids) - len(answer) + 1)
              if ids[start:start + len(answer)] == answer
              for p in range(start, start + len(answer))]
    return model, ids, answer, needle, sample


def summary(cells: List[Cell], shares: Sequence[float] = SHARES) -> Dict[str, float]:
    oracle = [c for c in cells if c.in_exact]
    lost = [c for c in oracle if not c.in_pq]
    out = {"cells": len(cells), "oracle": len(oracle), "pq_lost": len(lost),
           "pq_lost_mass": sum(c.mass for c in lost),
           "lost_top_mass_residual_share": (max(lost, key=lambda c: c.mass).residual_share
                                            if lost else float("nan")),
           "lost_top_mass_ranks": ((max(lost, key=lambda c: c.mass).exact_rank,
                                    max(lost, key=lambda c: c.mass).pq_rank) if lost else None)}
    for i, s in enumerate(shares):
        gone = [c for c in oracle if not c.kept_by[i]]
        out[f"lost@{s:g}"] = len(gone)
        out[f"lost_mass@{s:g}"] = sum(c.mass for c in gone)
    gone = [c for c in oracle if not c.in_lib_outliers]
    out["lib_lost"], out["lib_lost_mass"] = len(gone), sum(c.mass for c in gone)
    return out


def main(argv: Optional[List[str]] = None) -> None:
    from pqeval import capture

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--tasks", default="niah_single")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--fraction", type=float, default=0.2)
    args = ap.parse_args(argv)
    print(f"# Needle cells: PQ against the exact top-k at 1/{round(1 / args.fraction)}, "
          f"{args.model}, {args.length} tokens\n")
    print("Cells: (layer, answer step, kv head, needle token). `lost`: cells in the exact "
          "top-k that the selection misses; `mass`: their exact attention mass summed "
          "(per query head). `numpy = lib`: numpy's PQ and the library's selection disagree "
          "on this many cells. `outliers s`: PQ with the share s of the middle with the "
          "largest residuals scored exactly.\n")
    head = ("| prompt | cells | in exact | PQ lost (mass) | numpy = lib | the top lost cell: exact "
            "rank, PQ rank, residual rank share |")
    head += "".join(f" outliers {s:g} lost (mass) |" for s in SHARES)
    head += f" library, pq_outliers {LIB_SHARE:g}, lost (mass) |"
    print(head)
    print("|---" * (7 + len(SHARES)) + "|")
    start = time.perf_counter()
    for task in args.tasks.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            model, ids, answer, needle, sample = prompt(args.model, args.length, task, seed)
            if not needle:
                print(f"| {task}/{seed} | the reference's tokens do not occur in the prompt |")
                continue
            t = capture.capture_transformers(model, ids + answer,
                                             list(range(model.config.num_hidden_layers)),
                                             len(answer) + 1, args.model, f"{task}/{seed}",
                                             dtype=np.float32)
            cells, disagree = study_trace(t, len(ids), len(answer), needle, args.fraction)
            s = summary(cells)
            ranks = s["lost_top_mass_ranks"]
            row = (f"| {task}/{seed} | {s['cells']} | {s['oracle']} | {s['pq_lost']} "
                   f"({s['pq_lost_mass']:.3f}) | {disagree} | "
                   + (f"{ranks[0]}, {ranks[1]}, {s['lost_top_mass_residual_share']:.4f} |"
                      if ranks else "|"))
            row += "".join(f" {s[f'lost@{x:g}']} ({s[f'lost_mass@{x:g}']:.3f}) |" for x in SHARES)
            row += f" {s['lib_lost']} ({s['lib_lost_mass']:.3f}) |"
            print(row, flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
