"""Runs one fenced snippet of a Markdown page as the page shows it, so that
the page is the only copy of the code and a snippet that no longer works
fails a test.

    python run_snippet.py PAGE.md NAME [--requires FILE] [--skip-unless CMD] [--expect REGEX]

The snippet is the first fenced block after the line `<!-- snippet: NAME`
(the rest of that comment is free text). A `python` block runs with this
interpreter, from the current directory, as a script of its own.
--requires FILE: exit 77 (CTest's SKIPPED), saying why, when the project's
venv was not built with that requirement file (scripts/python-env.sh records
the files it installed); where it was, nothing is skipped: a missing module
is the failure this test exists to catch.
--skip-unless CMD: exit 77, with CMD's error, when CMD fails (e.g. a model
that cannot be downloaded without network).
--expect REGEX: the snippet's output must match it (a snippet that runs
but does nothing useful fails too).
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77


def snippet(page: Path, name: str):
    """(language, code) of the first fenced block after the snippet marker."""
    text = page.read_text()
    marker = re.search(r"^<!-- snippet: " + re.escape(name) + r"\b.*$", text, re.M)
    if not marker:
        sys.exit(f"run_snippet: {page} has no '<!-- snippet: {name}' line")
    fence = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S).search(text, marker.end())
    if not fence:
        sys.exit(f"run_snippet: no fenced block after the snippet marker {name} in {page}")
    return fence.group(1), fence.group(2)


def venv_has(requirement_file: str) -> bool:
    stamp = Path(sys.prefix) / "pqcache-requirements"
    return stamp.is_file() and any(line.split(" ")[:2] == ["file", requirement_file]
                                   for line in stamp.read_text().splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("name")
    ap.add_argument("--requires", action="append", default=[])
    ap.add_argument("--skip-unless", action="append", default=[])
    ap.add_argument("--expect", help="a regular expression the output must match")
    args = ap.parse_args()

    language, code = snippet(args.page, args.name)
    for requirement_file in args.requires:
        if not venv_has(requirement_file):
            print(f"SKIPPED: {sys.prefix} was not built with {requirement_file} "
                  f"(scripts/setup.sh --eval)")
            return SKIP
    for command in args.skip_unless:
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"SKIPPED: `{command}` failed: {done.stderr.strip()[-300:]}")
            return SKIP
    if language != "python":
        sys.exit(f"run_snippet: snippet {args.name} is a '{language}' block; only python runs here")
    with tempfile.NamedTemporaryFile("w", suffix=f"_{args.name}.py") as script:
        script.write(code)
        script.flush()
        print(f"run_snippet: {args.page} snippet {args.name} ({len(code.splitlines())} lines)",
              flush=True)
        done = subprocess.run([sys.executable, script.name], stdout=subprocess.PIPE, text=True)
    print(done.stdout, end="")
    if done.returncode != 0:
        return done.returncode
    if args.expect and not re.search(args.expect, done.stdout):
        print(f"run_snippet: FAIL: the output does not match {args.expect!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
