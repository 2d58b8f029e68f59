#!/usr/bin/env bash
# Fuzzes the C API with libFuzzer (tests/fuzz/fuzz_api.cpp) under ASan +
# UBSan for a bounded time, starting from the committed seed corpus.
#
#   scripts/fuzz.sh [seconds]        (default 300)
#
# Builds build-fuzz/ with clang, unpacks tests/fuzz/corpus.tar.gz into
# build-fuzz/corpus (new inputs go there, never into the repository), runs
# on one core, and exits non-zero on a finding: the input is left in
# build-fuzz/ as crash-* (or leak-*, timeout-*), with the command that
# replays it. A fixed finding's input belongs in tests/fuzz/regressions/.
#
# It needs only the compiler and the build tools: clang++ with libFuzzer
# (Debian: clang, libclang-rt-14-dev), cmake and ninja. It installs nothing
# (scripts/setup.sh does, Python packages included; run it first on a bare
# machine) and says what is missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-300}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: seconds must be a number, not '$seconds'" >&2; exit 2; }
for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null ||
    { echo "fuzz.sh: $tool is needed (Debian: clang, libclang-rt-14-dev, cmake, ninja-build)" >&2; exit 1; }
done
# libFuzzer's runtime comes apart from clang (libclang-rt-14-dev on Debian).
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  >"$probe/probe.cpp"
clang++ -fsanitize=fuzzer "$probe/probe.cpp" -o "$probe/probe" 2>"$probe/log" ||
  { echo "fuzz.sh: clang++ cannot link libFuzzer (Debian: libclang-rt-14-dev):" >&2; cat "$probe/log" >&2; exit 1; }

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
