"""tail_estimate="code_means" (pq_tail_estimate, 0.12) through the binding:
Context.attend merges the selected rows with an estimate of the middle
tokens the selection leaves out, which equals the estimate written out here
in numpy from the index's own codes and centroids."""
import numpy as np
import pytest

import pqcache

Q, KV, DIM, M, BITS, SINK, LOCAL, N = 8, 2, 32, 2, 4, 4, 16, 600


def make(tail="code_means", selector="pq"):
    return pqcache.Context(1, Q, KV, DIM, "f32", pq_subspaces=M, pq_bits=BITS, sink_tokens=SINK,
                           local_tokens=LOCAL, topk_fraction=0.1, selector=selector,
                           tail_estimate=tail)


def estimate(ctx, keys, values, query, sel):
    """The attention pq_tail_estimate defines, in float64."""
    group, sub, mid_end = Q // KV, DIM // M, N - LOCAL
    scale = 1.0 / np.sqrt(DIM)
    out = np.zeros((Q, DIM))
    lse = np.zeros(Q)
    for h, chosen in enumerate(sel.heads()):
        codes = ctx.codes(0, 0, h, SINK, mid_end - SINK).astype(np.int64)
        cent = ctx.centroids(0, 0, h).astype(np.float64)
        first = codes[:, 0]
        sums = np.zeros((1 << BITS, DIM))
        np.add.at(sums, first, values[SINK:mid_end, h])
        means = sums / np.maximum(np.bincount(first, minlength=1 << BITS), 1)[:, None]
        tail = np.setdiff1d(np.arange(SINK, mid_end), chosen) - SINK
        for g in range(group):
            q = query[h * group + g].astype(np.float64)
            exact = keys[chosen, h] @ q * scale
            est = sum(cent[j][codes[tail, j]] @ q[j * sub:(j + 1) * sub] for j in range(M)) * scale
            logits = np.concatenate([exact, est])
            rows = np.concatenate([values[chosen, h], means[first[tail]]])
            top = logits.max()
            w = np.exp(logits - top)
            out[h * group + g] = w @ rows / w.sum()
            lse[h * group + g] = top + np.log(w.sum())
    return out, lse


def test_attend_adds_the_estimate_of_the_tail():
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((N, KV, DIM), dtype=np.float32) * 1.5
    values = rng.standard_normal((N, KV, DIM), dtype=np.float32)
    query = rng.standard_normal((Q, DIM), dtype=np.float32)
    with make() as ctx, make(tail="none") as plain:
        assert ctx.config()["tail_estimate"] == pqcache.TAIL_ESTIMATE["code_means"]
        assert repr(ctx.config()["tail_estimate"]) == "<tail_estimate.code_means: 1>"
        for c in (ctx, plain):
            c.add_sequence(0)
            c.prefill(0, 0, keys, values)
        sel = ctx.select(0, 0, query)
        out, lse = ctx.attend(0, 0, query, sel)
        want, want_lse = estimate(ctx, keys.astype(np.float64), values.astype(np.float64),
                                  query, sel)
        err = np.linalg.norm(out - want, axis=1) / np.linalg.norm(want, axis=1)
        assert err.max() < 2e-5
        np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)
        rows_only, _ = plain.attend(0, 0, query, sel)
        assert (np.linalg.norm(rows_only - want, axis=1) / np.linalg.norm(want, axis=1)).max() > 1e-3


def test_the_estimate_needs_the_pq_selector():
    with pytest.raises(pqcache.PQError, match="tail_estimate") as e:
        make(selector="exact")
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "PQ_SELECTOR_PQ" in str(e.value)
