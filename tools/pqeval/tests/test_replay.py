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


def test_interval_is_over_batch_means_of_the_steps():
    r = replay.Result("pq", 0.2)
    # Two layers, 48 steps each: three batches of 16 per layer; the batches'
    # means are 0..5, so the interval is 1.96 x std(0..5) / sqrt(6).
    for first in (0, 3):
        lr = replay.LayerResult(layer=first)
        lr.step_error = [float(first + b) for b in range(3) for _ in range(replay.BATCH_STEPS)]
        r.layers.append(lr)
    want = 1.96 * np.std(np.arange(6.0), ddof=1) / np.sqrt(6)
    assert r.interval("step_error") == pytest.approx(want)
    one = replay.Result("pq", 0.2, [replay.LayerResult(layer=0, step_error=[1.0] * 20)])
    assert np.isnan(one.interval("step_error"))  # a single batch: no interval


def test_replay_records_every_step(synthetic):
    r = replay.replay(synthetic, "pq", 0.2, steps=40, kmeans_iterations=5)
    lr = r.layers[0]
    assert len(lr.step_error) == len(lr.step_mid_mass) == lr.steps == 40
    assert np.mean(lr.step_error) == pytest.approx(lr.error, rel=1e-9)
    assert np.mean(lr.step_mid_mass) == pytest.approx(lr.mid_mass, rel=1e-9)
    assert r.interval("step_error") > 0.0
