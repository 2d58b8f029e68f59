"""Attention traces at long context from the transformers models, and what
the report measures on them: every selector's recall and mass, the
middle-only metrics per layer, and a sweep of PQ settings.

- SmolLM2-135M over the first 8192 tokens of perplexity document 0, all 30
  layers; Gemma-3-270M over its first 32768 tokens, its 3 global layers.
  Queries are kept for the last 160 positions: 32 for the observation window
  SnapKV-style selectors read, 128 decode steps replayed.
- Traces are cached next to the models ($PQCACHE_MODEL_DIR/traces), never
  committed (tens to hundreds of MiB); the figures go to the report's data.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from pqeval import replay, trace as trace_io

# The library's index the studies measure: "0.7" = m and b chosen from
# head_dim, sinks left out of K-Means. A study recorded with another is
# measured again for PQ (evaluate.py).
INDEX = "0.7"
# What the transformers integration declares for these models: rotate-half
# RoPE (Llama, Gemma-3). Only PQ's codebook reads it.
MODEL_FIELDS = {"key_rotary": "half"}
QUERIES = 160      # observation window (32) + decode steps replayed (128)
TRACES = {
    "smollm2-135m": dict(tokens=8192, layers=list(range(30))),
    "gemma3-270m": dict(tokens=32768, layers=[5, 11, 17]),
}
METRICS = ["recall", "head_recall", "mass", "fixed_mass", "mid_mass", "error", "selected",
           "select_bytes"]

# PQ settings at 1/5: (label, pq_config fields, dimension order of the keys).
# The first is the default a model integration gets (0.7): m and b chosen
# from head_dim, rotary pairs grouped by the library (key_rotary "half", the
# layout of every model here). "paper" is the 2 x 6-bit setting that was the
# default before; "model" order hands the keys as the model computes them,
# "pairs" reorders them by hand (the pre-0.7 rope_pairs), kept to check that
# the library's key_rotary gives the same figures.
SETTINGS = [
    ("default (rotary half)", {"key_rotary": "half"}, "model"),
    ("paper 2x6", {"pq_subspaces": 2, "pq_bits": 6}, "model"),
    ("default without rotary", {}, "model"),
    ("2x8", {"pq_subspaces": 2, "pq_bits": 8}, "model"),
    ("2x8, rotary", {"pq_subspaces": 2, "pq_bits": 8, "key_rotary": "half"}, "model"),
    ("4x8, rotary", {"pq_subspaces": 4, "pq_bits": 8, "key_rotary": "half"}, "model"),
    ("8x8, rotary", {"pq_subspaces": 8, "pq_bits": 8, "key_rotary": "half"}, "model"),
    ("4x8, pairs by hand", {"pq_subspaces": 4, "pq_bits": 8}, "pairs"),
    ("default, re-rank 0.25", {"key_rotary": "half", "pq_rerank": 0.25}, "model"),
    ("default, re-rank 0.5", {"key_rotary": "half", "pq_rerank": 0.5}, "model"),
    ("default, re-rank 1", {"key_rotary": "half", "pq_rerank": 1.0}, "model"),
    ("paper 2x6, re-rank 1", {"pq_subspaces": 2, "pq_bits": 6, "pq_rerank": 1.0}, "model"),
    # The default's m x b on keys and queries rotated by an OPQ rotation
    # learned per kv head from the prefill keys (pqeval.opq): a quantizer
    # measured before it is built into the core.
    ("default m x b, OPQ rotation", {}, "opq"),
]


def trace_path(model_name: str) -> Path:
    base = Path(os.environ.get("PQCACHE_MODEL_DIR", Path.home() / ".cache" / "pqcache"))
    return base / "traces" / f"{model_name}-{TRACES[model_name]['tokens']}.pqtrace"


def capture(model_name: str, model=None, tokenizer=None, log=print) -> trace_io.Trace:
    """The model's long trace, from the cache or captured now."""
    from pqeval import capture as capture_mod, hf, tasks

    path = trace_path(model_name)
    spec = TRACES[model_name]
    if path.exists():
        cached = trace_io.read(path)
        if list(cached.layers) == list(spec["layers"]):
            return cached
        log(f"{path} holds layers {list(cached.layers)}, not the planned ones: capturing again")
    if model is None:
        model, tokenizer = hf.load(model_name)
    ids = hf.encode(hf.MODELS[model_name], tokenizer, tasks.perplexity_text(0))[: spec["tokens"]]
    name = "+".join(tasks.PERPLEXITY_DOCUMENTS[0])
    t = capture_mod.capture_transformers(model, ids, spec["layers"], QUERIES,
                                         hf.MODELS[model_name].display.split(" ")[0], name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    trace_io.write(tmp, t)
    tmp.replace(path)
    log(f"captured {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return t


def rotary_pairs(t: trace_io.Trace) -> trace_io.Trace:
    """The trace with each head's dimensions reordered from transformers'
    rotate-half layout (x_i pairs with x_{i+D/2}) to adjacent rotary pairs
    (as llama.cpp stores them): q.k is unchanged, but each PQ subspace then
    holds whole rotary pairs, whose rotation with position stays inside it."""
    d = t.geometry[2]
    order = np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=1).reshape(-1)
    def reorder(arrays):
        return {l: np.ascontiguousarray(a[..., order]) for l, a in arrays.items()}

    return trace_io.Trace(t.model, t.text, t.token_ids, t.layers, reorder(t.queries),
                          reorder(t.keys), t.values, t.q_first, t.model_layers)


def add_trace_arguments(ap) -> None:
    """The command-line arguments study_trace reads: the trace and --pairs."""
    ap.add_argument("trace", help="a .pqtrace file, or a model whose long trace "
                    "pqeval.longtrace captures (" + ", ".join(TRACES) + ")")
    ap.add_argument("--pairs", action="store_true",
                    help="reorder each head's dimensions into rotary pairs first, as the "
                    "integration's key_rotary \"half\" has the library do (traces from "
                    "transformers are in the rotate-half layout)")


def study_trace(source: str, pairs: bool = False) -> trace_io.Trace:
    """The trace a study's command line names: a .pqtrace file, or a model of
    TRACES (its long trace, captured on first use). pairs: reordered into
    rotary pairs (rotary_pairs), as the integration's key_rotary "half" has
    the library do, for traces captured in the rotate-half layout."""
    t = capture(source) if source in TRACES else trace_io.read(source)
    return rotary_pairs(t) if pairs else t


def opq_trace(t: trace_io.Trace, fields: Dict, log=print):
    """The trace rotated by OPQ rotations learned for the m x b that `fields`
    resolve to, on the prefill keys after the sinks, and the keys'
    reconstruction errors (pqeval.opq.rotate_trace)."""
    from pqeval import opq
    import pqcache

    index = resolved_index(t, fields)
    q_heads, kv_heads, head_dim = t.geometry
    with pqcache.Context(1, q_heads, kv_heads, head_dim, "f32", **fields) as ctx:
        sinks = ctx.config()["sink_tokens"]
    return opq.rotate_trace(t, index["pq_subspaces"], index["pq_bits"], sinks, t.q_first, log=log)


def resolved_index(t: trace_io.Trace, fields: Dict) -> Dict[str, int]:
    """The pq_subspaces and pq_bits the library chooses for `fields` on the
    trace's geometry (0 = chosen from head_dim)."""
    import pqcache

    q_heads, kv_heads, head_dim = t.geometry
    with pqcache.Context(1, q_heads, kv_heads, head_dim, "f32", **fields) as ctx:
        c = ctx.config()
    return {"pq_subspaces": c["pq_subspaces"], "pq_bits": c["pq_bits"]}


def _layers(r: replay.Result) -> List[Dict[str, float]]:
    return [{"layer": l.layer, **{m: float(getattr(l, m)) for m in METRICS}} for l in r.layers]


def study(t: trace_io.Trace, selectors: List[str], fractions=(0.2, 0.1),
          steps: Optional[int] = None, log=print, tokenizer=None) -> Dict:
    """Every selector at every budget on every layer of the trace, then the
    PQ settings at 1/5. Returns plain data for the report (JSON)."""
    from pqeval.longctx import budget

    out: Dict = {"model": t.model, "text": t.text, "tokens": t.tokens, "layers": t.layers,
                 "steps": (t.tokens - t.q_first - replay.OBSERVATION_WINDOW
                           if steps is None else steps),
                 "index": INDEX, "selectors": {}, "settings": {}}
    out["selectors"] = study_selectors(t, selectors, fractions, steps, log, tokenizer)
    out["settings"] = study_settings(t, [label for label, _, _ in SETTINGS], steps, log)
    return out


def study_selectors(t: trace_io.Trace, selectors: List[str], fractions, steps: Optional[int],
                    log=print, tokenizer=None) -> Dict:
    """Every selector at every budget on every layer, with the models' rotary
    layout declared (MODEL_FIELDS). tokenizer: the trace model's, for
    selectors that read token classes (FastGen)."""
    from pqeval.longctx import budget
    from pqcache.selector_inputs import TOKEN_CLASS_SELECTORS, token_class_table

    out = {}
    classes = None
    for fraction in fractions:
        for name in selectors:
            if name in TOKEN_CLASS_SELECTORS and classes is None:
                if tokenizer is None:
                    raise ValueError(f"selector {name} needs the trace model's tokenizer")
                classes = token_class_table(tokenizer)[np.asarray(t.token_ids)]
            r = replay.replay(t, name, budget(name, fraction), steps=steps,
                              token_classes=classes if name in TOKEN_CLASS_SELECTORS else None,
                              **MODEL_FIELDS)
            out[f"{name}@1/{round(1 / fraction)}"] = _layers(r)
            log(f"  {name} 1/{round(1 / fraction)}: middle mass {r.mean('mid_mass'):.3f} "
                f"({r.seconds:.0f} s)")
    return out


def study_settings(t: trace_io.Trace, labels: List[str], steps: Optional[int] = None,
                   log=print) -> Dict:
    """The PQ settings of SETTINGS named in `labels`, at 1/5, on every layer."""
    paired = rotary_pairs(t)
    out = {}
    for label, fields, order in SETTINGS:
        if label not in labels:
            continue
        extra = {}
        if order == "opq":
            source, extra["reconstruction_error"] = opq_trace(t, fields, log)
        else:
            source = paired if order == "pairs" else t
        r = replay.replay(source, "pq", 0.2, steps=steps, **fields)
        out[label] = {"fields": fields, "order": order, "resolved": resolved_index(t, fields),
                      "seconds": r.seconds, "layers": _layers(r), **extra}
        log(f"  setting {label}: middle mass {r.mean('mid_mass'):.3f} ({r.seconds:.0f} s)")
    return out


def time_settings(t: trace_io.Trace, labels: List[str], rounds: int = 15,
                  log=print) -> Dict[str, Dict[str, float]]:
    """Build and select time of the PQ settings named in `labels`, against the
    exact selector (the oracle reads every key), on the trace's middle layer
    at its full length: one context per setting, the last query selected in
    interleaved rounds (setting after setting, `rounds` times), medians in
    milliseconds. Build seconds are the library's own (pq_layer_info), with
    the threads of the machine. Returns {label: {build_seconds, select_ms,
    exact_select_ms}}."""
    import os
    import statistics

    import pqcache

    layer = t.layers[len(t.layers) // 2]
    q_heads, kv_heads, head_dim = t.geometry
    K, V, Q = (np.asarray(a[layer]) for a in (t.keys, t.values, t.queries))
    dtype = "f16" if K.dtype == np.float16 else "f32"
    query = np.ascontiguousarray(Q[-1])
    paired = rotary_pairs(t)
    contexts = {}
    for label, fields, order in SETTINGS:
        if label in labels:
            contexts[label] = (pqcache.Context(1, q_heads, kv_heads, head_dim, dtype,
                                               topk_fraction=0.2, **fields), order)
    contexts["exact"] = (pqcache.Context(1, q_heads, kv_heads, head_dim, dtype,
                                         topk_fraction=0.2, selector="exact"), "model")
    pk = np.asarray(paired.keys[layer])
    pquery = np.ascontiguousarray(np.asarray(paired.queries[layer])[-1])
    try:
        for ctx, order in contexts.values():
            ctx.add_sequence(0)
            ctx.prefill(0, 0, pk if order == "pairs" else K, V)
            ctx.wait_builds()
        times: Dict[str, List[float]] = {label: [] for label in contexts}
        for _ in range(rounds):
            for label, (ctx, order) in contexts.items():
                q = pquery if order == "pairs" else query
                start = time.perf_counter()
                ctx.select(0, 0, q)
                times[label].append((time.perf_counter() - start) * 1e3)
        exact_ms = statistics.median(times["exact"])
        out = {}
        for label, (ctx, _) in contexts.items():
            if label == "exact":
                continue
            out[label] = {"build_seconds": float(ctx.layer_info(0, 0)["build_seconds"]),
                          "select_ms": statistics.median(times[label]),
                          "exact_select_ms": exact_ms}
            log(f"  timing {label}: build {out[label]['build_seconds']:.2f} s, select "
                f"{out[label]['select_ms']:.2f} ms (exact {exact_ms:.2f} ms), load "
                f"{os.getloadavg()[0]:.1f}")
        return out
    finally:
        for ctx, _ in contexts.values():
            ctx.close()


REBUILD_SHARE = 0.1


def recluster_keys(generated: List[int]) -> List[str]:
    return ["0"] + [f"{g}{suffix}" for g in generated for suffix in ("", "+rebuild")]


def recluster_study(t: trace_io.Trace, generated: List[int], steps: Optional[int] = None,
                    have: Optional[Dict] = None, log=print) -> Dict[str, Dict]:
    """Does a long output need a new codebook? The default index at 1/5 with
    the last G tokens before the decode steps appended as generated tokens
    (coded with the codebook of the tokens before them) against the same
    tokens all prefilled (the codebook trained on every one of them: what a
    rebuild would give), and with the library's re-clustering on
    (pq_rebuild_share REBUILD_SHARE: the first select after the tokens
    queues a background rebuild and goes on with the old index until it is
    in). Returns {key: layers}: "0" the rebuilt case, "G", "G+rebuild";
    keys already in `have` are kept, not measured again."""
    out = dict(have or {})
    for key in recluster_keys(generated):
        if key in out:
            continue
        g = int(key.split("+")[0])
        extra = {"pq_rebuild_share": REBUILD_SHARE} if key.endswith("+rebuild") else {}
        r = replay.replay(t, "pq", 0.2, steps=steps, generated=g, **MODEL_FIELDS, **extra)
        out[key] = _layers(r)
        log(f"  generated {key}: middle mass {r.mean('mid_mass'):.3f} ({r.seconds:.0f} s)")
    return out
