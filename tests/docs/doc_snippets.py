"""The documentation's code blocks as tests: the pages are the only copy of
the code, so a snippet that stops working fails a test.

Every fenced block in README.md and docs/**/*.md whose language is one of
CODE_LANGUAGES carries a marker on one of the two lines before its fence:

    <!-- snippet: NAME [key=value ...] [(free text)] -->   run by CTest doc_<page>_<NAME>
    <!-- not-run: REASON -->                                 why it cannot run as a test

    python doc_snippets.py check SOURCE_DIR           every block marked, names unique
    python doc_snippets.py list SOURCE_DIR            test|page|name|language|fixtures (CMake)
    python doc_snippets.py run SOURCE_DIR BUILD_DIR PAGE NAME [--packages DIR] [--prefix DIR]

How a snippet runs follows from its language, in a scratch folder of its
own (BUILD_DIR/tests/docs/run/<page>_<name>) that is a view of the checkout:
a symlink to every top-level entry of SOURCE_DIR, with `build` pointing at
BUILD_DIR, so the pages' relative paths (build/, examples/, tests/data/)
mean what they mean to a reader in a fresh checkout, and what a snippet
writes stays in the scratch folder.

- sh: bash -euo pipefail. `<prefix>` is a fresh install prefix, `<root>`
  a fresh folder to unpack packages into, `<packages>` the folder of the
  built .deb/.rpm files (the packaging tests' fixture), `<build>` BUILD_DIR.
- c: compiled with -std=c99 -pedantic -Werror against the build tree and
  run. A fragment names a wrapper (wrap=FILE in tests/docs/wrap/, holding
  @SNIPPET@ where the block goes; the block's #include lines go to the top).
- python: run by this interpreter (the project's venv), PYTHONPATH the
  build's staged package; a wrapper as for C (import lines stay in place).
- go, java, rust: a program built against the build tree's binding (a
  wrapper holds what a fragment leaves out: imports, main, setup), run.
- cmake: a project folder whose CMakeLists.txt is the block (or its
  wrapper), with examples/decode_loop.c beside it, configured against the
  install prefix of `cmake --install` of the build (--prefix), built, and
  its `app` run with args=.

A C block of either kind may quote a declaration of the public headers
(a line starting PQ_API or PQ_REDIS_API, to its semicolon): `check` fails
unless include/*.h declare it so, whitespace aside, so that a page cannot
show a signature the header no longer has.

Options: wrap=FILE, expect=REGEX (the output must match), args=ARGS (cmake:
the program's arguments), requires=FILE (SKIPPED when the venv was not built
with that requirement file), skip-unless=CMD (SKIPPED when CMD fails, e.g. a
model that cannot be downloaded), fixtures=packages,install (what CTest must
set up first), cwd=source (run in SOURCE_DIR itself). Values with spaces are
quoted as in a shell.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests
CODE_LANGUAGES = {"sh", "bash", "c", "python", "go", "java", "rust", "cmake", "toml", "xml"}
RUNNABLE = {"sh", "bash", "c", "python", "go", "java", "rust", "cmake"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^<!--\s*(snippet|not-run):\s*(.*?)\s*-->\s*$")
OPTIONS = {"wrap", "expect", "args", "requires", "skip-unless", "fixtures", "cwd"}
WRAP_DIR = Path(__file__).resolve().parent / "wrap"
# A public function as a page quotes it: the export macro to the semicolon.
DECLARATION = re.compile(r"^PQ_(?:REDIS_)?API\b[^;{]*;", re.M)


@dataclass
class Block:
    page: str              # relative to the source dir
    line: int              # of the opening fence, 1-based
    language: str
    code: str
    kind: Optional[str] = None   # "snippet", "not-run" or None (unmarked)
    name: str = ""
    reason: str = ""
    options: Dict[str, str] = field(default_factory=dict)

    @property
    def test(self) -> str:
        stem = Path(self.page).stem.lower()
        return "doc_" + re.sub(r"[^a-z0-9]+", "_", f"{stem}_{self.name}".lower()).strip("_")


def pages(source: Path) -> List[Path]:
    return [source / "README.md"] + sorted((source / "docs").rglob("*.md"))


def blocks(source: Path, page: Path) -> List[Block]:
    text = page.read_text()
    lines = text.splitlines()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        b = Block(str(page.relative_to(source)), line, m.group(1), m.group(2))
        for back in (2, 3):  # the line before the fence, or the one before that
            if line - back < 0:
                break
            marker = MARKER.match(lines[line - back])
            if marker:
                b.kind = marker.group(1)
                if b.kind == "not-run":
                    b.reason = marker.group(2)
                else:
                    parse_snippet_marker(b, marker.group(2))
                break
            if lines[line - back].strip():
                break
        out.append(b)
    return out


def parse_snippet_marker(b: Block, text: str) -> None:
    text = re.sub(r"\s*\(.*\)\s*$", "", text)  # free text in parentheses
    words = shlex.split(text)
    if not words:
        raise SystemExit(f"{b.page}:{b.line}: a snippet marker without a name")
    b.name = words[0]
    for w in words[1:]:
        key, sep, value = w.partition("=")
        if not sep or key not in OPTIONS:
            raise SystemExit(f"{b.page}:{b.line}: snippet {b.name}: unknown option {w!r} "
                             f"(known: {', '.join(sorted(OPTIONS))})")
        b.options[key] = value


def all_blocks(source: Path) -> List[Block]:
    return [b for p in pages(source) for b in blocks(source, p)]


def squeezed(text: str) -> str:
    return " ".join(text.split())


def check(source: Path) -> int:
    problems = []
    seen: Dict[str, Block] = {}
    marked = 0
    headers = squeezed(" ".join(h.read_text() for h in sorted((source / "include").glob("*.h"))))
    for page in pages(source):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.match(r"^```\w*[ \t]+\S", line):  # text after a fence: the block never ends
                problems.append(f"{page.relative_to(source)}:{n}: text after a code fence "
                                f"({line[:40]!r}): put it on its own line")
    for b in all_blocks(source):
        where = f"{b.page}:{b.line}"
        if b.language not in CODE_LANGUAGES:
            continue
        if b.language == "c":
            for declaration in DECLARATION.findall(b.code):
                if squeezed(declaration) not in headers:
                    problems.append(f"{where}: {squeezed(declaration)[:60]!r}... is not declared "
                                    "so in include/*.h: quote the header's declaration")
        if b.kind is None:
            problems.append(f"{where}: a {b.language} block with no marker (add "
                            f"'<!-- snippet: NAME -->' and run it, or '<!-- not-run: REASON -->')")
            continue
        marked += 1
        if b.kind == "not-run":
            if len(b.reason) < 10:
                problems.append(f"{where}: 'not-run' needs a reason, not {b.reason!r}")
            continue
        if b.language not in RUNNABLE:
            problems.append(f"{where}: snippet {b.name}: a {b.language} block does not run "
                            f"on its own; mark it not-run and say which test uses it")
        if b.test in seen:
            problems.append(f"{where}: test name {b.test} also made by {seen[b.test].page}:"
                            f"{seen[b.test].line}")
        seen[b.test] = b
        wrap = b.options.get("wrap")
        if wrap and not (WRAP_DIR / wrap).is_file():
            problems.append(f"{where}: snippet {b.name}: no wrapper tests/docs/wrap/{wrap}")
    for p in problems:
        print(p)
    runs = len(seen)
    print(f"doc_snippets: {marked} code blocks marked, {runs} run as tests, "
          f"{marked - runs} not runnable with a reason; {len(problems)} problem(s)")
    return 1 if problems else 0


def list_tests(source: Path) -> int:
    for b in all_blocks(source):
        if b.kind == "snippet" and b.language in RUNNABLE:
            print(f"{b.test}|{b.page}|{b.name}|{b.language}|{b.options.get('fixtures', '')}")
    return 0


# ---- running one snippet --------------------------------------------------------

def venv_has(requirement_file: str) -> bool:
    stamp = Path(sys.prefix) / "pqcache-requirements"
    return stamp.is_file() and any(line.split(" ")[:2] == ["file", requirement_file]
                                   for line in stamp.read_text().splitlines())


def wrapped(b: Block, hoist: Optional[str]) -> str:
    """The block inside its wrapper, with the lines matching `hoist` (C's
    #include, Java's and Rust's imports) moved to the wrapper's top."""
    wrap = b.options.get("wrap")
    if not wrap:
        return b.code
    code, top = b.code, ""
    if hoist:
        lines = b.code.splitlines(keepends=True)
        top = "".join(l for l in lines if re.match(hoist, l))
        code = "".join(l for l in lines if not re.match(hoist, l))
    template = (WRAP_DIR / wrap).read_text()
    if "@SNIPPET@" not in template:
        raise SystemExit(f"tests/docs/wrap/{wrap} has no @SNIPPET@ line")
    return top + template.replace("@SNIPPET@", code)


class Runner:
    def __init__(self, source: Path, build: Path, block: Block, packages: Optional[Path],
                 prefix: Optional[Path]):
        self.source, self.build, self.b = source, build, block
        self.packages, self.prefix = packages, prefix
        self.dir = build / "tests" / "docs" / "run" / block.test
        self.env = dict(os.environ)

    def view(self) -> Path:
        """A fresh scratch folder that looks like the checkout (see above)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        for entry in self.source.iterdir():
            if entry.name == "build" or entry.name.startswith((".git", "build-")):
                continue
            (self.dir / entry.name).symlink_to(entry)
        (self.dir / "build").symlink_to(self.build)
        return self.dir

    def run(self, command, cwd: Path, env=None) -> subprocess.CompletedProcess:
        shown = command if isinstance(command, str) else " ".join(map(str, command))
        print(f"doc_snippets: $ {shown}", flush=True)
        return subprocess.run(command, cwd=cwd, env=env or self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)

    def checked(self, command, cwd: Path, env=None) -> str:
        done = self.run(command, cwd, env)
        print(done.stdout, end="", flush=True)
        if done.returncode != 0:
            raise Failed(f"exit status {done.returncode}")
        return done.stdout

    # Each returns the program's output.
    def sh(self) -> str:
        cwd = self.view()
        code = self.b.code.replace("<build>", str(self.build))
        for placeholder, path in (("<prefix>", cwd / "prefix"), ("<root>", cwd / "root")):
            code = code.replace(placeholder, str(path))
        if "<packages>" in code:
            if not self.packages or not any(self.packages.glob("*.deb")):
                raise Failed(f"no .deb files in {self.packages} (the pq_packages fixture)")
            code = code.replace("<packages>", str(self.packages))
        # Go as a user's shell has it, with caches of its own and no flags
        # from the environment.
        env = {k: v for k, v in self.env.items()
               if k not in ("GOFLAGS", "GOWORK", "GO111MODULE", "CGO_CFLAGS", "CGO_LDFLAGS")}
        env.update(GOENV="off", GOTOOLCHAIN="local", GOPATH=str(cwd / "gopath"),
                   GOCACHE=str(self.build / "tests" / "docs" / "gocache"))
        return self.checked(["bash", "-euo", "pipefail", "-c", code], cwd, env)

    bash = sh

    def c(self) -> str:
        cwd = self.view()
        (cwd / "snippet.c").write_text(wrapped(self.b, r"\s*#\s*include\b"))
        self.checked(["cc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror",
                      "-Wno-unused-variable", "-Wno-unused-but-set-variable",
                      "-Wno-unused-parameter", f"-I{self.source}/include", f"-I{WRAP_DIR}", "-o", "snippet",
                      "snippet.c", f"-L{self.build}", f"-Wl,-rpath,{self.build}", "-lpqcache",
                      "-lm"], cwd)
        return self.checked(["./snippet"], cwd)

    def python(self) -> str:
        cwd = self.source if self.b.options.get("cwd") == "source" else self.view()
        scratch = self.dir
        scratch.mkdir(parents=True, exist_ok=True)
        script = scratch / "snippet.py"
        script.write_text(wrapped(self.b, None))
        env = dict(self.env, PYTHONPATH=str(self.build / "python"),
                   PYTHONPYCACHEPREFIX=str(self.build / "tests" / "docs" / "pycache"))
        return self.checked([sys.executable, str(script)], cwd, env)

    def go(self) -> str:
        cwd = self.view()
        module = self.build / "bindings" / "go" / "module"
        work = cwd / "program"
        work.mkdir()
        (work / "main.go").write_text(wrapped(self.b, None))
        (work / "go.mod").write_text(
            "module example.com/docsnippet\n\ngo 1.19\n\n"
            "require libpqcache.org/pqcache v0.0.0\n\n"
            f"replace libpqcache.org/pqcache => {module}\n")
        go = self.build / "bindings" / "go"
        env = dict(self.env, GOCACHE=str(go / "gocache"), GOPATH=str(go / "gopath"),
                   GOENV="off", GOFLAGS="-mod=mod", GOPROXY="off", GOTOOLCHAIN="local",
                   CGO_ENABLED="1", PKG_CONFIG_PATH=str(go / "pkgconfig"))
        self.checked(["go", "build", "-o", "snippet", "."], work, env)
        return self.checked(["./snippet"], work, env)

    def java(self) -> str:
        cwd = self.view()
        jar = self.build / "bindings" / "java" / "pqcache.jar"
        (cwd / "Snippet.java").write_text(wrapped(self.b, r"\s*import\s"))
        self.checked(["javac", "-cp", str(jar), "-d", "classes", "Snippet.java"], cwd)
        return self.checked(["java", "-cp", f"{jar}:classes",
                             f"-Djava.library.path={self.build / 'bindings' / 'java' / 'native'}",
                             "Snippet"], cwd,
                            dict(self.env, LD_LIBRARY_PATH=str(self.build)))

    def rust(self) -> str:
        cwd = self.view()
        crate = cwd / "program"
        (crate / "src").mkdir(parents=True)
        (crate / "src" / "main.rs").write_text(wrapped(self.b, r"\s*use\s"))
        (crate / "Cargo.toml").write_text(
            '[package]\nname = "docsnippet"\nversion = "0.1.0"\nedition = "2021"\n\n'
            "[dependencies]\n"
            f'pqcache = {{ path = "{self.source}/bindings/rust/pqcache" }}\n\n[workspace]\n')
        env = dict(self.env, CARGO_HOME=str(self.build / "cargo-home"),
                   CARGO_TARGET_DIR=str(self.build / "tests" / "docs" / "cargo-target"),
                   PQCACHE_LIB_DIR=str(self.build), LD_LIBRARY_PATH=str(self.build))
        return self.checked(["cargo", "run", "--offline", "--quiet"], crate, env)

    def cmake(self) -> str:
        cwd = self.view()
        project = cwd / "project"
        project.mkdir()
        (project / "CMakeLists.txt").write_text(wrapped(self.b, None))
        shutil.copy(self.source / "examples" / "decode_loop.c", project / "decode_loop.c")
        if not self.prefix or not (self.prefix / "include" / "pqcache.h").is_file():
            raise Failed(f"no installed tree at {self.prefix} (the doc_install fixture)")
        self.checked(["cmake", "-S", "project", "-B", "project-build",
                      f"-DCMAKE_PREFIX_PATH={self.prefix}"], cwd)
        self.checked(["cmake", "--build", "project-build"], cwd)
        args = shlex.split(self.b.options.get("args", ""))
        return self.checked([str(cwd / "project-build" / "app"), *args], cwd)


class Failed(Exception):
    pass


def run(source: Path, build: Path, page: str, name: str, packages: Optional[Path],
        prefix: Optional[Path]) -> int:
    found = [b for b in blocks(source, source / page) if b.kind == "snippet" and b.name == name]
    if not found:
        print(f"doc_snippets: {page} has no block marked '<!-- snippet: {name}'")
        return 1
    b = found[0]
    requirement = b.options.get("requires")
    if requirement and not venv_has(requirement):
        print(f"SKIPPED: {sys.prefix} was not built with {requirement} (scripts/setup.sh --eval)")
        return SKIP
    if "skip-unless" in b.options:
        done = subprocess.run(b.options["skip-unless"], shell=True, cwd=source,
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(f"SKIPPED: `{b.options['skip-unless']}` failed: {done.stderr.strip()[-300:]}")
            return SKIP
    print(f"doc_snippets: {page}:{b.line} snippet {name} ({b.language}, "
          f"{len(b.code.splitlines())} lines)", flush=True)
    runner = Runner(source, build, b, packages, prefix)
    try:
        output = getattr(runner, b.language)()
    except Failed as e:
        print(f"doc_snippets: FAIL: {page}:{b.line} snippet {name}: {e}")
        return 1
    expect = b.options.get("expect")
    if expect and not re.search(expect, output, re.M):
        print(f"doc_snippets: FAIL: {page}:{b.line} snippet {name}: the output does not "
              f"match {expect!r}")
        return 1
    print(f"doc_snippets: PASS: {page}:{b.line} snippet {name}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for command in ("check", "list"):
        sub.add_parser(command).add_argument("source", type=Path)
    r = sub.add_parser("run")
    r.add_argument("source", type=Path)
    r.add_argument("build", type=Path)
    r.add_argument("page")
    r.add_argument("name")
    r.add_argument("--packages", type=Path)
    r.add_argument("--prefix", type=Path)
    args = ap.parse_args(argv)
    source = args.source.resolve()
    if args.command == "check":
        return check(source)
    if args.command == "list":
        return list_tests(source)
    return run(source, args.build.resolve(), args.page, args.name, args.packages, args.prefix)


if __name__ == "__main__":
    sys.exit(main())
