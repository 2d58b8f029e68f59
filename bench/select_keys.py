"""pq_decode_select on the host on four kinds of keys, against the
code-bytes floor (issue 43, "select"):

  random     Gaussian keys;
  clustered  a few hundred cluster centres + small noise;
  real       tests/data/smollm2_sotu_2k.pqtrace's keys (3 layers x 3 kv
             heads = 9 sources of 2K real tokens, head_dim 64), tiled to the
             length: context kv head h's block b of 2K tokens is source
             (h + b) mod 9; for head_dim 128 two sources side by side. Its
             queries: the trace's last query of the matching source.
  gemma      Gemma-3-270M's keys from its 32K trace (pqeval.longtrace, cached
             next to the model; the kind is left out, with the reason
             printed, where it is not): 3 layers x 1 kv head of head_dim
             256 in rotary pairs, cut into streams of head_dim dimensions
             (6 at 128, 12 at 64); context kv head h holds stream h mod the
             streams, its 32,768 tokens in order and repeated to the
             length, and its queries are the stream's last query (4 query
             heads, as Gemma's group).

Configurations: "4x8" (head_dim 128, m = 4, b = 8: the default there) and
"2x8" (head_dim 64, m = 2, b = 8: the default there, the tuple path). One
layer of 32 q / 8 kv heads, f16, 4 sinks, 128 local tokens, top 1/5.

PQ_CPU_LEVEL is read once per process, so each --levels entry is a worker
process holding the same contexts; the parent runs the rounds interleaved
(level A, level B, level A, ...) and prints medians:

  select_ms    one pq_decode_select (all 8 kv heads), run right after
               the cold one below (codes warm in cache);
  floor_ms     a sequential read of as many bytes as the layer's codes
               (numpy sum over them as uint64, best of 7, same process; the
               array is as warm in cache as the codes of a repeated select);
  x_floor      select / floor, per round, median;
  cold_*       the same after reading 256 MiB (what the other layers'
               attends do to the codes between two selects of a layer in a
               decode step): select_cold_ms, cold_floor_ms (best of 3) and
               cold_x_floor, the figure the 5x target of issue 43 is about;
  rand/clust   random / clustered of the same round, median;
  <level>/<last level>  same-round speedup of the last level over the others.

    PQ_BUILD_DIR=build scripts/run-python bench/select_keys.py \\
        [--tokens 32768 131072] [--configs 4x8 2x8] [--rounds 9] \\
        [--levels avx2 avx512] [--threads 2] [--json OUT]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
KV, Q, SINK, LOCAL, BLOCK = 8, 32, 4, 128, 2048
CONFIGS = {"4x8": (128, 4, 8), "2x8": (64, 2, 8)}
KINDS = ("random", "clustered", "real", "gemma")




def real_sources():
    from pqeval import trace
    t = trace.read(ROOT / "tests/data/smollm2_sotu_2k.pqtrace")
    _, kv_t, _ = t.geometry
    q_t = t.queries[t.layers[0]].shape[1]
    keys, queries = [], []
    for layer in t.layers:
        for h in range(kv_t):
            keys.append(np.asarray(t.keys[layer][:BLOCK, h], np.float32))
            g_t = q_t // kv_t
            queries.append(np.asarray(t.queries[layer][-1, h * g_t:(h + 1) * g_t], np.float32))
    return keys, queries


def gemma_trace():
    """Gemma-3's cached 32K trace in rotary pairs, or None (with why) where it
    is not cached (pqeval.longtrace.capture makes it; the bench does not
    run the model)."""
    from pqeval import longtrace, trace
    path = longtrace.trace_path("gemma3-270m")
    if not path.exists():
        return None, (f"no cached Gemma-3 trace at {path} (cd tools && ../scripts/run-python -c "
                      "\"from pqeval import longtrace; longtrace.capture('gemma3-270m')\")")
    return longtrace.rotary_pairs(trace.read(path)), None


def gemma_keys(t, n: int, dim: int):
    """keys [n][KV][dim] and queries [Q][dim] from Gemma's streams (above)."""
    g = Q // KV
    streams = []
    for layer in t.layers:
        K = np.asarray(t.keys[layer][:, 0], np.float32)           # [tokens][256]
        last = np.asarray(t.queries[layer][-1], np.float32)        # [4 q heads][256]
        for c in range(K.shape[1] // dim):
            streams.append((K[:, c * dim:(c + 1) * dim], last[:, c * dim:(c + 1) * dim]))
    keys = np.empty((n, KV, dim), np.float32)
    queries = np.empty((Q, dim), np.float32)
    for h in range(KV):
        k, q = streams[h % len(streams)]
        keys[:, h] = np.concatenate([k] * (n // len(k) + 1))[:n]
        for j in range(g):
            queries[h * g + j] = q[j % len(q)]
    return keys, queries


def make_keys(kind: str, n: int, dim: int, rng, sources):
    """keys [n][KV][dim] and queries [Q][dim], float32."""
    g = Q // KV
    if kind == "gemma":
        return gemma_keys(sources[2], n, dim)
    if kind == "random":
        return (rng.standard_normal((n, KV, dim), dtype=np.float32),
                rng.standard_normal((Q, dim), dtype=np.float32))
    if kind == "clustered":
        centres = rng.standard_normal((KV, 300, dim), dtype=np.float32) * 2.0
        pick = rng.integers(0, 300, size=(n, KV))
        keys = centres[np.arange(KV)[None, :], pick] + 0.05 * rng.standard_normal((n, KV, dim), dtype=np.float32)
        return keys.astype(np.float32), rng.standard_normal((Q, dim), dtype=np.float32)
    src_keys, src_queries = sources[:2]
    s = len(src_keys)
    parts = dim // src_keys[0].shape[1]
    keys = np.empty((n, KV, dim), np.float32)
    queries = np.empty((Q, dim), np.float32)
    for h in range(KV):
        for b0 in range(0, n, BLOCK):
            rows = min(BLOCK, n - b0)
            src = [(h + b0 // BLOCK + p) % s for p in range(parts)]
            keys[b0:b0 + rows, h] = np.concatenate([src_keys[i][:rows] for i in src], axis=1)
        src = [(h + p) % s for p in range(parts)]
        for j in range(g):
            queries[h * g + j] = np.concatenate(
                [src_queries[i][j % src_queries[i].shape[0]] for i in src])
    return keys, queries


EVICT = None


def evict():
    """Reads 256 MiB: what the attend of the other layers does to the codes
    between two selects of one layer in a decode step."""
    global EVICT
    if EVICT is None:
        EVICT = np.ones(256 << 17, np.uint64)
    EVICT.sum()


def floor_seconds(nbytes: int, buf, cold: bool) -> float:
    view = buf[:nbytes // 8]
    best = float("inf")
    for _ in range(3 if cold else 7):
        if cold:
            evict()
        start = time.perf_counter()
        view.sum()
        best = min(best, time.perf_counter() - start)
    return best


def worker(args) -> int:
    import pqcache
    sources = (*real_sources(), gemma_trace()[0])
    kinds = [k for k in KINDS if k != "gemma" or sources[2] is not None]
    print(json.dumps({"level": pqcache.cpu_level()}), flush=True)
    contexts = {}
    buf = np.ones(max(args.tokens) * KV * 8 // 8 + 8, np.uint64)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "setup":
            for ctx, _, _ in contexts.values():
                ctx.close()
            contexts.clear()
            dim, m, bits = CONFIGS[cmd["config"]]
            n = cmd["tokens"]
            for kind in kinds:
                rng = np.random.default_rng([n, dim, KINDS.index(kind)])
                keys, queries = make_keys(kind, n, dim, rng, sources)
                values = rng.standard_normal((n, KV, dim), dtype=np.float32).astype(np.float16)
                ctx = pqcache.Context(1, Q, KV, dim, "f16", sink_tokens=SINK, local_tokens=LOCAL,
                                      topk_fraction=0.2, worker_threads=args.threads,
                                      pq_subspaces=m, pq_bits=bits)
                ctx.add_sequence(0)
                ctx.prefill(0, 0, keys.astype(np.float16), values)
                ctx.wait_builds()
                query = queries.astype(np.float16)
                sel = ctx.select(0, 0, query)
                contexts[kind] = (ctx, query, sel)
            print(json.dumps({"ok": True}), flush=True)
        elif cmd["op"] == "round":
            n = cmd["tokens"]
            m = CONFIGS[cmd["config"]][1]
            out = {}
            for kind, (ctx, query, sel) in contexts.items():
                evict()
                start = time.perf_counter()
                ctx.select(0, 0, query, out=sel)
                out[kind + "_cold"] = time.perf_counter() - start
                start = time.perf_counter()
                ctx.select(0, 0, query, out=sel)
                out[kind] = time.perf_counter() - start
            out["floor"] = floor_seconds(n * KV * m, buf, cold=False)
            out["floor_cold"] = floor_seconds(n * KV * m, buf, cold=True)
            print(json.dumps(out), flush=True)
        else:
            break
    for ctx, _, _ in contexts.values():
        ctx.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--configs", nargs="+", default=["4x8", "2x8"], choices=sorted(CONFIGS))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--levels", nargs="+", default=None,
                    help="PQ_CPU_LEVEL of each worker (default: the CPU's own level), "
                         "optionally :NAME=VALUE[,NAME=VALUE] for more of its environment "
                         "(PYTHONPATH=<other build>/python:tools times another build)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    import pqcache
    levels = args.levels or [pqcache.cpu_level()]
    procs = {}
    for level in levels:
        name, _, rest = level.partition(":")
        extra = rest.split(",") if rest else []
        env = dict(os.environ, PQ_CPU_LEVEL=name.split("+")[0])
        env.update(kv.split("=", 1) for kv in extra)
        cmd = [sys.executable, __file__, "--worker", "--threads", str(args.threads), "--tokens",
               *map(str, args.tokens)]
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        used = json.loads(p.stdout.readline())["level"]
        procs[level] = (p, used + "".join(":" + kv for kv in extra))

    def ask(p, msg):
        p.stdin.write(json.dumps(msg) + "\n")
        p.stdin.flush()
        return json.loads(p.stdout.readline())

    from pqeval import longtrace
    if not longtrace.trace_path("gemma3-270m").exists():
        print(f"gemma keys: SKIPPED, {gemma_trace()[1]}", flush=True)
    print(f"select_keys: {cpu_model()}, {os.cpu_count()} cpus, {args.threads} threads, "
          f"levels {[lv for _, lv in procs.values()]}, libpqcache {pqcache.version()}, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for config in args.configs:
        for n in args.tokens:
            for p, _ in procs.values():
                ask(p, {"op": "setup", "config": config, "tokens": n})
            rounds = {level: [] for level in procs}
            for _ in range(args.rounds):
                for level, (p, _) in procs.items():
                    rounds[level].append(ask(p, {"op": "round", "config": config, "tokens": n}))
            last = list(procs)[-1]
            for level, (_, used) in procs.items():
                rs = rounds[level]
                med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
                row = {"config": config, "tokens": n, "level": used,
                       "load": round(os.getloadavg()[0], 2),
                       "floor_ms": round(med(lambda r: r["floor"]) * 1e3, 3),
                       "cold_floor_ms": round(med(lambda r: r["floor_cold"]) * 1e3, 3)}
                kinds = [k for k in KINDS if k in rs[0]]
                for kind in kinds:
                    row[f"{kind}_ms"] = round(med(lambda r: r[kind]) * 1e3, 3)
                    row[f"{kind}_x_floor"] = round(med(lambda r: r[kind] / r["floor"]), 1)
                    row[f"{kind}_cold_ms"] = round(med(lambda r: r[kind + "_cold"]) * 1e3, 3)
                    row[f"{kind}_cold_x_floor"] = round(
                        med(lambda r: r[kind + "_cold"] / r["floor_cold"]), 1)
                row["rand/clust"] = round(med(lambda r: r["random"] / r["clustered"]), 2)
                if level != last:
                    for kind in kinds:
                        row[f"{kind}_{level}/{last}"] = round(statistics.median(
                            a[kind] / b[kind] for a, b in zip(rs, rounds[last])), 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    for p, _ in procs.values():
        p.stdin.write(json.dumps({"op": "quit"}) + "\n")
        p.stdin.flush()
        p.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
