#!/bin/sh
# select_ab.sh BASE [ROUNDS] [TOKENS] [COLD_MIB] [APPEND]: the select of this
# tree's library against BASE's (a commit), same program, same data,
# alternately; with COLD_MIB, each select after a read of that many MiB
# (bench_select_one --cold); with APPEND 1, each select after the append of
# a new token, both timed (bench_select_one --append).
#
# Builds BASE's libpqcache.so in a git worktree (build-ab/, reused on the next
# run), then runs this tree's build/bench/bench_select_one ROUNDS times
# against each library, alternating (BASE first in each round), each run a
# process of its own that builds its context and times 200 selects. Prints
# every run, then the medians of the runs' medians and their ratio, and
# whether the two libraries selected the same positions. Run it on a quiet
# machine: every run prints the load.
#
#   bench/select_ab.sh 3552c0e 5 131072
set -eu
base=${1:?usage: bench/select_ab.sh BASE [ROUNDS] [TOKENS] [COLD_MIB] [APPEND]}
rounds=${2:-5}
tokens=${3:-131072}
cold=${4:-0}
append=${5:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
program="$root/build/bench/bench_select_one"
[ -x "$program" ] || { echo "select_ab: build $program first (cmake --build build)" >&2; exit 2; }
# BASE as this repository names it (the worktree's own HEAD is another commit).
base=$(git -C "$root" rev-parse --verify "$base^{commit}")
tree="$root/build-ab/tree"
if [ ! -d "$tree" ]; then
  git -C "$root" worktree add --detach "$tree" "$base" >/dev/null
else
  git -C "$tree" checkout --quiet --detach "$base"
fi
cmake -S "$tree" -B "$root/build-ab/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build-ab/build" --target pqcache >/dev/null
echo "select_ab: base $(git -C "$tree" rev-parse --short HEAD), this tree $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo ' (with changes)'), $rounds rounds, $tokens tokens, cold $cold MiB, append $append"
log=$(mktemp)
for r in $(seq "$rounds"); do
  for side in base this; do
    if [ "$side" = base ]; then lib="$root/build-ab/build"; else lib="$root/build"; fi
    line=$(LD_LIBRARY_PATH="$lib" "$program" --tokens "$tokens" --steps 200 --cold "$cold" --append "$append")
    echo "$side $line" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import re, statistics, sys
runs = {"base": [], "this": []}
hashes = {"base": set(), "this": set()}
for line in open(sys.argv[1]):
    side = line.split()[0]
    runs[side].append(float(re.search(r"median_ms ([0-9.]+)", line).group(1)))
    hashes[side].add(re.search(r"selection_hash ([0-9a-f]+)", line).group(1))
b, t = statistics.median(runs["base"]), statistics.median(runs["this"])
print(f"select_ab: median of medians: base {b:.3f} ms, this {t:.3f} ms, base/this {b / t:.2f}; "
      f"same positions: {'yes' if hashes['base'] == hashes['this'] else 'NO'}")
PY
rm -f "$log"
