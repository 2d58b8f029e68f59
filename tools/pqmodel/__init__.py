"""pqmodel: numpy tooling for running SmolLM2-135M (GGUF) against libpqcache.

Modules: gguf (the file's metadata and dequantised tensors, through the gguf
package), tokenizer (byte-level BPE from the GGUF metadata, run by the
tokenizers package), model (numpy Llama forward pass with KV cache and a
selection hook: the reference), cli (`python3 -m pqmodel.cli ppl|generate|info`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = REPO_ROOT / "scripts" / "fetch-model.sh"


def default_model_path() -> Path:
    """$PQCACHE_MODEL if set, else ${PQCACHE_MODEL_DIR:-~/.cache/pqcache}/SmolLM2-135M-Instruct.Q4_1.gguf
    (where scripts/fetch-model.sh caches it)."""
    p = os.environ.get("PQCACHE_MODEL")
    if p:
        return Path(p)
    d = os.environ.get("PQCACHE_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pqcache")
    return Path(d) / MODEL_FILE


def ensure_model(path=None, fetch: bool = True) -> Path:
    """Path of the model file; runs scripts/fetch-model.sh when it is missing (if fetch)."""
    p = Path(path) if path else default_model_path()
    if p.is_file():
        return p
    if not fetch or path is not None or os.environ.get("PQCACHE_MODEL"):
        raise FileNotFoundError(f"model file {p} not found (run scripts/fetch-model.sh)")
    if not FETCH_SCRIPT.is_file():
        raise FileNotFoundError(f"model file {p} not found and {FETCH_SCRIPT} is missing")
    res = subprocess.run([str(FETCH_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{FETCH_SCRIPT} failed (exit {res.returncode})")
    q = Path(res.stdout.strip().splitlines()[-1])
    if not q.is_file():
        raise RuntimeError(f"{FETCH_SCRIPT} printed {q}, which is not a file")
    return q
