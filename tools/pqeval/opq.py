"""An OPQ rotation (Ge et al., "Optimized Product Quantization", 2013,
non-parametric form) learned from a trace's prefill keys, to measure
whether a learned rotation beats the library's rotary-pair grouping at the
same code bytes before building one into the core (issue 26).

q.k is unchanged by an orthogonal R (q R . k R = q . k), so a trace whose
keys and queries are both multiplied by R has the same exact attention;
only what product quantization loses changes. learn_rotation alternates
(1) K-Means per subspace on X R and (2) the R that best maps X onto the
reconstruction (orthogonal Procrustes: R = U V^T from the SVD of X^T Y),
starting from the rotary-pair permutation, the library's default grouping.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from pqeval import trace as trace_io


def _kmeans(x: np.ndarray, k: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """Lloyd's K-Means from k distinct random points; returns the centroids."""
    k = min(k, x.shape[0])
    c = x[rng.choice(x.shape[0], k, replace=False)].copy()
    x_sq = (x * x).sum(1)
    for _ in range(iterations):
        d = x_sq[:, None] - 2.0 * x @ c.T + (c * c).sum(1)[None, :]
        a = d.argmin(1)
        sums = np.zeros_like(c)
        np.add.at(sums, a, x)
        counts = np.bincount(a, minlength=k)
        keep = counts > 0
        c[keep] = sums[keep] / counts[keep, None]
    return c


def _reconstruct(y: np.ndarray, m: int, bits: int, iterations: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Each subspace of y replaced by its nearest centroid (K-Means on y)."""
    n, d = y.shape
    w = d // m
    out = np.empty_like(y)
    for s in range(m):
        sub = np.ascontiguousarray(y[:, s * w:(s + 1) * w])
        c = _kmeans(sub, 1 << bits, iterations, rng)
        a = ((sub * sub).sum(1)[:, None] - 2.0 * sub @ c.T + (c * c).sum(1)[None, :]).argmin(1)
        out[:, s * w:(s + 1) * w] = c[a]
    return out


def pair_permutation(d: int) -> np.ndarray:
    """The permutation matrix taking rotate-half order to adjacent rotary pairs
    (what key_rotary "half" does inside the library)."""
    order = np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=1).reshape(-1)
    p = np.zeros((d, d))
    p[order, np.arange(d)] = 1.0
    return p


def learn_rotation(x: np.ndarray, m: int, bits: int, rounds: int = 8, kmeans_iterations: int = 8,
                   seed: int = 0, start: Optional[np.ndarray] = None):
    """R (d x d, orthogonal) for keys x [n][d]; returns R and the relative
    reconstruction error after each round (round 0: the start)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(x, dtype=np.float64)
    r = np.eye(x.shape[1]) if start is None else start.copy()
    errors = []
    norm = (x * x).sum()
    for i in range(rounds + 1):
        y = x @ r
        y_hat = _reconstruct(y, m, bits, kmeans_iterations, rng)
        errors.append(float(((y - y_hat) ** 2).sum() / norm))
        if i == rounds:
            break
        u, _, vt = np.linalg.svd(x.T @ y_hat)
        r = u @ vt
    return r, errors


def rotate_trace(t: trace_io.Trace, m: int, bits: int, first: int, last: int,
                 rounds: int = 8, log=print):
    """The trace with every layer's keys and queries multiplied by the OPQ
    rotation learned, per kv head, on keys [first, last) (the prefill after
    the sinks); a query head uses its kv head's rotation. Also returns the
    keys' relative reconstruction error, mean over the heads, with the
    rotary-pair grouping (start) and with the learned rotation (learned)."""
    q_heads, kv_heads, d = t.geometry
    group = q_heads // kv_heads
    keys, queries = {}, {}
    start = pair_permutation(d)
    first_errors, last_errors = [], []
    for layer in t.layers:
        k = np.asarray(t.keys[layer], dtype=np.float32)
        q = np.asarray(t.queries[layer], dtype=np.float32)
        k_out, q_out = np.empty_like(k), np.empty_like(q)
        for h in range(kv_heads):
            r, errors = learn_rotation(k[first:last, h, :], m, bits, rounds, start=start, seed=layer)
            r = r.astype(np.float32)
            k_out[:, h, :] = k[:, h, :] @ r
            for j in range(h * group, (h + 1) * group):
                q_out[:, j, :] = q[:, j, :] @ r
            first_errors.append(errors[0])
            last_errors.append(errors[-1])
            log(f"  opq layer {layer} kv head {h}: reconstruction error "
                f"{errors[0]:.4f} (pairs) -> {errors[-1]:.4f}")
        keys[layer] = k_out.astype(t.keys[layer].dtype)
        queries[layer] = q_out.astype(t.queries[layer].dtype)
    rotated = trace_io.Trace(t.model, t.text, t.token_ids, t.layers, queries, keys, t.values,
                             t.q_first, t.model_layers)
    return rotated, {"start": float(np.mean(first_errors)), "learned": float(np.mean(last_errors))}
