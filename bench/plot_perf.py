#!/usr/bin/env python3
"""The curves of docs/perf.md, drawn from the raw logs committed under
docs/perf-data/ (never from the numbers in the markdown), one picture per
table, docs/perf-<name>.png:

    scripts/run-python bench/plot_perf.py            # every picture
    scripts/run-python bench/plot_perf.py seam fp8-pairs

FIGURES says which table each picture draws, from which files, on which
machine; tools/tests/test_doc_pictures.py reads it to check that every
picture is newer (by git commit time) than its data. A table whose figures
exist only in the markdown has no entry here.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "docs" / "perf-data"


@dataclass
class Run:
    """One run of a benchmark in a log: its header line, the label the log
    gives it (a "== ..." line before it, or the header's kernel level) and
    its rows."""
    header: str
    label: str = ""
    rows: List[dict] = field(default_factory=list)


# --- reading the logs --------------------------------------------------------

def json_runs(path: Path, program: str) -> List[Run]:
    """cpu_step_vs_torch.py and select_keys.py logs: a header line per run
    ("<program>: ..."), then one JSON object per row."""
    runs: List[Run] = []
    label = ""
    for line in path.read_text().splitlines():
        if line.startswith("== "):
            label = line[3:].strip()
        elif line.startswith(program + ":"):
            level = re.search(r"kernel level ([\w+]+)", line)
            runs.append(Run(line, label or (level.group(1) if level else "")))
        elif line.startswith("{"):
            runs[-1].rows.append(json.loads(line))
    return runs


_FP8_STEP = re.compile(r"^(\d+) tokens: select\+attend f16 ([\d.]+) ms, fp8 ([\d.]+) ms.*"
                       r"attend alone f16 ([\d.]+) ms, fp8 ([\d.]+) ms")
_FP8_ROWS = re.compile(r"^(\d+) tokens: the selected rows read alone.*?: f16 ([\d.]+) ms, "
                       r"fp8 ([\d.]+) ms")


def fp8_runs(path: Path) -> List[Run]:
    """bench_fp8 logs: a "bench_fp8: CPU ..." header per run, a line per
    length with the step and the attend, and from 0.11 one with the rows'
    read floor. A line outside a run (the extra 128K runs of one log, after
    a "#" line) starts a run of its own under the last header."""
    runs: List[Run] = []
    label = ""
    for line in path.read_text().splitlines():
        if line.startswith("== "):
            label = line[3:].strip()
        elif line.startswith("bench_fp8:"):
            runs.append(Run(line, label))
        elif line.startswith("#") and runs:
            runs.append(Run(runs[-1].header, label))
        elif m := _FP8_STEP.match(line):
            runs[-1].rows.append({"tokens": int(m[1]), "step f16": float(m[2]),
                                  "step fp8": float(m[3]), "attend f16": float(m[4]),
                                  "attend fp8": float(m[5])})
        elif m := _FP8_ROWS.match(line):
            row = next(r for r in runs[-1].rows if r["tokens"] == int(m[1]))
            row.update({"rows read f16": float(m[2]), "rows read fp8": float(m[3])})
    return [r for r in runs if r.rows]


def markdown_rows(path: Path) -> List[List[str]]:
    """The body rows of the markdown tables a log holds, as cells."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in path.read_text().splitlines()
            if line.startswith("|") and not line.startswith("|---") and
            re.match(r"\|\s*[\d,]+\s*\|", line)]


def _number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


