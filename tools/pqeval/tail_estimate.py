"""Issue 44's measurement: how much of the error a selection leaves can an
estimate of the tokens it leaves out (the tail) recover, computed from what
the PQ index already holds? Made in numpy before the library had it, and
now also read from the library (pq_decode_attend with tail_estimate
"code_means", which must agree with the numpy form). Replays a trace as pqeval.replay does (the library selects, numpy
attends) and, per decode step, kv head and query head, compares with full
attention the output of:

- `pq`: attention over PQ's selection alone (what pq_decode_attend gives);
- `pq+est`: the same merged by log-sum-exp with an estimate of the tail
  from the index: each left-out middle token's score from its codes (the
  lookup-table score the select already computes, q . centroid per
  subspace), exp of it as its weight, and as its value the mean value of
  the middle tokens sharing its first subspace's code (one mean per code: a
  table of 2^b rows kept up to date as tokens are coded);
- `pq+est(lib)`: the library's own attend with config.tail_estimate
  PQ_TAIL_CODE_MEANS, which is `pq+est` computed in the library (the two
  agree to float rounding);
- `pq+est(V)`: the estimate with each tail token's exact value, which
  separates the scores' error from the grouped values' (it reads every
  value, so it is a diagnostic, not a method);
- `exact`: the oracle top-k at the same budget (exact scores), alone, and
  `exact+est` with the same estimate of its tail.
- the drop methods (`--drop`, default h2o and snapkv, the best two of the
  budgets section): their selection attended exactly, the rest dropped for
  good, as pqeval.replay runs them over the same steps.

Sinks and local window are attended exactly in every variant; the output
error is the relative L2 error of each query head's output, as SkyLight
reports it, averaged over heads and steps, with 95% intervals over batch
means of 16 steps (replay.Result.interval).

    scripts/run-python -m pqeval.tail_estimate tests/data/smollm2_sotu_2k.pqtrace \\
        --fractions 0.2,0.1,0.05,0.02 --drop h2o,snapkv --plot docs/quality-tail.png \\
        > docs/quality-data/tail-estimate-2k.md
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

import pqcache
from pqeval import replay, trace as trace_io

VARIANTS = ("pq", "pq+est", "pq+est(lib)", "pq+est(V)", "exact", "exact+est")


def _merge(parts):
    """Attention output from (max, sum, acc) parts: sum_i acc_i e^(m_i - m) /
    sum_i s_i e^(m_i - m), per query head (arrays [g], [g], [g][dim])."""
    m = np.max(np.stack([p[0] for p in parts]), axis=0)
    num = sum(p[2] * np.exp(p[0] - m)[:, None] for p in parts)
    den = sum(p[1] * np.exp(p[0] - m) for p in parts)
    return num / den[:, None]


def _part(logits: np.ndarray, values: np.ndarray):
    """(max, sum, acc) of logits [g][n] over values [n][dim] (or [g][n][dim])."""
    if logits.shape[1] == 0:
        g = logits.shape[0]
        return (np.full(g, -np.inf), np.zeros(g),
                np.zeros((g, values.shape[-1])))
    m = logits.max(axis=1)
    w = np.exp(logits - m[:, None])
    acc = np.einsum("gn,gnd->gd", w, values) if values.ndim == 3 else w @ values
    return m, w.sum(axis=1), acc


def _safe(parts):
    return [p for p in parts if np.all(np.isfinite(p[0]))]


def study(t: trace_io.Trace, fractions: Sequence[float], steps: Optional[int] = None,
          layers: Optional[Sequence[int]] = None,
          pq_fields: Optional[Dict[str, float]] = None) -> Dict[float, Dict[str, replay.Result]]:
    """Every variant's output error at each budget. pq_fields: further
    pq_config fields of the PQ contexts (pq and pq+est read the same index
    and selection; the oracle is never changed)."""
    pq_fields = dict(pq_fields or {})
    q_heads, kv_heads, head_dim = t.geometry
    group = q_heads // kv_heads
    window = min(replay.OBSERVATION_WINDOW, t.tokens - t.q_first - 1)
    prompt = t.q_first + window
    last = t.tokens if steps is None else min(t.tokens, prompt + steps)
    scale = 1.0 / math.sqrt(head_dim)
    out: Dict[float, Dict[str, replay.Result]] = {}
    for fraction in fractions:
        results = {v: replay.Result(v, fraction) for v in VARIANTS}
        for layer in (layers if layers is not None else t.layers):
            K = np.asarray(t.keys[layer])
            V = np.asarray(t.values[layer])
            Q = np.asarray(t.queries[layer])
            Kf, Vf = K.astype(np.float32), V.astype(np.float32)
            depth = max(t.model_layers, layer + 1)
            opts = dict(topk_fraction=fraction)
            ctx = pqcache.Context(depth, q_heads, kv_heads, head_dim, replay._dtype(K),
                                  selector="pq", **opts, **pq_fields)
            oracle = pqcache.Context(depth, q_heads, kv_heads, head_dim, replay._dtype(K),
                                     selector="exact", **opts)
            lib = pqcache.Context(depth, q_heads, kv_heads, head_dim, replay._dtype(K),
                                  selector="pq", tail_estimate="code_means", **opts, **pq_fields)
            lrs = {v: replay.LayerResult(layer) for v in VARIANTS}
            try:
                for c in (ctx, oracle, lib):
                    c.add_sequence(0)
                    c.prefill(0, layer, K[:prompt], V[:prompt])
                centroids = [ctx.centroids(0, layer, h) for h in range(kv_heads)]
                m = centroids[0].shape[0]
                sub = head_dim // m
                for p in range(prompt, last):
                    for c in (ctx, oracle, lib):
                        c.append(0, layer, K[p:p + 1], V[p:p + 1])
                    q = Q[p - t.q_first].astype(np.float32)
                    sel, ref = ctx.select(0, layer, Q[p - t.q_first]), \
                        oracle.select(0, layer, Q[p - t.q_first])
                    lib_out, _ = lib.attend(0, layer, Q[p - t.q_first],
                                            lib.select(0, layer, Q[p - t.q_first]))
                    sink = min(replay.ctx_sink(opts), p + 1)
                    mid_end = p + 1 - replay.ctx_local(opts, p + 1, sink)
                    step = {v: 0.0 for v in VARIANTS}
                    for h in range(kv_heads):
                        qh = q[h * group:(h + 1) * group]                    # [g][dim]
                        logits = (qh @ Kf[: p + 1, h].T) * scale             # [g][p+1]
                        full = _merge([_part(logits, Vf[: p + 1, h])])
                        codes = ctx.codes(0, layer, h, sink, mid_end - sink)  # [mid][m]
                        # Each middle token's score from the index: q . its centroids.
                        cent = centroids[h][np.arange(m)[None, :], codes]    # [mid][m][sub]
                        est = np.einsum("gms,nms->gn", qh.reshape(group, m, sub), cent) * scale
                        # One mean value per code of the first subspace.
                        first = codes[:, 0].astype(np.int64)
                        counts = np.bincount(first, minlength=centroids[h].shape[1])
                        sums = np.zeros((centroids[h].shape[1], head_dim), np.float64)
                        np.add.at(sums, first, Vf[sink:mid_end, h])
                        means = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
                        for name, chosen in (("pq", sel.heads()[h]), ("exact", ref.heads()[h])):
                            exact = _part(logits[:, chosen], Vf[chosen, h])
                            tail = np.setdiff1d(np.arange(sink, mid_end), chosen) - sink
                            outs = {name: _merge([exact])}
                            if name == "pq":
                                outs["pq+est(lib)"] = lib_out[h * group:(h + 1) * group]
                            grouped = _part(est[:, tail], means[first[tail]])
                            outs[name + "+est"] = _merge(_safe([exact, grouped]))
                            if name == "pq":
                                own = _part(est[:, tail], Vf[sink + tail, h])
                                outs["pq+est(V)"] = _merge(_safe([exact, own]))
                            for v, o in outs.items():
                                err = np.linalg.norm(o - full, axis=1) / \
                                    np.maximum(np.linalg.norm(full, axis=1), 1e-30)
                                lrs[v].error += float(err.mean())
                                step[v] += float(err.mean()) / kv_heads
                    for v in VARIANTS:
                        lrs[v].step_error.append(step[v])
                        lrs[v].steps += 1
            finally:
                ctx.close()
                oracle.close()
                lib.close()
            for v in VARIANTS:
                lrs[v].error /= max(lrs[v].steps, 1) * kv_heads
                results[v].layers.append(lrs[v])
        out[fraction] = results
    return out


def add_drop_methods(found: Dict[float, Dict[str, replay.Result]], t: trace_io.Trace,
                     selectors: Sequence[str], steps: Optional[int] = None,
                     layers: Optional[Sequence[int]] = None) -> None:
    """Adds each drop method's replay (its selection attended exactly, the
    rest gone) at every budget of `found`, over the same steps and layers."""
    for fraction, results in found.items():
        for selector in selectors:
            results[selector] = replay.replay(t, selector, fraction, steps, layers)


def _names(found: Dict[float, Dict[str, replay.Result]]) -> List[str]:
    first = next(iter(found.values()), {})
    return list(VARIANTS) + [v for v in first if v not in VARIANTS]


def table(found: Dict[float, Dict[str, replay.Result]]) -> List[str]:
    names = _names(found)
    lines = ["| budget | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for fraction, results in found.items():
        cells = [f"{results[v].mean('error'):.4f} ± {results[v].interval('step_error'):.4f}"
                 for v in names]
        lines.append(f"| 1/{round(1 / fraction)} | " + " | ".join(cells) + " |")
    return lines


def plot(found: Dict[float, Dict[str, replay.Result]], path: str, title: str) -> None:
    """Output error against the budget, one line per variant, with its interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"pq": dict(color="tab:red", lw=2), "pq+est": dict(color="tab:red", lw=2, ls="--"),
              "pq+est(lib)": dict(color="tab:orange", lw=1, ls="--", marker="x"),
              "pq+est(V)": dict(color="tab:red", lw=1, ls=":"),
              "exact": dict(color="black", lw=2), "exact+est": dict(color="black", lw=1, ls="--")}
    drop_colours = iter(["tab:green", "tab:purple", "tab:brown", "tab:gray"])
    fractions = sorted(found, reverse=True)
    x = [round(1 / f) for f in fractions]
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in _names(found):
        y = [found[f][v].mean("error") for f in fractions]
        e = [found[f][v].interval("step_error") for f in fractions]
        style = styles.get(v) or dict(color=next(drop_colours, "tab:gray"), lw=1, ls="-.")
        label = v if v in VARIANTS else f"{v} (drops the rest)"
        ax.errorbar(x, y, yerr=e, capsize=3, label=label, **{"marker": "o", **style})
    ax.set_xscale("log")
    ax.minorticks_off()  # the log axis's own labels (3 x 10^1) would sit among the budgets
    ax.set_xticks(x, [f"1/{n}" for n in x])
    ax.set_xlabel("budget (share of the tokens)")
    ax.set_ylabel("attention output error (relative L2)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from pqeval import longtrace
    longtrace.add_trace_arguments(ap)
    ap.add_argument("--fractions", default="0.2,0.1,0.05,0.02")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--drop", default="h2o,snapkv",
                    help="drop methods replayed beside (comma-separated selectors; '' for none)")
    ap.add_argument("--plot", help="write a PNG of the error against the budget")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a pq_config field of the PQ contexts (pq, pq+est), e.g. --set "
                    "pq_rerank=1 (repeatable); the oracle and the drop methods keep theirs")
    args = ap.parse_args(argv)
    pq_fields = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            pq_fields[name] = float(value) if "." in value else int(value)
        except ValueError:
            ap.error(f"--set {item!r}: expected FIELD=NUMBER")
    t = longtrace.study_trace(args.trace, args.pairs)
    start = time.perf_counter()
    found = study(t, [float(f) for f in args.fractions.split(",")], args.steps,
                  pq_fields=pq_fields)
    add_drop_methods(found, t, [s for s in args.drop.split(",") if s], args.steps)
    settings = "".join(f", {k} = {v:g} for PQ" for k, v in pq_fields.items())
    print(f"tail estimate on {args.trace}{' in rotary pairs' if args.pairs else ''}{settings} "
          f"({t.model}, {t.tokens} tokens, layers {t.layers}); "
          f"output error against full attention, mean ± 95% over batch means of "
          f"{replay.BATCH_STEPS} steps; {time.perf_counter() - start:.0f} s\n")
    print("\n".join(table(found)))
    if args.plot:
        plot(found, args.plot, f"{t.model}, {t.tokens} tokens: the tail estimated from the index")


if __name__ == "__main__":
    main()
