"""Index build time against prompt length, with what the machine's memory
was doing: one layer of Llama-3-8B geometry (8 kv heads, head_dim 128, f16,
the default PQ setting), random keys, prefilled in one pq_prefill_layer call
and built on the context's worker threads. Per length it prints the
prefill call (the copy into the store), the build (pq wait), the build's
time per million tokens, the process's major and minor page faults during
both, the memory the kernel had available before and after, and the load.

It answers issue 43's question about 1M tokens (17.7 s against 1.9 s at
512K, measured from outside under memory pressure): the build trains
K-Means on at most max_points_per_centroid x 2^b rows per head (a fixed
cost) and codes every token (linear), so on a machine with memory to spare
the time per million tokens should not grow with the length.

    scripts/run-python bench/prefill_scaling.py [--tokens 131072 524288 1048576]
        [--rounds 3] [--threads 2]
"""

import argparse
import os
import resource
import statistics
import sys
import time

import numpy as np

from machine import cpu_model

KV, Q, DIM = 8, 32, 128


def mem_available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")




def random_f16(rng, n: int) -> np.ndarray:
    """[n][KV][DIM] float16 normal values, generated in slices so that no
    float32 copy of the whole tensor exists (it would be 2x the memory)."""
    out = np.empty((n, KV, DIM), np.float16)
    step = 65536
    for s in range(0, n, step):
        e = min(n, s + step)
        out[s:e] = rng.standard_normal((e - s, KV, DIM), dtype=np.float32)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[131072, 524288, 1048576])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    import pqcache

    print(f"prefill_scaling: libpqcache {pqcache.version()}, kernels {pqcache.cpu_level()}, "
          f"{cpu_model()}, {os.cpu_count()} cpus, {args.threads} worker threads, "
          f"MemAvailable {mem_available_gib():.1f} GiB, load {os.getloadavg()[0]:.2f}", flush=True)
    print("| tokens | K+V GiB | prefill s | build s | build s per 1M tokens | major faults | "
          "minor faults | MemAvailable before / after GiB | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.tokens:
        rng = np.random.default_rng(n)
        keys = random_f16(rng, n)
        values = random_f16(rng, n)
        copy_s, build_s, majors, minors = [], [], [], []
        before = after = 0.0
        for _ in range(args.rounds):
            ctx = pqcache.Context(1, Q, KV, DIM, "f16", worker_threads=args.threads)
            ctx.add_sequence(0)
            before = mem_available_gib()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            ctx.prefill(0, 0, keys, values)
            t1 = time.perf_counter()
            ctx.wait_builds()
            t2 = time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            after = mem_available_gib()
            copy_s.append(t1 - t0)
            build_s.append(t2 - t1)
            majors.append(r1.ru_majflt - r0.ru_majflt)
            minors.append(r1.ru_minflt - r0.ru_minflt)
            ctx.close()
        gib = 2 * keys.nbytes / 2**30
        b = statistics.median(build_s)
        print(f"| {n:,} | {gib:.2f} | {statistics.median(copy_s):.2f} | {b:.2f} | "
              f"{b / (n / 2**20):.2f} | {statistics.median(majors):.0f} | "
              f"{statistics.median(minors):.0f} | {before:.1f} / {after:.1f} | "
              f"{os.getloadavg()[0]:.2f} |", flush=True)
        del keys, values
    return 0


if __name__ == "__main__":
    sys.exit(main())
