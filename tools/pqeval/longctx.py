"""Long-context evaluation through the transformers integration
(pqcache.transformers): RULER-style tasks and perplexity, every selector at
every budget in one batched forward.

Each prompt runs once (batch 1, full attention, Session.prefill_all_rows) and
its keys and values go to one libpqcache context per row: full attention
(the EXACT selector keeping every token, which equals SDPA within float
rounding, tests/test_transformers.py), and each selector at each budget.
Then all rows decode together, each attending only over its own selection.

Results are appended to a JSON-lines file, one record per prompt, so a long
run can stop and resume: a prompt already recorded is skipped, or run again
with only the rows no record has (a selector added later), as a record of
its own that the report merges (pqeval.report.merge_records).

    python3 -m pqeval.longctx tasks --model smollm2-135m --lengths 4096,8192 \\
        --seeds 3 --out results.jsonl
    python3 -m pqeval.longctx ppl --model gemma3-270m --context 32768 \\
        --continuation 256 --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

SELECTORS = ["exact", "pq", "sparq", "infllm", "quest", "h2o", "snapkv", "pyramidkv", "scope",
             "scissorhands", "keyformer", "clusterkv", "adakv", "zigzagkv", "pyramidinfer",
             "fastgen", "infinigen", "window", "random"]
# Selectors that choose with a query estimated a layer early (the Session's
# speculate=True): a trace holds the true queries only, so the trace studies
# leave them out.
SPECULATING = ("infinigen",)
TRACE_SELECTORS = [s for s in SELECTORS if s not in SPECULATING]
# Selectors that keep what their own rule asks, not the budget (FastGen's
# recovery target: a head may keep the whole middle). Their rows are listed
# at their own cost; the report ranks PQ against the budgeted ones only.
UNBUDGETED = ("fastgen",)
# A tuple, not a set: ties between drop methods resolve in this order, the
# same in every run (a set's order of strings changes with the hash seed).
DROP = ("h2o", "snapkv", "pyramidkv", "scope", "scissorhands", "keyformer", "adakv",
        "zigzagkv", "pyramidinfer", "fastgen")
COMPENSATION = 1.0 / 128   # the paper gives drop methods 1/128 more tokens
FRACTIONS = (0.2, 0.1)
FULL = "full"
# PQ beyond the paper's LongBench setting (2 subspaces x 6 bits, the model's
# dimension order), from the settings sweep of docs/quality.md: the same 2
# code bytes per token with rotary pairs in one subspace, and with 8 bits.
# pq-4x8-pairs (4 code bytes, the best of the sweep on Gemma-3's 256-dim
# heads at 32K) runs only when asked for (--selectors), to test a setting on
# one model without another pass over every prompt.
# PQ settings other than the default ("pq": m and b chosen from head_dim,
# rotary pairs declared by the Session, 0.7). Each names every field it
# depends on, so that its rows mean the same whatever the default. Records
# made before 0.7 measured the paper's 2 x 6 bits as "pq"; their rows were
# relabelled "pq-paper".
PQ_VARIANTS = {"pq-paper": {"pq_subspaces": 2, "pq_bits": 6, "key_rotary": "none"},
               "pq-pairs": {"pq_subspaces": 2, "pq_bits": 6, "key_rotary": "half"},
               "pq-2x8-pairs": {"pq_subspaces": 2, "pq_bits": 8, "key_rotary": "half"},
               "pq-4x8-pairs": {"pq_subspaces": 4, "pq_bits": 8, "key_rotary": "half"},
               "pq-rerank": {"pq_rerank": 0.5},
               # The default PQ row with issue 44's tail estimate in the attend.
               "pq-tail": {"tail_estimate": "code_means"},
               # The default PQ row with issue 44's outliers: the 1% of keys the
               # codebook represents worst scored exactly.
               "pq-outliers": {"pq_outliers": 0.01}}
DEFAULT_VARIANTS = ["pq-pairs", "pq-2x8-pairs"]
NAMES = SELECTORS[:2] + DEFAULT_VARIANTS + SELECTORS[2:]   # default row names, report order
ALL_NAMES = NAMES + [v for v in PQ_VARIANTS if v not in NAMES]


def budget(selector: str, fraction: float) -> float:
    return fraction + (COMPENSATION if selector in DROP else 0.0)


@dataclass(frozen=True)
class Row:
    label: str          # "full", or "<selector>@1/<n>"
    selector: str
    fraction: float
    config: tuple       # pq_config fields as sorted (name, value) pairs

    def fields(self) -> dict:
        return dict(self.config)


def rows(names: Sequence[str] = NAMES, fractions: Sequence[float] = FRACTIONS,
         **pq_fields) -> List[Row]:
    """Full attention first, then every selector (or PQ variant) at every budget."""
    out = [Row(FULL, "exact", 1.0, tuple(sorted({"selector": "exact",
                                                 "topk_fraction": 1.0}.items())))]
    for fraction in fractions:
        for name in names:
            s = "pq" if name in PQ_VARIANTS else name
            fields = {"selector": s, "topk_fraction": budget(s, fraction), **pq_fields,
                      **PQ_VARIANTS.get(name, {})}
            out.append(Row(f"{name}@1/{round(1 / fraction)}", s, fraction,
                           tuple(sorted(fields.items()))))
    return out


def _rows_suffix(row_list: List[Row]) -> str:
    """The key suffix of a run with rows other than the default set: such a
    run is a record of its own (merged with the default one by the report,
    pqeval.report.merge_records), so it neither skips nor repeats another."""
    names = list(dict.fromkeys(r.label.split("@")[0] for r in row_list if r.label != FULL))
    return "" if names == NAMES else "/" + ",".join(names)


def base_key(key: str, kind: str) -> str:
    """A record's prompt or document key without its rows suffix."""
    parts = key.split("/")
    return "/".join(parts[:5] if kind == "ppl" else parts[:6])


