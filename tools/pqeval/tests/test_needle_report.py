"""docs/quality.md's needle section (pqeval.needle_report): lost and won
count against the exact top-k's answered prompts only, and the section
shows the study's table and judges each row."""
import json

from pqeval import needle_report


def record(key, exact, pq, outliers):
    rows = {"full": {"output": "x", "score": 1.0}}
    for budget in ("1/5",):
        rows[f"exact@{budget}"] = {"output": "x", "score": exact}
        rows[f"pq@{budget}"] = {"output": "x", "score": pq}
        rows[f"pq-outliers@{budget}"] = {"output": "x", "score": outliers}
    return {"key": key, "kind": "task", "task": "niah_single", "rows": rows}


RECORDS = [record("a", 1.0, 0.0, 1.0),   # exact answers, pq loses, outliers keep it
           record("b", 1.0, 1.0, 1.0),
           record("c", 0.0, 1.0, 0.0),   # pq wins where exact does not
           record("d", 0.5, 0.0, 0.0)]   # exact does not answer fully: neither lost nor won


def test_lost_and_won_count_against_the_exact_top_k():
    assert needle_report.lost_and_won(RECORDS, "pq", "1/5") == (2, 1, 1)
    assert needle_report.lost_and_won(RECORDS, "pq-outliers", "1/5") == (2, 0, 0)
    assert needle_report.lost_and_won(RECORDS, "pq", "1/10") == (0, 0, 0)


def test_the_section_shows_the_study_and_judges_each_row(tmp_path):
    (tmp_path / "needle-study-4k.md").write_text("# x\n\n| prompt | cells |\n|---|---|\n| a | 1 |\n")
    (tmp_path / "needle-tasks-4k.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in RECORDS))
    lines = []
    needle_report.needle_section(tmp_path, lines)
    text = "\n".join(lines)
    assert "| a | 1 |" in text
    assert "at 1/5 pq loses 1 of the 2 prompts" in text
    assert "at 1/5 pq-outliers loses 0 of the 2 prompts" in text
    rows = [l for l in lines if l.startswith("| 1/5 |")]
    assert len(rows) == 3 and all(l.count("|") == 8 for l in rows)
    assert "Issue 44's aim on SmolLM2-135M" in text and "Gemma-3-270M" not in text
    # A second model's records: a table and a verdict of its own.
    (tmp_path / "needle-tasks-gemma3-4k.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in RECORDS[:1]))
    lines = []
    needle_report.needle_section(tmp_path, lines)
    text = "\n".join(lines)
    assert "Gemma-3-270M (1 prompt)" in text and "Issue 44's aim on Gemma-3-270M" in text
    assert len([l for l in lines if l.startswith("| 1/5 |")]) == 6


def test_no_data_no_section(tmp_path):
    lines = []
    needle_report.needle_section(tmp_path, lines)
    assert lines == []
