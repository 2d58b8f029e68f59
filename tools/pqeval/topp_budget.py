"""Issue 44's top-p budgets: at the same average number of tokens as a fixed
1/10 budget, how much of the middle's attention mass does a per-head,
per-step top-p budget keep, and can it reach what the fixed 1/5 budget keeps
(the issue's target)? Modelled here from the index, then run through the
library's own mode (config.top_p, 0.15) at the p the model found.

On a trace (pqeval.trace), for every `--stride`-th decode step, layer and kv
head: the middle tokens (past 4 sinks, before the 128-token window) ranked by
PQ's estimated mass (the GQA sum of softmaxes of the code scores from the
library's own index, divided by the group) or, for the oracle, by the exact
mass. A top-p budget takes tokens in that order until their estimated mass
reaches p, clamped to [floor, ceiling] x middle; p is found by bisection so
that the average count over all cases is the target share. `mid mass` is the
exact mass of the middle those tokens hold (mean over cases, each case the
group's mean), as pqeval.replay's middle mass. The row "the library
(config.top_p)" replays the trace through pqcache with top_p = that p,
top_p_floor and the ceiling as topk_fraction, and measures its selections
the same way (the same cases): it checks the mode against the model. The
last row is the best split of each (layer, step)'s tokens among its kv
heads at that share: the largest exact masses of the layer's kv heads pooled
(top-p may also move tokens between steps).

    scripts/run-python -m pqeval.topp_budget tests/data/smollm2_sotu_2k.pqtrace \\
        > docs/quality-data/topp-budget-2k.md
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

SINK, LOCAL = 4, 128


@dataclass
class Case:
    """One (layer, step, kv head): cumulative masses in a ranking order."""
    ranked_estimate: np.ndarray   # cumulative estimated mass, estimated order
    ranked_exact: np.ndarray      # cumulative exact mass, estimated order
    oracle: np.ndarray            # cumulative exact mass, exact order
    group: Tuple[int, int]        # (layer, step)


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def make_case(exact_logits: np.ndarray, code_logits: np.ndarray, group: Tuple[int, int]) -> Case:
    """From one kv head's [query heads][middle] exact and code logits."""
    exact = _softmax_rows(exact_logits).mean(axis=0)
    estimate = _softmax_rows(code_logits).mean(axis=0)
    order = np.argsort(-estimate, kind="stable")
    return Case(np.cumsum(estimate[order]), np.cumsum(exact[order]),
                np.cumsum(np.sort(exact)[::-1]), group)


def fixed(cases: Sequence[Case], share: float, oracle: bool = False) -> float:
    """Mean middle mass of the top share x middle by the estimate (or exact)."""
    out = []
    for c in cases:
        k = max(1, int(round(share * c.oracle.size)))
        out.append((c.oracle if oracle else c.ranked_exact)[k - 1])
    return float(np.mean(out))


def top_p(cases: Sequence[Case], p: float, floor: float, ceiling: float,
          oracle: bool = False) -> Tuple[float, float]:
    """(mean count share, mean middle mass) of top-p budgets at p."""
    counts, mass = [], []
    for c in cases:
        n = c.oracle.size
        ranked = c.oracle if oracle else c.ranked_estimate
        k = int(np.searchsorted(ranked, p)) + 1
        k = min(n, max(math.ceil(floor * n), min(k, int(ceiling * n)), 1))
        counts.append(k / n)
        mass.append((c.oracle if oracle else c.ranked_exact)[k - 1])
    return float(np.mean(counts)), float(np.mean(mass))


def p_for_share(cases: Sequence[Case], share: float, floor: float, ceiling: float,
                oracle: bool = False) -> float:
    """The p whose top-p budgets average `share` of the middle (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if top_p(cases, mid, floor, ceiling, oracle)[0] < share:
            lo = mid
        else:
            hi = mid
    return hi


def pooled(cases: Sequence[Case], share: float) -> float:
    """The best split of each (layer, step)'s share x middle tokens among
    its kv heads: the largest exact masses of its heads pooled."""
    by_group = {}
    for c in cases:
        by_group.setdefault(c.group, []).append(c)
    out = []
    for heads in by_group.values():
        masses = np.concatenate([np.diff(np.concatenate([[0.0], c.oracle])) for c in heads])
        k = int(share * masses.size)
        out.append(np.sort(masses)[::-1][:k].sum() / len(heads))
    return float(np.mean(out))


def _replay(t, stride: int, visit, **config) -> None:
    """Replays the trace's layers through a PQ context made with `config`:
    visit(ctx, layer, step, query, mid_end, Kf) at every stride-th decode
    step, once the step's token is appended."""
    import pqcache
    from pqeval import replay

    q_heads, kv_heads, dim = t.geometry
    window = min(replay.OBSERVATION_WINDOW, t.tokens - t.q_first - 1)
    prompt = t.q_first + window
    for layer in t.layers:
        K, V = np.asarray(t.keys[layer]), np.asarray(t.values[layer])
        Q = np.asarray(t.queries[layer])
        Kf = K.astype(np.float32)
        ctx = pqcache.Context(max(t.model_layers, layer + 1), q_heads, kv_heads, dim,
                              replay._dtype(K), selector="pq", **config)
        try:
            ctx.add_sequence(0)
            ctx.prefill(0, layer, K[:prompt], V[:prompt])
            for p in range(prompt, t.tokens):
                ctx.append(0, layer, K[p:p + 1], V[p:p + 1])
                if (p - prompt) % stride:
                    continue
                mid_end = p + 1 - min(LOCAL, p + 1 - SINK)
                visit(ctx, layer, p, Q[p - t.q_first].astype(np.float32), mid_end, Kf)
        finally:
            ctx.close()


