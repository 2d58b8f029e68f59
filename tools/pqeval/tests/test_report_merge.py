"""A run with rows other than the default set (pqeval.longctx --selectors)
is its own record; the report merges it into the record of the same prompt
or document, and refuses to when the two full-attention rows disagree."""

import pytest

from pqeval import longctx, report


def ppl(key, rows, seconds=10.0):
    return {"key": key, "kind": "ppl", "model": "gemma3-270m", "context": 32512,
            "document": 0, "nll": rows, "seconds": seconds}


def test_a_separate_run_adds_its_rows_to_the_same_document():
    base = ppl("ppl/gemma3-270m/32512/256/0", {"full": [1.0, 2.0], "pq@1/5": [1.1, 2.1]})
    extra = ppl("ppl/gemma3-270m/32512/256/0/pq-4x8-pairs",
                {"full": [1.0, 2.0004], "pq-4x8-pairs@1/5": [1.05, 2.0]}, seconds=5.0)
    [merged] = report.merge_records([extra, base])
    assert merged["key"] == "ppl/gemma3-270m/32512/256/0"
    assert merged["nll"]["full"] == [1.0, 2.0]          # the default run's own row
    assert set(merged["nll"]) == {"full", "pq@1/5", "pq-4x8-pairs@1/5"}
    assert merged["seconds"] == 10.0                    # the default run's, for the cost
    assert merged["variant_seconds"] == 5.0
    assert base["nll"].keys() == {"full", "pq@1/5"}     # the input is not changed


def test_full_rows_that_disagree_are_an_error():
    base = ppl("ppl/gemma3-270m/32512/256/0", {"full": [1.0, 2.0]})
    extra = ppl("ppl/gemma3-270m/32512/256/0/pq-4x8-pairs", {"full": [1.0, 2.5]})
    with pytest.raises(ValueError, match="full-attention row differs"):
        report.merge_records([base, extra])


def test_a_task_run_merges_by_prompt_and_checks_full_attentions_answer():
    def task(key, answer, rows):
        return {"key": key, "kind": "task", "model": "gemma3-270m", "length": 32768,
                "rows": {"full": {"output": answer, "score": 1.0}, **rows}, "seconds": 1.0}
    base = task("task/gemma3-270m/32768/vt/last/0", "X1 X2", {})
    extra = task("task/gemma3-270m/32768/vt/last/0/pq-4x8-pairs", "X1 X2",
                 {"pq-4x8-pairs@1/5": {"output": "X1", "score": 0.5}})
    [merged] = report.merge_records([base, extra])
    assert merged["rows"]["pq-4x8-pairs@1/5"]["score"] == 0.5
    with pytest.raises(ValueError):
        report.merge_records([base, task(extra["key"], "X3", {})])


def test_only_a_non_default_row_set_gets_a_key_suffix():
    assert longctx._rows_suffix(longctx.rows()) == ""
    assert longctx._rows_suffix(longctx.rows(["pq-4x8-pairs"])) == "/pq-4x8-pairs"
    assert longctx._rows_suffix(longctx.rows(["pq", "h2o"])) == "/pq,h2o"
