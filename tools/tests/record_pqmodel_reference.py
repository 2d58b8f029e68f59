"""Records what tools/pqmodel's hand-written GGUF reader and BPE tokenizer
produce on the shipped model and texts, so that the libraries replacing them
(gguf, tokenizers) can be checked against it (tools/tests/test_pqmodel_reference.py).

    python3 tools/tests/record_pqmodel_reference.py [MODEL.gguf]

Run once, with the hand-written code (commit e8e9217), before it was removed;
kept in the history only. Writes tools/tests/data/pqmodel_reference.json.
"""

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from pqmodel import default_model_path  # noqa: E402
from pqmodel.gguf import GGUFReader  # noqa: E402
from pqmodel.tokenizer import Tokenizer  # noqa: E402

# Strings with every path of the tokenizer: contractions, digits, whitespace
# runs, non-ASCII, bytes without a token, control tokens (parsed and not), the chat template.
STRINGS = [
    "", " ", "Hello world", "Hello, world!", "naïve café — 東京 🙂", "tabs\tand\r\nCRLF   trailing   ",
    "  leading spaces and 12345.678 numbers", "don't won't they'll I'd we've you're", "in 1932",
    "a\n\n  b", "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>x<|im_end|>", "x²+½ = ٣ and Ⅻ", "\u00a0\u2003spaces\u3000", "a\x00b\x7f",
    # bytes the vocabulary has no token for (0x04, and 0xF1 leading U+40000): the unknown token
    "a\x04b\x06", "\U00040000 \U00050001",
]


def ids_digest(ids) -> str:
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()[:16]


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default_model_path()
    t0 = time.perf_counter()
    r = GGUFReader(path)
    tok = Tokenizer.from_gguf(r)
    t_open = time.perf_counter() - t0

    t0 = time.perf_counter()
    tensors = {}
    for name, t in r.tensors.items():
        w = t.numpy()
        tensors[name] = [t.type_name, list(w.shape), hashlib.sha256(w.astype("<f4").tobytes()).hexdigest()[:16]]
    t_dequant = time.perf_counter() - t0

    texts = [ROOT / "tools/tests/data/1932_herbert_hoover_r.txt"] + sorted((ROOT / "tests/data").glob("*.txt")) \
        + sorted((ROOT / "tests/data/sotu").glob("*.txt"))
    t0 = time.perf_counter()
    files, n_tokens = {}, 0
    for f in texts:
        ids = tok.encode(f.read_text(encoding="utf-8"))
        n_tokens += len(ids)
        files[str(f.relative_to(ROOT))] = [len(ids), ids_digest(ids)]
    t_tokenize = time.perf_counter() - t0
    hoover = tok.encode((ROOT / "tools/tests/data/1932_herbert_hoover_r.txt").read_text(encoding="utf-8"))

    out = {
        "about": "Recorded by tools/pqmodel's hand-written GGUF reader and BPE tokenizer (as of commit e8e9217) "
                 "with tools/tests/record_pqmodel_reference.py (in the history with the code it ran) "
                 "on SmolLM2-135M-Instruct.Q4_1.gguf. "
                 "tensors: name -> [ggml type, numpy shape, sha256[:16] of the dequantised float32 "
                 "little-endian bytes]; files: path -> [token count, sha256[:16] of the ids as int32 "
                 "little-endian]; strings: [text, ids, ids with parse_special=False]; hoover_ids: all ids "
                 "of the first file, so a failure shows where the tokenizers part.",
        "tensors": tensors,
        "files": files,
        "strings": [[s, tok.encode(s), tok.encode(s, parse_special=False)] for s in STRINGS],
        "hoover_ids": hoover,
    }
    dst = ROOT / "tools/tests/data/pqmodel_reference.json"
    dst.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"open+tokenizer {t_open:.2f} s, dequantise {len(tensors)} tensors {t_dequant:.2f} s, "
          f"tokenize {len(texts)} files ({n_tokens} tokens) {t_tokenize:.2f} s; wrote {dst} "
          f"({dst.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
