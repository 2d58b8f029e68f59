"""ZigZagKV against the only implementation found, kvpress's ZigZagKVPress
(NVIDIA/kvpress PR #238, closed unmerged; _compute_lmba and _compute_budgets
re-typed below in numpy, float32 as the PR computes them) over SnapKVPress's
scores (compute_window_attention, also re-typed), on the same keys and
window queries of three layers.

Aligned settings: the PR measures each layer's LMBA over the whole prompt,
whose window tokens it scores max + 1 and always keeps, and shares
seq_len * (1 - compression_ratio) tokens a layer on average; the library
measures and shares the middle (the tokens between the sinks and the local
window). So the reference runs the PR's two functions on the scores of the
prompt without its window, with seq_len = the middle and the compression
ratio that leaves k of it, and the library keeps no sinks and a local window
of the observation window. Both pool as SnapKVPress's default does,
avg_pool1d with a kernel of 5 over the tokens before the window only. The
layers' queries are scaled apart so that their
budgets differ. (Checked: a reference with mass 0.8, a floor of 0.3 or the
budgets of uniform layers fails.)"""
import math

import numpy as np

import pqcache

LAYERS, Q_HEADS, KV_HEADS, DIM, PROMPT, WINDOW, K = 3, 4, 2, 16, 240, 8, 40
MASS, FLOOR = 0.9, 0.2                   # the PR's attention_threshold and b_bound_ratio
KERNEL = 5                               # SnapKVPress.kernel_size
MIDDLE = PROMPT - WINDOW


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def snapkv_context_scores(queries, keys, kernel=KERNEL):
    """SnapKVPress.score before its window padding: [kv_heads, PROMPT - WINDOW]."""
    group = Q_HEADS // KV_HEADS
    key_states = np.repeat(keys.transpose(1, 0, 2), group, axis=0)           # repeat_kv
    attn = queries.transpose(1, 0, 2) @ key_states.transpose(0, 2, 1) / math.sqrt(DIM)
    mask = np.triu(np.full(attn.shape[1:], -np.inf), k=PROMPT - WINDOW + 1)
    attn = softmax(attn + mask)[..., :-WINDOW]
    scores = attn.mean(axis=-2)                                               # [heads, ctx]
    pad = kernel // 2                                                         # avg_pool1d
    padded = np.pad(scores, ((0, 0), (pad, pad)))
    scores = np.stack([padded[:, i:i + kernel].sum(-1) / kernel
                       for i in range(scores.shape[1])], axis=-1)
    return scores.reshape(KV_HEADS, group, -1).mean(1)


def compute_lmba(scores, threshold=MASS):
    """ZigZagKVPress._compute_lmba: scores [kv_heads, k_len]."""
    mass = np.clip(scores.astype(np.float32), 0, None)
    sorted_mass = -np.sort(-mass, axis=-1)
    cumsum = np.cumsum(sorted_mass, axis=-1, dtype=np.float32)
    total = sorted_mass.sum(axis=-1, keepdims=True, dtype=np.float32)
    mba = np.minimum((cumsum < threshold * total).sum(axis=-1) + 1, scores.shape[-1])
    return float(mba.astype(np.float32).mean())


def compute_budgets(lmba_values, seq_len, compression_ratio, b_bound_ratio=FLOOR):
    """ZigZagKVPress._compute_budgets (the PR's equation 6)."""
    total = sum(lmba_values)
    b_avg = seq_len * (1 - compression_ratio)
    b_bound = b_avg * b_bound_ratio
    out = []
    for lmba in lmba_values:
        budget = b_avg if total == 0 else b_bound + (b_avg - b_bound) * len(lmba_values) * lmba / total
        out.append(max(1, min(int(round(budget)), seq_len)))
    return out


def test_each_layers_tokens_are_those_zigzagkvpress_keeps():
    rng = np.random.default_rng(5)
    keys = [rng.normal(size=(PROMPT, KV_HEADS, DIM)).astype(np.float32) for _ in range(LAYERS)]
    queries = [(scale * rng.normal(size=(WINDOW, Q_HEADS, DIM))).astype(np.float32)
               for scale in (8.0, 2.0, 0.2)]                       # sharp, middling, flat
    scores = [snapkv_context_scores(q.astype(np.float64), k.astype(np.float64))
              for q, k in zip(queries, keys)]
    budgets = compute_budgets([compute_lmba(s) for s in scores], MIDDLE, 1 - K / MIDDLE)
    assert budgets[0] < budgets[1] < budgets[2], budgets
    assert compute_budgets([1.0] * LAYERS, MIDDLE, 1 - K / MIDDLE) != budgets
    with pqcache.Context(LAYERS, Q_HEADS, KV_HEADS, DIM, "f32", selector="zigzagkv",
                         sink_tokens=0, local_tokens=WINDOW, topk_tokens=K,
                         observation_window=WINDOW, pooling_kernel=KERNEL,
                         pooling="avg") as ctx:
        ctx.add_sequence(0)
        for layer in range(LAYERS):
            ctx.prefill(0, layer, keys[layer], keys[layer])
        for layer in (2, 0, 1):                                    # any order
            ctx.prefill_queries(0, layer, queries[layer])
        for layer in range(LAYERS):
            sel = ctx.select(0, layer, queries[layer][-1])
            for h, row in enumerate(sel.heads()):
                # topk on the float32 scores, as torch's topk; ties do not occur here
                want = np.sort(np.argsort(-scores[layer][h].astype(np.float32),
                                          kind="stable")[:budgets[layer]])
                middle = row[row < MIDDLE]
                assert middle.tolist() == want.tolist(), f"layer {layer} head {h}"
