"""The CPU decode step of libpqcache against what a PyTorch engine on the CPU
would run instead, in one process on the same cores, interleaved round by
round (medians and same-round ratios; only ratios travel between machines):

  lib            select + pq_decode_attend: the step, attention read from the
                 store (no gathered copy);
  lib_tail       the same in a context with tail_estimate="code_means" (issue
                 44: the middle tokens the selection leaves out estimated
                 from the index and merged in); lib_tail/lib is its cost
                 (issue 44's target: <= 1.3);
  lib_outliers   the same in a context with pq_outliers=0.01 (issue 44: the
                 1% of keys with the largest quantization residuals scored
                 exactly); lib_outliers/lib is its cost;
  lib_top_p      the same in a context with top_p=0.999 (0.15, issue 44's
                 top-p budgets): on these random keys every kv head reaches
                 its ceiling k, so the rows are lib's and lib_top_p/lib is
                 the cost of the mode's path (the fused scan where the tuple
                 path would pay, the mass sums and the sort of the k);
  lib_append     what an engine's step runs per layer: pq_decode_append of
                 the new token's K/V, then select + pq_decode_attend (a
                 context of its own, one token longer each round);
                 lib_append/lib is what coding the token that leaves the
                 local window adds to a step;
  select         pq_decode_select alone;
  attend         pq_decode_attend alone over a fixed selection;
  fetch          pq_fetch_kv alone of the same rows (the library's gather);
  fetch_sdpa     select + pq_fetch_kv + scaled_dot_product_attention over the
                 gathered rows, the queries viewed as [8 kv heads][4 q heads]
                 so each K/V row is read once ("grouped");
  fetch_sdpa_f32 the same with the gathered rows converted to float32 first
                 (torch's CPU SDPA is several times slower on float16 than on
                 float32 or bfloat16 where the CPU has no float16 arithmetic:
                 the baseline is the faster of the two);
  fetch_sdpa_gqa select + fetch + SDPA's enable_gqa over the 32 query heads;
  torch_gather   select + torch.index_select of the rows from a [kv][n][d]
                 tensor + grouped SDPA (the gather a PyTorch engine writes);
  sdpa_gathered  grouped SDPA alone over rows gathered beforehand;
  dense          grouped SDPA over every token (no selection at all);
  seq_read       a sequential read of 256 MiB (torch.sum of float32 on the
                 same threads): the memory bandwidth this process gets, for
                 attend's share of it. Each row also reports attend_GBps =
                 the K and V bytes of the selected rows / attend's median,
                 seq_read_GBps, and attend_share_of_seq_read = their ratio
                 (issue 43's target: >= 0.6).

Geometry: one layer of Llama-3-8B (32 q / 8 kv heads, head_dim 128, f16 or
--dtype bf16), PQ 4x8 (the defaults at head_dim 128), 4 sinks, 128 local
tokens, top 1/5 of the middle.

    scripts/run-python bench/cpu_step_vs_torch.py [--tokens 8192 32768 131072]
        [--dtype f16 bf16] [--rounds 15] [--threads 2] [--json OUT]

Needs torch (scripts/setup.sh --eval); without it prints SKIPPED and exits 0.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from machine import cpu_model

KV, Q, DIM, SINK, LOCAL = 8, 32, 128, 4, 128
G = Q // KV


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 as uint16 bits (round to nearest even)."""
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def as_torch(a: np.ndarray):
    import torch
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if a.dtype == np.uint16 else t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--dtype", nargs="+", default=["f16", "bf16"], choices=["f16", "bf16"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    args = ap.parse_args()
    # PyTorch's OpenMP threads otherwise spin for a while after each of its
    # calls, on the cores the library's next call runs on (the first call of
    # each round came right after torch's 256 MiB read and paid for it).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"cpu_step_vs_torch: SKIPPED: torch is not importable ({e})")
        return 0
    import pqcache

    torch.set_num_threads(args.threads)
    print(f"cpu_step_vs_torch: {cpu_model()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), libpqcache {pqcache.version()}, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.2f}, kernel level {pqcache.cpu_level()}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", flush=True)
    seq_buf = torch.ones(256 << 18, dtype=torch.float32)  # 256 MiB
    rows = []
    for dtype, n in [(d, n) for d in args.dtype for n in args.tokens]:
        rng = np.random.default_rng(n)
        as_dtype = to_bf16_bits if dtype == "bf16" else (lambda a: a.astype(np.float16))
        keys = as_dtype(rng.standard_normal((n, KV, DIM), dtype=np.float32))
        values = as_dtype(rng.standard_normal((n, KV, DIM), dtype=np.float32))
        ctx = pqcache.Context(1, Q, KV, DIM, dtype, sink_tokens=SINK, local_tokens=LOCAL,
                              topk_fraction=0.2, worker_threads=args.threads)
        tail_ctx = pqcache.Context(1, Q, KV, DIM, dtype, sink_tokens=SINK, local_tokens=LOCAL,
                                   topk_fraction=0.2, worker_threads=args.threads,
                                   tail_estimate="code_means")
        outlier_ctx = pqcache.Context(1, Q, KV, DIM, dtype, sink_tokens=SINK, local_tokens=LOCAL,
                                      topk_fraction=0.2, worker_threads=args.threads,
                                      pq_outliers=0.01)
        top_p_ctx = pqcache.Context(1, Q, KV, DIM, dtype, sink_tokens=SINK, local_tokens=LOCAL,
                                    topk_fraction=0.2, worker_threads=args.threads, top_p=0.999)
        append_ctx = pqcache.Context(1, Q, KV, DIM, dtype, sink_tokens=SINK, local_tokens=LOCAL,
                                     topk_fraction=0.2, worker_threads=args.threads)
        for c in (ctx, tail_ctx, outlier_ctx, top_p_ctx, append_ctx):
            c.add_sequence(0)
            c.prefill(0, 0, keys, values)
            c.wait_builds()
        query = as_dtype(rng.standard_normal((Q, DIM), dtype=np.float32))
        sel = ctx.select(0, 0, query)
        counts = sel.counts
        if len(set(counts.tolist())) != 1:
            raise SystemExit(f"expected equal counts per kv head, got {counts}")
        count = int(counts[0])
        gathered = ctx.fetch(0, 0, sel)
        tq = as_torch(query).view(1, KV, G, DIM)      # grouped: [1][kv][g][d]
        tq_gqa = as_torch(query).view(1, Q, 1, DIM)   # [1][q][1][d]
        tq_f32 = tq.float()
        tk = as_torch(np.ascontiguousarray(keys.transpose(1, 0, 2)))   # [kv][n][d]
        tv = as_torch(np.ascontiguousarray(values.transpose(1, 0, 2)))

        def select():
            ctx.select(0, 0, query, out=sel)

        def sdpa_rows(k, v, gqa=False, f32=False):
            kk = as_torch(k)[:, :count].unsqueeze(0)
            vv = as_torch(v)[:, :count].unsqueeze(0)
            if gqa:
                return F.scaled_dot_product_attention(tq_gqa, kk, vv, enable_gqa=True)
            if f32:
                return F.scaled_dot_product_attention(tq_f32, kk.float(), vv.float())
            return F.scaled_dot_product_attention(tq, kk, vv)

        def lib():
            select()
            ctx.attend(0, 0, query, sel)

        def attend():
            ctx.attend(0, 0, query, sel)

        tail_sel = tail_ctx.select(0, 0, query)

        def lib_tail():
            tail_ctx.select(0, 0, query, out=tail_sel)
            tail_ctx.attend(0, 0, query, tail_sel)

        outlier_sel = outlier_ctx.select(0, 0, query)

        def lib_outliers():
            outlier_ctx.select(0, 0, query, out=outlier_sel)
            outlier_ctx.attend(0, 0, query, outlier_sel)

        top_p_sel = top_p_ctx.select(0, 0, query)
        if top_p_sel.counts.tolist() != counts.tolist():
            raise SystemExit(f"top_p=0.999 kept {top_p_sel.counts} rows, not lib's {counts}")

        def lib_top_p():
            top_p_ctx.select(0, 0, query, out=top_p_sel)
            top_p_ctx.attend(0, 0, query, top_p_sel)

        # One new token per call (the warm-up call and each round); the
        # selection has room for the few rows they add.
        new_tokens = iter(as_dtype(rng.standard_normal((args.rounds + 1, 2, 1, KV, DIM),
                                                       dtype=np.float32)))
        append_sel = pqcache.SelectionResult(KV, count + 1024)

        def lib_append():
            k, v = next(new_tokens)
            append_ctx.append(0, 0, k, v)
            append_ctx.select(0, 0, query, out=append_sel)
            append_ctx.attend(0, 0, query, append_sel)

        def fetch():
            ctx.fetch(0, 0, sel, out=gathered)

        def fetch_sdpa():
            select()
            ctx.fetch(0, 0, sel, out=gathered)
            sdpa_rows(*gathered)

        def fetch_sdpa_f32():
            select()
            ctx.fetch(0, 0, sel, out=gathered)
            sdpa_rows(*gathered, f32=True)

        def fetch_sdpa_gqa():
            select()
            ctx.fetch(0, 0, sel, out=gathered)
            sdpa_rows(*gathered, gqa=True)

        def torch_gather():
            select()
            index = torch.from_numpy(sel.positions[:, :count].astype(np.int64))
            k = torch.stack([tk[h].index_select(0, index[h]) for h in range(KV)]).unsqueeze(0)
            v = torch.stack([tv[h].index_select(0, index[h]) for h in range(KV)]).unsqueeze(0)
            F.scaled_dot_product_attention(tq, k, v)

        def sdpa_gathered():
            sdpa_rows(*gathered)

        def dense():
            F.scaled_dot_product_attention(tq, tk.unsqueeze(0), tv.unsqueeze(0))

        def seq_read():
            seq_buf.sum()

        # The outputs agree (the library and SDPA over the same rows).
        out, _ = ctx.attend(0, 0, query, sel)
        ref = sdpa_rows(*gathered, f32=True).reshape(Q, DIM).numpy()
        err = float(np.abs(out - ref).max())
        candidates = {"lib": lib, "lib_append": lib_append, "lib_tail": lib_tail, "lib_outliers": lib_outliers, "lib_top_p": lib_top_p, "select": select, "attend": attend, "fetch": fetch, "fetch_sdpa": fetch_sdpa,
                      "fetch_sdpa_f32": fetch_sdpa_f32, "fetch_sdpa_gqa": fetch_sdpa_gqa, "torch_gather": torch_gather,
                      "sdpa_gathered": sdpa_gathered, "dense": dense, "seq_read": seq_read}
        for fn in candidates.values():
            fn()
        times = {name: [] for name in candidates}
        ratios = {"best_fetch_sdpa/lib": [], "attend/fetch": [], "torch_gather/lib": [],
                  "dense/lib": [], "dense/lib_append": [], "lib_append/lib": [], "lib_tail/lib": [], "lib_outliers/lib": [], "lib_top_p/lib": []}
        for _ in range(args.rounds):
            this = {}
            for name, fn in candidates.items():
                start = time.perf_counter()
                fn()
                this[name] = time.perf_counter() - start
                times[name].append(this[name])
            this["best_fetch_sdpa"] = min(this["fetch_sdpa"], this["fetch_sdpa_f32"])
            for key in ratios:
                a, b = key.split("/")
                ratios[key].append(this[a] / this[b])
        attend_bytes = count * KV * 2 * DIM * 2  # K and V rows of 2-byte elements
        attend_gbps = attend_bytes / statistics.median(times["attend"]) / 1e9
        seq_gbps = seq_buf.numel() * 4 / statistics.median(times["seq_read"]) / 1e9
        row = {"dtype": dtype, "tokens": n, "rows_per_kv_head": count, "load": round(os.getloadavg()[0], 2),
               "max_abs_diff_vs_sdpa": err, "attend_GBps": round(attend_gbps, 2),
               "seq_read_GBps": round(seq_gbps, 2),
               "attend_share_of_seq_read": round(attend_gbps / seq_gbps, 3),
               "ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()},
               "median_ratio": {k: round(statistics.median(v), 3) for k, v in ratios.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        for c in (ctx, tail_ctx, outlier_ctx, top_p_ctx, append_ctx):
            c.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
