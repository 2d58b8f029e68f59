"""The evaluation's progress bar: it counts the runs run_tasks and
run_perplexity will make (what each prompt or document still lacks), and
it is drawn only on a terminal."""
import io
import json

from pqeval import longctx, progress


def _record(path, key, kind, labels):
    rows = {label: ({"score": 1.0} if kind == "task" else [0.0]) for label in labels}
    with path.open("a") as f:
        f.write(json.dumps({"key": key, "kind": kind, ("rows" if kind == "task" else "nll"): rows})
                + "\n")


def test_planned_runs_count_what_each_prompt_and_document_lacks(tmp_path):
    out = tmp_path / "longctx.jsonl"
    row_list = longctx.rows()
    per_prompt = len(longctx.runs_of(row_list))
    assert per_prompt >= 1
    args = ("m", [4096, 8192], ["needle", "count"], ["start"], range(2))
    assert longctx.planned_task_runs(*args, out) == 8 * per_prompt
    # One prompt fully measured: its runs drop out.
    labels = [r.label for r in row_list]
    _record(out, "task/m/4096/needle/start/0/all", "task", labels)
    assert longctx.planned_task_runs(*args, out) == 7 * per_prompt
    # One measured but for one row: one run of full attention and that row.
    _record(out, "task/m/8192/count/start/1/most", "task", labels[:-1])
    assert longctx.planned_task_runs(*args, out) == 6 * per_prompt + 1
    assert longctx.planned_perplexity_runs("m", 1024, 256, range(3), out) == 3 * per_prompt
    _record(out, "ppl/m/1024/256/2/all", "ppl", labels)
    assert longctx.planned_perplexity_runs("m", 1024, 256, range(3), out) == 2 * per_prompt


def test_the_bar_is_drawn_on_a_terminal_only():
    quiet, logged = io.StringIO(), []
    with progress.Progress(3, stream=quiet, log=logged.append) as bar:  # StringIO: no terminal
        bar.log("run 1")
        bar.advance()
    assert not bar.shown and quiet.getvalue() == "" and logged == ["run 1"]

    shown, lines, logged = io.StringIO(), io.StringIO(), []
    with progress.Progress(3, stream=shown, enabled=True, log=logged.append, out=lines) as bar:
        for i in range(3):
            bar.log(f"run {i}")
            bar.advance()
    assert bar.shown and "3/3" in shown.getvalue() and logged == []
    assert lines.getvalue().splitlines() == ["run 0", "run 1", "run 2"]
    # Nothing planned: no bar even where it could be drawn.
    assert not progress.Progress(0, stream=io.StringIO(), enabled=True).shown
