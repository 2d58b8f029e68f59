#!/usr/bin/env bash
# The quality evaluation (issue: quality on a real model): installs what is
# missing, builds, downloads SmolLM2-135M if it is not cached, captures a
# trace over real text, replays every selector, runs the perplexity and
# needle tests with selective attention in every layer, and writes
# docs/quality.md and its plot.
#
#   scripts/evaluate.sh [pqeval.evaluate options, e.g. --quick, --continuation 128]
#
# The full run takes tens of minutes on 2 cores (numpy model on one thread).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PQ_BUILD_DIR:-build}
"$root/scripts/build.sh" "$build_dir"
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"
"$root/scripts/fetch-model.sh"

cd "$root/tools"
# The build stages the Python binding (package pqcache) in $build_dir/python.
PYTHONPATH="$root/tools:$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -m pqeval.evaluate --out "$root/docs" "$@"
