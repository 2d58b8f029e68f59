"""What finding the outliers (pq_outliers, issue 44) adds to an index build:
one layer of Llama-3-8B geometry (8 kv heads, head_dim 128, f16, the default
PQ setting), random keys, one pq_prefill_layer + pq_wait_builds, with
pq_outliers = SHARE and without, alternated round by round in one process.
The build then reads every key once more for its quantization residual (the
encode computed each subspace's distance and dropped it): this measures
whether that second read is worth removing. Prints the medians and the
same-round ratio (with / without).

    scripts/run-python bench/build_outliers.py [--tokens 131072] [--rounds 5]
        [--share 0.01] [--threads 2]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

from machine import cpu_model

KV, Q, DIM = 8, 32, 128


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    import pqcache

    rng = np.random.default_rng(1)
    keys = rng.standard_normal((args.tokens, KV, DIM), dtype=np.float32).astype(np.float16)
    values = rng.standard_normal((args.tokens, KV, DIM), dtype=np.float32).astype(np.float16)
    print(f"build_outliers: {cpu_model()}, {os.cpu_count()} cpus, {args.threads} threads, "
          f"libpqcache {pqcache.version()}, kernel level {pqcache.cpu_level()}, "
          f"{args.tokens} tokens, load {os.getloadavg()[0]:.2f}", flush=True)
    seconds = {0.0: [], args.share: []}
    for _ in range(args.rounds):
        for share in seconds:
            with pqcache.Context(1, Q, KV, DIM, "f16", topk_fraction=0.2,
                                 worker_threads=args.threads, pq_outliers=share) as ctx:
                ctx.add_sequence(0)
                start = time.perf_counter()
                ctx.prefill(0, 0, keys, values)
                ctx.wait_builds()
                seconds[share].append(time.perf_counter() - start)
    ratio = statistics.median(b / a for a, b in zip(seconds[0.0], seconds[args.share]))
    print(f"prefill + build s, median of {args.rounds}: without {statistics.median(seconds[0.0]):.3f}, "
          f"pq_outliers {args.share:g} {statistics.median(seconds[args.share]):.3f}; "
          f"with / without {ratio:.3f} (same round); load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
