#!/usr/bin/env bash
# The project's Python environment: a virtual environment built from the
# requirement files alone, which the scripts, the CTest Python tests and the
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
# The venv records the files it was built from, with their sha256, in
# <venv>/pqcache-requirements. When one of them has changed since, or the
# base interpreter has, or with --fresh, the venv is deleted and built again
# from the files (pip's cache makes that a local install). Every run ends
# with scripts/check_python_env.py: each requirement installed at a version
# its file allows, every installed distribution needed by one of them (a
# module installed into the venv by hand fails the check), `pip check`
# clean.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${PQCACHE_VENV:-${HOME:?HOME is not set}/.cache/pqcache/venv}
python=$venv/bin/python
stamp=$venv/pqcache-requirements

files=(requirements.txt)
fresh=0
mode=update
for arg in "$@"; do
  case "$arg" in
    --eval) files+=(requirements-eval.txt) ;;
    --bench) files+=(requirements-bench.txt) ;;
    --fresh) fresh=1 ;;
    --check) mode=check ;;
    --python) echo "$python"; exit 0 ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
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

# The files the venv records: "python <path> <version>" then "file <name> <sha256>".
recorded_files() { [[ -f $stamp ]] && sed -n 's/^file \([^ ]*\) .*/\1/p' "$stamp"; true; }

check() {
  [[ -x $python ]] || die "no venv at $venv: run scripts/setup.sh"
  "$python" -I "$root/scripts/check_python_env.py" "$root" ||
    die "$venv does not hold exactly what its requirement files name (above);" \
        "scripts/setup.sh --fresh-venv rebuilds it from the files"
}

if [[ $mode == check ]]; then
  check
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# One writer at a time: two builds may run setup.sh together.
exec 9>"$venv.lock"
flock 9

rebuild=$fresh
reason="--fresh"
if [[ ! -x $python || ! -f $stamp ]]; then
  rebuild=1; reason="none built yet"
elif ! grep -qxF "python $base_id" "$stamp"; then
  rebuild=1; reason="the base interpreter is now $base_id"
else
  for f in $(recorded_files); do
    if ! grep -qx "file $f $(sha "$f")" "$stamp"; then
      rebuild=1; reason="$f changed"
    fi
  done
fi

# Everything recorded stays; what is asked for is added.
mapfile -t wanted < <( (recorded_files; printf '%s\n' "${files[@]}") | awk '!seen[$0]++')
missing=()
for f in "${wanted[@]}"; do grep -q "^file $f " "$stamp" 2>/dev/null || missing+=("$f"); done

if ((rebuild)); then
  log "building $venv from ${wanted[*]} ($reason)"
  started=$SECONDS
  rm -rf "$venv"
  "$base" -m venv "$venv"
elif ((${#missing[@]} > 0)); then
  log "adding ${missing[*]} to $venv"
  started=$SECONDS
else
  log "$venv holds ${wanted[*]}"
fi
if ((rebuild || ${#missing[@]} > 0)); then
  # One pip call over every file: the resolver sees all constraints at once.
  args=()
  for f in "${wanted[@]}"; do args+=(-r "$root/$f"); done
  # -I: neither PYTHONPATH nor the user's site may leak into the install.
  "$python" -I -m pip install --quiet --disable-pip-version-check "${args[@]}" ||
    die "pip install ${args[*]} failed (is PyPI reachable?)"
  # The stamp is written last: an interrupted build has none and is rebuilt.
  {
    echo "python $base_id"
    for f in "${wanted[@]}"; do echo "file $f $(sha "$f")"; done
  } >"$stamp.tmp"
  mv "$stamp.tmp" "$stamp"
  log "pip installed ${wanted[*]} in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1) in $venv)"
fi
check
