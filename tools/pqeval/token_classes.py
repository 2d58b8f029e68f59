"""Token classes (pq_token_class flags: special, punctuation) of a trace's
tokens, which FastGen reads: token_class_table(tokenizer)[trace.token_ids].

The committed trace's classes are committed beside it
(tests/data/smollm2_sotu_2k.classes, one byte per token), so that its replay
in CI needs no tokenizer. They were made, and are checked, with

    python -m pqeval.token_classes ../tests/data/smollm2_sotu_2k.pqtrace smollm2-135m
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

import numpy as np


def classes_path(trace_path: Path) -> Path:
    return Path(trace_path).with_suffix(".classes")


def read(trace_path: Path) -> np.ndarray:
    """The committed classes of the trace at trace_path (uint8 [tokens])."""
    return np.fromfile(classes_path(trace_path), dtype=np.uint8)


def compute(trace_path: Path, model_name: str) -> np.ndarray:
    from pqcache.selector_inputs import token_class_table
    from pqeval import hf, trace

    t = trace.read(trace_path)
    return token_class_table(hf.tokenizer(model_name))[np.asarray(t.token_ids)]


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("model", help="the evaluation's model name (pqeval.hf.MODELS)")
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed file instead of writing it")
    args = ap.parse_args(argv)
    classes = compute(args.trace, args.model)
    if args.check:
        same = np.array_equal(read(args.trace), classes)
        print("the committed classes match" if same else "the committed classes differ")
        raise SystemExit(0 if same else 1)
    classes.tofile(classes_path(args.trace))
    counts = np.bincount(classes, minlength=4)
    print(f"{classes_path(args.trace)}: {len(classes)} tokens, {counts[1]} special, "
          f"{counts[2]} punctuation")


if __name__ == "__main__":
    main()
