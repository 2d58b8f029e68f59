"""docs/quality.md's section on RULER's own niah_single_1 cell (pqeval.ruler)
beside the home-made niah_single, both through pqeval.longctx on the same
rows, from ruler-niah-4k.jsonl: does the home-made task agree with RULER's
cell on full attention's accuracy, and on PQ against the exact top-k?"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np

from pqeval import report, stats
from pqeval.longctx import FULL

DATA_FILE = "ruler-niah-4k.jsonl"
COMMAND = ("cd tools && ../scripts/run-python -m pqeval.longctx tasks --model smollm2-135m "
           "--lengths 4096 --tasks niah_single,ruler_niah_single_1 --placements last --seeds 16 "
           "--selectors exact,pq --fractions 0.2,0.1 --out ../docs/quality-data/" + DATA_FILE)
HOME, RULER = "niah_single", "ruler_niah_single_1"
NAMES = {HOME: "home-made niah_single (State of the Union haystack)",
         RULER: "RULER niah_single_1 (its generator, noise haystack)"}


def _interval_holds_zero(ci) -> bool:
    return ci[1] <= 0.0 <= ci[2]


def _pq_minus_exact(records: List[dict], budget: str) -> np.ndarray:
    """PQ's score less the exact top-k's, per prompt that measured both."""
    both = [r for r in records if f"pq@{budget}" in r["rows"] and f"exact@{budget}" in r["rows"]]
    return np.array([r["rows"][f"pq@{budget}"]["score"] - r["rows"][f"exact@{budget}"]["score"]
                     for r in both])


def _agreement(what: str, home, ruler, diff, sign: bool) -> str:
    """`what` for both tasks (signed where it is itself a difference) and the
    verdict of their difference's interval."""
    verdict = ("agree within the interval" if _interval_holds_zero(diff) else
               "disagree: the interval leaves out 0")
    return (f"{what}: home-made {report._ci(*home, sign=sign)}, RULER "
            f"{report._ci(*ruler, sign=sign)}; RULER less home-made "
            f"{report._ci(*diff, sign=True)} points: they {verdict}.")


def ruler_section(data: Path, lines: List[str]) -> None:
    path = data / DATA_FILE
    if not path.exists():
        return
    records = report.merge_records(
        [json.loads(l) for l in path.read_text().splitlines() if l.strip()])
    by_task = {t: [r for r in records if r["task"] == t] for t in (HOME, RULER)}
    if not all(by_task.values()):
        return
    summaries: Dict[str, dict] = {t: report.cell_summary(rs) for t, rs in by_task.items()}
    budgets = [b for b in report.BUDGETS
               if all(f"pq@{b}" in s and f"exact@{b}" in s for s in summaries.values())]
    lines += ["", "## RULER's own cell beside the home-made one", "",
              "The home-made tasks follow RULER's recipes; this checks one of them against "
              "RULER's own generator. `tools/pqeval/ruler/` vendors RULER's `niah.py` (NVIDIA/"
              "RULER, Apache-2.0; its README: the commit and what was changed) for the cell "
              "`niah_single_1`: one adjective-noun key, one 7-digit number, and the repeated "
              "noise sentence as the haystack, the NIAH haystack that ships with the generator "
              "(`niah_single_2`, which the home-made `niah_single` follows, needs Paul Graham's "
              "essays, a download). RULER's samples 0, 1, ... of seed 42, fitted to the "
              "length in the model's own tokens with RULER's 128 tokens to generate; the "
              "home-made task fills the length less its 16. Where a sample's key is longer than "
              "the one RULER's search fitted, RULER's generator takes its haystack one step (25 "
              "noise sentences, about 600 tokens) shorter: the tokens' range shows it. Both: "
              "SmolLM2-135M, 4K tokens, question after the context, greedy answers to the first "
              "line break, scored by RULER's string_match_all, through the same `Session` rows. "
              "Accuracy with 95% intervals over prompts; \"vs full\" and \"pq - exact\" are "
              "paired on the same prompts. Written by `" + COMMAND + "`.", ""]
    header = "| task | prompts | tokens, mean (range) | full attention |"
    rule = "|---|---:|---:|---:|"
    for b in budgets:
        header += f" exact@{b} (vs full) | pq@{b} (vs full) | pq - exact {b} |"
        rule += "---:|---:|---:|"
    lines += [header, rule]
    for task, rs in by_task.items():
        s = summaries[task]
        tokens = [r["tokens"] for r in rs]
        cols = [NAMES[task], str(len(rs)),
                f"{np.mean(tokens):.0f} ({min(tokens)}-{max(tokens)})",
                report._ci(*s[FULL]["acc"])]
        for b in budgets:
            for label in (f"exact@{b}", f"pq@{b}"):
                cols.append(f"{report._ci(*s[label]['acc'])} "
                            f"({report._ci(*s[label]['diff'], sign=True)})")
            cols.append(report._ci(*stats.mean_ci(_pq_minus_exact(rs, b)), sign=True))
        lines.append("| " + " | ".join(cols) + " |")

    home, ruler = by_task[HOME], by_task[RULER]
    full = [report.scores(rs, FULL) for rs in (home, ruler)]
    verdicts = [_agreement("Full attention's accuracy", stats.mean_ci(full[0]),
                           stats.mean_ci(full[1]), stats.unpaired_diff_ci(full[1], full[0]),
                           sign=False)]
    for b in budgets:
        gaps = [_pq_minus_exact(rs, b) for rs in (home, ruler)]
        verdicts.append(_agreement(f"PQ less the exact top-k at {b}", stats.mean_ci(gaps[0]),
                                   stats.mean_ci(gaps[1]), stats.unpaired_diff_ci(gaps[1], gaps[0]),
                                   sign=True))
    lines += [""] + [f"- {v}" for v in verdicts]
    lines += ["", f"With {len(home)} and {len(ruler)} prompts an interval that holds 0 says "
              "the two tasks are not shown to differ, not that they are the same; the haystacks "
              "differ (prose against one repeated sentence), so a difference in full attention's "
              "accuracy is the haystack's as much as the generator's."]
