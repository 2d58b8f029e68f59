"""The GPU decode step of libpqcache against what a PyTorch engine would do
instead, in one process on one GPU, interleaved round by round (medians):

  lib         select_device + fetch_device through the Python binding: the
              step kept on the device (LUT from the device query, scan,
              top-k, gather reading the pinned host store), one sync;
  memcpy      one pinned cudaMemcpyAsync of the bytes the step moves (the
              selected K and V rows): the PCIe floor;
  pqcache_ref the official PQCache operations in PyTorch: LUT einsum, code
              gather and sum, softmax, GQA sum, topk; then the selected rows
              gathered on the CPU by index_select into pinned memory and sent
              up in one copy;
  sdpa        dense attention with every K/V resident on the GPU
              (scaled_dot_product_attention, enable_gqa): the latency floor
              when the KV fits.

Geometry: one layer, 32 q / 8 kv heads, head_dim 128, f16, PQ m=2 b=6, 4
sink and 128 local tokens; top-k 1/5 of the middle, or a fixed 2,048 per kv
head (--budget 2048). Batches (--batch 8 32): the batched host-positions
calls against as many per-sequence calls, on forks of one prompt.

    python bench/gpu_step_vs_torch.py [--tokens 8192 32768 131072 1048576]
        [--budget fraction 2048] [--batch 8 32] [--rounds 20] [--json OUT]

Needs torch with CUDA and the Python binding built with the CUDA plug-in
(PYTHONPATH=<build>/python, PQCACHE_CUDA_PLUGIN=<build>/libpqcache_cuda.so).
Without a GPU it prints why and exits 0: nothing to measure.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

KV, Q, DIM, M, BITS, SINK, LOCAL = 8, 32, 128, 2, 6, 4, 128


def timed(fn, sync):
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768, 131072, 1 << 20])
    ap.add_argument("--budget", nargs="+", default=["fraction", "2048"])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"gpu_step_vs_torch: SKIPPED: torch is not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("gpu_step_vs_torch: SKIPPED: torch sees no CUDA device")
        return 0
    import pqcache

    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    print(f"gpu_step_vs_torch: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"libpqcache {pqcache.version()}, load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for n in args.tokens:
        rng = np.random.default_rng(n)
        keys = rng.standard_normal((n, KV, DIM), dtype=np.float32).astype(np.float16)
        values = rng.standard_normal((n, KV, DIM), dtype=np.float32).astype(np.float16)
        for budget in args.budget:
            options = dict(backend="cuda", pq_subspaces=M, pq_bits=BITS, sink_tokens=SINK,
                           local_tokens=LOCAL, kmeans_iterations=4)
            if budget == "fraction":
                options["topk_fraction"] = 0.2
            else:
                options["topk_tokens"] = int(budget)
            ctx = pqcache.Context(1, Q, KV, DIM, "f16", **options)
            ctx.add_sequence(0)
            ctx.prefill(0, 0, keys, values)
            ctx.wait_builds()
            cap = ctx.capacity(0, 0)
            query = torch.randn(Q, DIM, device=dev, dtype=torch.float16)
            sel = pqcache.DeviceSelection(torch.empty(KV, cap, device=dev, dtype=torch.int32),
                                          torch.empty(KV, device=dev, dtype=torch.int32))
            out_k = torch.empty(KV, cap, DIM, device=dev, dtype=torch.float16)
            out_v = torch.empty_like(out_k)

            def lib():
                ctx.select_device(0, 0, query, sel)
                ctx.fetch_device(0, 0, sel, out_k, out_v)

            k = cap - SINK - LOCAL
            moved = KV * cap * DIM * 2 * 2  # K and V rows, f16
            pinned = torch.empty(moved, dtype=torch.uint8).pin_memory()
            target = torch.empty(moved, dtype=torch.uint8, device=dev)

            def memcpy():
                target.copy_(pinned, non_blocking=True)

            # The official PQCache operations on the same geometry.
            cents = torch.randn(KV, M, 1 << BITS, DIM // M, device=dev, dtype=torch.float16)
            codes = torch.randint(0, 1 << BITS, (KV, n, M), device=dev, dtype=torch.int64)
            cpu_k = torch.from_numpy(keys).permute(1, 0, 2).contiguous().pin_memory()
            cpu_v = torch.from_numpy(values).permute(1, 0, 2).contiguous().pin_memory()
            staged = torch.empty(2, KV, k, DIM, dtype=torch.float16).pin_memory()

            def pqcache_ref():
                q = query.view(KV, Q // KV, M, DIM // M)
                lut = torch.einsum("hgmd,hmcd->hgmc", q, cents)  # [KV][G][M][C]
                idx = codes.unsqueeze(1).expand(KV, Q // KV, n, M)
                scores = torch.gather(lut.unsqueeze(2).expand(KV, Q // KV, n, M, 1 << BITS), 4,
                                      idx.unsqueeze(-1)).squeeze(-1).sum(-1)
                probs = torch.softmax(scores.float() / DIM ** 0.5, dim=-1).sum(1)
                top = torch.topk(probs[:, SINK:n - LOCAL], k, dim=-1).indices + SINK
                top_cpu = top.cpu()
                for h in range(KV):
                    torch.index_select(cpu_k[h], 0, top_cpu[h], out=staged[0, h])
                    torch.index_select(cpu_v[h], 0, top_cpu[h], out=staged[1, h])
                staged.to(dev, non_blocking=True)

            dense = None
            if KV * n * DIM * 2 * 2 < torch.cuda.mem_get_info()[0] // 2:
                gk = torch.from_numpy(keys).to(dev).permute(1, 0, 2).unsqueeze(0)
                gv = torch.from_numpy(values).to(dev).permute(1, 0, 2).unsqueeze(0)
                gq = query.view(1, Q, 1, DIM)

                def dense():
                    F.scaled_dot_product_attention(gq, gk, gv, enable_gqa=True)

            candidates = {"lib": lib, "memcpy": memcpy,
                          "pqcache_ref": pqcache_ref}
            if dense is not None:
                candidates["sdpa"] = dense
            for fn in candidates.values():  # warm-up: codes resident, kernels loaded
                fn()
            times = {name: [] for name in candidates}
            for _ in range(args.rounds):
                for name, fn in candidates.items():
                    times[name].append(timed(fn, sync))
            med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            row = {"tokens": n, "budget": budget, "selected_per_head": cap, "ms": med,
                   "lib_vs_memcpy": med["lib"] / med["memcpy"],
                   "pqcache_ref_vs_lib": med["pqcache_ref"] / med["lib"]}
            if "sdpa" in med:
                row["lib_vs_sdpa"] = med["lib"] / med["sdpa"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            ctx.close()
    for n in args.tokens[:2]:
        for batch in args.batch:
            rng = np.random.default_rng(7)
            keys = rng.standard_normal((n, KV, DIM), dtype=np.float32).astype(np.float16)
            ctx = pqcache.Context(1, Q, KV, DIM, "f16", backend="cuda", kmeans_iterations=4,
                                  pq_subspaces=M, pq_bits=BITS)
            ctx.add_sequence(0)
            ctx.prefill(0, 0, keys, keys)
            ctx.wait_builds()
            for s in range(1, batch):
                ctx.fork(0, s)
            qs = [rng.standard_normal((Q, DIM), dtype=np.float32).astype(np.float16)
                  for _ in range(batch)]
            seqs = list(range(batch))

            def batched():
                sels = ctx.select_batch(0, seqs, qs)
                ctx.fetch_batch(0, seqs, sels)

            def loop():
                for s in seqs:
                    ctx.fetch(s, 0, ctx.select(s, 0, qs[s]))  # (seq, layer, ...)

            batched(), loop()
            tb, tl = [], []
            for _ in range(args.rounds):
                tb.append(timed(batched, sync))
                tl.append(timed(loop, sync))
            row = {"tokens": n, "batch": batch, "batched_ms": statistics.median(tb) * 1e3,
                   "loop_ms": statistics.median(tl) * 1e3}
            row["loop_vs_batched"] = row["loop_ms"] / row["batched_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            ctx.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
