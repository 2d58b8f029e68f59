"""Trace replay through the library on a small synthetic trace: the oracle
scores perfectly against itself, PQ beats the window, and the metrics are
consistent (mass <= 1, error >= 0)."""
import numpy as np
import pytest

from pqeval import replay, trace


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    rng = np.random.default_rng(0)
    n, f, qh, kvh, hd = 700, 500, 6, 2, 32
    centers = rng.standard_normal((16, hd)) * 3
    K = (centers[rng.integers(0, 16, (n, kvh))] + rng.standard_normal((n, kvh, hd))).astype(np.float16)
    V = rng.standard_normal((n, kvh, hd)).astype(np.float16)
    Q = (centers[rng.integers(0, 16, (n - f, qh))] * 0.5 +
         rng.standard_normal((n - f, qh, hd))).astype(np.float16)
    t = trace.Trace("synthetic", "clusters", np.arange(n, dtype=np.int32), [3], {3: Q}, {3: K},
                    {3: V}, f)
    path = tmp_path_factory.mktemp("tr") / "syn.pqtrace"
    trace.write(path, t, "f16")
    return trace.read(path)


def test_oracle_is_perfect_against_itself(synthetic):
    r = replay.replay(synthetic, "exact", 0.2, steps=20, kmeans_iterations=5)
    assert r.mean("recall") == pytest.approx(1.0)
    assert 0.0 < r.mean("mass") <= 1.0 + 1e-6
    assert r.layers[0].steps == 20


def test_pq_beats_the_window(synthetic):
    pq = replay.replay(synthetic, "pq", 0.2, steps=20, kmeans_iterations=5)
    window = replay.replay(synthetic, "window", 0.2, steps=20)
    # Measured 0.90 vs 0.20 recall; the margins leave room for seeds and CPUs.
    assert pq.mean("recall") > window.mean("recall") + 0.3
    assert pq.mean("mass") > window.mean("mass")
    assert pq.mean("error") < window.mean("error")
    assert pq.mean("select_bytes") > 0 and window.mean("select_bytes") == 0
