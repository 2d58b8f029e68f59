#!/usr/bin/env python3
"""Plots bench_floor's JSON output (docs/perf-floor.png).

    build/bench/bench_floor --benchmark_out=floor.json --benchmark_out_format=json
    python3 bench/plot_floor.py floor.json [more.json ...] docs/perf-floor.png

Left: pq_decode_select's median time per context length against the
memory floor (the middle's code bytes / the measured read bandwidth).
Right: one decode step through select + pq_decode_attend against dense
attention over every token (the same kernel, and BLAS) and against select +
fetch (gather copy) + attention.
"""
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(paths):
    """Benchmark rows by name and arguments, from one or more JSON files; with
    repetitions, each counter is the median over them."""
    runs = defaultdict(lambda: defaultdict(list))
    context = {}
    for path in paths:
        data = json.load(open(path))
        context = context or data["context"]
        for b in data["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            parts = b["name"].split("/")
            runs[parts[0]][tuple(int(p) for p in parts[1:] if p.isdigit())].append(b)
    out = defaultdict(dict)
    for name, by_args in runs.items():
        for args, reps in by_args.items():
            out[name][args] = {k: statistics.median(r[k] for r in reps)
                               for k in reps[0] if isinstance(reps[0][k], (int, float))}
    return context, out


def main():
    *srcs, dst = sys.argv[1:]
    context, r = rows(srcs)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m, label, color in ((2, "2x6", "tab:blue"), (4, "4x4", "tab:green")):
        pts = sorted((k[0], v) for k, v in r["select"].items() if k[1] == m)
        if not pts:
            continue
        n = [p[0] for p in pts]
        a.plot(n, [p[1]["median_us"] / 1e3 for p in pts], "o-", color=color,
               label=f"pq_decode_select {label}")
        a.plot(n, [p[1]["floor_us"] / 1e3 for p in pts], "--", color=color,
               label=f"floor {label} (code bytes / read bw)")
    a.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="ms per layer",
          title="selection against the memory floor")
    a.legend(fontsize=8)
    pts = sorted((k[0], v) for k, v in r["attend"].items())
    n = [p[0] for p in pts]
    b.plot(n, [p[1]["median_ms"] for p in pts], "o-", label="select + pq_decode_attend (1/5)")
    b.plot(n, [p[1]["gather_ms"] for p in pts], "s-", label="select + fetch + the same kernel (threaded)")
    b.plot(n, [p[1]["dense_ms"] for p in pts], "^-", label="dense: pq_decode_attend over every token")
    blas = [(p[0], p[1]["blas_ms"]) for p in pts if "blas_ms" in p[1]]
    if blas:
        b.plot(*zip(*blas), "v-", label="dense, BLAS sgemm (f32)")
    b.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="ms per layer",
          title="one decode step, 32 q / 8 kv heads, f16")
    b.legend(fontsize=8)
    load = context.get("load_avg", [])
    fig.suptitle(f"bench_floor, {context.get('date', '')[:10]}, {context.get('num_cpus')} CPUs"
                 + (f", load {load[0]:.1f}" if load else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
