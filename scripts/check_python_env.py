"""Checks that the running interpreter is the project's Python environment and
that it holds exactly what its lock file pins.

    <venv>/bin/python scripts/check_python_env.py [SOURCE_DIR]

Run from anywhere; SOURCE_DIR (default: this file's checkout) holds the lock
files (locks/). The venv names the lock it was installed from, with the
sha256 of its pins, in <venv>/pqcache-requirements (scripts/python-env.sh writes it).
scripts/python-env.sh runs this after every creation or update of the venv,
and CTest runs it as `python_environment` with the interpreter the build was
configured with. It fails (exit 1, one line per problem) when:
  - the venv was not built by scripts/python-env.sh, or from other pins
    than those of SOURCE_DIR's lock (run scripts/setup.sh);
  - the interpreter is not a virtual environment, or one that sees the
    system's or the user's site-packages: a module installed elsewhere on
    the machine could then stand in for a requirement no file names;
  - a distribution the lock pins is not installed, or at another version;
  - a distribution is installed that the lock does not pin: it was installed
    by hand, and a test that imports it would pass here and fail on a fresh
    machine;
  - `pip check` finds a broken dependency.
Right after python-env.sh built it from the lock (--require-hashes
--no-deps, into a fresh venv) nothing else can be there; the check is for
what happens later: a module installed by hand, a lock changed since.
Whether the lock itself still matches the requirement files is
scripts/python_lock.py's check (CTest `python_lock_current`).
pip and setuptools, which `python -m venv` puts in every venv, are allowed
at any version where the lock does not pin them.
Uses only the standard library and pip's vendored `packaging`.
"""

import importlib.metadata as metadata
import re
import site
import subprocess
import sys
from pathlib import Path

from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import Version

# The lock format's one definition, beside this file (-I leaves the script's
# folder off sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import python_lock  # noqa: E402

# What `python -m venv` installs by itself (ensurepip).
VENV_BASE = {"pip", "setuptools"}

STAMP = "pqcache-requirements"

# A pin of a lock file: "name==version \" at the start of a line.
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def recorded_lock(source_dir, problems):
    """The lock the venv was installed from, checked against the digest of
    its pins it recorded (python_lock.pins_digest)."""
    stamp = Path(sys.prefix) / STAMP
    if not stamp.is_file():
        problems.append(f"{sys.prefix} was not built by scripts/python-env.sh (no {STAMP})")
        return None
    for line in stamp.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "lock":
            continue
        name, _, digest = rest.partition(" ")
        path = source_dir / name
        if not path.is_file():
            problems.append(f"the venv was built from {name}, which {source_dir} does not have")
            return None
        if python_lock.pins_digest(path) != digest:
            problems.append(f"the venv was built from another version of {name}: "
                            "scripts/setup.sh rebuilds it")
        return path
    problems.append(f"{sys.prefix} was built before the lock files (no lock in {STAMP}): "
                    "scripts/setup.sh rebuilds it")
    return None


def pins(lock):
    """name -> version, for every distribution the lock pins."""
    return {canonicalize_name(m.group(1)): m.group(2)
            for m in map(PIN.match, lock.read_text().splitlines()) if m}


def installed_distributions():
    """name -> version, for every distribution this interpreter sees (what
    `pip freeze --all` lists)."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def isolation_problems():
    problems = []
    if sys.prefix == sys.base_prefix:
        problems.append(f"{sys.executable} is not a virtual environment (scripts/setup.sh builds one)")
    if site.ENABLE_USER_SITE:
        problems.append("the user's site-packages is on sys.path (run without PYTHONNOUSERSITE=0?)")
    foreign = [p for p in sys.path
               if p.endswith("-packages") and not Path(p).resolve().is_relative_to(Path(sys.prefix).resolve())]
    if foreign:
        problems.append(f"site-packages outside the venv are on sys.path: {', '.join(foreign)}")
    return problems


def main(source_dir):
    problems = []
    lock = recorded_lock(source_dir, problems)
    problems += isolation_problems()

    installed = installed_distributions()
    pinned = pins(lock) if lock else {}
    lock_name = lock.relative_to(source_dir) if lock else None
    for name, version in sorted(pinned.items()):
        if name not in installed:
            problems.append(f"{name}=={version} is pinned by {lock_name} but not installed")
        elif Version(installed[name]) != Version(version):
            problems.append(f"{name}=={version} is pinned by {lock_name} but {installed[name]} is installed")
    if lock:
        for name in sorted(set(installed) - set(pinned) - VENV_BASE):
            problems.append(f"{name} {installed[name]} is installed but {lock_name} "
                            "does not pin it (installed by hand?)")

    pip = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        problems.extend(f"pip check: {line}" for line in pip.stdout.splitlines() if line.strip())

    for p in problems:
        print(f"check_python_env: {p}", file=sys.stderr)
    if problems:
        return 1
    venv_base = sorted(set(installed) - set(pinned))
    print(f"check_python_env: {sys.prefix}: {len(installed)} distributions, the {len(pinned)} "
          f"pins of {lock_name}"
          f"{' and ' + ', '.join(venv_base) + ' of the venv' if venv_base else ''}; pip check clean")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(__doc__)
    default = Path(__file__).resolve().parent.parent
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) == 2 else default))
