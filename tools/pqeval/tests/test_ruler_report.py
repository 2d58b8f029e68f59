"""docs/quality.md's section on RULER's cell beside the home-made one
(pqeval.ruler_report): a row per task, and the verdicts follow the
intervals of the differences between the tasks."""
import json

from pqeval import ruler_report, stats


def record(task, seed, full, exact, pq):
    rows = {"full": {"output": "x", "score": full}}
    for budget in ("1/5", "1/10"):
        rows[f"exact@{budget}"] = {"output": "x", "score": exact}
        rows[f"pq@{budget}"] = {"output": "x", "score": pq}
    return {"key": f"task/m/4096/{task}/last/{seed}/exact,pq", "kind": "task", "task": task,
            "placement": "last", "seed": seed, "tokens": 4000 + seed, "rows": rows,
            "seconds": 1.0}


def section(tmp_path, records):
    (tmp_path / ruler_report.DATA_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = []
    ruler_report.ruler_section(tmp_path, lines)
    return lines


def test_tasks_that_score_alike_agree(tmp_path):
    records = [record(task, seed, 1.0, 1.0, float(seed % 4 != 0))
               for task in (ruler_report.HOME, ruler_report.RULER) for seed in range(8)]
    lines = section(tmp_path, records)
    rows = [l for l in lines if l.startswith("| home-made") or l.startswith("| RULER")]
    assert len(rows) == 2 and all(l.count("|") == 11 for l in rows)
    assert "| 8 | 4004 (4000-4007) | 100.0 [100.0, 100.0] |" in rows[0]
    verdicts = [l for l in lines if l.startswith("- ")]
    assert len(verdicts) == 3  # full attention, then PQ - exact at each budget
    assert all("they agree within the interval" in v for v in verdicts)
    assert "-25.0 [" in verdicts[1]  # PQ loses 2 of 8 prompts the exact top-k answers


def test_tasks_that_score_apart_disagree(tmp_path):
    records = ([record(ruler_report.HOME, seed, 0.0, 0.0, 0.0) for seed in range(8)]
               + [record(ruler_report.RULER, seed, 1.0, 1.0, 0.0) for seed in range(8)])
    verdicts = [l for l in section(tmp_path, records) if l.startswith("- ")]
    assert "RULER less home-made +100.0 [+100.0, +100.0]" in verdicts[0]
    assert all("they disagree: the interval leaves out 0" in v for v in verdicts)


def test_one_task_missing_no_section(tmp_path):
    assert section(tmp_path, [record(ruler_report.HOME, 0, 1.0, 1.0, 1.0)]) == []
    assert ruler_report.ruler_section(tmp_path / "absent", []) is None


def test_the_unpaired_interval_resamples_both_sides():
    one_side = stats.unpaired_diff_ci([1, 0] * 10, [0] * 20)
    assert one_side[0] == 0.5 and 0.2 < one_side[1] < 0.5 < one_side[2] < 0.8
    both = stats.unpaired_diff_ci([1, 0] * 10, [1, 0, 0, 1] * 5)
    assert both[0] == 0.0 and both[1] < 0.0 < both[2]
    assert both[2] - both[1] > 1.2 * (one_side[2] - one_side[1])  # b's spread counts too
