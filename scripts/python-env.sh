#!/usr/bin/env bash
# The project's Python environment: a virtual environment built from the
# requirement files' hashed locks alone, which the scripts, the CTest Python tests and the
# examples run in. Nothing installed elsewhere on the machine (the system's
# or the user's site-packages) is visible in it, so a module that no
# requirement file names fails here as it would on a fresh machine.
#
#   scripts/python-env.sh [--eval] [--bench] [--fresh]   create or update it, then check it
#   scripts/python-env.sh --check                        check it only
#   scripts/python-env.sh --python                       print its interpreter's path
#
# Always requirements.txt; --eval adds requirements-eval.txt (torch,
# transformers, accelerate: about 4 GB), --bench requirements-bench.txt
# (faiss-cpu). The venv keeps what was added before (a later run without
# --eval does not remove torch). Where: $PQCACHE_VENV, by default
# ~/.cache/pqcache/venv, built from the python3 on PATH.
#
# pip installs from the hashed lock of that combination of files,
# locks/base[+eval][+bench].txt (scripts/lock-python.sh compiles them), with
# `pip install --require-hashes --no-deps`: every distribution at the
# version the lock pins and from a file whose sha256 it lists, nothing that
# the lock does not name. A lock older than its requirement files stops it
# (scripts/python_lock.py check; run scripts/lock-python.sh).
#
# The venv records the lock it was installed from, with the sha256 of its
# pins, in <venv>/pqcache-requirements. When they have changed since, or the
# base interpreter has, or with --fresh, the venv is deleted and built again
# (pip's cache makes that a local install). Every run ends with
# scripts/check_python_env.py: the venv holds exactly the lock's pins (a
# module installed into it by hand fails the check), `pip check` clean.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${PQCACHE_VENV:-${HOME:?HOME is not set}/.cache/pqcache/venv}
python=$venv/bin/python
stamp=$venv/pqcache-requirements

parts=()
fresh=0
mode=update
for arg in "$@"; do
  case "$arg" in
    --eval) parts+=(eval) ;;
    --bench) parts+=(bench) ;;
    --fresh) fresh=1 ;;
    --check) mode=check ;;
    --python) echo "$python"; exit 0 ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "python-env: unknown option $arg" >&2; exit 2 ;;
  esac
done

log() { echo "python-env: $*"; }
die() { echo "python-env: error: $*" >&2; exit 1; }

base=$(command -v python3 || true)
[[ -n $base ]] || die "python3 is not on PATH (scripts/setup.sh installs Debian's)"
# The base interpreter as the venv will record it: the real executable and
# its version (a pyenv shim resolves to the version it selects).
base_id=$("$base" -c 'import sys, os; print(os.path.realpath(sys.executable), sys.version.split()[0])')
sha() { sha256sum "$root/$1" | cut -d' ' -f1; }
locks() { "$base" -I "$root/scripts/python_lock.py" "$@"; }

# The stamp: "python <path> <version>", "lock <lock> <sha256 of its pins>", then
# "file <name> <sha256>" for each requirement file the lock was compiled
# from (tests/docs/doc_snippets.py's requires= reads those).
recorded_lock() { [[ -f $stamp ]] && sed -n 's/^lock \([^ ]*\) .*/\1/p' "$stamp"; true; }
# The parts the venv holds, from its "file" lines (also in a stamp written
# before the locks existed).
recorded_parts() { [[ -f $stamp ]] && sed -n 's/^file requirements-\([a-z]*\)\.txt .*/\1/p' "$stamp"; true; }

check() {
  [[ -x $python ]] || die "no venv at $venv: run scripts/setup.sh"
  "$python" -I "$root/scripts/check_python_env.py" "$root" ||
    die "$venv does not hold exactly what its lock file pins (above);" \
        "scripts/setup.sh --fresh-venv rebuilds it from the lock"
}

if [[ $mode == check ]]; then
  check
  exit 0
fi

locks check --this-python "$root" ||
  die "the lock files do not match the requirement files or this python3 (above)"

mkdir -p "$(dirname "$venv")"
# One writer at a time: two builds may run setup.sh together.
exec 9>"$venv.lock"
flock 9

# Everything recorded stays; what is asked for is added.
mapfile -t wanted < <( (recorded_parts; printf '%s\n' "${parts[@]}") | awk 'NF && !seen[$0]++')
lock=locks/$(locks name "${wanted[@]}").txt
old_lock=$(recorded_lock)

rebuild=$fresh
reason="--fresh"
if [[ ! -x $python || ! -f $stamp ]]; then
  rebuild=1; reason="none built yet"
elif ! grep -qxF "python $base_id" "$stamp"; then
  rebuild=1; reason="the base interpreter is now $base_id"
elif [[ -z $old_lock ]]; then
  rebuild=1; reason="it was built before the lock files"
elif [[ ! -f $root/$old_lock ]] || ! grep -qxF "lock $old_lock $(locks digest "$root/$old_lock")" "$stamp"; then
  rebuild=1; reason="$old_lock changed"
fi

if ((rebuild)); then
  log "building $venv from $lock ($reason)"
  started=$SECONDS
  rm -rf "$venv"
  "$base" -m venv "$venv"
elif [[ $old_lock != "$lock" ]]; then
  # The larger lock keeps every pin of the smaller one (lock-python.sh
  # compiles it so): pip only adds.
  log "adding to $venv: $lock over $old_lock"
  started=$SECONDS
else
  log "$venv holds $lock"
fi
if ((rebuild)) || [[ $old_lock != "$lock" ]]; then
  # -I: neither PYTHONPATH nor the user's site may leak into the install.
  # --no-deps: the lock is complete; a dependency it lacks is an error of
  # the lock, which pip check (in check_python_env.py) reports.
  "$python" -I -m pip install --quiet --disable-pip-version-check \
      --require-hashes --no-deps -r "$root/$lock" ||
    die "pip install --require-hashes -r $lock failed (is PyPI reachable?)"
  # The stamp is written last: an interrupted build has none and is rebuilt.
  {
    echo "python $base_id"
    echo "lock $lock $(locks digest "$root/$lock")"
    for f in $(locks list | awk -v n="${lock#locks/}" '$1 ".txt" == n { $1 = ""; print }'); do
      echo "file $f $(sha "$f")"
    done
  } >"$stamp.tmp"
  mv "$stamp.tmp" "$stamp"
  log "pip installed $lock in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1) in $venv)"
fi
check
