"""The evaluation resumes where it stopped, and a selector added after some
prompts were measured is measured on those prompts alone: a run with only
the missing rows (and full attention, which the report pairs them with),
recorded apart and merged by the report."""

from types import SimpleNamespace

import pytest

from pqeval import hf, longctx, report, tasks


class FakeRunner:
    """Stands for longctx.Runner: records which rows each prompt ran with."""
    made = []

    def __init__(self, model_name, row_list, chunk_mode, model=None, tokenizer=None):
        self.rows, self.spec, self.tokenizer = row_list, None, None
        self.model = model or object()
        self.shared_model = model is not None
        FakeRunner.made.append(self)

    def generate(self, ids, max_new):
        return ["answer" if r.label == longctx.FULL else r.label for r in self.rows]

    def continuation_nll(self, ids, context):
        import numpy as np
        return np.full((len(self.rows), len(ids) - context), 0.5)

    def close(self):
        pass

    def release(self):
        self.released = True


@pytest.fixture
def fake(monkeypatch):
    FakeRunner.made = []
    monkeypatch.setattr(longctx, "Runner", FakeRunner)
    monkeypatch.setattr(hf, "format_prompt", lambda spec, tok, prompt, prefix: prompt)
    monkeypatch.setattr(hf, "encode", lambda spec, tok, text: list(range(len(text))))
    monkeypatch.setattr(tasks, "Corpus", lambda: None)
    monkeypatch.setattr(tasks, "make_sample", lambda task, placement, seed, length, corpus, n:
                        SimpleNamespace(prompt="p" * 40, answer_prefix="", depths=[0.5],
                                        references=["answer"], max_new_tokens=4,
                                        score=lambda o: float(o == "answer")))
    monkeypatch.setattr(tasks, "perplexity_text", lambda doc: "d" * 64)
    return FakeRunner


def run(out, names, **kw):
    return longctx.run_tasks("smollm2-135m", [4096], ["niah_single"], ["last", "first"], [0],
                             out, longctx.rows(names, (0.2,)), log=lambda *_: None, **kw)


def test_rows_added_later_run_alone_on_the_prompts_already_measured(fake, tmp_path):
    out = tmp_path / "r.jsonl"
    first = run(out, ["pq", "h2o"])
    assert [sorted(r["rows"]) for r in first] == [["full", "h2o@1/5", "pq@1/5"]] * 2
    assert run(out, ["pq", "h2o"]) == []                         # resumed: nothing left
    fake.made = []
    added = run(out, ["pq", "h2o", "keyformer", "adakv"])
    assert [sorted(r["rows"]) for r in added] == [["adakv@1/5", "full", "keyformer@1/5"]] * 2
    assert [r["key"] for r in added] == ["task/smollm2-135m/4096/niah_single/last/0/keyformer,adakv",
                                         "task/smollm2-135m/4096/niah_single/first/0/keyformer,adakv"]
    assert len(fake.made) == 1                                   # one runner for both prompts
    merged = report.merge_records([*first, *added])
    assert len(merged) == 2
    assert all(set(m["rows"]) == {"full", "pq@1/5", "h2o@1/5", "keyformer@1/5", "adakv@1/5"}
               for m in merged)
    assert run(out, ["pq", "h2o", "keyformer", "adakv"]) == []


def test_a_prompt_never_measured_runs_every_row_beside_one_that_lacks_some(fake, tmp_path):
    out = tmp_path / "r.jsonl"
    longctx.run_tasks("smollm2-135m", [4096], ["niah_single"], ["last"], [0], out,
                      longctx.rows(["pq"], (0.2,)), log=lambda *_: None)
    fake.made = []
    records = run(out, ["pq", "h2o"])
    assert [sorted(r["rows"]) for r in records] == [["full", "h2o@1/5"],
                                                    ["full", "h2o@1/5", "pq@1/5"]]
    assert len(fake.made) == 2 and fake.made[1].shared_model   # the model is loaded once


