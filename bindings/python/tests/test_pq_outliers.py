"""pq_outliers (0.13) through the binding: a key pushed toward the query in
dimensions no centroid spans is hidden by its codes and selected once the
keys with the largest quantization residuals are scored exactly; the field
round-trips through config(); a bad share is a named error."""
import numpy as np
import pytest

import pqcache

Q, KV, DIM, M, BITS, SINK, LOCAL, N, NEEDLE = 8, 2, 32, 2, 4, 4, 16, 700, 300


def needle_keys():
    """Keys in 16 tight clusters per subspace whose centres span half of it;
    the needle: its group's lowest-scoring centres + 3 x the group's query
    direction in the unspanned half, where the queries are large: too close
    to win a centroid of its own, far enough to have the largest residual."""
    rng = np.random.default_rng(5)
    sub = DIM // M
    centers = rng.standard_normal((M, 16, sub)).astype(np.float32)
    centers[:, :, sub // 2:] = 0
    picks = rng.integers(0, 16, (N, KV, M))
    keys = np.concatenate([centers[j][picks[:, :, j]] for j in range(M)], axis=2)
    keys += 0.1 * rng.standard_normal(keys.shape).astype(np.float32)
    query = (1.5 * rng.standard_normal((Q, DIM))).astype(np.float32)
    for j in range(M):
        query[:, j * sub + sub // 2:(j + 1) * sub] *= 4
    for h in range(KV):
        direction = query[h * Q // KV:(h + 1) * Q // KV].sum(axis=0)
        away = direction.copy()
        for j in range(M):
            away[j * sub:j * sub + sub // 2] = 0
            low = np.argmin(centers[j] @ direction[j * sub:(j + 1) * sub])
            keys[NEEDLE, h, j * sub:(j + 1) * sub] = centers[j][low]
        keys[NEEDLE, h] += 3 * away / np.linalg.norm(away)
    values = rng.standard_normal((N, KV, DIM)).astype(np.float32)
    return keys, values, query


def make(share):
    return pqcache.Context(1, Q, KV, DIM, "f32", pq_subspaces=M, pq_bits=BITS, sink_tokens=SINK,
                           local_tokens=LOCAL, topk_fraction=0.05, pq_outliers=share)


def test_outliers_find_the_key_its_codes_hide():
    keys, values, query = needle_keys()
    found = {}
    for share in (0.0, 0.01):
        with make(share) as ctx:
            ctx.add_sequence(0)
            ctx.prefill(0, 0, keys, values)
            found[share] = [NEEDLE in row for row in ctx.select(0, 0, query).heads()]
    assert found[0.0] == [False, False]
    assert found[0.01] == [True, True]


def test_the_share_round_trips_and_a_bad_one_is_named():
    with make(0.01) as ctx:
        assert ctx.config()["pq_outliers"] == pytest.approx(0.01)
    with pytest.raises(pqcache.PQError, match="pq_outliers"):
        make(0.5)
    with pytest.raises(pqcache.PQError, match="PQ_SELECTOR_PQ"):
        pqcache.Context(1, Q, KV, DIM, "f32", selector="h2o", pq_outliers=0.01)
