"""Checks that the running interpreter is the project's Python environment and
that it holds what the requirement files name, and nothing more.

    <venv>/bin/python scripts/check_python_env.py [SOURCE_DIR]

Run from anywhere; SOURCE_DIR (default: this file's checkout) holds the
requirement files. The venv names the files it was built from, with their
sha256, in <venv>/pqcache-requirements (scripts/python-env.sh writes it).
scripts/python-env.sh runs this after every creation or update of the venv,
and CTest runs it as `python_environment` with the interpreter the build was
configured with. It fails (exit 1, one line per problem) when:
  - the venv was not built by scripts/python-env.sh, or from other versions
    of the requirement files than SOURCE_DIR's (run scripts/setup.sh);
  - the interpreter is not a virtual environment, or one that sees the
    system's or the user's site-packages: a module installed elsewhere on
    the machine could then stand in for a requirement no file names;
  - a requirement of the files is not installed, or its version does not
    satisfy the file's specifier;
  - a distribution is installed that no requirement file names and no named
    requirement needs (by its metadata, with the extras the files ask for):
    it was installed by hand, and a test that imports it would pass here and
    fail on a fresh machine;
  - `pip check` finds a broken dependency.
pip and setuptools, which `python -m venv` puts in every venv, are allowed.
Uses only the standard library and pip's vendored `packaging`.
"""

import hashlib
import importlib.metadata as metadata
import site
import subprocess
import sys
from pathlib import Path

from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
from pip._vendor.packaging.utils import canonicalize_name

# What `python -m venv` installs by itself (ensurepip).
VENV_BASE = {"pip", "setuptools"}


STAMP = "pqcache-requirements"


def recorded_files(source_dir, problems):
    """The requirement files the venv was built from, checked against the
    sha256 it recorded for each."""
    stamp = Path(sys.prefix) / STAMP
    if not stamp.is_file():
        problems.append(f"{sys.prefix} was not built by scripts/python-env.sh (no {STAMP})")
        return []
    files = []
    for line in stamp.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "file":
            continue
        name, _, digest = rest.partition(" ")
        path = source_dir / name
        if not path.is_file():
            problems.append(f"the venv was built from {name}, which {source_dir} does not have")
            continue
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"the venv was built from another version of {name}: "
                            "scripts/setup.sh rebuilds it")
        files.append(path)
    return files


def read_requirements(files):
    """The requirements of the files: one per line, '#' comments, no options."""
    requirements = []
    for file in files:
        for number, line in enumerate(Path(file).read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                requirements.append(Requirement(line))
            except InvalidRequirement as e:
                sys.exit(f"check_python_env: {file}:{number}: {e}")
    return requirements


def installed_distributions():
    """name -> distribution, for every distribution this interpreter sees."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist)
    return found


def closure(requirements, installed):
    """The names of every distribution the requirements need: each installed
    distribution's Requires-Dist followed, with the extras asked for."""
    seen = set()  # (name, extra); extra "" is the distribution itself
    todo = [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        for extra in [""] + sorted(requirement.extras):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            dist = installed.get(name)
            for line in (dist.requires or []) if dist else []:
                dep = Requirement(line)
                if dep.marker is None or dep.marker.evaluate({"extra": extra}):
                    todo.append(dep)
    return {name for name, _ in seen}


def main(source_dir):
    problems = []
    files = recorded_files(source_dir, problems)
    if sys.prefix == sys.base_prefix:
        problems.append(f"{sys.executable} is not a virtual environment (scripts/setup.sh builds one)")
    if site.ENABLE_USER_SITE:
        problems.append("the user's site-packages is on sys.path (run without PYTHONNOUSERSITE=0?)")
    foreign = [p for p in sys.path
               if p.endswith("-packages") and not Path(p).resolve().is_relative_to(Path(sys.prefix).resolve())]
    if foreign:
        problems.append(f"site-packages outside the venv are on sys.path: {', '.join(foreign)}")

    requirements = read_requirements(files)
    installed = installed_distributions()
    for r in requirements:
        dist = installed.get(canonicalize_name(r.name))
        if dist is None:
            problems.append(f"{r} is required but not installed")
        elif r.specifier and not r.specifier.contains(dist.version, prereleases=True):
            problems.append(f"{r} is required but {dist.version} is installed")

    needed = closure(requirements, installed)
    extra = sorted(set(installed) - set(needed) - VENV_BASE)
    for name in extra:
        problems.append(f"{name} {installed[name].version} is installed but no requirement file "
                        f"({', '.join(Path(f).name for f in files)}) names it or needs it")

    pip = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        problems.extend(f"pip check: {line}" for line in pip.stdout.splitlines() if line.strip())

    for p in problems:
        print(f"check_python_env: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_python_env: {sys.prefix}: {len(installed)} distributions, "
          f"all needed by {', '.join(Path(f).name for f in files)}; pip check clean")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(__doc__)
    default = Path(__file__).resolve().parent.parent
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) == 2 else default))
