#!/usr/bin/env python3
"""What an attend on AVX512_FP16 arithmetic (VFMADDPH: products and sums
rounded to binary16) would move pq_decode_attend's result by, against the
float attend it has (docs/perf.md, "AMX-BF16 and AVX512_FP16 in the
attend"). numpy rounds every step to float16 as the instructions would.

    scripts/run-python bench/fp16_sum_error.py [--rows 4096] [--seed 1]

The data have the bench workload's shape: head_dim 128, clustered f16 keys
(64 centres, noise 0.35), Gaussian f16 values, a query aimed at a centre
(as bench/bench_data.h builds them), scale 1/sqrt(128). The logits are
summed as the AVX-512 kernel would on binary16 lanes: 32 lanes of
head_dim / 32 products each, then the lanes halved in binary16; the value
sums in binary16 over each 32-row block, the blocks added in float.
Printed: the largest logit error, and the output's largest error over its
largest element, for float (the kernel today), binary16 logits, and
binary16 logits and value sums; the kernel tests hold the attend to 1e-5.
"""
import argparse

import numpy as np

HEAD_DIM, BLOCK = 128, 32


def fp16_dot(keys, query):
    """Each key row . query with binary16 products and sums, per lane."""
    q = query.astype(np.float16)
    lanes = np.zeros((keys.shape[0], 32), np.float16)
    for j in range(HEAD_DIM // 32):  # one fused multiply-add a lane: one rounding
        part = keys[:, 32 * j:32 * j + 32].astype(np.float32) * q[32 * j:32 * j + 32].astype(np.float32)
        lanes = (lanes.astype(np.float32) + part).astype(np.float16)
    while lanes.shape[1] > 1:
        half = lanes.shape[1] // 2
        lanes = (lanes[:, :half].astype(np.float32) + lanes[:, half:].astype(np.float32)).astype(np.float16)
    return lanes[:, 0].astype(np.float64)


def attend(logits, values, fp16_sums):
    w = np.exp(logits - logits.max())
    w /= w.sum()
    if not fp16_sums:
        return w @ values.astype(np.float64)
    out = np.zeros(HEAD_DIM)
    for b in range(0, len(w), BLOCK):
        acc = np.zeros(HEAD_DIM, np.float16)
        for i in range(b, min(len(w), b + BLOCK)):
            acc = (acc.astype(np.float32) + np.float32(np.float16(w[i])) * values[i].astype(np.float32)).astype(np.float16)
        out += acc
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((64, HEAD_DIM)).astype(np.float32)
    keys = (centres[rng.integers(0, 64, args.rows)]
            + 0.35 * rng.standard_normal((args.rows, HEAD_DIM))).astype(np.float16)
    values = rng.standard_normal((args.rows, HEAD_DIM)).astype(np.float16)
    query = (1.5 * centres[3] + 0.5 * rng.standard_normal(HEAD_DIM)).astype(np.float32)
    scale = 1 / np.sqrt(HEAD_DIM)
    exact = keys.astype(np.float64) @ query.astype(np.float64) * scale
    as_float = ((keys.astype(np.float32) @ query) * np.float32(scale)).astype(np.float64)
    as_fp16 = fp16_dot(keys, query) * scale
    ref = attend(exact, values, False)
    peak = np.abs(ref).max()
    print(f"{args.rows} rows, head_dim {HEAD_DIM}, largest |logit| {np.abs(exact).max():.1f}")
    print(f"logit error: float {np.abs(as_float - exact).max():.1e}, "
          f"binary16 {np.abs(as_fp16 - exact).max():.1e}")
    for name, logits, sums in (("float", as_float, False), ("binary16 logits", as_fp16, False),
                               ("binary16 logits and value sums", as_fp16, True)):
        err = np.abs(attend(logits, values, sums) - ref).max() / peak
        print(f"output error / largest output, {name}: {err:.1e} (kernel tests: 1e-5)")


if __name__ == "__main__":
    main()
