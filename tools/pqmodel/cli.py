"""Command line: perplexity, greedy generation and file info for the GGUF model.

    python3 -m pqmodel.cli ppl <textfile> [--tokens N] [--chunk C] [--model PATH]
    python3 -m pqmodel.cli generate "<prompt>" [--max-new N] [--chat] [--model PATH]
    python3 -m pqmodel.cli info [--model PATH]
    (global options before the command: --model PATH, --threads N)

Run from tools/ (or with tools/ on PYTHONPATH). Without --model the file is
looked up where scripts/fetch-model.sh caches it ($PQCACHE_MODEL, or
${PQCACHE_MODEL_DIR:-~/.cache/pqcache}/) and fetched when missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import ensure_model

# numpy is imported inside the commands so that --threads can set
# OPENBLAS_NUM_THREADS before it loads.


def _load(args):
    from .model import Model
    path = ensure_model(args.model)
    t0 = time.perf_counter()
    m = Model(path)
    print(f"model: {path} (loaded in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return m


def cmd_ppl(args) -> int:
    import numpy as np
    m = _load(args)
    with open(args.textfile, encoding="utf-8") as f:
        text = f.read()
    ids = m.tokenizer.encode(text)
    if args.tokens:
        ids = ids[: args.tokens]
    if len(ids) < 2:
        print("error: need at least 2 tokens", file=sys.stderr)
        return 2
    if len(ids) > m.cfg.n_ctx:
        print(f"warning: {len(ids)} tokens exceed the model context {m.cfg.n_ctx}", file=sys.stderr)
    t0 = time.perf_counter()
    nll = m.nll(ids, chunk=args.chunk)
    dt = time.perf_counter() - t0
    print(f"file: {args.textfile}")
    print(f"tokens: {len(ids)} (scored {len(nll)})")
    print(f"mean nll: {nll.mean():.4f} nats")
    print(f"perplexity: {float(np.exp(nll.mean())):.3f}")
    print(f"time: {dt:.1f} s")
    return 0


CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def cmd_generate(args) -> int:
    m = _load(args)
    prompt = CHAT.format(args.prompt) if args.chat else args.prompt
    ids = m.tokenizer.encode(prompt)
    stop = [m.tokenizer.eos_id, m.tokenizer.vocab.get("<|endoftext|>")]
    t0 = time.perf_counter()
    out = m.generate(ids, args.max_new, stop=[s for s in stop if s is not None])
    dt = time.perf_counter() - t0
    print(m.tokenizer.decode(out, skip_special=True))
    print(f"[{len(ids)} prompt tokens, {len(out)} generated in {dt:.1f} s]", file=sys.stderr)
    return 0


def cmd_info(args) -> int:
    import numpy as np
    from .gguf import GGUFReader
    from .model import Config
    path = ensure_model(args.model)
    r = GGUFReader(path)
    print(f"file: {path}\nGGUF v{r.version}, alignment {r.alignment}, data offset {r.data_offset}")
    print(f"tensors: {len(r.tensors)} by type {r.type_summary()}")
    print(Config.from_gguf(r))
    for k, v in r.metadata.items():
        s = f"[{len(v)} items]" if isinstance(v, (list, np.ndarray)) and len(v) > 8 else repr(v)
        print(f"  {k} = {s[:120]}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pqmodel.cli", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="path of the .gguf file (default: the fetch-model.sh cache)")
    ap.add_argument("--threads", type=int, default=0,
                    help="BLAS threads (sets OPENBLAS_NUM_THREADS/OMP_NUM_THREADS); 1 is much faster "
                         "on a loaded 2-core machine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ppl", help="perplexity of a text file")
    p.add_argument("textfile")
    p.add_argument("--tokens", type=int, default=0, help="score only the first N tokens")
    p.add_argument("--chunk", type=int, default=512, help="queries per attention chunk")
    p.set_defaults(fn=cmd_ppl)
    p = sub.add_parser("generate", help="greedy generation from a prompt")
    p.add_argument("prompt", help="raw prompt text (special tokens like <|im_start|> are parsed)")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template as a user turn")
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("info", help="GGUF metadata and tensor types")
    p.set_defaults(fn=cmd_info)
    # accept --model after the subcommand too
    for sp in sub.choices.values():
        sp.add_argument("--model", dest="model", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads > 0:
        if "numpy" in sys.modules:
            print("warning: numpy already loaded; --threads has no effect", file=sys.stderr)
        os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
