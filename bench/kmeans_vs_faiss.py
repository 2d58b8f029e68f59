#!/usr/bin/env python3
"""The PQ index build of libpqcache against faiss on the same keys.

For each key set and iteration count, both train a product quantizer with
m subspaces of 2^b centroids per kv head and encode every key:
  - libpqcache: pq_prefill_layer + pq_wait_builds with kmeans_iterations = I,
    kmeans_tolerance 0 (exactly I iterations); the build time is the one the
    layer reports (pq_layer_info.build_seconds: K-Means and encoding);
  - faiss: faiss.ProductQuantizer(d, m, b) with cp.niter = I, train + compute
    codes, per kv head, timed around those calls.
Both sample at most 256 points per centroid for training (the defaults of
both) and run on the same number of threads (OMP_NUM_THREADS = the
library's worker_threads). The runs alternate, libpqcache first on even
repetitions; the table gives medians and the ratio. The reconstruction
error is mean ||k - decode(code(k))||^2 / mean ||k||^2 over every key.

Key sets: the real keys of the committed SmolLM2 trace (tests/data; 2,048
tokens x 3 kv heads x 64 dims, 5 layers) and clustered synthetic keys of a
Llama-3-8B-like layer (8 kv heads x 128 dims) at 32K and 128K tokens.

    PYTHONPATH=build/python OMP_WAIT_POLICY=PASSIVE python3 bench/kmeans_vs_faiss.py 2>/dev/null

(faiss warns on stderr when a trace layer has fewer than 39 points per
centroid; the library samples the same way, so the warning says nothing
about the comparison.)
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root / "tools"))

import faiss  # noqa: E402
import pqcache  # noqa: E402
from pqeval import trace as pqtrace  # noqa: E402


def relative_error(keys, recon):
    return float(((keys - recon) ** 2).sum() / (keys ** 2).sum())


def run_pqcache(keys, m, bits, iterations, threads):
    """keys: [tokens][kv_heads][dim] float32. Returns (seconds, error)."""
    tokens, kv_heads, dim = keys.shape
    with pqcache.Context(1, kv_heads, kv_heads, dim, dtype="f32", pq_subspaces=m,
                         pq_bits=bits, kmeans_iterations=iterations, kmeans_tolerance=0.0,
                         worker_threads=threads) as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, keys)
        ctx.wait_builds()
        seconds = ctx.layer_info(1, 0)["build_seconds"]
        recon = np.empty_like(keys)
        sub = dim // m
        for h in range(kv_heads):
            cents = ctx.centroids(1, 0, h).reshape(m, 2 ** bits, sub)
            codes = ctx.codes(1, 0, h, 0, tokens).reshape(tokens, m)
            for j in range(m):
                recon[:, h, j * sub:(j + 1) * sub] = cents[j][codes[:, j]]
    return seconds, relative_error(keys, recon)


def run_faiss(keys, m, bits, iterations):
    tokens, kv_heads, dim = keys.shape
    recon = np.empty_like(keys)
    seconds = 0.0
    for h in range(kv_heads):
        x = np.ascontiguousarray(keys[:, h, :])
        pq = faiss.ProductQuantizer(dim, m, bits)
        pq.cp.niter = iterations
        start = time.perf_counter()
        pq.train(x)
        codes = pq.compute_codes(x)
        seconds += time.perf_counter() - start
        recon[:, h, :] = pq.decode(codes)
    return seconds, relative_error(keys, recon)


def synthetic(tokens, kv_heads=8, dim=128, clusters=64, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((kv_heads, clusters, dim)).astype(np.float32)
    pick = rng.integers(0, clusters, size=(tokens, kv_heads))
    keys = centres[np.arange(kv_heads)[None, :], pick] + 0.35 * rng.standard_normal(
        (tokens, kv_heads, dim)).astype(np.float32)
    return keys.astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--iterations", default="10,25")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sets", default="",
                        help="only the key sets whose name contains this text (e.g. clustered)")
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    print(f"libpqcache {pqcache.version()}, faiss {faiss.__version__}, {args.threads} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
          f"load average {os.getloadavg()[0]:.2f}")
    real = pqtrace.read(root / "tests/data/smollm2_sotu_2k.pqtrace")
    sets = [(f"SmolLM2 trace layer {layer}, 2K x 3 x 64",
             np.ascontiguousarray(real.keys[layer], dtype=np.float32))
            for layer in real.layers]
    sets += [("clustered 32K x 8 x 128", synthetic(32768)),
             ("clustered 128K x 8 x 128", synthetic(131072))]
    sets = [(name, keys) for name, keys in sets if args.sets in name]
    print()
    print("| keys | m x b | iterations | libpqcache s | faiss s | faiss / libpqcache | "
          "error libpqcache | error faiss | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, keys in sets:
        for m, bits in ((2, 6), (2, 8)):
            if keys.shape[0] < 256 * 2 ** bits // 8:
                continue
            for iterations in (int(i) for i in args.iterations.split(",")):
                ours, theirs, ours_err, theirs_err = [], [], 0.0, 0.0
                for rep in range(args.reps):
                    order = (0, 1) if rep % 2 == 0 else (1, 0)
                    for which in order:
                        if which == 0:
                            s, ours_err = run_pqcache(keys, m, bits, iterations, args.threads)
                            ours.append(s)
                        else:
                            s, theirs_err = run_faiss(keys, m, bits, iterations)
                            theirs.append(s)
                a, b = statistics.median(ours), statistics.median(theirs)
                print(f"| {name} | {m}x{bits} | {iterations} | {a:.3f} | {b:.3f} | {b / a:.2f}x "
                      f"| {ours_err:.4f} | {theirs_err:.4f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
