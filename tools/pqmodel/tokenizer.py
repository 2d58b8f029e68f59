"""Byte-level BPE tokenizer (GPT-2 style) built from GGUF metadata.

Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,
eos_token_id,add_bos_token,add_eos_token}. Only tokenizer.ggml.model == "gpt2"
is supported.

Pre-tokenisation follows llama.cpp for the pre-tokenizer named in
tokenizer.ggml.pre. SmolLM2 uses "smollm" (same as "starcoder"): every digit is
split off on its own, then the GPT-2 regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
splits the rest. This equals the Hugging Face tokenizer of SmolLM2
(Digits(individual_digits) + ByteLevel(use_regex)).

Control tokens (token_type 3, e.g. <|im_start|>, <|im_end|>, <|endoftext|>)
are recognised as single tokens where they appear literally in the text
(unless encode(..., parse_special=False)).
"""

from __future__ import annotations

from functools import lru_cache

import regex

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# pre-tokenizer name -> list of regexes applied in sequence (as llama.cpp does:
# each regex splits every piece left by the previous one; text between matches
# is kept as pieces too).
PRE_TOKENIZERS = {
    "default": [GPT2_PATTERN],
    "gpt2": [GPT2_PATTERN],
    "smollm": [r"\p{N}", GPT2_PATTERN],
    "starcoder": [r"\p{N}", GPT2_PATTERN],
}


@lru_cache(maxsize=None)
def bytes_to_unicode() -> dict:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _split(pattern: "regex.Pattern", pieces: list[str]) -> list[str]:
    out = []
    for piece in pieces:
        pos = 0
        for m in pattern.finditer(piece):
            if m.start() > pos:
                out.append(piece[pos:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            pos = m.end()
        if pos < len(piece):
            out.append(piece[pos:])
    return out


class Tokenizer:
    def __init__(self, tokens, token_types, merges, *, pre="default", bos_id=None, eos_id=None,
                 add_bos=False, add_eos=False, unk_id=None):
        self.tokens = list(tokens)
        self.token_types = [int(t) for t in token_types] if token_types is not None else [TOKEN_NORMAL] * len(self.tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {}
        for i, m in enumerate(merges):
            a, b = m.split(" ", 1)
            self.ranks[(a, b)] = i
        self.pre = pre
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unsupported pre-tokenizer {pre!r} (known: {sorted(PRE_TOKENIZERS)})")
        self._patterns = [regex.compile(p) for p in PRE_TOKENIZERS[pre]]
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.special = {t: i for i, t in enumerate(self.tokens)
                        if self.token_types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}
        if self.special:
            alts = sorted(self.special, key=len, reverse=True)
            self._special_re = regex.compile("|".join(regex.escape(s) for s in alts))
        else:
            self._special_re = None
        self._cache: dict[str, list[int]] = {}

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

    # ---------------------------------------------------------------- BPE
    def _bpe(self, word: str) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        parts = list(word)
        ranks = self.ranks
        while len(parts) > 1:
            best, best_i = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            a, b = parts[best_i], parts[best_i + 1]
            # merge every occurrence of the pair (left to right), as GPT-2 does
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = []
        for p in parts:
            i = self.vocab.get(p)
            if i is None:
                # not in the vocabulary: fall back to single byte-characters
                for ch in p:
                    j = self.vocab.get(ch, self.unk_id)
                    if j is None:
                        raise KeyError(f"no token for {ch!r} and no unknown token")
                    ids.append(j)
            else:
                ids.append(i)
        if len(self._cache) < 200_000:
            self._cache[word] = ids
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        pieces = [text]
        for pat in self._patterns:
            pieces = _split(pat, pieces)
        enc = self.byte_encoder
        out = []
        for piece in pieces:
            word = "".join(enc[b] for b in piece.encode("utf-8"))
            out.extend(self._bpe(word))
        return out

    def encode(self, text: str, *, add_bos=None, add_eos=None, parse_special=True) -> list[int]:
        """Text -> token ids. BOS/EOS are added per the GGUF metadata unless overridden."""
        ids = []
        if add_bos if add_bos is not None else self.add_bos:
            ids.append(self.bos_id)
        if parse_special and self._special_re is not None:
            pos = 0
            for m in self._special_re.finditer(text):
                if m.start() > pos:
                    ids.extend(self._encode_ordinary(text[pos:m.start()]))
                ids.append(self.special[m.group()])
                pos = m.end()
            if pos < len(text):
                ids.extend(self._encode_ordinary(text[pos:]))
        else:
            ids.extend(self._encode_ordinary(text))
        if add_eos if add_eos is not None else self.add_eos:
            ids.append(self.eos_id)
        return ids

    def token_bytes(self, i: int) -> bytes:
        t = self.tokens[i]
        if self.token_types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            return t.encode("utf-8")
        dec = self.byte_decoder
        return bytes(dec[c] for c in t if c in dec)

    def decode(self, ids, *, skip_special=False) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if skip_special and self.token_types[i] == TOKEN_CONTROL:
                continue
            out += self.token_bytes(i)
        return out.decode("utf-8", errors="replace")
