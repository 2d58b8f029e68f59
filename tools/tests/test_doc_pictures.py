"""Every picture a page shows (README.md, docs/**/*.md) is drawn by a script
of the repository from data the repository holds, and is newer than that
data (issue 45): a picture left behind when its data changed shows figures
the tables beside it no longer have.

PICTURES is the one table of picture -> script -> data. "Newer" is by git
commit time (`git log -1 --format=%ct`), since a fresh clone gives every
file the same mtime; a file with uncommitted changes counts as changed now,
so a data file edited without redrawing its picture fails before the commit.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACE_2K = "tests/data/smollm2_sotu_2k.pqtrace"
REPORT_ONLY = "scripts/run-python -m pqeval.evaluate --report-only"


@dataclass(frozen=True)
class Made:
    """script: the file whose source names the picture and draws it (or runs
    what draws it); data: the files it reads; redraw: the one command that
    redraws it, which the page showing the picture names; missing: why the
    data cannot be checked, where the repository lacks it."""
    script: str
    data: Tuple[str, ...]
    redraw: str
    missing: str = ""


def _plot_perf():
    spec = importlib.util.spec_from_file_location("plot_perf", REPO / "bench" / "plot_perf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _evaluate_command(name: str) -> str:
    """A command constant of tools/pqeval/evaluate.py, read from its source:
    importing it needs the Python binding, which this test does not."""
    tree = ast.parse((REPO / "tools" / "pqeval" / "evaluate.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and
                any(getattr(t, "id", None) == name for t in node.targets))


def _pictures() -> Dict[str, Made]:
    plot_perf = _plot_perf()
    return {
        # bench_floor's rerun of 2026-11-29 (the AMD run's JSON was not kept).
        "docs/perf-floor.png": Made(
            "bench/plot_floor.py",
            ("docs/perf-data/bench_floor-select-intel-2026-11-29.json",
             "docs/perf-data/bench_floor-attend-ingest-intel-2026-11-29.json"),
            "scripts/run-python bench/plot_floor.py "
            "docs/perf-data/bench_floor-select-intel-2026-11-29.json "
            "docs/perf-data/bench_floor-attend-ingest-intel-2026-11-29.json docs/perf-floor.png"),
        **{f"docs/{fig.png}": Made("bench/plot_perf.py",
                                   tuple(str(p.relative_to(REPO)) for p in fig.data),
                                   plot_perf.command(fig))
           for fig in plot_perf.FIGURES},
        "docs/quality-accuracy.png": Made("tools/pqeval/evaluate.py",
                                          ("docs/quality-data/longctx.jsonl",), REPORT_ONLY),
        "docs/quality-layers.png": Made("tools/pqeval/evaluate.py",
                                        ("docs/quality-data/traces.json",), REPORT_ONLY),
        "docs/quality-budgets.png": Made("tools/pqeval/replay.py", (TRACE_2K,),
                                         _evaluate_command("BUDGETS_COMMAND")),
        "docs/quality-tail.png": Made("tools/pqeval/tail_estimate.py", (TRACE_2K,),
                                      _evaluate_command("TAIL_COMMAND")),
        # Drawn from Gemma-3's trace, captured from the model and not
        # committed; the same run writes the table beside it.
        "docs/quality-tail-gemma3.png": Made(
            "tools/pqeval/evaluate.py", ("docs/quality-data/tail-estimate-gemma3-32k.md",),
            _evaluate_command("TAIL_GEMMA_COMMAND")),
    }


PICTURES = _pictures()

_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def pages():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def shown_pictures() -> Dict[str, Path]:
    """Repository path of each picture a page shows -> the page, from the
    markdown image links outside fenced code blocks."""
    shown = {}
    for page in pages():
        fenced = False
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                for target in _IMAGE.findall(line):
                    path = (page.parent / target).resolve().relative_to(REPO)
                    shown[str(path)] = page
    return shown


def test_every_picture_a_page_shows_exists_and_is_declared():
    shown = shown_pictures()
    assert shown, "no page shows a picture: the image links were not found"
    for picture, page in shown.items():
        assert (REPO / picture).is_file(), f"{page.name} shows {picture}, which does not exist"
    undeclared = sorted(set(shown) - set(PICTURES))
    assert not undeclared, f"pictures shown with no script and data in PICTURES: {undeclared}"


def test_every_declared_picture_and_every_png_under_docs_is_shown():
    shown = set(shown_pictures())
    assert not set(PICTURES) - shown, f"declared, shown by no page: {sorted(set(PICTURES) - shown)}"
    orphans = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.png")
                     if str(p.relative_to(REPO)) not in shown)
    assert not orphans, f"pictures under docs/ that no page shows: {orphans}"


@pytest.mark.parametrize("picture", sorted(PICTURES))
def test_a_script_of_the_repository_draws_the_picture(picture):
    made = PICTURES[picture]
    source = (REPO / made.script).read_text()
    assert Path(picture).name in source, f"{made.script} does not name {Path(picture).name}"


@pytest.mark.parametrize("picture", sorted(PICTURES))
def test_the_page_showing_the_picture_names_the_command_that_redraws_it(picture):
    page = shown_pictures()[picture]
    # Commands are wrapped at different points on different pages.
    words = " ".join(page.read_text().replace("\\\n", " ").split())
    assert " ".join(PICTURES[picture].redraw.split()) in words, \
        f"{page.name} does not say how {picture} is redrawn: {PICTURES[picture].redraw}"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _skip_unless_git_checkout() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the pictures' ages are their commit times")
    try:
        top = _git("rev-parse", "--show-toplevel")
    except subprocess.CalledProcessError:
        pytest.skip("not a git checkout: the pictures' ages are their commit times")
    if Path(top).resolve() != REPO:
        pytest.skip(f"the git checkout at {top} is not this source tree's")


def changed_at(path: str, now: int) -> int:
    """When `path` last changed: `now` with uncommitted changes (or never
    committed), else its last commit's time."""
    if _git("status", "--porcelain", "--", path):
        return now
    committed = _git("log", "-1", "--format=%ct", "--", path)
    return int(committed) if committed else now


@pytest.mark.parametrize("picture", sorted(PICTURES))
def test_the_picture_is_newer_than_its_data(picture):
    _skip_unless_git_checkout()
    made = PICTURES[picture]
    if made.missing:
        assert not any((REPO / d).exists() for d in made.data), \
            f"{picture}'s data is in the repository now: declare it in PICTURES"
        pytest.skip(f"{picture} cannot be checked: {made.missing}")
    now = int(time.time())
    drawn = changed_at(picture, now)
    for data in made.data:
        assert (REPO / data).is_file(), f"{picture} is drawn from {data}, which does not exist"
        changed = changed_at(data, now)
        assert drawn >= changed, (
            f"{picture} (last changed {time.ctime(drawn)}) is older than its data {data} "
            f"({time.ctime(changed)}): redraw it with `{made.redraw}` and commit it")
