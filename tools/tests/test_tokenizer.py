"""Tokenizer tests. The byte map test always runs; the rest need the model file
(the vocabulary and merges live in the GGUF) and skip without it."""

import pytest

from pqmodel.tokenizer import bytes_to_unicode


def test_bytes_to_unicode_is_gpt2_map():
    m = bytes_to_unicode()
    assert len(m) == 256 and len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord("!")] == "!"
    assert m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ" and m[ord("\t")] == "ĉ"
    assert m[0] == "Ā" and m[0x7F] == "ġ" and m[0xAD] == "Ń"  # 33 + 34 unprintables before 0xAD


def ids_of(tok, *pieces):
    return [tok.vocab[p] for p in pieces]


def test_metadata(tokenizer):
    assert len(tokenizer) == 49152
    assert tokenizer.pre == "smollm"
    assert tokenizer.add_bos is False            # tokenizer.ggml.add_bos_token = false in the file
    assert tokenizer.bos_id == 1 and tokenizer.eos_id == 2


def test_known_ids(tokenizer):
    t = tokenizer
    assert t.encode("Hello world") == ids_of(t, "Hello", "Ġworld") == [19556, 905]
    assert t.encode(" the") == [t.vocab["Ġthe"]]
    assert t.encode("The capital of France") == ids_of(t, "The", "Ġcapital", "Ġof", "ĠFrance")
    # contractions split GPT-2 style
    assert t.encode("I'm here") == ids_of(t, "I", "'m", "Ġhere")
    # smollm pre-tokenizer: every digit is its own piece
    assert t.encode("in 1932") == ids_of(t, "in", "Ġ", "1", "9", "3", "2")
    # newlines / whitespace runs: "\n\n " then " Indented"
    assert t.encode("a\n\n  b") == ids_of(t, "a", "ĊĊĠ", "Ġb")


def test_special_tokens(tokenizer):
    t = tokenizer
    assert t.vocab["<|endoftext|>"] == 0
    assert t.vocab["<|im_start|>"] == 1
    assert t.vocab["<|im_end|>"] == 2
    assert t.encode("<|im_start|>") == [1]
    assert t.encode("<|im_end|>") == [2]
    assert t.encode("<|endoftext|>") == [0]
    ids = t.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids == [1] + ids_of(t, "user", "Ċ", "Hi") + [2, t.vocab["Ċ"]]
    # not parsed when asked
    assert 1 not in t.encode("<|im_start|>", parse_special=False)
    assert t.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n"
    assert t.decode(ids, skip_special=True) == "user\nHi\n"
    assert t.encode("x", add_bos=True) == [1, t.vocab["x"]]


@pytest.mark.parametrize("s", [
    "", " ", "Hello, world!", "naïve café — 東京 🙂", "tabs\tand\r\nCRLF   trailing   ",
    "  leading spaces and 12345.678 numbers", "don't won't they'll I'd we've you're",
])
def test_roundtrip_strings(tokenizer, s):
    assert tokenizer.decode(tokenizer.encode(s)) == s


def test_roundtrip_real_text(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert 1200 < len(ids) < 1800          # 1501 tokens for the 1932 address
    assert all(0 <= i < len(tokenizer) for i in ids)
