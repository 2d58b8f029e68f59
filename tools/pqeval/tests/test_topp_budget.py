"""pqeval.topp_budget: top-p budgets hit their average by bisection, an
oracle ranking keeps at least the mass of an estimated one, and the pooled
split is at least every per-head rule at the same average."""
import numpy as np

from pqeval import topp_budget


def cases(seed=3, n=400, heads=4, steps=6):
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        for h in range(heads):
            # Heads differ: some peaked, some flat.
            exact = rng.standard_normal((2, n)) * (1 + 2 * h)
            noisy = exact + rng.standard_normal((2, n))
            out.append(topp_budget.make_case(exact, noisy, (0, step)))
    return out


def test_top_p_averages_the_share_and_the_oracle_keeps_more():
    c = cases()
    for oracle in (False, True):
        p = topp_budget.p_for_share(c, 0.1, 0.0, 0.5, oracle)
        count, mass = topp_budget.top_p(c, p, 0.0, 0.5, oracle)
        assert abs(count - 0.1) < 0.005
        assert 0 < mass <= 1
    est = topp_budget.top_p(c, topp_budget.p_for_share(c, 0.1, 0.0, 0.5), 0.0, 0.5)[1]
    orc = topp_budget.top_p(c, topp_budget.p_for_share(c, 0.1, 0.0, 0.5, True), 0.0, 0.5, True)[1]
    assert orc >= est
    assert topp_budget.fixed(c, 0.1, oracle=True) >= topp_budget.fixed(c, 0.1)
    # The pooled split is the best split of each step's tokens among its
    # heads: at least the oracle's fixed budget (an equal split).
    assert topp_budget.pooled(c, 0.1) >= topp_budget.fixed(c, 0.1, oracle=True) - 1e-12


def test_the_table_has_every_row():
    lines = topp_budget.table(cases())
    assert lines[0].startswith("| budget |")
    assert len(lines) == 2 + 4 + 4 + 1


def test_the_report_section_judges_the_target(tmp_path):
    rows = topp_budget.table(cases())
    (tmp_path / "topp-budget-2k.md").write_text("header\n\n" + "\n".join(rows) + "\n")
    lines = []
    topp_budget.report_section(tmp_path, lines)
    text = "\n".join(lines)
    assert rows[2] in text
    met = "is met here" in text
    assert met != ("is not met here" in text)
    # The verdict follows the numbers: make top-p from the estimate reach the target.
    boosted = [r if "PQ estimate" not in r else r.rsplit("|", 2)[0] + "| 0.9999 |" for r in rows]
    (tmp_path / "topp-budget-2k.md").write_text("header\n\n" + "\n".join(boosted) + "\n")
    lines = []
    topp_budget.report_section(tmp_path, lines)
    assert "is met here" in "\n".join(lines)
    lines = []
    topp_budget.report_section(tmp_path / "missing", lines)
    assert lines == []


def test_the_library_row_decides_the_verdict(tmp_path):
    # The library's run is asked for at the modelled p of the largest floor.
    asked = []
    rows = topp_budget.table(cases(), library=lambda p, floor, ceiling: (
        asked.append((p, floor, ceiling)) or (0.1, 0.9999)))
    assert len(rows) == 2 + 4 + 5 + 1
    assert len(asked) == 1 and asked[0][1:] == (0.02, 0.5)
    assert any(topp_budget.LIBRARY in r and f"p = {asked[0][0]:.3f}" in r for r in rows)
    (tmp_path / "topp-budget-2k.md").write_text("header\n\n" + "\n".join(rows) + "\n")
    lines = []
    topp_budget.report_section(tmp_path, lines)
    text = "\n".join(lines)
    assert "mode at the modelled p keeps 0.9999" in text
    assert "is met here" in text  # 0.9999 reaches any fixed 1/5 mass