# --- drawing -------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _tokens_axis(ax, tokens: Sequence[int], ylabel: str) -> None:
    """Both axes logarithmic: the contexts are powers of two, the times span
    one to three decades (ticks at 1, 2 and 5 of each, in plain numbers)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(set(tokens)), [f"{t // 1024}K" if t < 1 << 20 else f"{t >> 20}M"
                                        for t in sorted(set(tokens))])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _series(ax, points: Dict[int, List[float]], label: str, colour: str, marker: str,
            ls: str = "-", nudge: float = 0.0) -> None:
    """The median of each length's values, with the range of the runs as a
    bar where there is more than one; `nudge` shifts the points sideways by
    that many eighths of an octave, so that the bars of series with close
    values stay apart."""
    xs = sorted(points)
    med = [statistics.median(points[x]) for x in xs]
    lo = [m - min(points[x]) for m, x in zip(med, xs)]
    hi = [max(points[x]) - m for m, x in zip(med, xs)]
    ax.errorbar([x * 2 ** (nudge / 8) for x in xs], med,
                yerr=[lo, hi] if any(lo) or any(hi) else None, label=label,
                color=colour, marker=marker, ls=ls, capsize=3, lw=1.5, ms=6, elinewidth=1)


def _finish(fig, axes, title: str, path: Path, columns: int = 2) -> None:
    """One legend for the panels (a series drawn in several is listed once),
    below them, where it hides no point."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    handles, labels = list(entries.values()), list(entries)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.legend(handles, labels, fontsize=7, ncol=columns, loc="upper center",
               bbox_to_anchor=(0.5, 0.0), frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)


# One colour per quantity, one marker per run or level: no two series of a
# panel share both.
_RUN_MARKERS = ["o", "s", "^", "D", "v", "P"]
_RUN_LINES = ["-", "--", ":", "-."]


def draw_step(fig_: "Figure", path: Path) -> None:
    """cpu_step_vs_torch.py: the step against PyTorch's baselines, ms per
    layer against the context, a panel per dtype; runs with the same label
    (repeats) are pooled, runs with different labels (kernel levels, builds)
    are series of their own."""
    quantities = [("lib", "select + pq_decode_attend (the step)", "tab:red"),
                  ("select", "pq_decode_select alone", "tab:orange"),
                  ("attend", "pq_decode_attend alone", "tab:purple"),
                  ("best_fetch_sdpa", "select + pq_fetch_kv + SDPA (faster of f16 / f32 rows)",
                   "tab:blue"),
                  ("dense", "dense SDPA over every token", "black")]
    runs = [r for path_ in fig_.data for r in json_runs(path_, "cpu_step_vs_torch")]
    labels = list(dict.fromkeys(r.label for r in runs))
    dtypes = list(dict.fromkeys(row["dtype"] for r in runs for row in r.rows))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5.8 * len(dtypes), 4.4), squeeze=False,
                             sharey=True)
    for ax, dtype in zip(axes[0], dtypes):
        for li, label in enumerate(labels):
            rows = [row for r in runs if r.label == label for row in r.rows
                    if row["dtype"] == dtype]
            for key, name, colour in quantities:
                points = defaultdict(list)
                for row in rows:
                    ms = row["ms"]
                    points[row["tokens"]].append(
                        min(ms["fetch_sdpa"], ms["fetch_sdpa_f32"]) if key == "best_fetch_sdpa"
                        else ms[key])
                if points:
                    _series(ax, points, name + (f", {label} kernels" if len(labels) > 1 else ""),
                            colour, _RUN_MARKERS[li], _RUN_LINES[li], li - (len(labels) - 1) / 2)
        _tokens_axis(ax, [row["tokens"] for r in runs for row in r.rows], "ms per layer (median)")
        ax.set_title(f"{dtype} K/V", fontsize=9)
    _finish(fig, axes[0], fig_.title(runs), path)


def draw_select(fig_: "Figure", path: Path) -> None:
    """select_keys.py: one pq_decode_select against the context, a panel per
    index; colour per kernel level (or build), marker per kind of keys."""
    runs = [r for path_ in fig_.data for r in json_runs(path_, "select_keys")]
    rows = [row for r in runs for row in r.rows]
    configs = list(dict.fromkeys(row["config"] for row in rows))
    levels = list(dict.fromkeys(row["level"] for row in rows))
    colours = ["tab:gray", "tab:blue", "tab:red", "tab:green"]
    if len(levels) < 3:  # no "before" build: avx2 and avx512 keep their colours
        colours = colours[1:]
    keys = [("random", "o"), ("clustered", "s"), ("real", "^")]
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(configs), figsize=(5.8 * len(configs), 4.4), squeeze=False,
                             sharey=True)
    for ax, config in zip(axes[0], configs):
        for level, colour in zip(levels, colours):
            for kind, marker in keys:
                points = defaultdict(list)
                for row in rows:
                    if row["config"] == config and row["level"] == level:
                        points[row["tokens"]].append(row[f"{kind}_ms"])
                _series(ax, points, f"{_level_name(level)}, {kind} keys", colour, marker)
        _tokens_axis(ax, [row["tokens"] for row in rows], "ms per select (median, codes warm)")
        ax.set_title(f"index {config}", fontsize=9)
    _finish(fig, axes[0], fig_.title(runs), path)


