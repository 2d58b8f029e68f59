#!/usr/bin/env bash
# The quality evaluation (docs/quality.md): installs what is missing (torch,
# transformers, accelerate), builds, downloads SmolLM2-135M and Gemma-3-270M when
# they are not cached, then runs tools/pqeval/evaluate.py: long-context tasks
# and perplexity through the transformers integration, long attention traces
# and their replay, and the committed trace; it writes docs/quality.md and
# its plots from the measurements in docs/quality-data/.
#
#   scripts/evaluate.sh                  everything still missing, then the report
#   scripts/evaluate.sh --report-only    the report from the recorded measurements
#   scripts/evaluate.sh --quick          the committed trace only (about a minute)
#   scripts/evaluate.sh --parts traces --models gemma3-270m
#                                        only what is missing of those parts and models
#
# A full run from nothing takes about 13 hours on 2 cores (docs/quality.md
# estimates it from the recorded rates); it resumes where it stopped, because
# each measurement is appended to docs/quality-data/ as it finishes.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PQ_BUILD_DIR:-build}
"$root/scripts/setup.sh" --eval
"$root/scripts/build.sh" "$build_dir"
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"
case " $* " in
  *" --quick "*|*" --report-only "*) ;;
  *) "$root/scripts/fetch-model.sh" smollm2 >/dev/null
     "$root/scripts/fetch-model.sh" gemma3-270m >/dev/null ;;
esac

cd "$root/tools"
# In the project's venv, with the binding the build staged in $build_dir/python.
# OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads must not spin against the
# library's worker threads on a small machine. On a terminal the evaluation
# draws a progress bar over its planned runs (count, rate, time left); into a
# log file or a pipe it does not, and neither do the model downloads' bars.
[[ -t 2 ]] || export TQDM_DISABLE=1
OMP_WAIT_POLICY=PASSIVE PQ_BUILD_DIR=$build_dir \
  "$root/scripts/run-python" -u -m pqeval.evaluate "$@"
