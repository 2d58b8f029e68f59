"""The hashed lock files of the project's Python environment: which exist,
what each is compiled from, and whether each is still current.

    python3 scripts/python_lock.py list                 NAME INPUT... per lock, in compile order
    python3 scripts/python_lock.py target                the Python and platform they are compiled for
    python3 scripts/python_lock.py header NAME [SOURCE_DIR]   the header scripts/lock-python.sh writes
    python3 scripts/python_lock.py compile-args NAME     its arguments for uv pip compile, one a line
    python3 scripts/python_lock.py name [PART...]         the lock of requirements.txt and those parts
    python3 scripts/python_lock.py digest LOCK           the sha256 of its pins (comments left out)
    python3 scripts/python_lock.py check [--this-python] [SOURCE_DIR]

One lock per combination of requirement files that scripts/python-env.sh
installs: locks/base.txt from requirements.txt, locks/base+eval.txt adding
requirements-eval.txt, locks/base+bench.txt, locks/base+eval+bench.txt.
Each is complete (every distribution pinned, with the sha256 of its files),
so pip installs one alone with --require-hashes --no-deps.

scripts/lock-python.sh compiles them and writes, at the top of each, the
sha256 of every requirement file it was compiled from. `check` (CTest
`python_lock_current`, and scripts/python-env.sh before it installs) fails
when a lock is missing, or one of its requirement files has changed since:
the requirement file then says something the lock does not, and the venv
would be built from the old answer. It reads no network. --this-python also
fails when the running interpreter is not the one the locks were compiled
for (another Python minor version or platform would need other wheels).

Standard library only: python-env.sh runs it with the base python3, before
any venv exists.
"""

import hashlib
import platform
import re
import sys
from pathlib import Path

# The optional parts, in the order they appear in a lock's name; part P adds
# requirements-P.txt to requirements.txt.
PARTS = ("eval", "bench")
BASE_FILE = "requirements.txt"
LOCK_DIR = "locks"

# What the locks are compiled for: Debian 12's python3 (3.11) and glibc
# (2.36) on x86_64, the machines of the README, CI's included. uv resolves
# the markers for this target whatever machine compiles them.
TARGET_PYTHON = (3, 11)
TARGET_PLATFORM = "x86_64-manylinux_2_36"

INPUT_LINE = re.compile(r"^# input: (\S+) sha256=([0-9a-f]{64})$")


def combinations():
    """Every lock name with its requirement files, each lock after the locks
    it is constrained by (itself less one part)."""
    combos = [()]
    for part in PARTS:
        combos += [c + (part,) for c in combos]
    combos.sort(key=len)
    return [("+".join(("base",) + c), [BASE_FILE] + [f"requirements-{p}.txt" for p in c])
            for c in combos]


def lock_path(source_dir, name):
    return source_dir / LOCK_DIR / f"{name}.txt"


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pins_digest(lock):
    """The sha256 of a lock's lines less its comments: what a venv installed
    from it depends on. A header or "# via" note that changes (a comment
    edited in a requirement file) then does not rebuild a 5 GB venv."""
    pins = [line for line in lock.read_text().splitlines() if not line.lstrip().startswith("#")]
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()


def recorded_inputs(lock):
    """file name -> sha256, from the lock's header."""
    inputs = {}
    for line in lock.read_text().splitlines():
        if not line.startswith("#"):
            break
        match = INPUT_LINE.match(line)
        if match:
            inputs[match.group(1)] = match.group(2)
    return inputs


def header(source_dir, name):
    files = dict(combinations())[name]
    lines = ["# Compiled by scripts/lock-python.sh: do not edit. Change the requirement",
             "# files and run it again (the python_lock_current test fails until then).",
             f"# target: cpython {'.'.join(map(str, TARGET_PYTHON))} {TARGET_PLATFORM}"]
    lines += [f"# input: {f} sha256={sha256(source_dir / f)}" for f in files]
    return "\n".join(lines)


