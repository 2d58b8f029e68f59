#!/usr/bin/env bash
# Configures and builds libpqcache with CMake + Ninja.
#
#   scripts/build.sh [--sanitize | --tsan] [build-dir]
#
# Default:     Release into build/. The CUDA plug-in (libpqcache_cuda.so) is
#              built when nvcc is found (a GPU is not needed to build it).
# --sanitize:  AddressSanitizer + UndefinedBehaviorSanitizer, RelWithDebInfo,
#              no CUDA plug-in, no benchmarks, into build-asan/.
# --tsan:      ThreadSanitizer, RelWithDebInfo, the C++ tests only (no CUDA,
#              benchmarks, bindings or packaging), into build-tsan/.
#
# Extra CMake arguments can be passed in PQ_CMAKE_ARGS (split on spaces).
# Runs scripts/setup.sh first (installs only what is missing), and configures
# the Python tests with the project's venv (scripts/python-env.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

sanitize=0
tsan=0
build_dir=""
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    --tsan) tsan=1 ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "build.sh: unknown option $arg" >&2; exit 2 ;;
    *)
      if [[ -n $build_dir ]]; then echo "build.sh: more than one build dir" >&2; exit 2; fi
      build_dir=$arg ;;
  esac
done

"$root/scripts/setup.sh"

if ((sanitize && tsan)); then
  echo "build.sh: --sanitize and --tsan exclude each other" >&2; exit 2
elif ((sanitize)); then
  build_dir=${build_dir:-build-asan}
  config=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPQ_SANITIZE=ON -DPQ_WITH_CUDA=OFF
          -DPQ_BUILD_BENCHMARKS=OFF)
elif ((tsan)); then
  build_dir=${build_dir:-build-tsan}
  config=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPQ_SANITIZE_THREAD=ON -DPQ_WITH_CUDA=OFF
          -DPQ_BUILD_BENCHMARKS=OFF -DPQ_BUILD_BINDINGS=OFF)
else
  build_dir=${build_dir:-build}
  config=(-DCMAKE_BUILD_TYPE=Release -DPQ_SANITIZE=OFF)
fi
# A relative build dir is relative to the repository root.
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"

# nvcc may be installed but not on PATH; CMake finds it through CUDACXX.
if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

# Every Python test, tool and example runs in the project's venv, which
# setup.sh built from the requirement files' hashed locks (scripts/python-env.sh).
config+=("-DPython3_EXECUTABLE=$("$root/scripts/python-env.sh" --python)")

extra=()
if [[ -n ${PQ_CMAKE_ARGS:-} ]]; then read -r -a extra <<<"$PQ_CMAKE_ARGS"; fi

echo "build: configuring $build_dir (${config[*]} ${extra[*]})"
cmake -S "$root" -B "$build_dir" -G Ninja "${config[@]}" "${extra[@]}"
echo "build: building with $(nproc) jobs"
cmake --build "$build_dir" -j "$(nproc)"
echo "build: done: $build_dir"
