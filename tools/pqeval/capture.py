"""Captures a .pqtrace from the numpy SmolLM2 model over real text.

    python3 -m pqeval.capture TEXT.txt OUT.pqtrace [--tokens 2048]
        [--layers 0,7,15,22,29] [--queries 512] [--dtype f16]

The text is tokenized, cut to --tokens tokens, and run through the model in
one prefill; Q and K after RoPE and V of the chosen layers are recorded.
Queries are kept for the last --queries positions only (plus the observation
window replay.py gives to SnapKV-style selectors, which it takes from the
first stored queries), see docs/trace-format.md.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from pqeval import trace as trace_io

MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> Path:
    base = Path(os.environ.get("PQCACHE_MODEL_DIR", Path.home() / ".cache" / "pqcache"))
    return base / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_model(path: Optional[str] = None):
    from pqmodel.model import Model  # imported late: tests without the model skip it

    p = Path(path) if path else default_model_path()
    if not p.exists():
        raise FileNotFoundError(f"{p} not found: run scripts/fetch-model.sh first")
    return Model(str(p))


def capture(model, tokens: Sequence[int], layers: Sequence[int], queries: int, text_name: str,
            dtype=np.float16) -> trace_io.Trace:
    n = len(tokens)
    q_first = max(0, n - queries)
    Q, K, V = {}, {}, {}
    wanted = set(layers)

    def hook(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        if layer in wanted:
            # model layout [heads, T, D] -> trace layout [T, heads, D]
            Q[layer] = np.ascontiguousarray(q[:, q_first:].transpose(1, 0, 2), dtype=dtype)
            K[layer] = np.ascontiguousarray(k.transpose(1, 0, 2), dtype=dtype)
            V[layer] = np.ascontiguousarray(v.transpose(1, 0, 2), dtype=dtype)

    model.prefill(list(tokens), logits="none", capture=hook)
    return trace_io.Trace(MODEL_NAME, text_name, np.asarray(tokens, np.int32), list(layers),
                          Q, K, V, q_first, model.cfg.n_layer)


def capture_transformers(model, tokens: Sequence[int], layers: Sequence[int], queries: int,
                         model_name: str, text_name: str, chunk_tokens: int = 2048,
                         dtype=np.float16) -> trace_io.Trace:
    """The same trace from a transformers model (pqeval.hf): the prompt runs
    in chunks with SDPA through a recording attention function, which keeps
    the chosen layers' queries of the last `queries` positions; keys and
    values come from the DynamicCache at the end (after RoPE, as attention
    saw them)."""
    import torch
    from transformers import AttentionInterface, DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    n = len(tokens)
    q_first = max(0, n - queries)
    wanted = set(layers)
    recorded: dict = {layer: [] for layer in layers}
    done = [0]  # tokens before the current chunk

    def record(module, query, key, value, attention_mask, **kwargs):
        if module.layer_idx in wanted:
            t = query.shape[2]
            lo = max(q_first - done[0], 0)
            if lo < t:  # [1, q_heads, T, D] -> [T', q_heads, D]
                recorded[module.layer_idx].append(
                    query[0, :, lo:].transpose(0, 1).to(torch.float32).numpy())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("pqeval_capture", record)
    AttentionMaskInterface.register("pqeval_capture", sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation("pqeval_capture")
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(tokens)])
    try:
        with torch.no_grad():
            for start in range(0, n, chunk_tokens):
                model(ids[:, start:start + chunk_tokens], past_key_values=cache, use_cache=True,
                      logits_to_keep=1)
                done[0] = min(n, start + chunk_tokens)
    finally:
        model.set_attn_implementation(previous)
    Q, K, V = {}, {}, {}
    for layer in layers:
        Q[layer] = np.ascontiguousarray(np.concatenate(recorded[layer]), dtype=dtype)
        K[layer] = np.ascontiguousarray(cache.layers[layer].keys[0].transpose(0, 1).numpy(),
                                        dtype=dtype)
        V[layer] = np.ascontiguousarray(cache.layers[layer].values[0].transpose(0, 1).numpy(),
                                        dtype=dtype)
        if K[layer].shape[0] != n:
            raise ValueError(f"layer {layer} keeps {K[layer].shape[0]} of {n} tokens: a "
                             "sliding-window layer cannot be traced")
    text_config = model.config.get_text_config(decoder=True)
    return trace_io.Trace(model_name, text_name, np.asarray(tokens, np.int32), list(layers),
                          Q, K, V, q_first, text_config.num_hidden_layers)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--layers", default="0,7,15,22,29")
    ap.add_argument("--queries", type=int, default=512)
    ap.add_argument("--dtype", default="f16", choices=["f16", "f32"])
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    model = load_model(args.model)
    text = Path(args.text).read_text(encoding="utf-8")
    tokens = model.tokenizer.encode(text)[: args.tokens]
    if len(tokens) < args.tokens:
        raise SystemExit(f"{args.text} has only {len(tokens)} tokens, {args.tokens} asked")
    layers = [int(x) for x in args.layers.split(",")]
    start = time.perf_counter()
    t = capture(model, tokens, layers, args.queries, Path(args.text).name,
                np.float16 if args.dtype == "f16" else np.float32)
    trace_io.write(args.out, t, args.dtype)
    size = Path(args.out).stat().st_size
    print(f"captured {len(tokens)} tokens, layers {layers}, queries for the last "
          f"{args.queries}: {args.out} ({size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