def compile_args(name):
    """uv's arguments for one lock: the locks one part smaller as constraints
    (base+eval+bench: base+eval and base+bench; each of those: base), then
    its requirement files. A pin of a smaller lock so holds in every larger
    one, and adding a part to a venv only adds distributions."""
    combos = dict(combinations())
    parts = set(name.split("+")[1:])
    args = []
    for smaller in combos:
        smaller_parts = set(smaller.split("+")[1:])
        if smaller_parts < parts and len(smaller_parts) == len(parts) - 1:
            args += ["-c", f"{LOCK_DIR}/{smaller}.txt"]
    return args + combos[name]


def this_python_problems():
    """Why the running interpreter cannot install the locks' wheels, if so."""
    problems = []
    if platform.python_implementation() != "CPython" or sys.version_info[:2] != TARGET_PYTHON:
        problems.append(f"the locks are for CPython {'.'.join(map(str, TARGET_PYTHON))}, "
                        f"{sys.executable} is {platform.python_implementation()} "
                        f"{platform.python_version()}")
    target = re.fullmatch(r"(\w+)-manylinux_(\d+)_(\d+)", TARGET_PLATFORM)
    arch, glibc = target.group(1), (int(target.group(2)), int(target.group(3)))
    libc, version = platform.libc_ver()
    found = tuple(map(int, re.findall(r"\d+", version)[:2]))
    if sys.platform != "linux" or platform.machine() != arch or libc != "glibc" or found < glibc:
        problems.append(f"the locks are for {TARGET_PLATFORM} (Linux, {arch}, glibc >= "
                        f"{'.'.join(map(str, glibc))}); this is {sys.platform} "
                        f"{platform.machine()} {libc or 'without glibc'} {version}")
    return problems


def check(source_dir, this_python):
    problems = this_python_problems() if this_python else []
    for name, files in combinations():
        lock = lock_path(source_dir, name)
        if not lock.is_file():
            problems.append(f"{lock} is missing: run scripts/lock-python.sh")
            continue
        recorded = recorded_inputs(lock)
        if sorted(recorded) != sorted(files):
            problems.append(f"{lock} was compiled from {', '.join(sorted(recorded)) or 'nothing'} "
                            f"instead of {', '.join(files)}: run scripts/lock-python.sh")
            continue
        changed = [f for f in files if sha256(source_dir / f) != recorded[f]]
        if changed:
            problems.append(f"{', '.join(changed)} changed since {lock.relative_to(source_dir)} "
                            "was compiled: run scripts/lock-python.sh and commit the locks")
    for p in problems:
        print(f"python_lock: {p}", file=sys.stderr)
    if not problems:
        print(f"python_lock: {len(combinations())} locks in {source_dir / LOCK_DIR} "
              "match their requirement files")
    return 1 if problems else 0


def main(argv):
    default = Path(__file__).resolve().parent.parent
    command = argv[0] if argv else ""
    args = argv[1:]
    this_python = "--this-python" in args
    args = [a for a in args if a != "--this-python"]
    if command == "list" and not args:
        for name, files in combinations():
            print(name, *files)
        return 0
    if command == "target" and not args:
        print(".".join(map(str, TARGET_PYTHON)), TARGET_PLATFORM)
        return 0
    if command == "header" and len(args) in (1, 2) and args[0] in dict(combinations()):
        print(header(Path(args[1]).resolve() if len(args) == 2 else default, args[0]))
        return 0
    if command == "digest" and len(args) == 1:
        print(pins_digest(Path(args[0])))
        return 0
    if command == "name" and set(args) <= set(PARTS):
        print("+".join(["base"] + [p for p in PARTS if p in args]))
        return 0
    if command == "compile-args" and len(args) == 1 and args[0] in dict(combinations()):
        print("\n".join(compile_args(args[0])))
        return 0
    if command == "check" and len(args) <= 1:
        return check(Path(args[0]).resolve() if args else default, this_python)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
