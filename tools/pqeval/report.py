"""docs/quality.md from the evaluation's recorded results: tables with
intervals, plots, and a statement for every cell of where PQ is and is not
ahead. Nothing here measures; everything comes from the data files."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from pqeval import longctx, stats
from pqeval.longctx import (ALL_NAMES, DROP, FULL, NAMES, PQ_VARIANTS, SELECTORS, TRACE_SELECTORS,
                            UNBUDGETED, base_key)

BUDGETS = {"1/5": 0.2, "1/10": 0.1}
# The non-oracle competition at the same budget.
OTHERS = [s for s in SELECTORS if s not in ("exact", "pq") and s not in UNBUDGETED]
BUDGETED_DROP = [s for s in DROP if s not in UNBUDGETED]


def _name(s: str) -> str:
    return f"{s} (variant)" if s in PQ_VARIANTS else s
TASK_LABELS = {"niah_single": "single", "niah_multikey": "multi-key",
               "niah_multivalue": "multi-value", "niah_multiquery": "multi-query",
               "vt": "var. tracking", "cwe": "common words", "fwe": "frequent words",
               "qa": "QA"}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _ci(m: float, lo: float, hi: float, scale: float = 100, digits: int = 1,
        sign: bool = False) -> str:
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(scale * m)} [{f.format(scale * lo)}, {f.format(scale * hi)}]"


def merge_records(records: List[dict]) -> List[dict]:
    """One record per prompt or document: a run with rows other than the
    default set (a key with a rows suffix, pqeval.longctx) adds its rows to
    the record of the same prompt. Both measured full attention on the same
    tokens, so their full rows must agree: the log-likelihoods within 1e-3,
    a task's score exactly (what the paired statistics use); a mismatch is an
    error, not a silent choice. A task whose two greedy full-attention texts
    differ at the same score (a near tie resolved otherwise by another torch
    build's rounding) is merged and marked full_output_differs, and the
    report counts such prompts.

    A prompt whose runs all had a rows suffix (a prompt split into runs of
    at most ROWS_PER_RUN rows, pqeval.longctx.runs_of, or measured with
    each selector as it was added) is a default record all the same once its
    runs together hold every default row; its "seconds" is then the sum of
    the runs of default rows, as one default run would have taken."""
    merged: Dict[str, dict] = {}
    default_seconds: Dict[str, float] = defaultdict(float)
    field = {"ppl": "nll", "task": "rows"}
    for r in sorted(records, key=lambda r: len(r["key"].split("/"))):  # default runs first
        base = base_key(r["key"], r["kind"])
        if _default_rows_only(r[field[r["kind"]]]):
            default_seconds[base] += r["seconds"]
        if base not in merged:
            merged[base] = {**r, "key": base, field[r["kind"]]: dict(r[field[r["kind"]]])}
            if r["key"] != base:  # default runs sort first: this prompt has none
                merged[base]["separate_only"] = True
            continue
        into, f = merged[base], field[r["kind"]]
        a, b = into[f][FULL], r[f][FULL]
        same = (np.max(np.abs(np.array(a) - np.array(b))) <= 1e-3 if f == "nll"
                else a["score"] == b["score"])
        if not same:
            raise ValueError(f"{r['key']}: its full-attention row differs from {base}'s")
        if f == "rows" and a["output"] != b["output"]:
            into["full_output_differs"] = True
        into[f].update({k: v for k, v in r[f].items() if k != FULL})
        # "seconds" stays the default run's: the report's cost estimate is
        # of a default run, and a separate run is not part of it.
        into["variant_seconds"] = into.get("variant_seconds", 0.0) + r["seconds"]
    every_default_row = {row.label for row in longctx.rows()}
    for base, record in merged.items():
        if record.get("separate_only") and \
                every_default_row <= set(record[field[record["kind"]]]):
            del record["separate_only"]
            spent = record["seconds"] + record.get("variant_seconds", 0.0)
            record["seconds"] = default_seconds[base]
            record["variant_seconds"] = spent - default_seconds[base]
    return list(merged.values())


def _default_rows_only(rows: Dict[str, object]) -> bool:
    """Whether a run measured default rows only (a part of a split default run)."""
    return all(label == FULL or label.split("@")[0] in NAMES for label in rows)


def task_cells(records: List[dict]) -> Dict[tuple, List[dict]]:
    """(model, length) -> records. A cell the default rows measured holds the
    prompts they measured: a prompt only a separate run measured (a key
    with a rows suffix and no default record, merge_records) would compare
    its rows with full attention on prompts the others never saw."""
    cells: Dict[tuple, List[dict]] = defaultdict(list)
    for r in records:
        cells[(r["model"], r["length"])].append(r)
    for key, rs in cells.items():
        default = [r for r in rs if not separate_only(r)]
        if default:
            cells[key] = default
    return dict(sorted(cells.items(), key=lambda kv: (kv[0][0] != "smollm2-135m", kv[0][1])))


def separate_only(record: dict) -> bool:
    """Whether only a run with a rows suffix measured this prompt (merge_records)."""
    return bool(record.get("separate_only"))


def scores(records: List[dict], label: str) -> np.ndarray:
    return np.array([r["rows"][label]["score"] for r in records])


def agreement(records: List[dict], label: str) -> float:
    """Share of prompts where the row answered exactly as full attention."""
    return float(np.mean([r["rows"][label]["output"].strip() == r["rows"][FULL]["output"].strip()
                          for r in records]))


def cell_summary(records: List[dict]) -> Dict[str, dict]:
    """Per row label: accuracy CI, paired difference to full attention,
    agreement, each over the prompts that measured the row (a separate run,
    merge_records, may cover fewer or other prompts than the default rows;
    "prompts" says how many), and the scores by prompt key for pairing two
    rows over the prompts both measured (paired_scores)."""
    full = scores(records, FULL)
    out = {FULL: {"acc": stats.mean_ci(full), "diff": (0.0, 0.0, 0.0), "agree": 1.0,
                  "prompts": len(records)}}
    labels = dict.fromkeys(label for r in records for label in r["rows"])
    for label in labels:
        if label == FULL:
            continue
        measured = [r for r in records if label in r["rows"]]
        s = scores(measured, label)
        out[label] = {"acc": stats.mean_ci(s),
                      "diff": stats.paired_diff_ci(s, scores(measured, FULL)),
                      "agree": agreement(measured, label), "scores": s,
                      "by_key": {r["key"]: float(x) for r, x in zip(measured, s)},
                      "prompts": len(measured)}
    return out


def paired_scores(summary: Dict[str, dict], a: str, b: str):
    """Rows a's and b's scores over the prompts both measured, aligned."""
    ka, kb = summary[a]["by_key"], summary[b]["by_key"]
    common = [k for k in ka if k in kb]
    return np.array([ka[k] for k in common]), np.array([kb[k] for k in common])


def task_table(records: List[dict], lines: List[str]) -> Dict[str, dict]:
    summary = cell_summary(records)
    lines += ["| selector | 1/5 accuracy | 1/5 vs full | 1/5 same answer | 1/10 accuracy "
              "| 1/10 vs full | 1/10 same answer |", "|---|---:|---:|---:|---:|---:|---:|"]
    f = summary[FULL]
    lines.append(f"| full attention | {_ci(*f['acc'])} | | | {_ci(*f['acc'])} | | |")
    for s in ALL_NAMES:
        if f"{s}@1/5" not in summary:
            continue
        n = summary[f"{s}@1/5"]["prompts"]
        name = _name(s) + (f" ({n} prompts)" if n != f["prompts"] else "")
        cols = []
        for b in BUDGETS:  # a separate run may have measured one budget only
            c = summary.get(f"{s}@{b}")
            # a budget measured on other prompts than the row's first says so
            own = f" ({c['prompts']} prompts)" if c and c["prompts"] != n else ""
            cols += ([_ci(*c["acc"]) + own, _ci(*c["diff"], sign=True), f"{100 * c['agree']:.0f}%"]
                     if c else ["", "", ""])
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    return summary


def task_breakdown(records: List[dict], lines: List[str], budget: str = "1/5") -> None:
    tasks_ = [t for t in TASK_LABELS if any(r["task"] == t for r in records)]
    head = [TASK_LABELS[t] for t in tasks_] + ["question last", "question first"]
    lines += ["| selector | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]

    def group(label: str) -> List[str]:
        cells = []
        for t in tasks_:
            rs = [r for r in records if r["task"] == t]
            cells.append(_pct(scores(rs, label).mean()))
        for p in ("last", "first"):
            rs = [r for r in records if r["placement"] == p]
            cells.append(_pct(scores(rs, label).mean()) if rs else "")
        return cells

    lines.append("| full attention | " + " | ".join(group(FULL)) + " |")
    for s in ALL_NAMES:
        if all(f"{s}@{budget}" in r["rows"] for r in records):
            lines.append(f"| {_name(s)} | " + " | ".join(group(f"{s}@{budget}")) + " |")
    per_task = len(records) // max(len(tasks_), 1)
    differs = sum(1 for r in records if r.get("full_output_differs"))
    lines += ["", f"({per_task} prompts per task, {len(records)} in all; accuracy in points, "
              "RULER's partial credit for multi-answer tasks."
              + (f" On {differs} prompt{'s' if differs > 1 else ''} the runs that measured "
                 "different rows generated different full-attention text at the same score "
                 "(a near tie in greedy decoding); \"same answer\" compares with the first "
                 "run's." if differs else "") + ")"]


def perplexity_table(records: List[dict], lines: List[str],
                     budgets: Sequence[str] = BUDGETS) -> Dict[str, tuple]:
    """Each row over the documents that measured it (a row added later may
    cover fewer), its change paired with full attention on those documents.
    out[label] = (perplexity interval, change interval, documents)."""
    full_all = np.array([r["nll"][FULL] for r in records])
    out = {FULL: (stats.perplexity_ci(full_all), (0.0, 0.0, 0.0), len(records))}
    lines += ["| selector | " + " | ".join(f"{b} perplexity | {b} vs full" for b in budgets)
              + " | documents |", "|---|" + "---:|" * (2 * len(budgets) + 1)]
    p = out[FULL][0]
    lines.append("| full attention | " + " | | ".join(_ci(*p, scale=1, digits=3) for _ in budgets)
                 + f" | | {len(records)} |")
    for s in ALL_NAMES:
        if not any(f"{s}@{next(iter(budgets))}" in r["nll"] for r in records):
            continue
        cols, docs = [], 0
        for b in budgets:
            label = f"{s}@{b}"
            having = [r for r in records if label in r["nll"]]
            nll = np.array([r["nll"][label] for r in having])
            full = np.array([r["nll"][FULL] for r in having])
            out[label] = (stats.perplexity_ci(nll), stats.perplexity_change_ci(nll, full),
                          len(having))
            docs = len(having)
            cols += [_ci(*out[label][0], scale=1, digits=3),
                     _ci(*out[label][1], scale=1, digits=2, sign=True) + "%"]
        lines.append(f"| {_name(s)} | " + " | ".join(cols) + f" | {docs} |")
    return out


def pq_label(table: Dict) -> str:
    """The row that stands for PQ in a table: "pq" (the 0.7 default) where
    measured, else "pq-paper" (the 2 x 6-bit index that was the default
    before 0.7, which records made then call so). In a task summary "pq"
    must cover every budget and every prompt of the cell (a separate run of
    the default at 1/5 only is reported beside the paper's index instead)."""
    if "pq@1/5" not in table:
        return "pq-paper"
    full = table.get(FULL)
    if isinstance(full, dict) and "prompts" in full:
        rows = [table.get(f"pq@{b}") for b in BUDGETS]
        if any(r is None or r.get("prompts") != full["prompts"] for r in rows):
            return "pq-paper"
    return "pq"


def _layer_mean(layers: List[dict], metric: str) -> float:
    return float(np.mean([l[metric] for l in layers]))


def mid_mass(study: Dict, label: str) -> float:
    """A trace study's middle mass of one row ("pq@1/5"), over its layers."""
    return _layer_mean(study["selectors"][label], "mid_mass")


def settings_mid_mass(study: Dict) -> Dict[str, float]:
    """Middle mass of each PQ setting of the study's sweep, in sweep order
    (the default first)."""
    return {label: _layer_mean(st["layers"], "mid_mass")
            for label, st in study.get("settings", {}).items()}


def code_bytes(setting: Dict) -> int:
    """Bytes a selection reads per token and kv head: one per subspace,
    whatever the bits (as the library chose them where recorded; settings
    measured before 0.7 name them or had the old default, 2 subspaces)."""
    if "resolved" in setting:
        return setting["resolved"]["pq_subspaces"]
    return setting["fields"].get("pq_subspaces", 2)


def variant_changes(table: Dict[str, tuple], budget: str) -> List[str]:
    """"name +x.xx%" of each PQ variant in a perplexity table at `budget`."""
    return [f"{v} {table[f'{v}@{budget}'][1][0]:+.2f}%" for v in PQ_VARIANTS
            if f"{v}@{budget}" in table]


def trace_table(study: Dict, lines: List[str]) -> None:
    lines += ["| selector | budget | exact top-k recall | per-head recall | attention mass "
              "| sinks + local alone | middle mass | output error | tokens per kv head |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    missing = [s for s in TRACE_SELECTORS
               if any(f"{s}@{b}" not in study["selectors"] for b in BUDGETS)]
    for b in BUDGETS:
        for s in TRACE_SELECTORS:
            if s in missing:
                continue
            layers = study["selectors"][f"{s}@{b}"]
            m = {k: _layer_mean(layers, k) for k in ("recall", "head_recall", "mass",
                                                     "fixed_mass", "mid_mass", "error",
                                                     "selected")}
            lines.append(f"| {s} | {b} | {m['recall']:.3f} | {m['head_recall']:.3f} | "
                         f"{m['mass']:.3f} | {m['fixed_mass']:.3f} | {m['mid_mass']:.3f} | "
                         f"{m['error']:.4f} | {m['selected']:.0f} |")
    if missing:  # selectors added after this trace's study was recorded
        lines += ["", "Not measured on this trace yet: " + ", ".join(missing) + "."]


def settings_table(study: Dict, lines: List[str]) -> None:
    """PQ settings at 1/5. Codes are stored one byte per subspace, so the
    bytes a selection reads per token and kv head are m, whatever b is.
    Middle mass: the mean over layers, with the lowest and highest layer;
    the gap is to the oracle (exact top-k at the same budget). Times from
    the study's timing pass (longtrace.time_settings), where recorded."""
    oracle = mid_mass(study, "exact@1/5") if "exact@1/5" in study["selectors"] else None
    timing = study.get("timing", {})
    lines += ["| PQ setting | m x b | code bytes per token | middle mass [lowest, highest layer] "
              "| gap to the oracle | exact top-k recall | select ms (exact: ms) | build s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, setting in study["settings"].items():
        m = code_bytes(setting)
        bits = setting.get("resolved", {}).get("pq_bits", setting["fields"].get("pq_bits", 6))
        layers = setting["layers"]
        mids = [l["mid_mass"] for l in layers]
        mid = float(np.mean(mids))
        gap = f"{oracle - mid:.3f}" if oracle is not None else ""
        t = timing.get(label)
        times = (f"{t['select_ms']:.2f} ({t['exact_select_ms']:.2f}) | {t['build_seconds']:.2f}"
                 if t else " | ")
        lines.append(f"| {label} | {m} x {bits} | {m} | {mid:.3f} [{min(mids):.3f}, "
                     f"{max(mids):.3f}] | {gap} | {_layer_mean(layers, 'recall'):.3f} | {times} |")


# Colours for the selectors other than PQ and its variants (red): tab10
# without its red (full attention is the black zero line), each colour
# taken with one marker before the next marker, so that no two selectors
# share a colour and a marker.
_OTHER_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
                  "tab:gray", "tab:olive", "tab:cyan"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]


def accuracy_style(name: str) -> dict:
    """The point of one selector (a row name without its budget) in
    plot_accuracy: full attention black, PQ and its variants red, each
    with a marker of its own; every other selector a colour and marker from
    its place in ALL_NAMES (a name outside it, from its letters)."""
    if name == FULL:
        return dict(color="black", marker="|")
    variants = [n for n in ALL_NAMES if n == "pq" or n.startswith("pq-")]
    if name in variants:
        return dict(color="tab:red", marker=_MARKERS[variants.index(name) % len(_MARKERS)])
    others = [n for n in ALL_NAMES if n not in variants]
    i = others.index(name) if name in others else len(others) + sum(map(ord, name))
    return dict(color=_OTHER_COLOURS[i % len(_OTHER_COLOURS)],
                marker=_MARKERS[(i // len(_OTHER_COLOURS)) % len(_MARKERS)])


def accuracy_rows() -> List[str]:
    """The selectors in plot_accuracy's order, top to bottom: the oracle,
    PQ and every variant, then the others as the tables list them."""
    pq = [n for n in ALL_NAMES if n == "pq" or n.startswith("pq-")]
    return ["exact"] + pq + [n for n in ALL_NAMES if n != "exact" and n not in pq]


def plot_accuracy(cells: Dict[tuple, List[dict]], path: Path) -> Optional[str]:
    """Each selector's task accuracy minus full attention's on the same
    prompts, with its 95% paired bootstrap interval (cell_summary's
    "diff"): a panel per cell (model and length) and budget, a row per
    selector measured on every prompt of the cell (covers_cell)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    keys = list(cells)
    summaries = {key: cell_summary(cells[key]) for key in keys}
    names = [n for n in accuracy_rows()
             if any(covers_cell(summaries[k], f"{n}@{b}") for k in keys for b in BUDGETS)]
    fig, axes = plt.subplots(len(BUDGETS), len(keys), figsize=(3.6 * len(keys) + 1.2,
                                                               0.26 * len(names) * len(BUDGETS) + 2),
                             squeeze=False, sharex=True, sharey=True)
    for row, b in enumerate(BUDGETS):
        for col, key in enumerate(keys):
            ax, summary = axes[row][col], summaries[key]
            ax.axvline(0, color="black", lw=1.2)
            for y, name in enumerate(names):
                label = f"{name}@{b}"
                if not covers_cell(summary, label):
                    continue
                m, lo, hi = (100 * v for v in summary[label]["diff"])
                style = accuracy_style(name)
                ax.errorbar([m], [y], xerr=[[m - lo], [hi - m]], ls="none", ms=5, capsize=2,
                            elinewidth=1, label=name, **style)
            model, length = key
            ax.set_title(f"{model} {length // 1024}K, budget {b}\n"
                         f"({summary[FULL]['prompts']} prompts, full attention "
                         f"{_pct(summary[FULL]['acc'][0])})", fontsize=8)
            ax.grid(True, axis="x", alpha=0.3)
            ax.tick_params(labelsize=8)
            if row == len(BUDGETS) - 1:
                ax.set_xlabel("accuracy - full attention's (points)", fontsize=8)
    axes[0][0].set_yticks(range(len(names)), names)
    axes[0][0].set_ylim(len(names) - 0.5, -0.5)  # the oracle on top
    fig.suptitle("Long-context tasks: each selector against full attention on the same prompts "
                 "(black line); bars: 95% paired bootstrap intervals", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


# One colour and one marker per selector (a line of 30 layers is told from
# another by its markers where the colours cross); PQ alone in red, the
# oracle black.
_LAYER_STYLES = [("exact", dict(lw=2.5, color="black", marker="o")),
                 ("pq", dict(lw=2.5, color="tab:red", marker="s")),
                 ("h2o", dict(lw=1, color="tab:blue", marker="^")),
                 ("snapkv", dict(lw=1, color="tab:orange", marker="v")),
                 ("quest", dict(lw=1, color="tab:green", marker="D")),
                 ("sparq", dict(lw=1, color="tab:purple", marker="P")),
                 ("window", dict(lw=1, color="tab:gray", marker="X"))]


def plot_layers(studies: Dict[str, Dict], path: Path) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(studies), figsize=(6 * len(studies), 4), squeeze=False)
    for ax, (model, study) in zip(axes[0], studies.items()):
        lines = [(s, study["selectors"][f"{s}@1/5"], style) for s, style in _LAYER_STYLES]
        settings = settings_mid_mass(study)
        if settings:  # the best PQ setting next to the default
            best = max(settings, key=settings.get)
            lines.append((f"pq {best}", study["settings"][best]["layers"],
                          dict(lw=1.5, color="tab:red", ls="--", marker="o", mfc="white")))
        for label, layers, style in lines:
            ax.plot([l["layer"] for l in layers], [l["mid_mass"] for l in layers], ms=5,
                    label=label, **style)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{model}: {study['tokens']} tokens, budget 1/5")
        ax.set_xlabel("layer")
        ax.set_ylabel("middle-only attention-mass recall")
        ax.legend(fontsize=8, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def covers_cell(summary: Dict[str, dict], label: str) -> bool:
    """Whether row `label` was measured on every prompt of the cell: a row
    measured on fewer (a selector added later, its run not finished) is
    listed with its prompt count but ranks against nothing, since its
    prompts may be easier or harder than the cell's."""
    row, full = summary.get(label), summary.get(FULL)
    if row is None:
        return False
    if not (isinstance(full, dict) and "prompts" in full and "prompts" in row):
        return True
    return row["prompts"] == full["prompts"]


def best_other(summary: Dict[str, dict], budget: str, key: str = "acc") -> str:
    return max((s for s in OTHERS if covers_cell(summary, f"{s}@{budget}")),
               key=lambda s: summary[f"{s}@{budget}"][key][0])


def _standing(gap: float, rival: str) -> str:
    """PQ against a rival, from the accuracy gap (a fraction)."""
    if gap == 0:
        return f"level with {rival}"
    return f"{100 * abs(gap):.1f} points {'ahead of' if gap > 0 else 'behind'} {rival}"


def cell_statements(model: str, length: int, summary: Dict[str, dict],
                    lines: List[str]) -> None:
    """One sentence per budget: PQ against full attention and the field."""
    p = pq_label(summary)
    name = "PQ" if p == "pq" else "PQ (the paper's 2 x 6 bits, the default before 0.7)"
    for b in BUDGETS:
        pq = summary[f"{p}@{b}"]
        rival = best_other(summary, b)
        drop = max((s for s in BUDGETED_DROP if covers_cell(summary, f"{s}@{b}")),  # every prompt
                   key=lambda s: summary[f"{s}@{b}"]["acc"][0])
        gap = pq["acc"][0] - summary[f"{rival}@{b}"]["acc"][0]
        dgap = pq["acc"][0] - summary[f"{drop}@{b}"]["acc"][0]
        lines.append(
            f"- {model} {length // 1024}K, {b}: {name} {_pct(pq['acc'][0])} against full "
            f"attention's {_pct(summary[FULL]['acc'][0])} ({_ci(*pq['diff'], sign=True)} points, "
            f"same answer on {100 * pq['agree']:.0f}% of prompts); "
            + _standing(gap, f"the best other selector ({rival}, "
                             f"{_pct(summary[f'{rival}@{b}']['acc'][0])})") + "; "
            + _standing(dgap, f"the best drop method ({drop})") + ".")
        variants = [f"{v} {_pct(summary[f'{v}@{b}']['acc'][0])} "
                    f"({_ci(*summary[f'{v}@{b}']['diff'], sign=True)})"
                    for v in PQ_VARIANTS if f"{v}@{b}" in summary and v != p]
        if variants:
            lines.append(f"  PQ variants: {'; '.join(variants)}.")


def recluster_table(studies: Dict[str, Dict], lines: List[str]) -> None:
    """The middle mass after G generated tokens coded with the prompt's
    codebook, against G = 0 (the codebook trained on every token)."""
    lines += ["| model | generated tokens G | share of the sequence | middle mass, prompt's "
              "codebook [lowest, highest layer] | all prefilled | difference | with "
              "pq_rebuild_share 0.1 |", "|---|---:|---:|---:|---:|---:|---:|"]
    for study in studies.values():
        runs = study.get("recluster")
        if not runs:
            continue
        rebuilt = _layer_mean(runs["0"], "mid_mass")
        for g in sorted(int(k) for k in runs if k != "0" and "+" not in k):
            mids = [l["mid_mass"] for l in runs[str(g)]]
            mid = float(np.mean(mids))
            rb = runs.get(f"{g}+rebuild")
            with_rebuild = f"{_layer_mean(rb, 'mid_mass'):.3f}" if rb else "not measured"
            lines.append(f"| {study['model']} | {g:,} | {g / study['tokens']:.0%} | {mid:.3f} "
                         f"[{min(mids):.3f}, {max(mids):.3f}] | {rebuilt:.3f} | "
                         f"{mid - rebuilt:+.3f} | {with_rebuild} |")
