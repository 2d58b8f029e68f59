"""The OPQ prototype (pqeval.opq) learns an orthogonal rotation that lowers
the product quantizer's reconstruction error where one exists to find, and
rotating keys and queries together leaves every q.k as it was."""

import numpy as np

from pqeval import opq, trace as trace_io


def test_pair_permutation_groups_each_rotary_pair():
    p = opq.pair_permutation(8)
    x = np.arange(8.0)[None, :]
    # rotate-half pairs (i, i + 4) become adjacent columns
    assert (x @ p).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert np.allclose(p.T @ p, np.eye(8))


def test_rotation_is_orthogonal_and_finds_a_hidden_mix():
    rng = np.random.default_rng(3)
    # Two strong directions spread over both subspaces by a hidden rotation:
    # the identity splits each across subspaces, a learned rotation can undo it.
    z = rng.normal(size=(2000, 8)) * np.array([6, 1, 1, 1, 6, 1, 1, 1])
    hidden, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    x = z @ hidden.T
    r, errors = opq.learn_rotation(x, 2, 3, rounds=6, kmeans_iterations=10)
    assert np.allclose(r.T @ r, np.eye(8), atol=1e-8)
    assert errors[-1] < 0.9 * errors[0], errors


def test_rotated_trace_keeps_every_dot_product():
    rng = np.random.default_rng(5)
    n, q_heads, kv_heads, d = 300, 4, 2, 8
    keys = {0: rng.normal(size=(n, kv_heads, d)).astype(np.float32)}
    queries = {0: rng.normal(size=(40, q_heads, d)).astype(np.float32)}
    t = trace_io.Trace("m", "t", np.arange(n, dtype=np.int32), [0], queries, keys, keys,
                       q_first=n - 40)
    rotated, errors = opq.rotate_trace(t, 2, 3, 4, n - 40, rounds=2, log=lambda *_: None)
    group = q_heads // kv_heads
    for j in range(q_heads):
        before = queries[0][:, j, :] @ keys[0][:, j // group, :].T
        after = rotated.queries[0][:, j, :] @ rotated.keys[0][:, j // group, :].T
        assert np.allclose(before, after, atol=1e-4)
    assert set(errors) == {"start", "learned"}