def _level_name(level: str) -> str:
    """A select_keys level; one with environment settings after its name is
    the build before the change, loaded through LD_PRELOAD."""
    name, _, env = level.partition(":")
    return f"before ({name})" if env else name


def draw_fp8(fig_: "Figure", path: Path) -> None:
    """bench_fp8: f16 and fp8 K/V, the step and the attend (and, where
    logged, the selected rows read alone: the attend's floor) against the
    context; a panel per group of runs (a label of the log, or a file)."""
    groups: Dict[str, List[Run]] = defaultdict(list)
    for path_, name in zip(fig_.data, fig_.group_names or [""] * len(fig_.data)):
        for r in fp8_runs(path_):
            groups[", ".join(x for x in (name, _ab_group(r.label)) if x)].append(r)
    quantities = [("step f16", "tab:blue", "o", "-"), ("step fp8", "tab:orange", "o", "-"),
                  ("attend f16", "tab:blue", "s", "--"), ("attend fp8", "tab:orange", "s", "--"),
                  ("rows read f16", "tab:blue", "^", ":"), ("rows read fp8", "tab:orange", "^", ":")]
    names = {"step": "select + attend", "attend": "attend alone",
             "rows read": "selected rows read alone (floor)"}
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(max(5.8, 4.2 * len(groups)), 4.4),
                             squeeze=False, sharey=True)
    for ax, (group, runs) in zip(axes[0], groups.items()):
        for key, colour, marker, ls in quantities:
            points = defaultdict(list)
            for row in (row for r in runs for row in r.rows if key in row):
                points[row["tokens"]].append(row[key])
            if points:
                what, dtype = key.rsplit(" ", 1)
                _series(ax, points, f"{names[what]}, {dtype}", colour, marker, ls)
        _tokens_axis(ax, [row["tokens"] for r in runs for row in r.rows],
                     "ms per layer (median of a run)")
        ax.set_title(f"{group + ': ' if group else ''}{len(runs)} run{'s' * (len(runs) > 1)}",
                     fontsize=9)
    _finish(fig, axes[0], fig_.title([r for rs in groups.values() for r in rs]), path)


def _ab_group(label: str) -> str:
    """"old level avx512 pair 1" -> "old, avx512": the pairs pooled."""
    m = re.match(r"(\w+) level (\w+) pair \d+", label)
    return f"{m[1]}, {m[2]}" if m else label


def draw_seam(fig_: "Figure", path: Path) -> None:
    """bench_batch before (0.8) and after (0.9) the tier seam: the decode
    step of B sequences, batched calls and per-sequence calls, against the
    context; a panel per batch size; the median of the runs, bars their range."""
    builds = {}
    for path_ in fig_.data:
        version = re.search(r"seam-ab-([\d.]+)\.txt", path_.name)[1]
        builds[version] = markdown_rows(path_)
    batches = sorted({int(r[1]) for rows in builds.values() for r in rows})
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(batches), figsize=(5.8 * len(batches), 4.4), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for v, ((version, rows), marker, ls) in enumerate(zip(builds.items(), _RUN_MARKERS,
                                                              _RUN_LINES)):
            for c, (column, calls, colour) in enumerate(((4, "batched calls", "tab:red"),
                                                         (5, "per-sequence calls", "tab:blue"))):
                points = defaultdict(list)
                for r in rows:
                    if int(r[1]) == batch:
                        points[int(r[0])].append(_number(r[column]))
                _series(ax, points, f"{version}, {calls}", colour, marker, ls,
                        0.6 * (2 * v + c - 1.5))
        _tokens_axis(ax, [int(r[0]) for rows in builds.values() for r in rows],
                     "ms per decode step, 2 layers")
        ax.set_title(f"batch of {batch} sequence{'s' * (batch > 1)}", fontsize=9)
    header = (fig_.data[0].read_text().splitlines() or [""])[0]
    _finish(fig, axes[0], fig_.title([Run(header)]), path)


