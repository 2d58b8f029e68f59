"""Replays a real attention trace through libpqcache and measures, per layer
and head, how close selective attention comes to full attention.

For each traced layer: the prompt is positions [0, P) with P = q_first +
window (the first `window` stored queries are the prompt's last queries,
which SnapKV-style selectors read through pq_prefill_queries). Then every
position p in [P, N) is a decode step: the token's K/V are appended, the
library selects with the query at p, and the selection is compared with full
causal attention over [0, p]:

- recall: |selected middle ∩ exact top-k middle| / k, with the EXACT
  selector's choice (same k, same GQA combine) as the reference;
- mass: the share of each query head's full softmax mass that falls on the
  selected tokens (sinks and local window included), averaged over heads;
- error: ||o_sel - o_full|| / ||o_full|| for the attention output of each
  query head, o_sel using softmax over the selected tokens only;
- fixed_mass: the mass on the sink and local tokens alone, which every
  selector keeps: the part of `mass` no selector can take credit for;
- mid_mass: of each query head's mass on the middle tokens (neither sink nor
  local), the share on the selected middle tokens;
- head_recall: per query head, |selected middle ∩ that head's own exact
  top-k middle| / k (k: the oracle's count), against the head's own scores
  rather than the GQA-combined ones PQ and the oracle rank by.

`--intervals` adds a 95% interval to the output error and the middle mass:
consecutive decode steps are correlated, so it is taken over batch means
(each layer's steps in blocks of BATCH_STEPS, the blocks' means pooled over
layers, mean +- 1.96 x their standard deviation / sqrt(blocks)). `--plot`
draws both against the budget, one line per selector; docs/quality.md's
picture of the budgets comes from

    scripts/run-python -m pqeval.replay tests/data/smollm2_sotu_2k.pqtrace \\
        --selectors pq,exact,h2o,snapkv,window --fractions 0.2,0.1,0.05,0.02 \\
        --intervals --plot docs/quality-budgets.png > docs/quality-data/budgets-2k.md

Selectors that learn from attention (H2O, SCOPE) are fed the probabilities of
the attention they were given, after every step, as a model would.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import numpy as np

import pqcache
from pqcache.selector_inputs import (ATTENTION_SELECTORS, LAYER_SHARING_SELECTORS,
                                     TOKEN_CLASS_SELECTORS,
                                     PROMPT_QUERY_SELECTORS, seed_h2o, seed_scissorhands)
from pqeval import trace as trace_io

OBSERVATION_WINDOW = 32
BATCH_STEPS = 16  # steps per batch mean of --intervals


@dataclass
class LayerResult:
    layer: int
    steps: int = 0
    recall: float = 0.0
    mass: float = 0.0
    error: float = 0.0
    fixed_mass: float = 0.0
    mid_mass: float = 0.0
    head_recall: float = 0.0
    selected: float = 0.0           # mean tokens attended per kv head
    select_bytes: float = 0.0       # mean bytes the selector read per step
    # Per decode step, the mean over kv heads (what --intervals batches).
    step_error: List[float] = field(default_factory=list)
    step_mid_mass: List[float] = field(default_factory=list)


@dataclass
class Result:
    selector: str
    fraction: float
    layers: List[LayerResult] = field(default_factory=list)
    seconds: float = 0.0

    def mean(self, name: str) -> float:
        return float(np.mean([getattr(l, name) for l in self.layers]))

    def interval(self, name: str) -> float:
        """The 95% half-width of the mean of per-step series `name`
        ("step_error" or "step_mid_mass") over batch means of BATCH_STEPS
        consecutive steps of each layer; nan with fewer than two batches."""
        batches = []
        for l in self.layers:
            steps = getattr(l, name)
            for b in range(len(steps) // BATCH_STEPS):
                batches.append(float(np.mean(steps[b * BATCH_STEPS:(b + 1) * BATCH_STEPS])))
        if len(batches) < 2:
            return float("nan")
        return 1.96 * float(np.std(batches, ddof=1)) / math.sqrt(len(batches))


def _dtype(keys: np.ndarray) -> str:
    return "f16" if keys.dtype == np.float16 else "f32"


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def replay(t: trace_io.Trace, selector: str, fraction: float, steps: Optional[int] = None,
           layers: Optional[Iterable[int]] = None, generated: int = 0,
           token_classes: Optional[np.ndarray] = None, **config) -> Result:
    """Runs one selector at one budget over the trace. `config` sets further
    pq_config fields (e.g. pq_subspaces=4, kmeans_iterations=10).
    generated > 0: the last `generated` tokens before the decode steps are not
    prefilled but appended as decode tokens (a teacher-forced continuation),
    so PQ codes them with the codebook of the tokens before them, as a long
    output is coded, instead of training on them.
    token_classes: pq_token_class flags of the trace's tokens (uint8
    [tokens], selector_inputs.token_class_table(tokenizer)[t.token_ids]),
    which FastGen needs."""
    q_heads, kv_heads, head_dim = t.geometry
    window = min(OBSERVATION_WINDOW, t.tokens - t.q_first - 1)
    prompt = t.q_first + window
    last = t.tokens if steps is None else min(t.tokens, prompt + steps)
    scale = 1.0 / math.sqrt(head_dim)
    opts = dict(selector=selector, topk_fraction=fraction, observation_window=window)
    opts.update(config)
    result = Result(selector, fraction)
    start = time.perf_counter()
    first = prompt - generated
    if not 0 < first <= prompt:
        raise ValueError(f"generated {generated}: the trace's prompt has {prompt} tokens")
    replayed = list(layers if layers is not None else t.layers)
    if selector in TOKEN_CLASS_SELECTORS:
        if token_classes is None or len(token_classes) < t.tokens:
            raise ValueError(f"selector {selector} needs token_classes for the trace's "
                             f"{t.tokens} tokens")
        token_classes = np.ascontiguousarray(token_classes[: t.tokens], dtype=np.uint8)
    else:
        token_classes = None

    # A selector that shares its budget across layers (ZigZagKV) needs every
    # layer's prompt queries before any select: one context holds all the
    # replayed layers (as the transformers integration holds the model's
    # compressed ones), each fed its prompt first.
    shared = None
    if selector in LAYER_SHARING_SELECTORS:
        shared = pqcache.Context(len(replayed), q_heads, kv_heads, head_dim,
                                 _dtype(np.asarray(t.keys[replayed[0]])), **opts)
        shared.add_sequence(0)
        if token_classes is not None:
            shared.token_classes(0, 0, token_classes)
    try:
        for at, layer in enumerate(replayed if shared is not None else []):
            K, V, Q = (np.asarray(x[layer]) for x in (t.keys, t.values, t.queries))
            shared.prefill(0, at, K[:first], V[:first])
            if generated:
                shared.append(0, at, K[first:prompt], V[first:prompt])
            shared.prefill_queries(0, at, Q[prompt - t.q_first - window: prompt - t.q_first])
        for at, layer in enumerate(replayed):
            result.layers.append(_replay_layer(t, layer, at, shared, selector, opts, first, prompt,
                                               last, window, generated, scale, token_classes))
    finally:
        if shared is not None:
            shared.close()
    result.seconds = time.perf_counter() - start
    return result


def _replay_layer(t, layer, at, shared, selector, opts, first, prompt, last, window, generated,
                  scale, token_classes=None) -> LayerResult:
    """One layer of replay(): its decode steps against full attention. The
    library's layer is `layer` in a context of its own, as deep as the model
    so that layer-dependent budgets (PyramidKV) see the real layer index, or
    `at` in `shared`, whose prompts replay() fed."""
    q_heads, kv_heads, head_dim = t.geometry
    group = q_heads // kv_heads
    K = np.asarray(t.keys[layer])
    V = np.asarray(t.values[layer])
    Q = np.asarray(t.queries[layer])
    dtype = _dtype(K)
    depth = max(t.model_layers, layer + 1)
    own_ctx = shared is None
    ctx = pqcache.Context(depth, q_heads, kv_heads, head_dim, dtype, **opts) if own_ctx else shared
    lib = layer if own_ctx else at
    oracle = pqcache.Context(depth, q_heads, kv_heads, head_dim, dtype,
                             **{**opts, "selector": "exact"})
    lr = LayerResult(layer)
    try:
        for c in ((ctx, oracle) if own_ctx else (oracle,)):
            c.add_sequence(0)
        if own_ctx and token_classes is not None:
            ctx.token_classes(0, 0, token_classes)
        for c in ((ctx, oracle) if own_ctx else (oracle,)):
            c.prefill(0, layer, K[:first], V[:first])
            if generated:
                c.append(0, layer, K[first:prompt], V[first:prompt])
        window_q = Q[prompt - t.q_first - window: prompt - t.q_first]
        if own_ctx and selector in PROMPT_QUERY_SELECTORS:
            ctx.prefill_queries(0, lib, window_q)
        if selector == "h2o":
            seed_h2o(ctx, 0, lib, window_q, K[:prompt], scale)
        if selector == "scissorhands":
            seed_scissorhands(ctx, 0, lib, window_q, K[:prompt], scale)
        Kf = K.astype(np.float32)
        Vf = V.astype(np.float32)
        for p in range(prompt, last):
            ctx.append(0, lib, K[p:p + 1], V[p:p + 1])
            oracle.append(0, layer, K[p:p + 1], V[p:p + 1])
            q = Q[p - t.q_first]
            sel = ctx.select(0, lib, q)
            ref = oracle.select(0, layer, q)
            qf = q.astype(np.float32)
            logits = (qf.reshape(kv_heads, group, head_dim) @
                      Kf[: p + 1].transpose(1, 2, 0)) * scale  # [kv][g][p+1]
            probs = _softmax_rows(logits)
            full_out = probs @ Vf[: p + 1].transpose(1, 0, 2)  # [kv][g][dim]
            heads = sel.heads()
            ref_heads = ref.heads()
            observed = np.zeros((kv_heads, max(sel.capacity, 1)), np.float32)
            step_error = step_mid_mass = 0.0
            for h in range(kv_heads):
                pos = heads[h]
                mass = probs[h][:, pos].sum(axis=1)               # [g]
                sub = _softmax_rows(logits[h][:, pos])            # [g][sel]
                out = sub @ Vf[pos, h]                            # [g][dim]
                err = np.linalg.norm(out - full_out[h], axis=1) / \
                    np.maximum(np.linalg.norm(full_out[h], axis=1), 1e-30)
                # the middle tokens [sink, mid_end): neither sink nor local
                sink = min(ctx_sink(opts), p + 1)
                mid_end = p + 1 - ctx_local(opts, p + 1, sink)
                mid_pos = pos[(pos >= sink) & (pos < mid_end)]
                rp = ref_heads[h]
                mid_ref = rp[(rp >= sink) & (rp < mid_end)]
                k = max(len(mid_ref), 1)
                lr.recall += len(np.intersect1d(mid_pos, mid_ref)) / k
                lr.mass += float(mass.mean())
                lr.error += float(err.mean())
                step_error += float(err.mean()) / kv_heads
                mid_probs = probs[h][:, sink:mid_end]                  # [g][middle]
                lr.fixed_mass += float(mass.mean() - probs[h][:, mid_pos].sum(axis=1).mean())
                mid_total = mid_probs.sum(axis=1)
                head_mid_mass = float(np.mean(probs[h][:, mid_pos].sum(axis=1) /
                                              np.maximum(mid_total, 1e-30)))
                lr.mid_mass += head_mid_mass
                step_mid_mass += head_mid_mass / kv_heads
                if mid_end > sink:
                    own = np.argpartition(-logits[h][:, sink:mid_end],
                                          min(k, mid_end - sink) - 1, axis=1)[:, :k] + sink
                    lr.head_recall += float(np.mean([len(np.intersect1d(mid_pos, o)) / k
                                                     for o in own]))
                lr.selected += len(pos)
                observed[h, : len(pos)] = sub.sum(axis=0)
            if selector in ATTENTION_SELECTORS:
                ctx.observe_attention(0, lib, sel, observed)
            lr.select_bytes += ctx.layer_info(0, lib)["last_select_bytes"]
            lr.step_error.append(step_error)
            lr.step_mid_mass.append(step_mid_mass)
            lr.steps += 1
    finally:
        if own_ctx:
            ctx.close()
        oracle.close()
    n = max(lr.steps, 1)
    lr.recall /= n * kv_heads
    lr.mass /= n * kv_heads
    lr.error /= n * kv_heads
    lr.fixed_mass /= n * kv_heads
    lr.mid_mass /= n * kv_heads
    lr.head_recall /= n * kv_heads
    lr.selected /= n * kv_heads
    lr.select_bytes /= n
    return lr


def ctx_sink(opts: Dict) -> int:
    return int(opts.get("sink_tokens", 4))


def ctx_local(opts: Dict, n: int, sink: int) -> int:
    return min(int(opts.get("local_tokens", 128)), n - sink)


def plot(results: List[Result], path: str, title: str) -> None:
    """Output error and middle mass against the budget, one line per
    selector, with the --intervals bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(dict.fromkeys(r.selector for r in results))
    for name in names:
        rs = sorted((r for r in results if r.selector == name), key=lambda r: -r.fraction)
        x = [1 / r.fraction for r in rs]
        for ax, metric, series in ((axes[0], "error", "step_error"),
                                   (axes[1], "mid_mass", "step_mid_mass")):
            ax.errorbar(x, [r.mean(metric) for r in rs], yerr=[r.interval(series) for r in rs],
                        marker="o", capsize=3, label=name)
    for ax, label in ((axes[0], "attention output error (relative L2)"),
                      (axes[1], "middle mass (share on the selected)")):
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks([5, 10, 20, 50])
        ax.set_xticklabels(["1/5", "1/10", "1/20", "1/50"])
        ax.set_xlabel("budget (share of the tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--selectors", default="pq,exact,window,random")
    ap.add_argument("--fractions", default="0.2,0.1")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per layer (default all)")
    ap.add_argument("--intervals", action="store_true",
                    help="95%% intervals (batch means) on the output error and the middle mass")
    ap.add_argument("--plot", help="write error and middle mass against the budget to this PNG")
    args = ap.parse_args(argv)
    t = trace_io.read(args.trace)
    from pqeval import token_classes  # FastGen's, when committed beside the trace
    classes_file = token_classes.classes_path(args.trace)
    classes = token_classes.read(args.trace) if classes_file.exists() else None
    print(f"trace {args.trace}: {t.model}, {t.text}, {t.tokens} tokens, layers {t.layers}")
    print("| selector | budget | recall | per-head recall | mass | fixed mass | middle mass "
          "| output error | tokens/head | bytes/step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        for name in args.selectors.split(","):
            r = replay(t, name, fraction, steps=args.steps, token_classes=classes)
            results.append(r)
            mid, err = f"{r.mean('mid_mass'):.3f}", f"{r.mean('error'):.4f}"
            if args.intervals:
                mid += f" ± {r.interval('step_mid_mass'):.3f}"
                err += f" ± {r.interval('step_error'):.4f}"
            print(f"| {name} | 1/{round(1 / fraction)} | {r.mean('recall'):.3f} | "
                  f"{r.mean('head_recall'):.3f} | {r.mean('mass'):.3f} | "
                  f"{r.mean('fixed_mass'):.3f} | {mid} | {err} | "
                  f"{r.mean('selected'):.0f} | {r.mean('select_bytes'):.0f} |", flush=True)
    if args.plot:
        plot(results, args.plot, f"{t.model}, {t.tokens} tokens, layers {t.layers}")


if __name__ == "__main__":
    main()
