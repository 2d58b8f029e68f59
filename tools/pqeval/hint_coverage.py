"""How much of each layer's selection a speculation one layer early covers,
on a real model (docs/selector-references.md, section 8): the model reads the first
`--tokens` tokens of perplexity document 0, then generates `--steps` greedy
tokens through a Session with speculate=True (during layer L-1 the query of
layer L is estimated from layer L-1's attention input and layer L's query
projection, as InfiniGen does; layers 0 and 1 are not speculated). For each
selector it prints the share of the middle tokens each select chose that
the hint made for it already held (pq_stats.hint_covered / hint_tokens),
and the hint's share for InfiniGen, whose attention uses the hint.

    python -m pqeval.hint_coverage --model smollm2-135m --tokens 2048 --steps 32
"""

from __future__ import annotations

import argparse
import time
from typing import List, Optional


def measure(model_name: str, tokens: int, steps: int, selectors: List[str],
            fraction: float) -> List[dict]:
    import torch
    from pqcache.transformers import Session
    from pqeval import hf, tasks

    model, tokenizer = hf.load(model_name)
    ids = hf.encode(hf.MODELS[model_name], tokenizer, tasks.perplexity_text(0))[:tokens]
    out = []
    for selector in selectors:
        start = time.perf_counter()
        with Session(model, selector=selector, topk_fraction=fraction, speculate=True,
                     tokenizer=tokenizer) as session:
            with torch.no_grad():
                model.generate(torch.tensor([ids]), max_new_tokens=steps + 1, do_sample=False,
                               past_key_values=session.cache())
            stats = session.stats()
        out.append({"selector": selector, "hint_tokens": stats["hint_tokens"],
                    "hint_covered": stats["hint_covered"],
                    "seconds": time.perf_counter() - start})
    return out


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--selectors", default="infinigen,pq,exact,sparq,quest")
    args = ap.parse_args(argv)
    rows = measure(args.model, args.tokens, args.steps, args.selectors.split(","), args.fraction)
    print(f"{args.model}, {args.tokens} prompt tokens, {args.steps} speculated steps, "
          f"budget 1/{round(1 / args.fraction)}")
    print("| selector | middle tokens selected after a hint | held by the hint | coverage |")
    print("|---|---:|---:|---:|")
    for r in rows:
        share = r["hint_covered"] / max(r["hint_tokens"], 1)
        print(f"| {r['selector']} | {r['hint_tokens']} | {r['hint_covered']} | {share:.3f} |")


if __name__ == "__main__":
    main()
