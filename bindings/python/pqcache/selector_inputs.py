"""What some selectors need from the caller besides keys, values and the query.

- FastGen also needs each token's class (special, punctuation):
  Context.token_classes with token_class_table(tokenizer)[ids], the
  prompt's before its prefill_queries.
- InfiniGen takes its skew from them too (its partial keys follow).
- SnapKV, PyramidKV, SCOPE, AdaKV, ZigZagKV, PyramidInfer and FastGen score the prompt
  once from its last queries (the observation window): pass them with
  Context.prefill_queries after the layer's prefill (ZigZagKV and
  PyramidInfer decide across layers: every layer's before any select). Keyformer takes
  them as its first step (a Gumbel softmax of each window row).
- H2O, SCOPE, Scissorhands and Keyformer learn from the attention the model
  paid: pass it after every decode step with Context.observe_attention (for
  Scissorhands and Keyformer each call is one step). H2O also starts from the
  prompt's attention; seed_h2o gives it the column sums of the observation
  window's attention (the full prompt attention matrix is what
  FlashAttention never materialises; the window is what a server has).

The tools (tools/pqeval) and the transformers integration
(pqcache.transformers) both feed selectors through these helpers.
"""

from __future__ import annotations

import numpy as np

PROMPT_QUERY_SELECTORS = frozenset({"snapkv", "pyramidkv", "scope", "keyformer", "adakv",
                                    "zigzagkv", "pyramidinfer", "fastgen", "infinigen"})
ATTENTION_SELECTORS = frozenset({"h2o", "scope", "scissorhands", "keyformer", "fastgen"})
# Selectors that keep tokens by class (special, punctuation): give the
# prompt's classes (Context.token_classes) before its prefill_queries, and
# each new token's as it comes; token_class_table makes them from a tokenizer.
TOKEN_CLASS_SELECTORS = frozenset({"fastgen"})
# Selectors whose choice in one layer depends on the other layers' prompt
# queries (ZigZagKV's budgets, PyramidInfer's nested sets): a select fails
# until those layers of the context had their pq_prefill_queries.
LAYER_SHARING_SELECTORS = frozenset({"zigzagkv", "pyramidinfer"})


def selector_name(selector) -> str:
    """The name ("pq", "h2o", ...) of a selector given by name or pq_selector value."""
    from . import SELECTORS  # the package imports this module first

    if isinstance(selector, str):
        if selector not in SELECTORS:
            raise ValueError(f"unknown selector {selector!r}; expected one of {sorted(SELECTORS)}")
        return selector
    for name, value in SELECTORS.items():
        if value == selector:
            return name
    raise ValueError(f"unknown selector value {selector!r}")


def token_class_table(tokenizer) -> np.ndarray:
    """pq_token_class flags for every id of a Hugging Face tokenizer, uint8
    [len(tokenizer)]: TOKEN_SPECIAL for its special ids, TOKEN_PUNCTUATION
    for a token that decodes to nothing but punctuation (string.punctuation)
    and white space, as cold-compress's FastGen marks them. Index it with
    token ids: token_class_table(tok)[ids]."""
    import string

    from . import TOKEN_PUNCTUATION, TOKEN_SPECIAL  # the package imports this module first

    size = len(tokenizer)
    table = np.zeros(size, np.uint8)
    allowed = set(string.punctuation) | set(string.whitespace)
    texts = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    for i, text in enumerate(texts):
        if text and all(ch in allowed for ch in text):
            table[i] = TOKEN_PUNCTUATION
    special = [i for i in tokenizer.all_special_ids if 0 <= i < size]
    table[special] = TOKEN_SPECIAL
    return table


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def prompt_attention_sums(window_queries: np.ndarray, keys: np.ndarray,
                          scale: float) -> np.ndarray:
    """Column sums of the causal attention of the prompt's last queries.

    window_queries: [w][q_heads][head_dim], the queries of prompt positions
    p - w .. p - 1; keys: [p][kv_heads][head_dim]. Returns float32
    [kv_heads][p]: per kv head, the softmax probabilities of its query heads
    summed over the group and the window."""
    w, q_heads, dim = window_queries.shape
    p, kv_heads, _ = keys.shape
    if w > p:
        raise ValueError(f"{w} window queries for a prompt of {p} tokens")
    group = q_heads // kv_heads
    qf = np.asarray(window_queries, np.float32).reshape(w, kv_heads, group, dim)
    kf = np.asarray(keys, np.float32)
    sums = np.zeros((kv_heads, p), np.float32)
    for i in range(w):
        visible = p - w + i + 1  # causal: window query i sits at position p - w + i
        for h in range(kv_heads):
            logits = qf[i, h] @ kf[:visible, h].T * scale  # [group][visible]
            sums[h, :visible] += _softmax_rows(logits).sum(axis=0)
    return sums


def seed_h2o(ctx, seq: int, layer: int, window_queries: np.ndarray, keys: np.ndarray,
             scale: float) -> None:
    """Seeds H2O's accumulators for (seq, layer) with prompt_attention_sums,
    observed over a selection of every prompt token."""
    from . import SelectionResult

    sums = prompt_attention_sums(window_queries, keys, scale)
    kv_heads, p = sums.shape
    sel = SelectionResult(kv_heads, p)
    sel.positions[:] = np.arange(p, dtype=np.int32)
    sel.counts[:] = p
    ctx.observe_attention(seq, layer, sel, sums)


def seed_scissorhands(ctx, seq: int, layer: int, window_queries: np.ndarray, keys: np.ndarray,
                      scale: float) -> None:
    """Seeds Scissorhands for (seq, layer) with one step, as cold-compress's
    Scissorhands cache takes the prompt: each prompt token's attention from
    the observation window, summed over the group and averaged over the
    window queries that see it (a hit: at least uniform attention)."""
    from . import SelectionResult

    w = window_queries.shape[0]
    sums = prompt_attention_sums(window_queries, keys, scale)
    kv_heads, p = sums.shape
    seen_by = p - np.maximum(np.arange(p), p - w)  # window queries at or after each token
    sel = SelectionResult(kv_heads, p)
    sel.positions[:] = np.arange(p, dtype=np.int32)
    sel.counts[:] = p
    ctx.observe_attention(seq, layer, sel, (sums / seen_by).astype(np.float32))
