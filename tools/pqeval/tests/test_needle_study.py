"""The needle study (pqeval.needle_study): its numpy PQ is the library's
selection (so its "outliers kept exact" rows change one thing only), and
keeping the largest-residual tokens exact brings back a token whose
approximate score hides it."""
import numpy as np

from pqeval import needle_study, trace


def test_outliers_kept_exact_bring_back_a_hidden_token():
    rng = np.random.default_rng(3)
    g, n, k = 3, 400, 20
    exact = rng.standard_normal((g, n))
    approx = exact + 0.05 * rng.standard_normal((g, n))
    residual = rng.random(n)
    hidden = 123
    exact[:, hidden] = 12.0          # the needle: the highest exact score ...
    approx[:, hidden] = -3.0         # ... which its codes do not show
    residual[hidden] = 5.0           # ... because its key is far from its centroids
    assert needle_study.outlier_threshold(residual, 0.0) == np.inf
    assert needle_study.outlier_threshold(residual, 0.01) == np.sort(residual)[-4]  # ceil(4.0)
    without = needle_study.outlier_exact_selection(
        exact, approx, residual >= needle_study.outlier_threshold(residual, 0.0), k)
    assert hidden not in without and len(without) == k
    with_outliers = needle_study.outlier_exact_selection(
        exact, approx, residual >= needle_study.outlier_threshold(residual, 0.01), k)
    assert hidden in with_outliers and len(with_outliers) == k
    # Share 0 is the approximate scores' top k, nothing else.
    combined = needle_study._softmax_rows(approx).sum(axis=0)
    assert set(without) == set(np.argsort(-combined)[:k])


def test_numpy_pq_is_the_library_s_selection(tmp_path):
    rng = np.random.default_rng(5)
    n, answer, qh, kvh, hd = 700, 3, 6, 2, 32
    centers = rng.standard_normal((16, hd))
    K = centers[rng.integers(0, 16, (n, kvh))] + 0.5 * rng.standard_normal((n, kvh, hd))
    V = rng.standard_normal((n, kvh, hd))
    Q = centers[rng.integers(0, 16, (answer + 1, qh))] + rng.standard_normal((answer + 1, qh, hd))
    t = trace.Trace("synthetic", "needle", np.arange(n, dtype=np.int32), [1],
                    {1: Q.astype(np.float32)}, {1: K.astype(np.float32)},
                    {1: V.astype(np.float32)}, n - answer - 1, 2)
    needle = list(range(300, 304))
    cells, disagree = needle_study.study_trace(t, n - answer, answer, needle, 0.2)
    assert len(cells) == answer * kvh * len(needle)
    assert disagree == 0
    s = needle_study.summary(cells)
    assert s["oracle"] == sum(c.in_exact for c in cells)
    assert s["lost@0"] == s["pq_lost"]
    for c in cells:
        assert 0 <= c.residual_share < 1 and c.mass >= 0 and len(c.kept_by) == len(needle_study.SHARES)
    # The library's pq_outliers row is numpy's outliers row at the same share
    # (the same outliers; near-ties aside, which this synthetic trace has none of).
    i = needle_study.SHARES.index(needle_study.LIB_SHARE)
    assert [c.in_lib_outliers for c in cells] == [c.kept_by[i] for c in cells]
