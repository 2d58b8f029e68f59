#!/usr/bin/env bash
# Fuzzes the C API with libFuzzer (tests/fuzz/fuzz_api.cpp) under ASan +
# UBSan for a bounded time, starting from the committed seed corpus.
#
#   scripts/fuzz.sh [seconds]        (default 300)
#
# Builds build-fuzz/ with clang (scripts/setup.sh installs clang and
# libclang-rt-14-dev), unpacks tests/fuzz/corpus.tar.gz into
# build-fuzz/corpus (new inputs go there, never into the repository), runs
# on one core, and exits non-zero on a finding: the input is left in
# build-fuzz/ as crash-* (or leak-*, timeout-*), with the command that
# replays it. A fixed finding's input belongs in tests/fuzz/regressions/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-300}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: seconds must be a number, not '$seconds'" >&2; exit 2; }
"$root/scripts/setup.sh"
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed" >&2; exit 1; }

build=$root/build-fuzz
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPQ_FUZZ=ON -DPQ_BUILD_TESTS=OFF -DPQ_BUILD_BINDINGS=OFF -DPQ_BUILD_BENCHMARKS=OFF \
  -DPQ_BUILD_EXAMPLES=OFF -DPQ_WITH_CUDA=OFF >/dev/null
cmake --build "$build" --target fuzz_api -j "$(nproc)"

corpus=$build/corpus
mkdir -p "$corpus"
tar -C "$corpus" -xzf "$root/tests/fuzz/corpus.tar.gz"
cd "$build"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "fuzz: $seconds s over $(ls "$corpus" | wc -l) seed inputs"
set +e
./tests/fuzz/fuzz_api -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
  -print_final_stats=1 "$corpus" "$root/tests/fuzz/regressions" 2>&1 |
  grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)'
status=${PIPESTATUS[0]}
set -e
if ((status != 0)); then
  echo "fuzz: FINDING (exit $status). Replay: $build/tests/fuzz/fuzz_api $build/crash-*" >&2
  exit 1
fi
echo "fuzz: no finding in $seconds s"
