#!/usr/bin/env bash
# Compiles the hashed lock files of the project's Python environment,
# locks/*.txt, from the requirement files: run it after changing one of
# them, and commit the locks with the change (the python_lock_current test
# fails until then).
#
#   scripts/lock-python.sh
#
# One lock per combination scripts/python-env.sh installs (base, base+eval,
# base+bench, base+eval+bench; scripts/python_lock.py lists them), each
# complete: every distribution pinned with the sha256 of its files on PyPI,
# for CPython 3.11 on x86_64 Linux (manylinux_2_36: Debian 12), whatever
# machine runs this. A lock is resolved with the pins of the locks one part
# smaller as constraints, so base's pins are the same in all four and adding
# --eval or --bench to a venv only adds distributions.
#
# The tool is uv (`uv pip compile --generate-hashes`), pinned with its hashes
# in requirements-lock-tool.txt and installed into a venv of its own,
# $PQCACHE_LOCK_TOOL_VENV (default ~/.cache/pqcache/lock-tool). Needs PyPI.
# Upgrades nothing by itself: a pin stays until a requirement file excludes
# it; --upgrade resolves every lock again to the newest versions the files
# allow.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool_venv=${PQCACHE_LOCK_TOOL_VENV:-${HOME:?HOME is not set}/.cache/pqcache/lock-tool}
tool_file=requirements-lock-tool.txt

upgrade=()
for arg in "$@"; do
  case "$arg" in
    --upgrade) upgrade=(--upgrade) ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "lock-python: unknown option $arg" >&2; exit 2 ;;
  esac
done

log() { echo "lock-python: $*"; }
die() { echo "lock-python: error: $*" >&2; exit 1; }

python3=$(command -v python3) || die "python3 is not on PATH (scripts/setup.sh installs Debian's)"
locks() { "$python3" -I "$root/scripts/python_lock.py" "$@"; }

# The tool's venv, rebuilt when requirements-lock-tool.txt changes.
tool_sha=$(sha256sum "$root/$tool_file" | cut -d' ' -f1)
if ! grep -qxF "$tool_sha" "$tool_venv/pqcache-lock-tool" 2>/dev/null; then
  log "installing the lock tool ($tool_file) into $tool_venv"
  rm -rf "$tool_venv"
  "$python3" -m venv "$tool_venv"
  "$tool_venv/bin/python" -I -m pip install --quiet --disable-pip-version-check \
    --require-hashes --no-deps -r "$root/$tool_file" || die "pip install -r $tool_file failed (is PyPI reachable?)"
  echo "$tool_sha" >"$tool_venv/pqcache-lock-tool"
fi
uv=$tool_venv/bin/uv

read -r target_python target_platform < <(locks target)
cd "$root"
mkdir -p locks
while read -r name files; do
  out=locks/$name.txt
  # uv reads the pins of the file it writes as preferences: a previous lock
  # stays as it was where the requirement files still allow it.
  if [[ -f $out ]]; then cp "$out" "$out.tmp"; else rm -f "$out.tmp"; fi
  # Paths relative to the checkout, so the "# via" notes read the same on
  # every machine.
  mapfile -t args < <(locks compile-args "$name")
  "$uv" pip compile --quiet --generate-hashes --no-header "${upgrade[@]}" \
      --python-version "$target_python" --python-platform "$target_platform" \
      "${args[@]}" --output-file "$out.tmp" ||
    { rm -f "$out.tmp"; die "uv pip compile failed for $out (above)"; }
  { locks header "$name" "$root"; cat "$out.tmp"; } >"$out.new"
  rm -f "$out.tmp"
  mv "$out.new" "$out"
  log "$out: $(grep -c '^[a-z0-9]' "$out") distributions from ${files// /, }"
done < <(locks list)
locks check "$root"
