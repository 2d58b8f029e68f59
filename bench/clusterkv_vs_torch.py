#!/usr/bin/env python3
"""ClusterKV's clustering in libpqcache against the authors' torch code on
the same keys and CPU threads.

ClusterKV clusters each kv head's prompt keys at the first decode step
(cluster_count = 400 clusters, 20 rounds of cosine assignment and
mean-of-raw-keys centroids, then a last assignment). A server pays that once
per layer per sequence; the authors run it on the GPU, and a CPU user would
otherwise run their build_cluster (sjtu-zhao-lab/ClusterKV,
clusterkv/clusterkv_utils/__init__.py, cb66a22) with torch on the CPU:
  - libpqcache: pq_prefill_layer, then the first pq_decode_select of a layer
    (the clustering of every kv head on worker_threads, then one select);
  - torch: build_cluster's loop re-typed (the authors' update_centroids and
    count_labels are CUDA kernels: here index_add_ / bincount), with the
    library's initial centroids (evenly spaced ranks instead of
    torch.randint), torch.set_num_threads = worker_threads.
Both cluster the same keys of every kv head. Runs alternate which goes
first; the table gives medians over the repetitions, the median of the
per-repetition ratios, and the load average.

Keys: Gaussian with a few outlier channels (as real keys have), a
Llama-3-8B-like layer (8 kv heads x 128 dims) at 8K and 32K tokens.

    PYTHONPATH=build/python OMP_WAIT_POLICY=PASSIVE python3 bench/clusterkv_vs_torch.py
"""
import argparse
import os
import statistics
import time

import numpy as np
import pqcache
import torch

CLUSTERS, ROUNDS, SINKS, LOCAL = 400, 20, 4, 64


def make_keys(tokens, kv_heads, dim, seed):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((tokens, kv_heads, dim), dtype=np.float32)
    keys[:, :, rng.choice(dim, 4, replace=False)] *= 8.0   # outlier channels
    return keys


def run_pqcache(keys, threads):
    tokens, kv_heads, dim = keys.shape
    with pqcache.Context(1, kv_heads, kv_heads, dim, dtype="f32", selector="clusterkv",
                         cluster_count=CLUSTERS, sink_tokens=SINKS, local_tokens=LOCAL,
                         topk_tokens=tokens // 5, worker_threads=threads) as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, keys)
        ctx.wait_builds()
        query = np.ones((1, kv_heads, dim), dtype=np.float32)
        start = time.perf_counter()
        ctx.select(1, 0, query)
        return time.perf_counter() - start


def build_cluster_torch(keys):
    """The authors' build_cluster on [kv_heads, n, dim] keys, CPU tensors."""
    heads, n, dim = keys.shape
    init = torch.tensor([(2 * j + 1) * n // (2 * CLUSTERS) for j in range(CLUSTERS)])
    centroids = keys[:, init, :].clone()
    eps = 1e-8
    keys_normalized = keys / (torch.linalg.norm(keys, dim=-1, keepdim=True) + eps)
    for _ in range(ROUNDS):
        c_norm = centroids / (torch.linalg.norm(centroids, dim=-1, keepdim=True) + eps)
        labels = torch.matmul(keys_normalized, c_norm.transpose(1, 2)).argmax(dim=2)
        for h in range(heads):  # update_centroids: the mean of the raw keys; empty ones stay
            sums = torch.zeros((CLUSTERS, dim), dtype=keys.dtype).index_add_(0, labels[h], keys[h])
            size = torch.bincount(labels[h], minlength=CLUSTERS)
            full = size > 0
            centroids[h, full] = sums[full] / size[full, None].to(keys.dtype)
    c_norm = centroids / (torch.linalg.norm(centroids, dim=-1, keepdim=True) + eps)
    labels = torch.matmul(keys_normalized, c_norm.transpose(1, 2)).argmax(dim=2)
    sizes = torch.stack([torch.bincount(labels[h], minlength=CLUSTERS) for h in range(heads)])
    torch.cumsum(sizes, dim=-1)
    torch.sort(labels)
    return labels


def run_torch(keys):
    middle = torch.from_numpy(np.ascontiguousarray(
        keys[SINKS:keys.shape[0] - LOCAL].transpose(1, 0, 2)))
    start = time.perf_counter()
    build_cluster_torch(middle)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# ClusterKV first select (clustering) vs the authors' build_cluster in torch "
          f"{torch.__version__}; {args.kv_heads} kv heads x {args.dim} dims, {CLUSTERS} "
          f"clusters, {ROUNDS} rounds, {args.threads} threads, {args.repeats} repetitions; "
          f"load before {os.getloadavg()[0]:.2f}")
    print("| tokens | libpqcache (s) | torch (s) | libpqcache / torch |")
    print("|---:|---:|---:|---:|")
    for tokens in (int(t) for t in args.tokens.split(",")):
        keys = make_keys(tokens, args.kv_heads, args.dim, tokens)
        ours, theirs, ratios = [], [], []
        for r in range(args.repeats):
            if r % 2 == 0:
                a = run_pqcache(keys, args.threads)
                b = run_torch(keys)
            else:
                b = run_torch(keys)
                a = run_pqcache(keys, args.threads)
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
        print(f"| {tokens} | {statistics.median(ours):.2f} | {statistics.median(theirs):.2f} "
              f"| {statistics.median(ratios):.2f} |", flush=True)
    print(f"# load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
