"""Byte-level BPE (GPT-2 style) from the GGUF metadata, run by Hugging Face's
`tokenizers`.

Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,
eos_token_id,add_bos_token,add_eos_token}. Only tokenizer.ggml.model == "gpt2"
is supported.

The pre-tokenizer follows llama.cpp's for the name in tokenizer.ggml.pre.
SmolLM2 uses "smollm" (as "starcoder"): every digit is split off on its own
(pre_tokenizers.Digits(individual_digits=True)), then the GPT-2 regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
splits the rest and maps bytes to GPT-2's printable characters
(pre_tokenizers.ByteLevel(use_regex=True)); the Hugging Face tokenizer of
SmolLM2 is built the same way.

Control tokens (token_type 3, e.g. <|im_start|>, <|im_end|>, <|endoftext|>)
and user-defined ones (4) are recognised as single tokens where they appear
literally in the text (unless encode(..., parse_special=False)).
"""

from __future__ import annotations

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def _byte_level():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_byte_level():
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])


# tokenizer.ggml.pre -> the pre-tokenizer llama.cpp applies for it
PRE_TOKENIZERS = {
    "default": _byte_level,
    "gpt2": _byte_level,
    "smollm": _digits_then_byte_level,
    "starcoder": _digits_then_byte_level,
}


class Tokenizer:
    def __init__(self, tokens, token_types, merges, *, pre="default", bos_id=None, eos_id=None,
                 add_bos=False, add_eos=False, unk_id=None):
        self.tokens = list(tokens)
        self.token_types = [int(t) for t in token_types] if token_types is not None else [TOKEN_NORMAL] * len(self.tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        # BPE starts from one token per byte. Byte-level vocabularies may lack
        # bytes that text hardly holds (SmolLM2: 21, e.g. 0x04, 0xC0, 0xF1):
        # those become the unknown token, as the hand-written tokenizer this
        # replaced did; without one, tokenizers would drop them unsaid.
        missing = sorted(set(pre_tokenizers.ByteLevel.alphabet()) - self.vocab.keys())
        if missing and unk_id is None:
            raise ValueError(f"the vocabulary lacks {len(missing)} of the 256 byte tokens (e.g. {missing[:8]}) "
                             "and names no unknown token (tokenizer.ggml.unknown_token_id) to stand for them")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unsupported pre-tokenizer {pre!r} (known: {sorted(PRE_TOKENIZERS)})")
        self.pre = pre
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.add_bos, self.add_eos = add_bos, add_eos
        pairs = []
        for n, m in enumerate(merges):
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"merge {n} {m!r} is not two tokens separated by a space")
            pairs.append((a, b))
        self._plain = self._build(pairs, specials=False)   # for parse_special=False
        self._hf = self._build(pairs, specials=True)

    def _build(self, merges, specials: bool) -> _HFTokenizer:
        """A tokenizers.Tokenizer on this vocabulary; with specials, the control
        and user-defined tokens are matched in the text before BPE (only the
        control ones count as special for decode(skip_special=True))."""
        unk = self.tokens[self.unk_id] if self.unk_id is not None else None
        hf = _HFTokenizer(models.BPE(vocab=self.vocab, merges=merges, unk_token=unk,
                                     fuse_unk=False, byte_fallback=False))
        hf.pre_tokenizer = PRE_TOKENIZERS[self.pre]()
        hf.decoder = decoders.ByteLevel()
        if specials:
            hf.add_tokens([AddedToken(t, special=self.token_types[i] == TOKEN_CONTROL, normalized=False)
                           for i, t in enumerate(self.tokens)
                           if self.token_types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)])
        return hf

    @classmethod
    def from_gguf(cls, reader) -> "Tokenizer":
        g = reader.get
        model = g("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model {model!r} is not supported (only 'gpt2' byte-level BPE)")
        return cls(
            g("tokenizer.ggml.tokens"), g("tokenizer.ggml.token_type"), g("tokenizer.ggml.merges", []),
            pre=g("tokenizer.ggml.pre", "default"),
            bos_id=g("tokenizer.ggml.bos_token_id"), eos_id=g("tokenizer.ggml.eos_token_id"),
            unk_id=g("tokenizer.ggml.unknown_token_id"),
            add_bos=bool(g("tokenizer.ggml.add_bos_token", False)),
            add_eos=bool(g("tokenizer.ggml.add_eos_token", False)),
        )

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        from .gguf import GGUFReader
        return cls.from_gguf(GGUFReader(path))

    def __len__(self):
        return len(self.tokens)

    def encode(self, text: str, *, add_bos=None, add_eos=None, parse_special=True) -> list[int]:
        """Text -> token ids. BOS/EOS are added per the GGUF metadata unless overridden."""
        hf = self._hf if parse_special else self._plain
        ids = hf.encode(text, add_special_tokens=False).ids
        if add_bos if add_bos is not None else self.add_bos:
            ids.insert(0, self.bos_id)
        if add_eos if add_eos is not None else self.add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, *, skip_special=False) -> str:
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        ids = [int(i) for i in ids]
        # tokenizers skips an id it has no token for without a word
        bad = next((i for i in ids if not 0 <= i < len(self.tokens)), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{len(self.tokens) - 1})")
        return self._hf.decode(ids, skip_special_tokens=skip_special)