def _recorded(path: Path):
    """(prompt or document base_key -> the row labels any run recorded for
    it, the set of record keys), from one read of the records."""
    measured: Dict[str, set] = defaultdict(set)
    keys = set()
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                keys.add(r["key"])
                measured[base_key(r["key"], r["kind"])].update(
                    r["rows" if r["kind"] == "task" else "nll"])
    return measured, keys


def _run_key(base: str, sub: List[Row], recorded: set) -> str:
    """The key of a run of rows `sub` on prompt `base`: the rows suffix of
    their names, or their labels when a run of the same names (at other
    budgets) was recorded before, so that no two records share a key."""
    key = base + _rows_suffix(sub)
    if key in recorded:
        key = base + "/" + ",".join(r.label for r in sub if r.label != FULL)
    recorded.add(key)
    return key


# The most rows one batched forward measures. Every row holds its own K/V in
# torch's cache and in its library context, so a prompt's memory grows with
# its rows: the 40 rows SmolLM2's 8K prompts lacked (every selector added
# since, at two budgets) took the process past 24 GB and the kernel killed it
# (2026-11-28); runs of 17-19 rows at 8K and 16K tokens fit. A prompt with
# more rows runs in several runs, each freeing its prompt before the next.
ROWS_PER_RUN = 20


def runs_of(sub: List[Row], limit: Optional[int] = None) -> List[List[Row]]:
    """The rows `sub` (full attention first, as rows_to_run gives them) in
    runs of at most `limit` rows (ROWS_PER_RUN by default), each beginning
    with full attention, which every run measures; [] for no rows."""
    limit = ROWS_PER_RUN if limit is None else limit
    if limit < 2:
        raise ValueError(f"a run needs full attention and one row; limit is {limit}")
    if len(sub) <= limit:
        return [sub] if sub else []
    rest, step = sub[1:], limit - 1
    return [[sub[0]] + rest[i:i + step] for i in range(0, len(rest), step)]


def _prompt_runs(runners: "_Runners", sub: List[Row]):
    """Each run of the rows `sub` (runs_of) with its Runner; where the prompt
    takes several runs, each frees the prompt after its record is made."""
    parts = runs_of(sub)
    for part in parts:
        run = runners.get(part)
        yield run, part
        if len(parts) > 1:
            run.release()


