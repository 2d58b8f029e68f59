#!/usr/bin/env python3
"""Decode speed of pqcache.transformers against transformers' own SDPA, on
the CPU, measured side by side.

    python3 bench/transformers_decode.py [--lengths 4096,7936] [--blocks 5]

SmolLM2-135M-Instruct (float32, torch on all cores) decodes greedily after
a prompt of each length, in four modes that run in turns, block by block
(16 tokens a block) so that machine load hits all of them alike:
- sdpa-dynamic: transformers' default, SDPA over a DynamicCache;
- sdpa-static: SDPA over a StaticCache;
- pq-1/5: PQ selecting 1/5 of the middle tokens in every layer, LibraryCache;
- exact-all: the integration attending over every token (EXACT at 1.0):
  the integration's cost without any saving from selection.
Prints per-token medians, their ratio to sdpa-dynamic, and the load average.
The prompt is prefilled once per mode, outside the timing.
"""

import argparse
import copy
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, StaticCache

import pqcache.transformers as pqt

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,7936")
    ap.add_argument("--blocks", type=int, default=5)
    args = ap.parse_args()
    path = Path(subprocess.run([str(ROOT / "scripts" / "fetch-model.sh")], check=True,
                               stdout=subprocess.PIPE, text=True).stdout.strip())
    base = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()
    text = " ".join(p.read_text() for p in sorted((ROOT / "tests" / "data" / "sotu").glob("19*")))
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    all_ids = tok(text).input_ids
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    for length in (int(x) for x in args.lengths.split(",")):
        ids = torch.tensor([all_ids[:length]])
        models = {"sdpa-dynamic": base, "sdpa-static": base}
        sessions = {}
        for name, fields in (("pq-1/5", dict(selector="pq", topk_fraction=0.2)),
                             ("exact-all", dict(selector="exact", topk_fraction=1.0))):
            models[name] = copy.deepcopy(base)
            sessions[name] = pqt.Session(models[name], **fields)
        caches = {"sdpa-dynamic": DynamicCache(config=base.config),
                  "sdpa-static": StaticCache(config=base.config,
                                             max_cache_len=length + BLOCK * args.blocks + 1),
                  **{name: s.cache() for name, s in sessions.items()}}
        nxt = {}
        with torch.no_grad():
            for name, model in models.items():
                for start in range(0, length, 2048):
                    out = model(ids[:, start:start + 2048], past_key_values=caches[name],
                                logits_to_keep=1)
                nxt[name] = out.logits[:, -1:].argmax(-1)
            for s in sessions.values():
                s.context().wait_builds()
            times = {name: [] for name in models}
            for _ in range(args.blocks):
                for name, model in models.items():
                    start = time.perf_counter()
                    for _ in range(BLOCK):
                        nxt[name] = model(nxt[name], past_key_values=caches[name]).logits[
                            :, -1:].argmax(-1)
                    times[name].append((time.perf_counter() - start) / BLOCK)
        for s in sessions.values():
            s.close()
        reference = statistics.median(times["sdpa-dynamic"])
        print(f"\n{length} prompt tokens, {args.blocks} blocks of {BLOCK} tokens, load "
              f"{os.getloadavg()[0]:.2f}")
        print("| mode | ms per token (median) | min | max | vs sdpa-dynamic |")
        print("|---|---:|---:|---:|---:|")
        for name, t in times.items():
            m = statistics.median(t)
            print(f"| {name} | {1e3 * m:.1f} | {1e3 * min(t):.1f} | {1e3 * max(t):.1f} | "
                  f"{m / reference:.2f}x |")


if __name__ == "__main__":
    main()
