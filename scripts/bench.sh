#!/usr/bin/env bash
# Builds libpqcache (Release) and runs bench/bench_pqcache (Google Benchmark),
# then prints a markdown summary: per context length, the PQ decode step
# (pq_decode_select + pq_fetch_kv) against the exact-scan baseline, and the
# prefill + index build time (fixed K-Means budget of 10 iterations), and the
# 8-layer prefill with each layer's build overlapped with the (simulated)
# compute of the next layers against waiting for each build.
#
#   scripts/bench.sh [build-dir] [-- extra Google Benchmark flags]
#
# The raw results are kept in <build-dir>/bench_pqcache.json.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=build
if [[ $# -gt 0 && $1 != -- ]]; then build_dir=$1; shift; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; fi

"$root/scripts/build.sh" "$build_dir"
[[ $build_dir = /* ]] || build_dir="$root/$build_dir"
bin="$build_dir/bench/bench_pqcache"
json="$build_dir/bench_pqcache.json"
if [[ ! -x $bin ]]; then
  echo "bench: $bin was not built (PQ_BUILD_BENCHMARKS=OFF?)" >&2
  exit 1
fi

echo "bench: running $bin (about 2-4 minutes on 2 cores)"
"$bin" --benchmark_out="$json" --benchmark_out_format=json "$@"

"$("$root/scripts/python-env.sh" --python)" - "$json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
ctx = data.get("context", {})
rows = {}
for b in data["benchmarks"]:
    if b.get("run_type", "iteration") != "iteration":
        continue
    name, _, arg = b["name"].partition("/")
    arg = arg.split("/")[0]
    if not arg.isdigit():
        continue
    unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
    rows.setdefault(int(arg), {})[name] = (b["real_time"] * unit, b)

def us(r, key):
    v = r.get(key)
    return v[0] if v else None

def fmt_ms(v):
    return "n/a" if v is None else f"{v / 1e3:.2f}"

def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.1f}x"

print()
print(f"CPU: {ctx.get('num_cpus', '?')} cores @ {ctx.get('mhz_per_cpu', '?')} MHz; "
      f"libpqcache {ctx.get('pqcache_version', '?')}; {ctx.get('geometry', '')}; "
      f"{ctx.get('pq', '')}; K-Means iterations {ctx.get('kmeans_iterations', '?')}")
print()
print("| context | PQ select (ms) | exact scan (ms) | scan / PQ select "
      "| PQ select+fetch (ms) | scan / PQ step | GQA max step (ms) | EXACT step (ms) "
      "| prefill+build (ms) | K-Means its |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted(rows):
    r = rows[n]
    sel, sf = us(r, "pq_select"), us(r, "pq_select_fetch")
    scan, exact = us(r, "exact_scan_baseline"), us(r, "exact_select_fetch")
    sfmax = us(r, "pq_select_fetch_gqa_max")
    build = us(r, "prefill_build")
    its = r.get("prefill_build", (None, {}))[1].get("kmeans_iterations")
    label = f"{n // 1024}K" if n % 1024 == 0 else str(n)
    print(f"| {label} | {fmt_ms(sel)} | {fmt_ms(scan)} | {ratio(scan, sel)} | {fmt_ms(sf)} "
          f"| {ratio(scan, sf)} | {fmt_ms(sfmax)} | {fmt_ms(exact)} | {fmt_ms(build)} "
          f"| {'n/a' if its is None else int(its)} |")
print()
print("Times are wall-clock per call for one layer (32 q heads, 8 kv heads). "
      "'exact scan' = q.k over all f16 keys + nth_element top-k per kv head, "
      "outside the library (no fetch; max over each GQA group); PQ columns use the default "
      "GQA combination (sum of per-head softmax) unless marked 'GQA max'; "
      "'EXACT' = the library's oracle selector; "
      "prefill+build = pq_prefill_layer + pq_wait_builds with 10 K-Means iterations.")

overlap = [(n, r["prefill_overlap"]) for n, r in sorted(rows.items()) if "prefill_overlap" in r]
if overlap:
    print()
    print("| context | 8 layers sequential (ms) | 8 layers overlapped (ms) | speedup "
          "| compute / layer (ms) | pq_prefill_layer / layer (ms) | build / layer (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, (t, b) in overlap:
        label = f"{n // 1024}K" if n % 1024 == 0 else str(n)
        print(f"| {label} | {b['sequential_ms']:.0f} | {t / 1e3:.0f} | {b['overlap_speedup']:.2f}x "
              f"| {b['compute_ms']:.1f} | {b['prefill_ms']:.1f} | {b['build_ms']:.0f} |")
    print()
    print("Prefill of 8 layers: each layer sleeps for the caller's compute (an 8B model's layer "
          "on an H100, see bench_pqcache.cpp), then pq_prefill_layer; 'sequential' waits for "
          "each layer's build, 'overlapped' once at the end.")
PY
