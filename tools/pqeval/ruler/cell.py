"""RULER's niah_single_1 as pqeval.tasks samples, so pqeval.longctx runs it
through the Session like the home-made tasks.

Sample `seed` of a length is RULER's sample number `seed` (from 0) of one
`niah.py --random_seed 42 --max_seq_length <length>` run, with the length
counted in the tokens the model reads: the prompt through its chat template
and RULER's answer prefix, as RULER's own model templates are counted
(prepare.py --prepare_for_ns), plus RULER's 128 tokens to generate."""

from __future__ import annotations

from typing import Callable

from pqeval.ruler import CELLS, niah
from pqeval.tasks import Sample


def _sample(task: str, seed: int, prompt: str, answer_prefix: str, references, depth: float):
    # The machinery starts the answer prefix on its own line (the assistant's
    # turn, or the line after a base model's prompt): RULER's leading space,
    # which follows the question on one line, is dropped.
    return Sample(task, "last", seed, prompt, answer_prefix.strip(), list(references), "all",
                  niah.TOKENS_TO_GENERATE, [depth])


def make_sample(task: str, placement: str, seed: int, tokens: int,
                count_tokens: Callable[[Sample], int]) -> Sample:
    """RULER's sample `seed` at `tokens` tokens; count_tokens as for
    pqeval.tasks.make_sample (the sample as the model will see it)."""
    if task not in CELLS:
        raise ValueError(f"unknown RULER cell {task!r}; expected one of {list(CELLS)}")
    if placement != "last":
        raise ValueError(f"{task}: placement {placement!r}: RULER asks after the context only "
                         "(use placement 'last')")
    if seed < 0:
        raise ValueError(f"{task}: seed {seed}: RULER's samples are numbered from 0")

    def count(text: str) -> int:
        at = text.rfind(niah.ANSWER_PREFIX[:10])
        return count_tokens(_sample(task, seed, text[:at], text[at:], [], 0.0))

    out = niah.Generator(count, tokens).generate_samples(seed + 1)[-1]
    return _sample(task, seed, out["input"], out["answer_prefix"], out["outputs"],
                   out["index"] / len(out["input"]))