def rows_to_run(row_list: List[Row], measured: Optional[set]) -> List[Row]:
    """The rows a prompt still lacks: all of row_list when no run measured it,
    else full attention (every run measures it: the report pairs each row
    with the full row of its own run) and the rows no run recorded, so a
    selector added after a prompt was measured is measured on that prompt
    alone; [] when nothing is missing."""
    if row_list[0].label != FULL:
        raise ValueError("the first row must be full attention (rows() puts it first)")
    if not measured:
        return row_list
    missing = [r for r in row_list[1:] if r.label not in measured]
    return [row_list[0]] + missing if missing else []


class _Runners:
    """One Runner per set of rows, sharing the first one's model: a resumed
    plan runs some prompts with every row and others with the rows added
    since they were measured."""

    def __init__(self, model_name: str, chunk_mode: str, row_list: List[Row],
                 given: Optional["Runner"] = None):
        self.model_name, self.chunk_mode, self.row_list = model_name, chunk_mode, row_list
        self.given = given
        self.own: Dict[tuple, Runner] = {}

    def get(self, sub: List[Row]) -> "Runner":
        if self.given is not None and sub is self.row_list:
            return self.given
        labels = tuple(r.label for r in sub)
        if labels not in self.own:
            loaded = self.given or next(iter(self.own.values()), None)
            self.own[labels] = Runner(self.model_name, sub, self.chunk_mode,
                                      *((loaded.model, loaded.tokenizer) if loaded else ()))
        return self.own[labels]

    def close(self) -> None:
        for r in self.own.values():
            r.close()


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


class Runner:
    """One model and one Session of rows, reused prompt after prompt."""

    def __init__(self, model_name: str, row_list: List[Row], chunk_mode: str,
                 model=None, tokenizer=None):
        import torch
        from pqcache.transformers import Session
        from pqeval import hf

        self.spec = hf.MODELS[model_name]
        if model is None:
            model, tokenizer = hf.load(model_name)
        self.model, self.tokenizer = model, tokenizer
        self.rows = row_list
        self.torch = torch
        fields = [r.fields() for r in row_list]
        self.session = Session(model, rows=fields, chunk_mode=chunk_mode, tokenizer=tokenizer,
                               speculate=any(f.get("selector") in SPECULATING for f in fields))

    def close(self) -> None:
        self.session.close()

    def release(self) -> None:
        """Frees the last prompt's K/V in every row's context, so that the
        next run of the same prompt (other rows) does not hold two."""
        self.session.forget_prompt()

    def generate(self, ids: List[int], max_new: int) -> List[str]:
        """Greedy answers of every row to one prompt: each row stops at the
        end-of-turn token or its first line break."""
        torch = self.torch
        cache, logits = self.session.prefill_all_rows(torch.tensor([ids]), chunk_tokens=2048)
        n = len(self.rows)
        stop = {self.tokenizer.eos_token_id}
        tokens = [[] for _ in range(n)]
        done = [False] * n
        nxt = logits.argmax().repeat(n)
        for step in range(max_new):
            for r in range(n):
                if not done[r]:
                    t = int(nxt[r])
                    if t in stop:
                        done[r] = True
                        continue
                    tokens[r].append(t)
                    if "\n" in self.tokenizer.decode(tokens[r]).lstrip():
                        done[r] = True
            if all(done) or step == max_new - 1:
                break
            with torch.inference_mode():
                logits = self.model(nxt[:, None], past_key_values=cache).logits[:, -1]
            nxt = logits.argmax(-1)
        return [self.tokenizer.decode(t).strip().split("\n")[0] for t in tokens]

    def continuation_nll(self, ids: List[int], context: int, chunk: int = 32) -> np.ndarray:
        """Per-row negative log-likelihood of ids[context:] after ids[:context],
        teacher-forced: [rows][len(ids) - context]. Needs chunk_mode "decode"."""
        torch = self.torch
        cache, logits = self.session.prefill_all_rows(torch.tensor([ids[:context]]),
                                                      chunk_tokens=2048)
        n = len(self.rows)
        targets = torch.tensor(ids[context:])
        nll = np.zeros((n, len(targets)), np.float64)
        nll[:, 0] = -float(torch.log_softmax(logits.float(), -1)[targets[0]])
        for start in range(0, len(targets) - 1, chunk):
            piece = targets[start:start + chunk][: len(targets) - 1 - start]
            with torch.inference_mode():
                out = self.model(piece[None].repeat(n, 1), past_key_values=cache).logits
            lp = torch.log_softmax(out.float(), -1)
            nxt = targets[start + 1:start + 1 + len(piece)]
            nll[:, start + 1:start + 1 + len(piece)] = \
                -lp.gather(-1, nxt[None, :, None].expand(n, -1, 1))[..., 0].numpy()
        return nll


