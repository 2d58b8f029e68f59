#!/usr/bin/env python3
"""model.generate with libpqcache choosing what each decode token attends to.

    python3 examples/python/generate.py [--selector pq] [--fraction 0.2]
        [--prompt-tokens 3000] [--new-tokens 24] [--model PATH.gguf]

Loads SmolLM2-135M-Instruct (scripts/fetch-model.sh caches it) in Hugging
Face transformers, builds a long prompt from a State of the Union address
with a question at the end, and answers it twice: with full attention, and
with pqcache.transformers selecting 1/5 of the middle tokens in every layer
(4 sink and 128 local tokens always). It prints both answers, what the
library did, and exits 1 if the library selected nothing (77, the test
suite's "skipped", when torch or transformers is not installed).
Needs torch and transformers (scripts/setup.sh --eval) and the Python
binding on PYTHONPATH (the build stages it in build/python).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import pqcache.transformers as pqt
except ImportError as missing:  # pqcache itself missing is a real error
    if getattr(missing, "name", "") not in ("torch", "transformers"):
        raise
    print(f"SKIPPED: {missing.name} is not installed (scripts/setup.sh --eval)", file=sys.stderr)
    sys.exit(77)

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a .gguf file (default: fetch SmolLM2-135M-Instruct)")
    ap.add_argument("--selector", default="pq")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args()
    path = Path(args.model or subprocess.run(
        [str(ROOT / "scripts" / "fetch-model.sh")], check=True, stdout=subprocess.PIPE,
        text=True).stdout.strip())
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32).eval()

    address = (ROOT / "tests" / "data" / "1980_jimmy_carter_d.txt").read_text()
    words = address.split()
    question = "\n\nAccording to the address above, which country invaded Afghanistan?"
    text = " ".join(words)
    while len(tokenizer(text + question).input_ids) > args.prompt_tokens:
        words = words[: int(len(words) * 0.95)]
        text = " ".join(words)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text + question}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(chat, return_tensors="pt", add_special_tokens=False).input_ids
    print(f"prompt: {ids.shape[1]} tokens")

    def answer(out):
        return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()

    with torch.no_grad():
        start = time.perf_counter()
        full = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
        print(f"full attention ({time.perf_counter() - start:.1f} s): {answer(full)!r}")

        with pqt.Session(model, selector=args.selector, topk_fraction=args.fraction) as session:
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False,
                                 past_key_values=session.cache())
            seconds = time.perf_counter() - start
            stats = session.stats()
            capacity = session.context().capacity(0, 0)
            length = session.length()
    print(f"{args.selector} at {args.fraction:g} ({seconds:.1f} s): {answer(out)!r}")
    print(f"library: {stats['select_calls']} selections, {stats['fetch_calls']} fetches, "
          f"{capacity} of {length} tokens per kv head attended at the last step, "
          f"{stats['bytes_scored'] / max(stats['select_calls'], 1):.0f} bytes scored per "
          f"selection, {stats['builds_finished']} index builds")
    same = torch.equal(out, full)
    print(f"same tokens as full attention: {'yes' if same else 'no'}")
    return 0 if stats["select_calls"] > 0 and capacity < length else 1


if __name__ == "__main__":
    sys.exit(main())
