#!/usr/bin/env bash
# Builds libpqcache (scripts/build.sh, Release, into build/) and runs the
# decode-loop demo: a synthetic 4-layer GQA model, an 8192-token prompt,
# 32 decode steps, PQ selection compared with the exact (oracle) selection.
#
#   scripts/demo.sh [demo options, e.g. --small]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PQ_BUILD_DIR:-build}
"$root/scripts/build.sh" "$build_dir"
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"

echo
exec "$build_dir/examples/decode_loop" "$@"