def test_perplexity_documents_resume_alike(fake, tmp_path):
    out = tmp_path / "r.jsonl"

    def ppl(names):
        return longctx.run_perplexity("gemma3-270m", 48, 8, range(2), out,
                                      longctx.rows(names, (0.2,)), log=lambda *_: None)

    assert len(ppl(["pq"])) == 2
    added = ppl(["pq", "clusterkv"])
    assert [sorted(r["nll"]) for r in added] == [["clusterkv@1/5", "full"]] * 2
    assert added[0]["key"] == "ppl/gemma3-270m/48/8/0/clusterkv"
    assert ppl(["pq", "clusterkv"]) == []


def test_the_first_row_must_be_full_attention():
    with pytest.raises(ValueError, match="full attention"):
        longctx.rows_to_run(longctx.rows(["pq"], (0.2,))[1:], None)


def test_a_budget_added_later_gets_a_key_of_its_own(fake, tmp_path):
    out = tmp_path / "r.jsonl"
    first = longctx.run_tasks("smollm2-135m", [4096], ["niah_single"], ["last"], [0], out,
                              longctx.rows(["pq"], (0.2,)), log=lambda *_: None)
    later = longctx.run_tasks("smollm2-135m", [4096], ["niah_single"], ["last"], [0], out,
                              longctx.rows(["pq"], (0.2, 0.1)), log=lambda *_: None)
    assert first[0]["key"] == "task/smollm2-135m/4096/niah_single/last/0/pq"
    assert later[0]["key"] == "task/smollm2-135m/4096/niah_single/last/0/pq@1/10"
    assert sorted(later[0]["rows"]) == ["full", "pq@1/10"]
    [merged] = report.merge_records(first + later)
    assert merged["key"] == "task/smollm2-135m/4096/niah_single/last/0"
    assert sorted(merged["rows"]) == ["full", "pq@1/10", "pq@1/5"]


def test_more_rows_than_a_run_holds_run_in_parts_each_with_full_attention(fake, tmp_path,
                                                                        monkeypatch):
    """A prompt that lacks more rows than one batched forward holds runs them
    in parts of at most ROWS_PER_RUN rows, each with full attention (which the
    report pairs each row with) and each freeing its prompt before the next;
    the report merges the parts into one prompt."""
    monkeypatch.setattr(longctx, "ROWS_PER_RUN", 3)
    out = tmp_path / "r.jsonl"
    names = ["pq", "h2o", "snapkv", "keyformer", "adakv"]
    records = run(out, names)
    assert [sorted(r["rows"]) for r in records[:3]] == [
        ["full", "h2o@1/5", "pq@1/5"], ["full", "keyformer@1/5", "snapkv@1/5"],
        ["adakv@1/5", "full"]]
    assert len({r["key"] for r in records}) == len(records) == 6      # 3 parts x 2 prompts
    assert all(getattr(r, "released", False) for r in fake.made)
    merged = report.merge_records(records)
    assert len(merged) == 2
    assert all(set(m["rows"]) == {"full"} | {f"{n}@1/5" for n in names} for m in merged)
    assert run(out, names) == []                                      # resumed: nothing left
    ppl = longctx.run_perplexity("gemma3-270m", 48, 8, range(1), out,
                                 longctx.rows(names, (0.2,)), log=lambda *_: None)
    assert [len(r["nll"]) for r in ppl] == [3, 3, 2]


def test_runs_of_splits_after_full_attention():
    rows = longctx.rows(["pq", "h2o", "snapkv"], (0.2, 0.1))          # full + 6
    assert [[r.label for r in part] for part in longctx.runs_of(rows, 4)] == [
        ["full", "pq@1/5", "h2o@1/5", "snapkv@1/5"], ["full", "pq@1/10", "h2o@1/10", "snapkv@1/10"]]
    assert longctx.runs_of(rows, 7) == [rows]
    assert longctx.runs_of([], 4) == []
    with pytest.raises(ValueError, match="limit is 1"):
        longctx.runs_of(rows, 1)