def trace_cases(t, stride: int) -> List[Case]:
    q_heads, kv_heads, dim = t.geometry
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(dim)
    cases: List[Case] = []

    def visit(ctx, layer, p, q, mid_end, Kf):
        for h in range(kv_heads):
            cents = ctx.centroids(0, layer, h)
            m = cents.shape[0]
            codes = ctx.codes(0, layer, h, SINK, mid_end - SINK).astype(np.int64)
            rebuilt = cents[np.arange(m)[None, :], codes]
            qh = q[h * group:(h + 1) * group]
            cases.append(make_case(
                (qh @ Kf[SINK:mid_end, h].T) * scale,
                np.einsum("gms,nms->gn", qh.reshape(group, m, dim // m), rebuilt) * scale,
                (layer, p)))

    _replay(t, stride, visit, topk_fraction=0.2)
    return cases


def library_top_p(t, stride: int, p: float, floor: float, ceiling: float) -> Tuple[float, float]:
    """(mean count share, mean middle mass) of the library's own top-p
    (config.top_p = p, top_p_floor = floor, topk_fraction = ceiling) on the
    cases of trace_cases: each kv head's selected middle tokens, and the
    exact mass of the middle they hold."""
    q_heads, kv_heads, dim = t.geometry
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(dim)
    counts: List[float] = []
    masses: List[float] = []

    def visit(ctx, layer, step, q, mid_end, Kf):
        rows = ctx.select(0, layer, q.astype(np.asarray(t.keys[layer]).dtype)).heads()
        for h in range(kv_heads):
            row = np.asarray(rows[h])
            middle = row[(row >= SINK) & (row < mid_end)] - SINK
            exact = _softmax_rows((q[h * group:(h + 1) * group] @ Kf[SINK:mid_end, h].T)
                                  * scale).mean(axis=0)
            counts.append(middle.size / exact.size)
            masses.append(float(exact[middle].sum()))

    _replay(t, stride, visit, topk_fraction=ceiling, top_p=p, top_p_floor=floor)
    return float(np.mean(counts)), float(np.mean(masses))


LIBRARY = "the library (config.top_p)"


def table(cases: Sequence[Case], share: float = 0.1, target: float = 0.2,
          floors: Sequence[float] = (0.0, 0.02), ceiling: float = 0.5,
          library=None) -> List[str]:
    """The table; with library(p, floor, ceiling) -> (count, mass), also
    the library's own top-p at the p modelled for the largest floor."""
    lines = [f"| budget | ranked by | average tokens | middle mass |", "|---|---|---:|---:|"]
    for s in (target, share):
        lines.append(f"| fixed 1/{round(1 / s)} | PQ's estimate | {s:.3f} | {fixed(cases, s):.4f} |")
        lines.append(f"| fixed 1/{round(1 / s)} | exact (oracle) | {s:.3f} | "
                     f"{fixed(cases, s, oracle=True):.4f} |")
    for oracle in (False, True):
        for floor in floors:
            p = p_for_share(cases, share, floor, ceiling, oracle)
            count, mass = top_p(cases, p, floor, ceiling, oracle)
            lines.append(f"| top-p, p = {p:.3f}, floor {floor:g}, ceiling {ceiling:g} | "
                         f"{'exact (oracle)' if oracle else 'PQ estimate'} | {count:.3f} | "
                         f"{mass:.4f} |")
        if library is not None and not oracle:
            count, mass = library(p, floors[-1], ceiling)
            lines.append(f"| top-p, p = {p:.3f}, floor {floors[-1]:g}, ceiling {ceiling:g} | "
                         f"{LIBRARY} | {count:.3f} | {mass:.4f} |")
    lines.append(f"| best split of 1/{round(1 / share)} among a step's kv heads | exact (oracle) | "
                 f"{share:.3f} | {pooled(cases, share):.4f} |")
    return lines


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from pqeval import longtrace
    longtrace.add_trace_arguments(ap)
    ap.add_argument("--stride", type=int, default=8, help="every stride-th decode step")
    args = ap.parse_args(argv)
    t = longtrace.study_trace(args.trace, args.pairs)
    cases = trace_cases(t, args.stride)
    print(f"trace {args.trace}{' in rotary pairs' if args.pairs else ''}: {t.model}, {t.tokens} tokens, layers {list(t.layers)}, "
          f"every {args.stride}th step: {len(cases)} (layer, step, kv head) cases\n")
    print("\n".join(table(cases, library=lambda p, floor, ceiling: library_top_p(
        t, args.stride, p, floor, ceiling))))


if __name__ == "__main__":
    main()


COMMAND = ("scripts/run-python -m pqeval.topp_budget tests/data/smollm2_sotu_2k.pqtrace "
           "> docs/quality-data/topp-budget-2k.md")
GEMMA_COMMAND = ("cd tools && ../scripts/run-python -m pqeval.topp_budget gemma3-270m --pairs "
                 "> ../docs/quality-data/topp-budget-gemma3-32k.md")
# (model, the trace, its table, the command that wrote it)
TRACES = [
    ("SmolLM2-135M", "the committed 2K trace (layers 3, 15 and 27, 3 kv heads)",
     "topp-budget-2k.md", COMMAND),
    ("Gemma-3-270M", "its 32K trace (pqeval.longtrace: layers 5, 11 and 17, one kv head; read in "
     "rotary pairs, as the integration's key_rotary \"half\" has the library do)",
     "topp-budget-gemma3-32k.md", GEMMA_COMMAND),
]


def _masses(path) -> tuple:
    """A table's lines and {(budget, ranked by): middle mass}."""
    table_lines = [l for l in path.read_text().splitlines() if l.startswith("|")]
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in table_lines[2:]]
    return table_lines, {(r[0], r[1]): float(r[3]) for r in rows}


def report_section(data, lines: List[str]) -> None:
    """docs/quality.md's section on top-p budgets, from each trace's table of
    TRACES: the table and the issue's target (top-p at the tokens of 1/10
    keeping the middle mass of fixed-budget PQ at 1/5) judged on it."""
    found = [(m, where, data / name, cmd) for m, where, name, cmd in TRACES if (data / name).exists()]
    if not found:
        return
    lines += ["", "## Top-p budgets (budgets that adapt per head and step)", "",
              "Issue 44 asks for a top-p mode: per kv head and step, tokens in the order of "
              "their estimated mass until it reaches p. The library has it since 0.15 "
              "(`config.top_p`, with `top_p_floor` and k as the ceiling; PQ, EXACT and SPARQ). "
              "Measured on a trace of each model, every 8th decode step: at the same average "
              "number of tokens as 1/10, the middle mass kept by top-p from PQ's own estimate "
              "(modelled from the index, and run through the library at the modelled p), from "
              "the exact masses (an oracle), and the best split of each step's tokens among its "
              "kv heads."]
    gains = []
    for model, where, path, command in found:
        table_lines, mass = _masses(path)
        target = mass.get(("fixed 1/5", "PQ's estimate"))
        fixed = mass.get(("fixed 1/10", "PQ's estimate"))
        pq_top_p = max((v for (b, by), v in mass.items()
                        if b.startswith("top-p") and by == "PQ estimate"), default=None)
        oracle_top_p = max((v for (b, by), v in mass.items()
                            if b.startswith("top-p") and by == "exact (oracle)"), default=None)
        run = next((b for (b, by) in mass if by == LIBRARY), None)
        lines += ["", f"### {model}", "", f"On {where}. Written by `{command}`.", ""]
        lines += table_lines
        if None in (target, pq_top_p, oracle_top_p):
            continue
        if run is not None:  # what the mode itself keeps decides
            pq_top_p = mass[(run, LIBRARY)]
            lines += ["", f"The library's own mode at the modelled p keeps {pq_top_p:.4f} of the "
                      f"middle mass (the model of it: {mass.get((run, 'PQ estimate'), float('nan')):.4f})."]
        met = pq_top_p >= target
        verdict = (f"Issue 44's target (top-p at the tokens of 1/10 keeps at least fixed PQ at 1/5's "
                   f"middle mass, {target:.4f}) is {'met' if met else 'not met'} here: top-p from "
                   f"PQ's estimate keeps {pq_top_p:.4f}, from the exact masses {oracle_top_p:.4f}.")
        if not met and oracle_top_p < target:
            verdict += (" Not even the exact ranking reaches it on this trace: the budget's shape "
                        "is not what 1/10 lacks, the mass of the heads that spread attention over "
                        "the middle is.")
        if fixed is not None:
            gains.append((model, pq_top_p - fixed))
            verdict += (f" Against PQ's fixed 1/10 ({fixed:.4f}) top-p from the estimate "
                        f"{'gains' if pq_top_p >= fixed else 'loses'} {abs(pq_top_p - fixed):.4f}.")
        lines += ["", verdict]
    if gains:
        changes = ", ".join(f"{g:+.4f} on {m}" for m, g in gains)
        if all(g < 0.02 for _, g in gains):
            lines += ["", "So top-p stays off by default (`config.top_p` = 0): at the tokens of "
                      f"1/10, top-p from PQ's estimate changes the middle mass by {changes} against "
                      "the fixed budget (less than 0.02 on every trace measured), and it costs a "
                      "sort of each head's k best per step and PQ's device selection."]
        else:
            lines += ["", "At the tokens of 1/10, top-p from PQ's estimate changes the middle mass "
                      f"by {changes} against the fixed budget: on these figures top-p is worth "
                      "turning on by default."]