def _task_run(run: "Runner", part: List[Row], corpus, key: str, model_name: str, length: int,
              task: str, placement: str, seed: int) -> dict:
    """One batched run of the rows `part` on one task prompt, as a record."""
    from pqeval import hf, tasks

    start = time.perf_counter()

    def text(s: tasks.Sample) -> str:
        return hf.format_prompt(run.spec, run.tokenizer, s.prompt, s.answer_prefix)

    sample = tasks.make_sample(task, placement, seed, length, corpus,
                               lambda s: len(hf.encode(run.spec, run.tokenizer, text(s))))
    ids = hf.encode(run.spec, run.tokenizer, text(sample))
    outputs = run.generate(ids, sample.max_new_tokens)
    return {
        "key": key, "kind": "task", "model": model_name, "length": length,
        "task": task, "placement": placement, "seed": seed,
        "tokens": len(ids), "depths": sample.depths,
        "references": sample.references,
        "rows": {r.label: {"output": o, "score": sample.score(o)}
                 for r, o in zip(part, outputs)},
        "seconds": time.perf_counter() - start,
    }


def task_base(model_name: str, length: int, task: str, placement: str, seed: int) -> str:
    """A task prompt's key without its rows suffix (base_key of its records)."""
    return f"task/{model_name}/{length}/{task}/{placement}/{seed}"


def perplexity_base(model_name: str, context: int, continuation: int, doc: int) -> str:
    """A perplexity document's key without its rows suffix."""
    return f"ppl/{model_name}/{context}/{continuation}/{doc}"


def planned_task_runs(model_name: str, lengths: Iterable[int], tasks_: Sequence[str],
                      placements: Sequence[str], seeds: Iterable[int], out: Path,
                      row_list: Optional[List[Row]] = None) -> int:
    """The prompt runs run_tasks would make with the same arguments (each one
    record and one log line): the runs of what each prompt still lacks."""
    row_list = row_list or rows()
    measured, _ = _recorded(out)
    return sum(len(runs_of(rows_to_run(row_list, measured.get(
        task_base(model_name, length, task, placement, seed)))))
        for length in lengths for seed in seeds for task in tasks_ for placement in placements)


def planned_perplexity_runs(model_name: str, context: int, continuation: int,
                            documents: Iterable[int], out: Path,
                            row_list: Optional[List[Row]] = None) -> int:
    """The document runs run_perplexity would make with the same arguments."""
    row_list = row_list or rows()
    measured, _ = _recorded(out)
    return sum(len(runs_of(rows_to_run(row_list, measured.get(
        perplexity_base(model_name, context, continuation, doc))))) for doc in documents)


