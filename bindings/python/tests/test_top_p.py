"""top_p (0.15) through the binding: a tiny share keeps the floor (one
middle token with a floor of 0), 1 keeps all k; both fields round-trip
through config(); a selector without q.k estimates is a named error."""
import numpy as np
import pytest

import pqcache

Q, KV, DIM, N, SINK, LOCAL, K = 8, 2, 32, 400, 4, 16, 32


def counts(top_p, floor):
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((N, KV, DIM)).astype(np.float32)
    values = rng.standard_normal((N, KV, DIM)).astype(np.float32)
    query = rng.standard_normal((Q, DIM)).astype(np.float32)
    with pqcache.Context(1, Q, KV, DIM, "f32", pq_subspaces=2, pq_bits=4, sink_tokens=SINK,
                         local_tokens=LOCAL, topk_tokens=K, top_p=top_p,
                         top_p_floor=floor) as ctx:
        assert ctx.config()["top_p"] == pytest.approx(top_p)
        assert ctx.config()["top_p_floor"] == pytest.approx(floor)
        ctx.add_sequence(0)
        ctx.prefill(0, 0, keys, values)
        return [len(row) for row in ctx.select(0, 0, query).heads()]


def test_a_tiny_share_keeps_the_floor_and_one_keeps_every_k():
    assert counts(1e-6, 0.0) == [SINK + 1 + LOCAL] * KV
    assert counts(1.0, 0.02) == [SINK + K + LOCAL] * KV


def test_top_p_needs_estimates_of_q_k():
    with pytest.raises(pqcache.PQError, match="top_p"):
        pqcache.Context(1, Q, KV, DIM, "f32", selector="h2o", top_p=0.5)
    with pytest.raises(pqcache.PQError, match="top_p_floor"):
        pqcache.Context(1, Q, KV, DIM, "f32", top_p=0.5, top_p_floor=2.0)
