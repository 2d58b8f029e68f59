"""The gguf and tokenizers packages give what tools/pqmodel's hand-written GGUF
reader and BPE tokenizer gave before they replaced them: the same dequantised
tensors, bit for bit, and the same token ids on every shipped text
(data/pqmodel_reference.json, recorded from the hand-written code; its
"about" says how). Where transformers is installed, its tokenizer of the same
file is compared too. Needs the model file; skips without it."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((ROOT / "tools/tests/data/pqmodel_reference.json").read_text(encoding="utf-8"))


def digest(values, dtype) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype).tobytes()).hexdigest()[:16]


def test_dequantised_tensors_match_the_hand_written_reader(model_path):
    from pqmodel.gguf import GGUFReader
    reader = GGUFReader(model_path)
    assert list(reader.tensors) == list(REFERENCE["tensors"])
    differing = []
    for name, (type_name, shape, expected) in REFERENCE["tensors"].items():
        tensor = reader.tensors[name]
        w = tensor.numpy()
        got = [tensor.type_name, list(w.shape), digest(w, "<f4")]
        if got != [type_name, shape, expected]:
            differing.append(f"{name}: {got} != {[type_name, shape, expected]}")
    assert not differing, f"{len(differing)} tensors differ: " + "; ".join(differing[:5])


def first_difference(got, expected) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return f"first difference at {i}: {got[i:i + 5]} != {expected[i:i + 5]}"


def test_ids_of_the_shipped_texts_match_the_hand_written_tokenizer(tokenizer):
    hoover, *_ = REFERENCE["files"]
    got = tokenizer.encode((ROOT / hoover).read_text(encoding="utf-8"))
    assert got == REFERENCE["hoover_ids"], first_difference(got, REFERENCE["hoover_ids"])
    differing = []
    for path, (count, expected) in REFERENCE["files"].items():
        ids = tokenizer.encode((ROOT / path).read_text(encoding="utf-8"))
        if [len(ids), digest(ids, "<i4")] != [count, expected]:
            differing.append(f"{path}: {len(ids)} ids (recorded {count})")
    assert len(REFERENCE["files"]) == 53
    assert not differing, f"{len(differing)} of {len(REFERENCE['files'])} texts differ: " + "; ".join(differing)


@pytest.mark.parametrize("text, ids, ids_unparsed", REFERENCE["strings"],
                         ids=[repr(s[0])[:24] for s in REFERENCE["strings"]])
def test_ids_of_edge_strings_match_the_hand_written_tokenizer(tokenizer, text, ids, ids_unparsed):
    assert tokenizer.encode(text) == ids
    assert tokenizer.encode(text, parse_special=False) == ids_unparsed
    if 0 not in ids:   # the unknown token stands for bytes the vocabulary lacks
        assert tokenizer.decode(ids) == text


def test_ids_match_transformers_tokenizer_of_the_file(tokenizer):
    pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh --eval)")
    from pqeval import hf
    reference = hf.tokenizer("smollm2-135m", fetch=False)
    for path in list(REFERENCE["files"]):
        text = (ROOT / path).read_text(encoding="utf-8")
        expected = reference(text, add_special_tokens=False).input_ids
        got = tokenizer.encode(text)
        assert got == expected, f"{path}: " + first_difference(got, expected)
