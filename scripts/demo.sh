#!/usr/bin/env bash
# Builds libpqcache (scripts/build.sh, Release, into build/) and runs two
# demos:
#  1. the C decode loop (examples/decode_loop.c): a synthetic 4-layer GQA
#     model, an 8192-token prompt, 32 decode steps, PQ selection compared with
#     the exact (oracle) selection, with timings;
#  2. every selector replayed over the committed real attention trace
#     (SmolLM2-135M over a 1964 State of the Union address, 3 layers, 64
#     decode steps): recall, attention-mass recall and output error at 1/5 and
#     1/10 of the middle tokens (tools/pqeval/replay.py through the library).
#
#   scripts/demo.sh [decode_loop options, e.g. --small]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PQ_BUILD_DIR:-build}
"$root/scripts/build.sh" "$build_dir"
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"

echo
"$build_dir/examples/decode_loop" "$@"

echo
echo "Selectors on real attention (the committed trace, first 64 decode steps):"
# In the project's venv, with the binding the build staged in $build_dir/python.
PQ_BUILD_DIR=$build_dir "$root/scripts/run-python" -m pqeval.replay \
  "$root/tests/data/smollm2_sotu_2k.pqtrace" --steps 64 \
  --selectors exact,pq,sparq,infllm,quest,h2o,snapkv,pyramidkv,scope,scissorhands,keyformer,clusterkv,adakv,zigzagkv,pyramidinfer,fastgen,window,random
