"""AdaKV against kvpress's AdaKVPress over its SnapKVPress (NVIDIA/kvpress at
8bb29b9c3078452a86d692f29123fa6c793e2b05, kvpress/presses/adakv_press.py
compress and snapkv_press.py score / compute_window_attention), re-typed
below in numpy, on the same keys and window queries.

Aligned settings: kvpress keeps n_kept = k + w tokens per head on average,
the w window tokens always (their score is max + 1); the library keeps k
middle tokens per head on average plus a local window of w, no sinks. Both
pool as SnapKVPress's default does, avg_pool1d with a kernel of 5 over the
tokens before the window only (zero padding counted at both ends).
kvpress's safeguard int(n_kept * alpha) counts the window
tokens, which it protects first: the library's adakv_safeguard is the share
left for the middle, (int(n_kept * alpha) - w) / k. The queries make one
head sharp and one flat, so that the safeguard decides what the sharp one
keeps. (Checked: a reference with one token less of safeguard, one more
pruned, or the group's max instead of its mean, fails.)"""
import math

import numpy as np

import pqcache

Q_HEADS, KV_HEADS, DIM, PROMPT, WINDOW, K = 4, 2, 16, 200, 8, 40
KERNEL = 5                                             # SnapKVPress.kernel_size
ALPHA = 0.75                                           # kvpress's alpha_safeguard
N_KEPT = K + WINDOW                                    # int(k_len * (1 - compression_ratio))
SAFEGUARD = (int(N_KEPT * ALPHA) - WINDOW) / K         # the library's share: 28 / 40


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def snapkv_score(queries, keys, window=WINDOW, kernel=KERNEL):
    """SnapKVPress.score with compute_window_attention: queries [w, q_heads,
    d] of the last w positions, keys [k_len, kv_heads, d] -> [kv_heads, k_len]."""
    k_len = len(keys)
    group = Q_HEADS // KV_HEADS
    key_states = np.repeat(keys.transpose(1, 0, 2), group, axis=0)           # repeat_kv
    q = queries.transpose(1, 0, 2)                                            # [heads, w, d]
    attn = q @ key_states.transpose(0, 2, 1) / math.sqrt(DIM)
    mask = np.triu(np.full(attn.shape[1:], -np.inf), k=k_len - window + 1)
    attn = softmax(attn + mask)[..., :-window]
    scores = attn.mean(axis=-2)                                               # [heads, ctx]
    pad = kernel // 2                                                         # avg_pool1d
    padded = np.pad(scores, ((0, 0), (pad, pad)))
    scores = np.stack([padded[:, i:i + kernel].sum(-1) / kernel
                       for i in range(scores.shape[1])], axis=-1)
    scores = scores.reshape(KV_HEADS, group, -1).mean(1)                      # per group
    return np.pad(scores, ((0, 0), (0, window)), constant_values=scores.max() + 1)


def adakv_kept(scores, n_kept=N_KEPT, alpha=ALPHA):
    """AdaKVPress.compress: the (head, position) pairs it does not mask."""
    heads, k_len = scores.shape
    scores = scores.copy()
    n_safe = int(n_kept * alpha)
    top = np.argsort(-scores, axis=-1, kind="stable")[:, :n_safe]
    np.put_along_axis(scores, top, np.finfo(scores.dtype).max, axis=-1)
    n_pruned = heads * (k_len - n_kept)
    pruned = np.argsort(scores.reshape(-1), kind="stable")[:n_pruned]      # bottom-k
    kept = np.ones(heads * k_len, bool)
    kept[pruned] = False
    return kept.reshape(heads, k_len)


def test_each_heads_tokens_are_those_adakvpress_keeps():
    rng = np.random.default_rng(3)
    keys = rng.normal(size=(PROMPT, KV_HEADS, DIM)).astype(np.float32)
    queries = (2 * rng.normal(size=(WINDOW, Q_HEADS, DIM))).astype(np.float32)
    # kv head 0's queries are sharp (few tokens matter), kv head 1's flat (many
    # matter a little): the global top gives head 1 most of the budget, and
    # head 0 keeps what the safeguard gives it.
    queries[:, :2] *= 4
    queries[:, 2:] *= 0.1
    kept = adakv_kept(snapkv_score(queries.astype(np.float64), keys.astype(np.float64)))
    counts = kept[:, :PROMPT - WINDOW].sum(axis=1)
    assert counts.sum() == KV_HEADS * K and counts[0] != counts[1], counts
    unguarded = adakv_kept(snapkv_score(queries.astype(np.float64), keys.astype(np.float64)),
                           alpha=WINDOW / N_KEPT)
    assert (unguarded != kept).any(), "the safeguard changes nothing: the test would not see it"
    with pqcache.Context(1, Q_HEADS, KV_HEADS, DIM, "f32", selector="adakv", sink_tokens=0,
                         local_tokens=WINDOW, topk_tokens=K, observation_window=WINDOW,
                         pooling_kernel=KERNEL, pooling="avg",
                         adakv_safeguard=SAFEGUARD) as ctx:
        ctx.add_sequence(0)
        ctx.prefill(0, 0, keys, keys)
        ctx.prefill_queries(0, 0, queries)
        sel = ctx.select(0, 0, queries[-1])
        for h, row in enumerate(sel.heads()):
            assert row.tolist() == np.flatnonzero(kept[h]).tolist(), f"head {h}"
