"""End-to-end quality of selective attention on the real model: every layer
of SmolLM2 attends, at each decode step, only to the tokens libpqcache
selected.

- perplexity: the prompt (context) runs with full attention, as PQCache's
  prefill does; then the continuation is decoded teacher-forced, one token at
  a time, with the library choosing each layer's tokens;
- needle in a haystack: a pass key sentence inside State of the Union text,
  asked for after the text (question last) or announced before it (question
  first); the answer is generated greedily with selective attention.
"""

from __future__ import annotations

import copy
import math
import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

import pqcache
from pqeval import replay

NEEDS_QUERIES = {"snapkv", "pyramidkv", "scope"}
NEEDS_ATTENTION = {"h2o", "scope"}


class LibrarySelection:
    """Plugs one libpqcache context into the model's decode hooks (all layers,
    one sequence). The model's cache is [layer][kv_head][position][dim], so
    K/V reach the library as head-major views, without copies."""

    def __init__(self, model, selector: str, fraction: float, window: int = 32, **options):
        cfg = model.cfg
        self.selector = selector
        self.window = window
        self.ctx = pqcache.Context(cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, "f32",
                                   selector=selector, topk_fraction=fraction,
                                   observation_window=window, **options)
        self.ctx.add_sequence(0)
        self.last: Dict[int, pqcache.SelectionResult] = {}

    def close(self) -> None:
        self.ctx.close()

    def prefill(self, cache, window_queries: Optional[Dict[int, np.ndarray]] = None) -> None:
        n = cache.n
        for layer in range(cache.k.shape[0]):
            self.ctx.prefill(0, layer, cache.k[layer, :, :n], cache.v[layer, :, :n],
                             layout="head_major")
            if self.selector in NEEDS_QUERIES:
                self.ctx.prefill_queries(0, layer, window_queries[layer])
            if self.selector == "h2o":
                replay.seed_h2o(self.ctx, layer, window_queries[layer],
                                cache.k[layer, :, :n].transpose(1, 0, 2),
                                1.0 / math.sqrt(cache.k.shape[-1]))

    def select(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray):
        p = k.shape[1] - 1  # the current token, just written to the cache
        self.ctx.append(0, layer, k[:, p:p + 1], v[:, p:p + 1], layout="head_major")
        sel = self.ctx.select(0, layer, np.ascontiguousarray(q, dtype=np.float32))
        self.last[layer] = sel
        return sel.heads()

    def observe(self, layer: int, positions: List[np.ndarray], probs: List[np.ndarray]) -> None:
        if self.selector not in NEEDS_ATTENTION:
            return
        sel = self.last[layer]
        observed = np.zeros((len(positions), max(sel.capacity, 1)), np.float32)
        for h, p in enumerate(probs):
            observed[h, : p.shape[1]] = p.sum(axis=0)
        self.ctx.observe_attention(0, layer, sel, observed)


def _window_capture(window: int, store: Dict[int, np.ndarray]):
    def hook(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        # q: [n_head, T, D] -> the last `window` queries as [w, n_head, D]
        store[layer] = np.ascontiguousarray(q[:, -window:].transpose(1, 0, 2), dtype=np.float32)
    return hook


@dataclass
class Prefilled:
    """A prompt run once with full attention; every selector starts from a copy."""
    cache: object
    logits: np.ndarray
    queries: Dict[int, np.ndarray]


def prefill_once(model, prompt: Sequence[int], extra: int = 512, window: int = 32) -> Prefilled:
    cache = model.new_cache(len(prompt) + extra)
    queries: Dict[int, np.ndarray] = {}
    logits = model.prefill(list(prompt), cache, logits="last",
                           capture=_window_capture(window, queries))
    return Prefilled(cache, logits, queries)


def _start(model, prompt: Sequence[int], selection: Optional[LibrarySelection],
           prefilled: Optional[Prefilled]):
    if prefilled is None:
        prefilled = prefill_once(model, prompt, window=selection.window if selection else 32)
    cache = copy.deepcopy(prefilled.cache)
    if selection is not None:
        selection.prefill(cache, prefilled.queries)
    return cache, prefilled.logits.copy()


def _hooks(selection: Optional[LibrarySelection]):
    if selection is None:
        return {}
    return {"select": selection.select, "observe": selection.observe}


def perplexity(model, tokens: Sequence[int], context: int, selector: Optional[str],
               fraction: float = 0.2, prefilled: Optional[Prefilled] = None,
               **options) -> float:
    """Perplexity of tokens[context:] given everything before, decoding with
    the selector (None: full attention). `prefilled` (prefill_once of
    tokens[:context]) saves running the prompt again."""
    selection = LibrarySelection(model, selector, fraction, **options) if selector else None
    try:
        cache, logits = _start(model, tokens[:context], selection, prefilled)
        nll = 0.0
        for i in range(context, len(tokens)):
            log_probs = logits - logits.max()
            log_probs = log_probs - math.log(float(np.exp(log_probs).sum()))
            nll -= float(log_probs[tokens[i]])
            if i + 1 < len(tokens):
                logits = model.decode_step(tokens[i], cache, **_hooks(selection))
        return math.exp(nll / (len(tokens) - context))
    finally:
        if selection:
            selection.close()


# --- needle in a haystack ----------------------------------------------------

NEEDLE = "The secret pass key is {key}. Remember it: {key} is the pass key."
QUESTION = "What is the secret pass key?"


@dataclass
class NeedleCase:
    tokens: List[int]
    key: str
    depth: float
    question_first: bool


def needle_case(tokenizer, haystack: str, length: int, depth: float, key: str,
                question_first: bool) -> NeedleCase:
    """A prompt of about `length` tokens with the needle at `depth` (0..1)."""
    needle = " " + NEEDLE.format(key=key) + " "
    intro = ("There is a pass key hidden in the following text. Find it and remember it. "
             + (QUESTION + " " if question_first else ""))
    outro = f"\n\n{QUESTION} The secret pass key is"
    budget = length - len(tokenizer.encode(intro + needle + outro, add_bos=False)) - 1
    hay = tokenizer.encode(haystack, add_bos=False)[:budget]
    cut = int(len(hay) * depth)
    text = (intro + tokenizer.decode(hay[:cut]) + needle + tokenizer.decode(hay[cut:]) + outro)
    return NeedleCase(tokenizer.encode(text), key, depth, question_first)


def answer(model, case: NeedleCase, selector: Optional[str], fraction: float = 0.2,
           max_new: int = 8, prefilled: Optional[Prefilled] = None, **options) -> bool:
    selection = LibrarySelection(model, selector, fraction, **options) if selector else None
    try:
        cache, logits = _start(model, case.tokens, selection, prefilled)
        out: List[int] = []
        for _ in range(max_new):
            token = int(np.argmax(logits))
            out.append(token)
            logits = model.decode_step(token, cache, **_hooks(selection))
        text = model.tokenizer.decode(out)
        return re.sub(r"\D", "", text).startswith(case.key)
    finally:
        if selection:
            selection.close()