def draw_prefill_scaling(fig_: "Figure", path: Path) -> None:
    """prefill_scaling.py: pq_prefill_layer and the index build to 1M
    tokens; left the seconds, right the build per 1M tokens (a fixed K-Means
    cost plus a linear encoding falls with the length)."""
    text = fig_.data[0].read_text()
    rows = markdown_rows(fig_.data[0])
    tokens = [int(_number(r[0])) for r in rows]
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.plot(tokens, [_number(r[2]) for r in rows], "o-", color="tab:blue",
           label="pq_prefill_layer (copy into the store)")
    a.plot(tokens, [_number(r[3]) for r in rows], "s-", color="tab:red",
           label="index build (pq_wait_builds)")
    _tokens_axis(a, tokens, "seconds (median of 2)")
    a.set_title("one layer, f16, random keys", fontsize=9)
    b.plot(tokens, [_number(r[4]) for r in rows], "D-", color="tab:green",
           label="index build per 1M tokens (right)")
    _tokens_axis(b, tokens, "build seconds per 1M tokens")
    b.set_title("the build's fixed K-Means cost spread over the tokens", fontsize=9)
    _finish(fig, [a, b], fig_.title([Run(text.splitlines()[0])]), path, columns=3)


# --- the pictures -----------------------------------------------------------

@dataclass
class Figure:
    """One picture: the section of docs/perf.md whose table it draws (the
    start of its heading), the files it reads, the machine they were
    measured on (checked against what the logs name) and how to draw it."""
    png: str
    section: str
    what: str
    machine: str
    draw: Callable[["Figure", Path], None]
    data: List[Path]
    group_names: List[str] = field(default_factory=list)

    def title(self, runs: Sequence[Run]) -> str:
        named = {cpu for r in runs for cpu in _CPUS if cpu in r.header}
        wrong = [cpu for cpu in named if cpu not in self.machine]
        if wrong:
            raise ValueError(f"{self.png}: the logs name {wrong}, the figure says {self.machine}")
        dates = sorted({m[0] for p in self.data for m in [re.search(r"\d{4}-\d\d-\d\d", p.name)]
                        if m} | {m[0] for r in runs
                                 for m in [re.search(r"\d{4}-\d\d-\d\d", r.header)] if m})
        return f"{self.what}\n{self.machine}; {', '.join(dates)}"


_CPUS = ("AMD EPYC", "Intel(R) Xeon(R)")
AMD = "AMD EPYC (KVM guest), 2 cores"
AMD_AVX512 = "AMD EPYC (KVM guest), 2 cores, AVX-512 F/BW/DQ/VL/VBMI/VNNI + AVX512_BF16"
INTEL = "Intel(R) Xeon(R) (Sapphire/Emerald Rapids class, KVM guest), 2 cores"


def _logs(*names: str) -> List[Path]:
    return [DATA / n for n in names]


