"""The reduced quality evaluation CI runs: every selector replayed over the
committed real trace (SmolLM2-135M, a 1964 State of the Union address, layers
3, 15 and 27, the first 64 decode positions), with floors that fail if the
PQ selector's quality regresses.

Measured when the floors were set (2026-11-22): PQ attention-mass recall
0.972 at 1/5 and 0.955 at 1/10, exact top-k recall 0.652 and 0.564, output
error 0.034; WINDOW 0.790 mass / 0.459 recall / 0.312 error at 1/5; RANDOM
0.768 / 0.200; EXACT 0.983 mass. Each floor sits a few hundredths under the
measurement, so noise-free regressions of that size fail while platform
differences in float rounding do not (the replay is deterministic: seeded
K-Means, fixed iteration rules).

The middle-only metrics (2026-11-23): the 4 sink and 128 local tokens alone
hold 0.711 of the attention mass; of the rest (the middle tokens' mass) PQ
covers 0.818 at 1/5 and 0.689 at 1/10, the oracle 0.907 and 0.818, the
window 0.443, random 0.203; PQ's recall against each query head's own exact
top-k is 0.586 (0.651 against the GQA-combined top-k the oracle ranks by).

Since 0.7 the PQ rows are the default index as a caller that declares this
trace's layout configures it: m and b chosen from head_dim (2 x 8 bits
here), key_rotary "interleaved" (the trace holds llama.cpp's adjacent rotary
pairs, which contiguous subspaces keep whole; "half" would pair the wrong
dimensions: middle mass 0.843), K-Means after the sinks. Measured
2026-11-27: attention mass 0.977 at 1/5 and 0.961 at 1/10, exact top-k
recall 0.731 and 0.668, output error 0.027; middle mass 0.858 and 0.746,
per-head recall 0.642. The paper's 2 x 6 bits measure as before (middle
mass 0.814 at 1/5, 0.688 at 1/10). Exact re-ranking of 1.5 k candidates
(pq_rerank 0.5): middle mass 0.891 at 1/5 and 0.787 at 1/10 (the oracle
0.907 and 0.818), reading 193,821 bytes per step at 1/5 against the
oracle's 613,056 and the codes' 9,579.
"""
from pathlib import Path

import pytest

from pqeval import evaluate, replay, token_classes, trace

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "smollm2_sotu_2k.pqtrace"
STEPS = 64
LAYOUT = {"key_rotary": "interleaved"}  # the trace's dimension order (GGUF)


@pytest.fixture(scope="module")
def results():
    t = trace.read(FIXTURE)
    classes = token_classes.read(FIXTURE)  # FastGen's (the fixture's committed classes)
    out = {}
    for fraction in (0.2, 0.1):
        for name in evaluate.TRACE_SELECTORS:
            out[(name, fraction)] = replay.replay(t, name, evaluate.budget(name, fraction),
                                                  steps=STEPS, token_classes=classes, **LAYOUT)
        out[("pq-rerank", fraction)] = replay.replay(
            t, "pq", fraction, steps=STEPS, pq_rerank=0.5, **LAYOUT)
    return out


def test_every_selector_runs_on_real_attention(results):
    for (name, fraction), r in results.items():
        assert len(r.layers) == 3 and all(l.steps == STEPS for l in r.layers), name
        assert 0.0 < r.mean("mass") <= 1.0 + 1e-6, name
        assert 0.0 <= r.mean("recall") <= 1.0 + 1e-6, name


def test_pq_attention_mass_floor(results):
    assert results[("pq", 0.2)].mean("mass") >= 0.96   # measured 0.977 (2 x 6 bits: 0.972)
    assert results[("pq", 0.1)].mean("mass") >= 0.94   # measured 0.961 (0.955)


def test_pq_exact_topk_recall_floor(results):
    assert results[("pq", 0.2)].mean("recall") >= 0.69  # measured 0.731 (2 x 6 bits: 0.652)
    assert results[("pq", 0.1)].mean("recall") >= 0.63  # measured 0.668 (0.564)


def test_pq_clearly_above_window_and_random(results):
    for fraction in (0.2, 0.1):
        pq, window, rnd = (results[(n, fraction)] for n in ("pq", "window", "random"))
        assert pq.mean("mass") >= window.mean("mass") + 0.10    # measured +0.18, +0.20
        assert pq.mean("mass") >= rnd.mean("mass") + 0.10       # measured +0.20, +0.22
        assert pq.mean("recall") >= rnd.mean("recall") + 0.30   # measured +0.45, +0.46
        assert pq.mean("error") <= 0.5 * window.mean("error")   # measured 0.034 vs 0.312


def test_pq_close_to_the_oracle(results):
    exact = results[("exact", 0.2)]
    assert exact.mean("recall") == pytest.approx(1.0)
    assert results[("pq", 0.2)].mean("mass") >= exact.mean("mass") - 0.03  # measured -0.011


def test_pq_reads_a_small_fraction_of_the_keys(results):
    # codes: m*b/8 bits per token against 2*head_dim bytes of f16 key
    pq, exact = results[("pq", 0.2)], results[("exact", 0.2)]
    assert pq.mean("select_bytes") < exact.mean("select_bytes") / 30


def test_the_fixed_part_is_the_same_for_every_selector(results):
    """Sinks and the local window: every selector keeps them, so their mass
    is no selector's merit (and the middle mass is measured without it)."""
    fixed = {name: r.mean("fixed_mass") for name, r in results.items()}
    assert max(fixed.values()) - min(fixed.values()) < 1e-6  # float sums only
    assert 0.6 < fixed[("pq", 0.2)] < 0.8  # measured 0.711


def test_pq_middle_mass_floors(results):
    pq5, pq10 = results[("pq", 0.2)], results[("pq", 0.1)]
    assert pq5.mean("mid_mass") >= 0.83     # measured 0.858 (2 x 6 bits: 0.818)
    assert pq10.mean("mid_mass") >= 0.72    # measured 0.746 (0.689)
    assert pq5.mean("head_recall") >= 0.61  # measured 0.642 (0.586)
    assert results[("exact", 0.2)].mean("mid_mass") >= 0.88  # measured 0.907
    for fraction in (0.2, 0.1):
        pq, window, rnd = (results[(n, fraction)] for n in ("pq", "window", "random"))
        assert pq.mean("mid_mass") >= window.mean("mid_mass") + 0.3  # measured +0.38, +0.41
        assert pq.mean("mid_mass") >= rnd.mean("mid_mass") + 0.5     # measured +0.62, +0.59
        # the oracle's middle mass bounds every selector's
        assert results[("exact", fraction)].mean("mid_mass") >= pq.mean("mid_mass")


def test_exact_reranking_closes_most_of_the_gap_to_the_oracle(results):
    """pq_rerank 0.5: the codes pick 1.5 k candidates, exact scores keep k."""
    for fraction, floor in ((0.2, 0.87), (0.1, 0.76)):  # measured 0.891, 0.787
        reranked, pq = results[("pq-rerank", fraction)], results[("pq", fraction)]
        exact = results[("exact", fraction)]
        assert reranked.mean("mid_mass") >= floor
        assert reranked.mean("mid_mass") >= pq.mean("mid_mass") + 0.02  # measured +0.033, +0.041
        assert reranked.mean("mid_mass") <= exact.mean("mid_mass") + 1e-9
        # It reads the candidates' keys: more than the codes, less than the oracle.
        assert pq.mean("select_bytes") < reranked.mean("select_bytes") < exact.mean("select_bytes")
