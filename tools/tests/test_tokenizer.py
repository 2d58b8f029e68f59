"""Tokenizer tests. The small-vocabulary tests always run; the rest need the
model file (the vocabulary and merges live in the GGUF) and skip without it.
tests/test_pqmodel_reference.py compares the ids with the hand-written
tokenizer's and with transformers'."""

import pytest
from tokenizers import pre_tokenizers

from pqmodel.tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED, Tokenizer

# A byte-level vocabulary: two control tokens, a user-defined one, the 256 byte
# characters (Ġ is the space), then what the merges make.
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<tool>"]
MERGED = ["ab", "Ġab", "12", "abc"]
MERGES = ["a b", "Ġ ab", "1 2", "ab c"]


def small(pre="smollm", tokens=None, **kw):
    tokens = tokens or SPECIAL + BYTES + MERGED
    types = [TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_USER_DEFINED] + [TOKEN_NORMAL] * (len(tokens) - 3)
    return Tokenizer(tokens, types, MERGES, pre=pre, bos_id=1, eos_id=0, **kw)


def test_small_vocabulary_merges_by_rank():
    t = small()
    # "ab abc": pieces "ab" and "Ġabc"; Ġabc: a+b first, then Ġ+ab, which
    # leaves no "ab c" pair: [Ġab, c]
    assert t.encode("ab abc") == [t.vocab["ab"], t.vocab["Ġab"], t.vocab["c"]]
    assert t.encode("abc") == [t.vocab["abc"]]
    assert t.decode(t.encode("ab abc")) == "ab abc"


def test_small_vocabulary_pre_tokenizers():
    # smollm splits every digit off, so the merge "1 2" never applies; gpt2 keeps "12" one piece
    assert small("smollm").encode("12") == [small().vocab["1"], small().vocab["2"]]
    assert small("gpt2").encode("12") == [small().vocab["12"]]
    with pytest.raises(ValueError, match="unsupported pre-tokenizer 'llama-bpe'"):
        small("llama-bpe")


def test_small_vocabulary_special_tokens_bos_eos():
    t = small()
    ab = t.vocab["ab"]
    assert t.encode("<|im_start|>ab<tool><|endoftext|>") == [1, ab, 2, 0]
    assert t.encode("<|im_start|>", parse_special=False) == [t.vocab[c] for c in "<|im_start|>"]
    assert t.encode("ab", add_bos=True, add_eos=True) == [1, ab, 0]
    assert small(add_bos=True).encode("ab") == [1, ab]
    # only control tokens are skipped; the user-defined one is text
    assert t.decode([1, ab, 2, 0], skip_special=True) == "ab<tool>"
    assert t.decode([1, ab, 2, 0]) == "<|im_start|>ab<tool><|endoftext|>"
    for bad in (len(t), -1):
        with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \(0..{len(t) - 1}\)"):
            t.decode([ab, bad])


def test_small_vocabulary_missing_byte_tokens():
    tokens = SPECIAL + [b for b in BYTES if b != "Ċ"] + MERGED     # no token for "\n"
    with pytest.raises(ValueError, match=r"lacks 1 of the 256 byte tokens \(e.g. \['Ċ'\]\) and names no unknown"):
        small(tokens=tokens)
    t = small(tokens=tokens, unk_id=0)
    assert t.encode("ab\nab") == [t.vocab["ab"], 0, t.vocab["ab"]]
    with pytest.raises(ValueError, match="merge 0 'ab' is not two tokens"):
        Tokenizer(SPECIAL + BYTES, None, ["ab"])


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
