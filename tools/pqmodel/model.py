"""Numpy (float32) forward pass of a Llama-architecture GGUF model (SmolLM2-135M).

Per layer:  h = x + Wo . attn(rope(Wq . n), rope(Wk . n), Wv . n)   with n = rmsnorm(x) * attn_norm
            x = h + Wdown . (silu(Wgate . m) * (Wup . m))           with m = rmsnorm(h) * ffn_norm
Final: rmsnorm * output_norm, logits = x . token_embd^T (tied embeddings when
there is no output.weight).

RoPE layout: GGUF llama files converted from Hugging Face have the rows of
attn_q / attn_k permuted so that llama.cpp's "normal" RoPE applies: the pairs
rotated together are ADJACENT dimensions (2i, 2i+1) of each head, with angle
pos * theta^(-2i/head_dim). Q and K returned by this module are in that
(file) layout; dot products q.k are the same as in the HF layout since Q and K
share the permutation.

GQA: query head h uses kv head h // (n_head // n_head_kv) (as llama.cpp).

Main entry points:
  Model(path)                        load and dequantise the weights (~540 MB float32)
  model.new_cache(max_tokens)        KVCache (K after RoPE, V) for all layers
  model.prefill(tokens, cache, ...)  process a prompt (chunked attention), fill the cache
  model.decode_step(token, cache, select=...)  one token, optionally restricting
                                     each layer's attention to selected positions
  model.nll(tokens)                  per-token negative log-likelihood (perplexity)
  model.generate(tokens, n)          greedy generation
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from .gguf import GGUFReader
from .tokenizer import Tokenizer


@dataclass
class Config:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    rms_eps: float
    n_ctx: int

    @property
    def group(self) -> int:
        return self.n_head // self.n_head_kv

    @classmethod
    def from_gguf(cls, r: GGUFReader) -> "Config":
        arch = r.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"architecture {arch!r} is not supported (only llama)")
        g = lambda k, d=None: r.get(f"{arch}.{k}", d)
        n_embd = int(g("embedding_length"))
        n_head = int(g("attention.head_count"))
        head_dim = int(g("rope.dimension_count", n_embd // n_head))
        vocab = g("vocab_size")
        if vocab is None:
            vocab = len(r.get("tokenizer.ggml.tokens"))
        return cls(
            n_layer=int(g("block_count")), n_embd=n_embd, n_head=n_head,
            n_head_kv=int(g("attention.head_count_kv", n_head)), head_dim=head_dim,
            n_ff=int(g("feed_forward_length")), n_vocab=int(vocab),
            rope_theta=float(g("rope.freq_base", 10000.0)),
            rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx=int(g("context_length", 2048)),
        )


class KVCache:
    """K (after RoPE) and V of every layer: k[layer] has shape [n_head_kv, max_tokens, head_dim].

    `n` is the number of positions filled; views of the live part are
    `keys(layer)` / `values(layer)` ([n_head_kv, n, head_dim])."""

    def __init__(self, cfg: Config, max_tokens: int):
        shape = (cfg.n_layer, cfg.n_head_kv, max_tokens, cfg.head_dim)
        self.k = np.zeros(shape, np.float32)
        self.v = np.zeros(shape, np.float32)
        self.n = 0
        self.max_tokens = max_tokens

    def keys(self, layer: int) -> np.ndarray:
        return self.k[layer, :, : self.n]

    def values(self, layer: int) -> np.ndarray:
        return self.v[layer, :, : self.n]


# A selection hook, called at each decode step for every layer after the
# current token's K/V have been appended to the cache:
#     select(layer, q, k, v) -> positions or None
# q: [n_head, head_dim] query of the current token after RoPE; k, v:
# [n_head_kv, n, head_dim] views of the cache (position n-1 is the current
# token). Return None for full attention, or the positions to attend per kv
# head: a sequence of n_head_kv int arrays (lengths may differ) or an int array
# [n_head_kv, budget]. Positions are used as given (the current token is only
# attended if it is listed; selectors usually keep it through their local window).
SelectFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray], Optional[object]]

# Optional observer at decode time: observe(layer, positions, probs) with
# positions a list of n_head_kv int arrays and probs a list of n_head_kv
# arrays [group, len(positions[h])] (the softmax rows of the query heads of kv
# head h). For H2O-style selectors that need attention rows.
ObserveFn = Callable[[int, list, list], None]


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return x * (1.0 / np.sqrt(ms + eps)) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    s = s - s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


_BIAS_CACHE: dict = {}


def _causal_bias(n: int) -> np.ndarray:
    """[n, n] float32: 0 on and below the diagonal, -inf above."""
    b = _BIAS_CACHE.get(n)
    if b is None:
        b = np.triu(np.full((n, n), -np.inf, np.float32), k=1)
        _BIAS_CACHE[n] = b
    return b


class Layer:
    __slots__ = ("attn_norm", "wqkv", "wo", "ffn_norm", "wgu", "wdown")


class Model:
    def __init__(self, path, tokenizer: bool = True):
        self.path = str(path)
        r = GGUFReader(self.path)
        self.reader = r
        self.cfg = cfg = Config.from_gguf(r)
        self.tokenizer = Tokenizer.from_gguf(r) if tokenizer else None
        D = cfg.head_dim
        # weights stored transposed ([in, out]) so that activations x @ W
        self.tok_embd = r.tensor("token_embd.weight")            # [vocab, n_embd]
        if "output.weight" in r.tensors:
            self.out_w = r.tensor("output.weight")
        else:
            self.out_w = self.tok_embd                            # tied
        self.out_norm = r.tensor("output_norm.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            L = Layer()
            L.attn_norm = r.tensor(p + "attn_norm.weight")
            wq = r.tensor(p + "attn_q.weight")                   # [n_head*D, n_embd]
            wk = r.tensor(p + "attn_k.weight")                   # [n_kv*D, n_embd]
            wv = r.tensor(p + "attn_v.weight")
            assert wq.shape == (cfg.n_head * D, cfg.n_embd) and wk.shape == (cfg.n_head_kv * D, cfg.n_embd)
            L.wqkv = np.ascontiguousarray(np.concatenate([wq, wk, wv], axis=0).T)
            L.wo = np.ascontiguousarray(r.tensor(p + "attn_output.weight").T)  # [n_head*D, n_embd]
            L.ffn_norm = r.tensor(p + "ffn_norm.weight")
            wg = r.tensor(p + "ffn_gate.weight")                 # [n_ff, n_embd]
            wu = r.tensor(p + "ffn_up.weight")
            L.wgu = np.ascontiguousarray(np.concatenate([wg, wu], axis=0).T)   # [n_embd, 2*n_ff]
            L.wdown = np.ascontiguousarray(r.tensor(p + "ffn_down.weight").T)  # [n_ff, n_embd]
            self.layers.append(L)
        half = D // 2
        self.inv_freq = (cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / D))

    # ------------------------------------------------------------ pieces
    def new_cache(self, max_tokens: Optional[int] = None) -> KVCache:
        return KVCache(self.cfg, max_tokens or self.cfg.n_ctx)

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [heads, T, D] (adjacent-pair layout), pos: [T] -> rotated copy."""
        ang = np.outer(pos.astype(np.float64), self.inv_freq)            # [T, D/2]
        cos = np.cos(ang).astype(np.float32)
        sin = np.sin(ang).astype(np.float32)
        x0 = x[..., 0::2]
        x1 = x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def _qkv(self, L: Layer, x: np.ndarray, pos: np.ndarray):
        cfg = self.cfg
        T, D = x.shape[0], cfg.head_dim
        n = _rmsnorm(x, L.attn_norm, cfg.rms_eps)
        qkv = n @ L.wqkv
        nq, nk = cfg.n_head * D, cfg.n_head_kv * D
        q = qkv[:, :nq].reshape(T, cfg.n_head, D).transpose(1, 0, 2)
        k = qkv[:, nq:nq + nk].reshape(T, cfg.n_head_kv, D).transpose(1, 0, 2)
        v = np.ascontiguousarray(qkv[:, nq + nk:].reshape(T, cfg.n_head_kv, D).transpose(1, 0, 2))
        return self.rope(q, pos), self.rope(k, pos), v

    def _ffn(self, L: Layer, h: np.ndarray) -> np.ndarray:
        m = _rmsnorm(h, L.ffn_norm, self.cfg.rms_eps)
        gu = m @ L.wgu
        nf = self.cfg.n_ff
        return h + (_silu(gu[:, :nf]) * gu[:, nf:]) @ L.wdown

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final hidden states [T, n_embd] (before the output norm) -> logits [T, vocab]."""
        return _rmsnorm(x, self.out_norm, self.cfg.rms_eps) @ self.out_w.T

    # ------------------------------------------------------------ prefill
    def prefill(self, tokens: Sequence[int], cache: Optional[KVCache] = None, *,
                chunk: int = 512, logits: str = "last", capture: Optional[Callable] = None,
                hidden: bool = False):
        """Run `tokens` (appended after the cache's current content) through the model.

        All tokens go through a layer before the next layer (large matmuls);
        attention is computed for `chunk` queries at a time against the keys up
        to each query (causal), so memory is bounded by ~3*group*chunk*n floats.

        logits: "last" -> [vocab] of the last token, "all" -> [T, vocab],
        "none" -> None. With hidden=True the final hidden states [T, n_embd]
        (before the output norm) are returned instead of logits (see nll()).
        capture(layer, q, k, v) is called per layer with q [n_head, T, D],
        k, v [n_head_kv, T, D] of the new tokens (after RoPE), float32.
        """
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if cache is None:
            cache = self.new_cache(T)
        p0 = cache.n
        if p0 + T > cache.max_tokens:
            raise ValueError(f"cache holds {cache.max_tokens} tokens; {p0}+{T} needed")
        pos = np.arange(p0, p0 + T)
        x = self.tok_embd[tokens].astype(np.float32)
        G, D = cfg.group, cfg.head_dim
        scale = np.float32(1.0 / np.sqrt(D))
        for li, L in enumerate(self.layers):
            q, k, v = self._qkv(L, x, pos)
            cache.k[li, :, p0:p0 + T] = k
            cache.v[li, :, p0:p0 + T] = v
            if capture is not None:
                capture(li, q, k, v)
            attn = np.empty((T, cfg.n_head * D), np.float32)
            # [n_kv, G, T, D]
            qg = q.reshape(cfg.n_head_kv, G, T, D)
            for c0 in range(0, T, chunk):
                c1 = min(T, c0 + chunk)
                nk = p0 + c1                                       # keys visible to this chunk
                kk = cache.k[li, :, :nk]                           # [n_kv, nk, D]
                vv = cache.v[li, :, :nk]
                qc = qg[:, :, c0:c1].reshape(cfg.n_head_kv, G * (c1 - c0), D)
                s = np.matmul(qc, kk.transpose(0, 2, 1)) * scale    # [n_kv, G*tc, nk]
                # causal: query at absolute position p0+c0+i sees keys <= p0+c0+i;
                # keys before p0+c0 are visible to the whole chunk, so only the
                # diagonal block [p0+c0, nk) needs the triangular mask.
                tc = c1 - c0
                s.reshape(cfg.n_head_kv, G, tc, nk)[..., p0 + c0:] += _causal_bias(tc)
                s = _softmax_rows(s)
                o = np.matmul(s, vv)                                # [n_kv, G*tc, D]
                o = o.reshape(cfg.n_head, c1 - c0, D).transpose(1, 0, 2).reshape(c1 - c0, cfg.n_head * D)
                attn[c0:c1] = o
            h = x + attn @ L.wo
            x = self._ffn(L, h)
        cache.n = p0 + T
        if hidden:
            return x
        if logits == "last":
            return self.logits(x[-1:])[0]
        if logits == "all":
            return self.logits(x)
        return None

    # ------------------------------------------------------------ decode
    def decode_step(self, token: int, cache: KVCache, *, select: Optional[SelectFn] = None,
                    observe: Optional[ObserveFn] = None, capture: Optional[Callable] = None) -> np.ndarray:
        """Append one token and return its logits [vocab].

        Without `select`, every layer attends to all cache positions (exact).
        With `select`, layer l attends, per kv head, only to the positions the
        hook returns (see SelectFn). capture(layer, q, k, v) as in prefill (T=1).
        """
        cfg = self.cfg
        p = cache.n
        if p + 1 > cache.max_tokens:
            raise ValueError("KV cache is full")
        pos = np.array([p])
        x = self.tok_embd[[int(token)]].astype(np.float32)        # [1, n_embd]
        G, D = cfg.group, cfg.head_dim
        scale = np.float32(1.0 / np.sqrt(D))
        for li, L in enumerate(self.layers):
            q, k, v = self._qkv(L, x, pos)                         # q [n_head,1,D]
            cache.k[li, :, p] = k[:, 0]
            cache.v[li, :, p] = v[:, 0]
            cache.n = p + 1                                        # visible to the hook
            if capture is not None:
                capture(li, q, k, v)
            q1 = q[:, 0]                                           # [n_head, D]
            kk = cache.k[li, :, :p + 1]
            vv = cache.v[li, :, :p + 1]
            sel = select(li, q1, kk, vv) if select is not None else None
            qg = q1.reshape(cfg.n_head_kv, G, D)
            if sel is None:
                s = np.matmul(qg, kk.transpose(0, 2, 1)) * scale    # [n_kv, G, n]
                s = _softmax_rows(s)
                o = np.matmul(s, vv)                                # [n_kv, G, D]
                if observe is not None:
                    allpos = np.arange(p + 1)
                    observe(li, [allpos] * cfg.n_head_kv, [s[h] for h in range(cfg.n_head_kv)])
            else:
                if isinstance(sel, np.ndarray) and sel.ndim == 2:
                    sel = [sel[h] for h in range(sel.shape[0])]
                if len(sel) != cfg.n_head_kv:
                    raise ValueError(f"select returned {len(sel)} position sets, expected {cfg.n_head_kv}")
                o = np.empty((cfg.n_head_kv, G, D), np.float32)
                probs = []
                for h in range(cfg.n_head_kv):
                    ph = np.asarray(sel[h], dtype=np.int64)
                    if ph.size == 0:
                        raise ValueError(f"layer {li} kv head {h}: empty selection")
                    if ph.min() < 0 or ph.max() > p:
                        raise ValueError(f"layer {li} kv head {h}: position out of range [0, {p}]")
                    s = (qg[h] @ kk[h, ph].T) * scale               # [G, m]
                    s = _softmax_rows(s)
                    o[h] = s @ vv[h, ph]
                    probs.append(s)
                if observe is not None:
                    observe(li, [np.asarray(s_, dtype=np.int64) for s_ in sel], probs)
            h_ = x + o.reshape(1, cfg.n_head * D) @ L.wo
            x = self._ffn(L, h_)
        return self.logits(x)[0]

    # ------------------------------------------------------------ helpers
    def nll(self, tokens: Sequence[int], *, chunk: int = 512, start: int = 1) -> np.ndarray:
        """Negative log-likelihood (nats) of tokens[i] given tokens[:i] for i in [start, T)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        x = self.prefill(tokens, self.new_cache(len(tokens)), chunk=chunk, hidden=True)
        out = []
        for c0 in range(start - 1, len(tokens) - 1, chunk):
            c1 = min(len(tokens) - 1, c0 + chunk)
            lg = self.logits(x[c0:c1]).astype(np.float64)
            m = lg.max(axis=1, keepdims=True)
            lse = (m + np.log(np.exp(lg - m).sum(axis=1, keepdims=True)))[:, 0]
            tgt = tokens[c0 + 1:c1 + 1]
            out.append(lse - lg[np.arange(c1 - c0), tgt])
        return np.concatenate(out) if out else np.zeros(0)

    def perplexity(self, tokens: Sequence[int], **kw) -> float:
        return float(np.exp(self.nll(tokens, **kw).mean()))

    def generate(self, tokens: Sequence[int], max_new: int = 64, *, stop: Optional[Sequence[int]] = None,
                 select: Optional[SelectFn] = None) -> list[int]:
        """Greedy generation; returns the new token ids (stops after a stop token)."""
        tokens = list(tokens)
        cache = self.new_cache(len(tokens) + max_new)
        logits = self.prefill(tokens, cache)
        stop = set(stop if stop is not None else [self.tokenizer.eos_id] if self.tokenizer else [])
        out = []
        for _ in range(max_new):
            t = int(np.argmax(logits))
            out.append(t)
            if t in stop or len(out) == max_new:
                break
            logits = self.decode_step(t, cache, select=select)
        return out
