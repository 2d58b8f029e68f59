"""tail_estimate="code_means" (pq_tail_estimate, 0.12) through the binding:
Context.attend merges the selected rows with an estimate of the middle
tokens the selection leaves out, which equals the estimate written out here
in numpy from the index's own codes and centroids; it is the tail's exact
attention when the index holds the tail exactly (each group one key and one
value), and within a bound set by the code scores' error otherwise."""
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


def data(seed):
    """keys, values [N][KV][DIM] and a query [Q][DIM], float32."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((N, KV, DIM), dtype=np.float32) * 1.5,
            rng.standard_normal((N, KV, DIM), dtype=np.float32),
            rng.standard_normal((Q, DIM), dtype=np.float32))


def prefilled(keys, values, **options):
    ctx = make(**options)
    ctx.add_sequence(0)
    ctx.prefill(0, 0, keys, values)
    return ctx


def test_attend_adds_the_estimate_of_the_tail():
    keys, values, query = data(3)
    with prefilled(keys, values) as ctx, prefilled(keys, values, tail="none") as plain:
        assert ctx.config()["tail_estimate"] == pqcache.TAIL_ESTIMATE["code_means"]
        assert repr(ctx.config()["tail_estimate"]) == "<tail_estimate.code_means: 1>"
        sel = ctx.select(0, 0, query)
        out, lse = ctx.attend(0, 0, query, sel)
        want, want_lse = estimate(ctx, keys.astype(np.float64), values.astype(np.float64),
                                  query, sel)
        err = np.linalg.norm(out - want, axis=1) / np.linalg.norm(want, axis=1)
        assert err.max() < 2e-5
        np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)
        rows_only, _ = plain.attend(0, 0, query, sel)
        assert (np.linalg.norm(rows_only - want, axis=1) / np.linalg.norm(want, axis=1)).max() > 1e-3


def test_the_tail_alone_merges_with_the_callers_attention():
    keys, values, query = data(5)
    with prefilled(keys, values) as ctx, prefilled(keys, values, tail="none") as plain:
        sel = ctx.select(0, 0, query)
        whole, whole_lse = ctx.attend(0, 0, query, sel)
        rows, rows_lse = plain.attend(0, 0, query, sel)  # the caller's own attention
        tail, tail_lse = ctx.tail(0, 0, query, sel)
        m = np.maximum(rows_lse, tail_lse)
        wa, wt = np.exp(rows_lse - m)[:, None], np.exp(tail_lse - m)[:, None]
        np.testing.assert_allclose((wa * rows + wt * tail) / (wa + wt), whole, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m + np.log(wa[:, 0] + wt[:, 0]), whole_lse, rtol=1e-5)
        with pytest.raises(pqcache.PQError, match="tail_estimate") as e:
            plain.tail(0, 0, query, sel)
        assert e.value.status_name == "PQ_ERR_BAD_STATE"


def test_the_estimate_needs_the_pq_selector():
    with pytest.raises(pqcache.PQError, match="tail_estimate") as e:
        make(selector="exact")
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "PQ_SELECTOR_PQ" in str(e.value)


def attention(logits, rows):
    """Softmax attention in float64: (output, log-sum-exp)."""
    top = logits.max()
    w = np.exp(logits - top)
    return w @ rows / w.sum(), top + np.log(w.sum())


def test_an_index_that_holds_the_tail_exactly_estimates_it_exactly():
    """Every token one of six (key, value) pairs: K-Means with 16 centroids
    puts one on each, so each group (first code) holds one key and one value
    and the estimate of the tail is the tail's exact attention: the tail
    alone matches attention over the left-out tokens, and attend with it
    matches attention over every token."""
    rng = np.random.default_rng(7)
    pair_keys = rng.standard_normal((6, KV, DIM)).astype(np.float32)
    pair_values = rng.standard_normal((6, KV, DIM)).astype(np.float32)
    which = rng.integers(0, 6, N)
    keys, values = pair_keys[which], pair_values[which]
    query = rng.standard_normal((Q, DIM)).astype(np.float32)
    group, mid_end, scale = Q // KV, N - LOCAL, 1.0 / np.sqrt(DIM)
    with prefilled(keys, values) as ctx:
        sel = ctx.select(0, 0, query)
        whole, whole_lse = ctx.attend(0, 0, query, sel)
        tail, tail_lse = ctx.tail(0, 0, query, sel)
        for h, chosen in enumerate(sel.heads()):
            left_out = np.setdiff1d(np.arange(SINK, mid_end), chosen)
            assert left_out.size > 0
            for g in range(h * group, (h + 1) * group):
                q = query[g].astype(np.float64)
                k, v = keys[:, h].astype(np.float64), values[:, h].astype(np.float64)
                want, want_lse = attention(k[left_out] @ q * scale, v[left_out])
                np.testing.assert_allclose(tail[g], want, rtol=1e-5, atol=1e-5)
                assert abs(tail_lse[g] - want_lse) < 1e-5
                want, want_lse = attention(k @ q * scale, v)  # every token
                np.testing.assert_allclose(whole[g], want, rtol=1e-5, atol=1e-5)
                assert abs(whole_lse[g] - want_lse) < 1e-5


def test_the_tails_error_is_bounded_by_its_code_scores():
    """On random keys: with d the largest |code score - exact logit| of a
    query head's left-out tokens (scaled), the tail's log-sum-exp is within
    d of the exact one over those tokens, and its output within
    (e^(2d) - 1) max|group mean| + max|group mean - value| of theirs, per
    dimension (each weight moves by at most e^(2d), each value to its
    group's mean)."""
    keys, values, query = data(11)
    group, sub, mid_end, scale = Q // KV, DIM // M, N - LOCAL, 1.0 / np.sqrt(DIM)
    with prefilled(keys, values) as ctx:
        sel = ctx.select(0, 0, query)
        tail, tail_lse = ctx.tail(0, 0, query, sel)
        for h, chosen in enumerate(sel.heads()):
            left_out = np.setdiff1d(np.arange(SINK, mid_end), chosen)
            codes = ctx.codes(0, 0, h, SINK, mid_end - SINK).astype(np.int64)
            cent = ctx.centroids(0, 0, h).astype(np.float64)
            first = codes[:, 0]
            v = values[SINK:mid_end, h].astype(np.float64)
            means = np.zeros((1 << BITS, DIM))
            np.add.at(means, first, v)
            means /= np.maximum(np.bincount(first, minlength=1 << BITS), 1)[:, None]
            i = left_out - SINK
            for g in range(h * group, (h + 1) * group):
                q = query[g].astype(np.float64)
                exact = keys[left_out, h].astype(np.float64) @ q * scale
                code = sum(cent[j][codes[i, j]] @ q[j * sub:(j + 1) * sub] for j in range(M)) * scale
                d = np.abs(code - exact).max()
                assert d > 0.01  # the codes are not the keys: the bound is tested
                want, want_lse = attention(exact, v[i])
                assert abs(tail_lse[g] - want_lse) <= d + 1e-5
                bound = (np.expm1(2 * d) * np.abs(means[first[i]]).max(axis=0)
                         + np.abs(means[first[i]] - v[i]).max(axis=0))
                assert (np.abs(tail[g] - want) <= bound + 1e-5).all()