FIGURES = [
    Figure("perf-seam.png", "The host tier behind the seam",
           "bench_batch: select + fetch of 2 layers, 0.8 against 0.9 (12 runs each)",
           AMD + ", AVX-512", draw_seam, _logs("seam-ab-0.8.txt", "seam-ab-0.9.txt")),
    Figure("perf-fp8-0.10.png", "fp8 K/V (0.10)",
           "bench_fp8 at 0.10 (AVX2 kernels): f16 against fp8 e4m3 K/V, one layer",
           AMD_AVX512, draw_fp8,
           _logs("bench_fp8-quiet-2026-11-29.log", "bench_fp8-2026-11-29.log"),
           ["quiet, load 1.3-1.5", "loaded, load 7.8-9.1"]),
    Figure("perf-step-0.11.png", "The CPU decode step at AVX-512",
           "cpu_step_vs_torch with the 0.11 kernels: the step against PyTorch (AVX2 before its L2 prefetch)",
           AMD_AVX512, draw_step,
           _logs("cpu_step_vs_torch-avx512-2026-11-29.log",
                 "cpu_step_vs_torch-avx2-level-2026-11-29.log")),
    Figure("perf-prefill-scaling.png", "The CPU decode step at AVX-512",
           "prefill_scaling: pq_prefill_layer + pq_wait_builds to 1M tokens",
           AMD_AVX512, draw_prefill_scaling, _logs("prefill_scaling-2026-11-29.log")),
    Figure("perf-select-0.11.png", "The host select step on any keys",
           "select_keys after the 0.11 merge: one pq_decode_select, 8 kv / 32 q heads, f16",
           AMD_AVX512, draw_select, _logs("select_keys-2026-11-29.log")),
    Figure("perf-select-rows.png", "The host select step by rows",
           "select_keys: select by rows against the build before (9 rounds)",
           AMD_AVX512, draw_select, _logs("select_keys-rows-2026-11-29.log")),
    Figure("perf-step-rows.png", "The host select step by rows",
           "cpu_step_vs_torch with the select by rows (PyTorch's OpenMP threads spinning)",
           AMD_AVX512, draw_step,
           _logs("cpu_step_vs_torch-rows-avx512-2026-11-29.log",
                 "cpu_step_vs_torch-rows-avx2-level-2026-11-29.log")),
    Figure("perf-step-rows-passive.png", "The host select step by rows",
           "cpu_step_vs_torch with the select by rows, OMP_WAIT_POLICY=PASSIVE",
           AMD_AVX512, draw_step,
           _logs("cpu_step_vs_torch-rows-passive-avx512-2026-11-29.log",
                 "cpu_step_vs_torch-rows-passive-avx2-level-2026-11-29.log")),
    Figure("perf-fp8-attend-ab.png", "The fp8 attend: its instructions",
           "bench_fp8 A/B: the attend before (f67116a) and after (f68dce6), 4 pairs per level",
           AMD_AVX512, draw_fp8, _logs("bench_fp8-ab-2026-11-29.log")),
    Figure("perf-step-attend.png", "The fp8 attend: its instructions",
           "cpu_step_vs_torch at 9c7e820: the step against PyTorch, OMP_WAIT_POLICY=PASSIVE",
           AMD_AVX512, draw_step, _logs("cpu_step_vs_torch-attend-avx512-2026-11-29.log")),
    Figure("perf-fp8-pairs.png", "The fp8 value sum on bf16 dot products",
           "bench_fp8 with the value sum on bf16 dot products: f16 against fp8 K/V",
           AMD_AVX512, draw_fp8, _logs("bench_fp8-pairs-2026-11-29.log")),
    Figure("perf-step-final.png", "The fp8 value sum on bf16 dot products",
           "cpu_step_vs_torch at dbfb63a: the step against PyTorch (2 runs)",
           AMD_AVX512, draw_step, _logs("cpu_step_vs_torch-pairs-final-2026-11-29.log")),
    Figure("perf-step-intel.png", "The step on an Intel Xeon",
           "cpu_step_vs_torch at 734c1f9: the step against PyTorch",
           INTEL, draw_step,
           _logs("cpu_step_vs_torch-intel-avx512-2026-11-29.log",
                 "cpu_step_vs_torch-intel-avx2-level-2026-11-29.log")),
    Figure("perf-select-intel.png", "The step on an Intel Xeon",
           "select_keys: one pq_decode_select, 8 kv / 32 q heads, f16 (9 rounds)",
           INTEL, draw_select, _logs("select_keys-intel-2026-11-29.log")),
]


def command(fig: Figure) -> str:
    """The one line that redraws a picture, as docs/perf.md gives it."""
    return f"scripts/run-python bench/plot_perf.py {fig.png[len('perf-'):-len('.png')]}"


def main(argv: List[str]) -> int:
    by_name = {f.png[len("perf-"):-len(".png")]: f for f in FIGURES}
    unknown = [a for a in argv if a not in by_name]
    if unknown:
        print(f"plot_perf: no picture {', '.join(unknown)}; there are: {', '.join(by_name)}",
              file=sys.stderr)
        return 2
    for name in argv or by_name:
        fig = by_name[name]
        out = REPO / "docs" / fig.png
        fig.draw(fig, out)
        print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
