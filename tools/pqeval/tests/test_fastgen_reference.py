"""FastGen against cold-compress's KVCacheHybrid (AnswerDotAI/cold-compress
at 15bb300, cache.py: build_masks, profile_attn_heads and
create_window_attention_mask re-typed below in numpy) on real attention:
the committed SmolLM2 trace's keys, its window queries and the classes of
its tokens (tests/data/smollm2_sotu_2k.classes), three layers of 3 kv heads.

Aligned settings: the reference profiles the same rows the library sees
(the observation window's 16 queries; cold-compress profiles every prompt
row), mean-pooling each kv head's group as cold-compress does; the library
keeps no local window (cold-compress has none beside its policies) and its
4 sinks are cold-compress's 4 global tokens; its k is 2 x ceil(0.3 P), so
that its heavy hitters and recent window are cold-compress's 0.3 of the
prompt each (P = 1680: 504 tokens). Both rank heavy hitters among the
tokens the last row leaves unmasked, by mean received attention.

What differs: cold-compress's recent window slides with each query row
((p - W, p] for the row at p), the library's is the newest W tokens of the
middle for every row, which is the same set for the last row only. So the
reference is run twice: with cold-compress's sliding window, and with the
library's fixed one. The library must equal the second on every head, and
the first wherever the window's difference does not move the choice (the
test counts those heads and requires that they are few). The kept set of
each head's policy at the first select is compared too (cold-compress's
mask_optimal: the last row of the chosen policy's mask)."""
import math
from pathlib import Path

import numpy as np
import pytest

import pqcache
from pqeval import token_classes, trace

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "smollm2_sotu_2k.pqtrace"
WINDOW, GLOBAL, FRACTION = 16, 4, 0.3
POLICIES = ("special", "special_punc", "special_punc_heavy_hitter",
            "special_punc_heavy_hitter_window", "full")


def window_attention(queries, keys, first):
    """[kv_heads, w, P]: each kv head's softmax rows (query at first + i,
    causal), mean-pooled over its group, in float64."""
    w, q_heads, d = queries.shape
    P, kv_heads, _ = keys.shape
    group = q_heads // kv_heads
    q = queries.astype(np.float64).reshape(w, kv_heads, group, d)
    k = keys.astype(np.float64)
    out = np.zeros((kv_heads, w, P))
    for h in range(kv_heads):
        logits = np.einsum("igd,td->igt", q[:, h], k[:, h]) / math.sqrt(d)
        visible = np.arange(P)[None, None, :] <= (first + np.arange(w))[:, None, None]
        logits = np.where(visible, logits, -np.inf)
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        out[h] = (e / e.sum(axis=-1, keepdims=True)).mean(axis=1)
    return out


def cold_compress_masks(attn, classes, first, sliding):
    """build_masks over the w rows (positions first ..): [policy][kv][w][P].
    sliding=False puts the last row's window on every row (the library's)."""
    kv_heads, w, P = attn.shape
    rows = first + np.arange(w)
    W = max(1, int(FRACTION * P))
    cols = np.arange(P)
    special = (classes[:P] & pqcache.TOKEN_SPECIAL) != 0
    punc = (classes[:P] & pqcache.TOKEN_PUNCTUATION) != 0
    # cum_attn: the attention each key received, averaged over the rows that
    # see it (every key before the window is seen by all w rows).
    seen = np.maximum((rows[:, None] >= cols[None, :]).sum(axis=0), 1)
    cum_attn = attn.sum(axis=1) / seen
    masks = []
    for name in POLICIES:
        m = np.zeros((kv_heads, w, P), bool)
        m[:, :, :GLOBAL] = True
        if "special" in name:
            m |= special[None, None, :]
        if "punc" in name:
            m |= punc[None, None, :]
        if "window" in name:
            ends = rows if sliding else np.full(w, P - 1)
            m |= ((cols[None, :] > ends[:, None] - W) & (cols[None, :] <= ends[:, None]))[None]
            m[:, :, :GLOBAL] = True
        if "heavy_hitter" in name:
            avail = np.flatnonzero(~m[0, -1])
            num_hh = math.ceil(min(FRACTION * P, len(avail)))
            for h in range(kv_heads):
                scores = cum_attn[h, avail]
                # torch.topk: the largest; ties here would be chance (real data)
                top = avail[np.argsort(-scores, kind="stable")[:num_hh]]
                m[h, :, top] = True
        if name == "full":
            m[:] = True
        masks.append(m)
    return np.stack(masks)


def cold_compress_profile(attn, masks, recovery):
    """profile_attn_heads: each head's first policy whose masked attention,
    summed over keys and averaged over rows, reaches min_recovery_frac; and
    mask_optimal, the last row of that policy's mask."""
    scores = np.where(masks, attn[None], 0.0).sum(axis=-1).mean(axis=-1)  # [policy][kv]
    chosen = (scores >= recovery).astype(int).argmax(axis=0)
    kept = [np.flatnonzero(masks[p, h, -1]) for h, p in enumerate(chosen)]
    return chosen, kept


@pytest.fixture(scope="module")
def data():
    t = trace.read(FIXTURE)
    return t, token_classes.read(FIXTURE)


@pytest.mark.parametrize("recovery", [0.55, 0.98, 0.9975])
def test_fastgen_chooses_and_keeps_as_cold_compress(data, recovery):
    t, classes = data
    q_heads, kv_heads, dim = t.geometry
    first = t.q_first
    P = first + WINDOW
    assert FRACTION * P == int(FRACTION * P)  # the budgets agree exactly
    differ_sliding = 0
    chosen_all = []
    for layer in t.layers:
        keys = np.asarray(t.keys[layer][:P])
        values = np.asarray(t.values[layer][:P])
        window = np.asarray(t.queries[layer][:WINDOW])
        attn = window_attention(window, keys, first)
        fixed, kept = cold_compress_profile(attn, cold_compress_masks(attn, classes, first, False),
                                            recovery)
        sliding, _ = cold_compress_profile(attn, cold_compress_masks(attn, classes, first, True),
                                           recovery)
        differ_sliding += int((fixed != sliding).sum())
        chosen_all += list(fixed)
        with pqcache.Context(1, q_heads, kv_heads, dim, "f16", selector="fastgen",
                             sink_tokens=GLOBAL, local_tokens=0, observation_window=WINDOW,
                             topk_tokens=2 * int(FRACTION * P),
                             fastgen_recovery=recovery) as ctx:
            ctx.add_sequence(0)
            ctx.token_classes(0, 0, classes[:P])
            ctx.prefill(0, 0, keys, values)
            ctx.prefill_queries(0, 0, window)
            selection = ctx.select(0, 0, window[-1])
        for h, positions in enumerate(selection.heads()):
            assert list(positions) == list(kept[h]), (
                f"layer {layer}, kv head {h}: the library keeps {len(positions)} tokens, "
                f"cold-compress's {POLICIES[fixed[h]]} policy {len(kept[h])}")
    # The data exercises more than one policy, and the sliding window moves few.
    assert len(set(chosen_all)) >= 2, chosen_all
    assert differ_sliding <= 2, f"{differ_sliding} of 9 heads choose otherwise with a sliding window"
