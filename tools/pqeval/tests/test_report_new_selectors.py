"""A selector added after the measurements were recorded has no rows in
them until a run adds it; the report leaves it out (and says so for the
trace tables) instead of failing."""

from pqeval import report
from pqeval.longctx import SELECTORS, TRACE_SELECTORS

OLD = ["exact", "pq", "sparq", "infllm", "quest", "h2o", "snapkv", "pyramidkv", "scope",
       "window", "random"]  # the selectors before issue 27 added more


def cell(acc):
    return {"acc": (acc, acc - 0.1, acc + 0.1), "diff": (acc - 0.5, acc - 0.6, acc - 0.4),
            "agree": 0.5, "prompts": 4}


def test_task_statements_use_the_selectors_the_prompts_measured():
    summary = {report.FULL: cell(0.5)}
    for i, s in enumerate(OLD):
        for b in report.BUDGETS:
            summary[f"{s}@{b}"] = cell(0.1 + 0.01 * i)
    lines = []
    report.cell_statements("smollm2-135m", 4096, summary, lines)
    assert any("best drop method (scope)" in l for l in lines), lines
    assert report.best_other(summary, "1/5") == "random"


def test_trace_table_lists_what_a_study_lacks():
    layer = {k: 0.5 for k in ("recall", "head_recall", "mass", "fixed_mass", "mid_mass",
                              "error", "selected")}
    study = {"selectors": {f"{s}@{b}": [layer] for s in OLD for b in report.BUDGETS}}
    lines = []
    report.trace_table(study, lines)
    new = [s for s in TRACE_SELECTORS if s not in OLD]  # a trace cannot measure InfiniGen
    assert new, "no selector was added: this test has nothing to check"
    assert lines[-1] == "Not measured on this trace yet: " + ", ".join(new) + "."
    assert "infinigen" in SELECTORS and not any("infinigen" in l for l in lines)
    assert sum(l.startswith("| h2o |") for l in lines) == len(report.BUDGETS)


def test_a_row_measured_on_fewer_prompts_ranks_against_nothing():
    """A selector whose run covers only some prompts of a cell (the plan
    still running) is listed with its count, but the statements rank PQ
    only against rows measured on every prompt."""
    summary = {report.FULL: cell(0.5)}
    for i, s in enumerate(OLD):
        for b in report.BUDGETS:
            summary[f"{s}@{b}"] = cell(0.1 + 0.01 * i)
    for b in report.BUDGETS:
        summary[f"clusterkv@{b}"] = {**cell(0.9), "prompts": 2}
        summary[f"keyformer@{b}"] = {**cell(0.8), "prompts": 2}
    assert report.best_other(summary, "1/5") == "random"
    lines = []
    report.cell_statements("smollm2-135m", 4096, summary, lines)
    assert not any("clusterkv" in l or "keyformer" in l for l in lines), lines
    assert any("best drop method (scope)" in l for l in lines), lines