def run_tasks(model_name: str, lengths: Iterable[int], tasks_: Sequence[str],
              placements: Sequence[str], seeds: Iterable[int], out: Path,
              row_list: Optional[List[Row]] = None, runner: Optional[Runner] = None,
              log=print, progress=None) -> List[dict]:
    """Runs what the prompts lack and appends each run's record to `out`;
    `progress()`, if given, is called once per record (planned_task_runs
    counts them beforehand)."""
    from pqeval import tasks

    row_list = row_list or rows()
    runners = _Runners(model_name, "prefill", row_list, runner)
    corpus = tasks.Corpus()
    measured, recorded = _recorded(out)
    records = []
    try:
        for length in lengths:
            for seed in seeds:
                for task in tasks_:
                    for placement in placements:
                        base = task_base(model_name, length, task, placement, seed)
                        sub = rows_to_run(row_list, measured.get(base))
                        for run, part in _prompt_runs(runners, sub):
                            record = _task_run(run, part, corpus, _run_key(base, part, recorded),
                                               model_name, length, task, placement, seed)
                            _append(out, record)
                            records.append(record)
                            full = record["rows"][FULL]["score"]
                            # PQ at the first budget this run has (1/5 by default).
                            pq_label = next((k for k in record["rows"] if k.startswith("pq@")),
                                            "pq@1/5")
                            pq = record["rows"].get(pq_label, {}).get("score", float("nan"))
                            log(f"{record['key']}: {record['tokens']} tokens, {len(part) - 1} "
                                f"rows, full {full:.2f}, {pq_label} {pq:.2f}, "
                                f"{record['seconds']:.0f} s")
                            if progress:
                                progress()
    finally:
        runners.close()
    return records


def run_perplexity(model_name: str, context: int, continuation: int, documents: Iterable[int],
                   out: Path, row_list: Optional[List[Row]] = None, log=print,
                   progress=None) -> List[dict]:
    """As run_tasks, for the perplexity documents (planned_perplexity_runs)."""
    from pqeval import hf, tasks

    row_list = row_list or rows()
    runners = _Runners(model_name, "decode", row_list)
    measured, recorded = _recorded(out)
    records = []
    try:
        for doc in documents:
            base = perplexity_base(model_name, context, continuation, doc)
            sub = rows_to_run(row_list, measured.get(base))
            for run, part in _prompt_runs(runners, sub):
                start = time.perf_counter()
                ids = hf.encode(run.spec, run.tokenizer, tasks.perplexity_text(doc))
                if len(ids) < context + continuation:
                    raise ValueError(f"document {doc} has {len(ids)} tokens, fewer than "
                                     f"{context} + {continuation}")
                nll = run.continuation_nll(ids[:context + continuation], context)
                record = {"key": _run_key(base, part, recorded), "kind": "ppl",
                          "model": model_name, "context": context, "document": doc,
                          "tokens": len(ids),
                          "nll": {r.label: [round(float(x), 5) for x in nll[i]]
                                  for i, r in enumerate(part)},
                          "seconds": time.perf_counter() - start}
                _append(out, record)
                records.append(record)
                log(f"{record['key']}: {len(part) - 1} rows, full {np.exp(nll[0].mean()):.3f}, "
                    f"{record['seconds']:.0f} s")
                if progress:
                    progress()
    finally:
        runners.close()
    return records


def main(argv: Optional[List[str]] = None) -> None:
    from pqeval import hf, tasks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["tasks", "ppl"])
    ap.add_argument("--model", choices=sorted(hf.MODELS), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--tasks", default=",".join(tasks.TASKS),
                    help="tasks (default: %(default)s), or RULER's own cells ("
                         + ", ".join(tasks.RULER_TASKS) + ", placement last only)")
    ap.add_argument("--placements", default=",".join(tasks.PLACEMENTS))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--continuation", type=int, default=256)
    ap.add_argument("--documents", type=int, default=len(tasks.PERPLEXITY_DOCUMENTS))
    ap.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS),
                    help="budgets, shares of the middle (default: %(default)s)")
    ap.add_argument("--selectors", default=",".join(NAMES),
                    help="selectors and PQ variants (" + ", ".join(PQ_VARIANTS) + "); default: "
                         + ",".join(NAMES))
    args = ap.parse_args(argv)
    row_list = rows(args.selectors.split(","), [float(f) for f in args.fractions.split(",")])
    out = Path(args.out)
    if args.what == "tasks":
        run_tasks(args.model, [int(x) for x in args.lengths.split(",")],
                  args.tasks.split(","), args.placements.split(","),
                  range(args.first_seed, args.first_seed + args.seeds), out, row_list)
    else:
        run_perplexity(args.model, args.context, args.continuation, range(args.documents), out,
                       row_list)


if __name__ == "__main__":
    main()
