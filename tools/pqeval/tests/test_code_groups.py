"""code_groups on a synthetic trace with one planted group: a few keys far
along the direction every query takes. With many centroids the group keeps
its own code and PQ sees its high scores; with two centroids per subspace it
shares a code with ordinary keys and PQ's estimate of its logits collapses,
which is the mechanism the tool exists to show on real traces."""
import numpy as np
import pytest

from pqeval import code_groups, trace

PLANTED = 12


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    rng = np.random.default_rng(1)
    n, f, qh, kvh, hd = 900, 700, 4, 1, 32
    direction = np.zeros(hd)
    direction[0] = 1.0
    K = rng.standard_normal((n, kvh, hd))
    members = rng.choice(np.arange(10, 500), PLANTED, replace=False)
    K[members, 0] = 6.0 * direction + 0.1 * rng.standard_normal(hd)
    Q = rng.standard_normal((n - f, qh, hd)) * 0.3 + 4.0 * direction
    V = rng.standard_normal((n, kvh, hd))
    t = trace.Trace("synthetic", "planted", np.arange(n, dtype=np.int32), [0],
                    {0: Q.astype(np.float16)}, {0: K.astype(np.float16)},
                    {0: V.astype(np.float16)}, f)
    path = tmp_path_factory.mktemp("cg") / "planted.pqtrace"
    trace.write(path, t, "f16")
    return trace.read(path), np.sort(members)


def test_the_planted_group_leads_and_many_centroids_keep_its_scores(planted):
    t, _ = planted
    r = code_groups.groups(t, 0, step=2, pq_subspaces=2, pq_bits=6, kmeans_iterations=10)
    lead = r["groups"][0]
    assert lead["tokens"] == PLANTED
    assert lead["middle_mass"] > 0.4  # measured 0.54
    assert lead["exact_rank"] <= PLANTED
    assert lead["selected"] == PLANTED
    # PQ's logit gap stays within 20% of the exact one (measured within 2%).
    assert lead["pq_logit_gap"] == pytest.approx(lead["exact_logit_gap"], rel=0.2)
    masses = [g["middle_mass"] for g in r["groups"]]
    assert masses == sorted(masses, reverse=True) and sum(masses) <= 1.0 + 1e-9
    assert r["kmeans_iterations"] >= 1 and r["distinct_tuples"] <= r["middle_tokens"]


def test_two_centroids_merge_the_group_and_flatten_its_scores(planted):
    t, _ = planted
    many = code_groups.groups(t, 0, step=2, pq_subspaces=2, pq_bits=6, kmeans_iterations=10)["groups"][0]
    few = code_groups.groups(t, 0, step=2, pq_subspaces=2, pq_bits=1, kmeans_iterations=10)
    lead = few["groups"][0]
    assert lead["tokens"] > PLANTED  # shares its code with ordinary keys
    assert lead["pq_logit_gap"] < 0.5 * many["pq_logit_gap"]


def test_selected_agrees_with_the_pq_rank(planted):
    t, _ = planted
    r = code_groups.groups(t, 0, step=5, top=20, pq_bits=4, kmeans_iterations=5)
    k = r["selected_middle"]
    for g in r["groups"]:
        assert 0 <= g["selected"] <= g["tokens"]
        # A group's tokens share one PQ score, so the library takes all of a
        # group ranked clearly inside k and none of one clearly outside.
        if g["pq_rank"] + g["tokens"] < 0.9 * k:
            assert g["selected"] == g["tokens"], g
        if g["pq_rank"] - g["tokens"] > 1.1 * k:
            assert g["selected"] == 0, g


def test_bad_arguments_are_named(planted, capsys, tmp_path):
    t, _ = planted
    with pytest.raises(ValueError, match="step 500"):
        code_groups.groups(t, 0, step=500)
    with pytest.raises(ValueError, match="layer 2 is not in the trace"):
        code_groups.groups(t, 2)
    with pytest.raises(ValueError, match="kv_head 1"):
        code_groups.groups(t, 0, kv_head=1)
    path = tmp_path / "p.pqtrace"
    trace.write(path, t, "f16")
    for argv, expected in (([str(path), "--layers", "3"], "layer 3 is not in the trace"),
                           ([str(path), "--set", "pq_bits"], "expected FIELD=INT"),
                           ([str(path), "--set", "pq_bits=9"], "at most 8 bits")):
        with pytest.raises(SystemExit) as exit_info:
            code_groups.main(argv)
        assert exit_info.value.code == 2
        assert expected in capsys.readouterr().err


def test_the_command_prints_a_table(planted, capsys, tmp_path):
    t, _ = planted
    path = tmp_path / "p.pqtrace"
    trace.write(path, t, "f16")
    code_groups.main([str(path), "--iterations", "3", "10", "--top", "2", "--set", "pq_bits=6"])
    out = capsys.readouterr().out
    assert out.count("| codes |") == 2 and "3 K-Means iterations run" in out
