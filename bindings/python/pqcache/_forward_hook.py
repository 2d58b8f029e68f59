"""pqcache.transformers' parts: the hook into the model's forward. The
attention implementation "pqcache" (transformers' AttentionInterface), the
switch of a model to it and back (_ModelBinding), and the work it does in a
selecting layer (_LibraryAttention): a prompt chunk runs full attention and
goes to the library, each decode token attends over the library's
selection."""

from __future__ import annotations

import weakref
from typing import Optional

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import SelectionResult
from ._host_arrays import _NUMPY_DTYPES, _fetch_all, _from_host, _Geometry, _host_array
from ._speculation import _take_hint
from .selector_inputs import ATTENTION_SELECTORS

ATTENTION_NAME = "pqcache"


def register() -> None:
    """Registers the "pqcache" attention function and its mask (SDPA's) with
    transformers. Idempotent; Session calls it."""
    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0, **kwargs):
    """The registered attention function. query [B, q_heads, T, D], key and
    value [B, kv_heads, L, D]; returns ([B, T, q_heads, D], None)."""
    session = getattr(module, "_pqcache_session", None)
    if session is None:
        raise RuntimeError(
            f"attention implementation {ATTENTION_NAME!r} on a module no open "
            "pqcache.transformers.Session serves: create one with Session(model, ...), or run "
            "the forward with an open Session's cache()")
    return session._attention.attend(module, query, key, value, attention_mask, scaling,
                                     dropout, kwargs)


class _ModelBinding:
    """A Session's hold on its model: the model's open Sessions (the
    attention implementation it had before the first of them comes back
    when the last one closes), and its attention layers, which point at the
    Session that serves the forward (module._pqcache_session)."""

    def __init__(self, model, session):
        self.model = model
        self.modules: list = []
        register()
        # A Session dropped without close leaves "pqcache" set: not taken as
        # the model's own.
        if not getattr(model, "_pqcache_open_sessions", None):
            model._pqcache_open_sessions = weakref.WeakSet()
            if model.config._attn_implementation != ATTENTION_NAME or \
                    not hasattr(model, "_pqcache_previous_attention"):
                model._pqcache_previous_attention = model.config._attn_implementation
        model._pqcache_open_sessions.add(session)

    def attach(self) -> None:
        """Switches the model to "pqcache" and finds its attention layers."""
        self.model.set_attn_implementation(ATTENTION_NAME)
        self.modules = [m for m in self.model.modules()
                        if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]

    def serve(self, session) -> None:
        """Points the model's attention layers at `session` (cheap when
        they already are)."""
        if self.modules and getattr(self.modules[0], "_pqcache_session", None) is not session:
            for m in self.modules:
                m._pqcache_session = session

    def release(self, session, still_open: bool) -> None:
        """Unbinds the attention layers from `session`; where it was still
        open, the last open Session restores the model's previous attention
        implementation. Idempotent."""
        for m in self.modules:
            if getattr(m, "_pqcache_session", None) is session:
                del m._pqcache_session
        self.modules = []
        model = self.model
        open_sessions = getattr(model, "_pqcache_open_sessions", None)
        if still_open and open_sessions is not None:
            open_sessions.discard(session)
            if not open_sessions:
                model.set_attn_implementation(model._pqcache_previous_attention)
                # Nothing of the Sessions stays on the model (a WeakSet would
                # not pickle with it).
                del model._pqcache_open_sessions, model._pqcache_previous_attention


class _LibraryAttention:
    """The attention function's work for one Session: `library_layer` maps
    model layers to library layers (the others keep SDPA), `table` holds
    the rows, `feed` gives their selectors what they observe."""

    def __init__(self, library_layer: dict, geometry: _Geometry, chunk_mode: str, table, feed):
        self.library_layer, self.geometry, self.chunk_mode = library_layer, geometry, chunk_mode
        self.table, self.feed = table, feed

    def attend(self, module, query, key, value, attention_mask, scaling, dropout, kwargs):
        if module.layer_idx not in self.library_layer:  # a sliding-window layer stays local
            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          dropout=dropout, scaling=scaling, **kwargs)
        if module.training and dropout > 0:
            raise ValueError("pqcache attention is for inference: call model.eval()")
        if kwargs.get("softcap") is not None:
            raise ValueError("pqcache attention does not support attention logit soft-capping")
        g = self.geometry
        layer = self.library_layer[module.layer_idx]
        scaling = g.head_dim ** -0.5 if scaling is None else scaling
        batch, _, tokens, _ = query.shape
        position_ids = kwargs.get("position_ids")
        out = torch.empty(batch, tokens, g.num_q_heads, g.head_dim,
                          dtype=query.dtype, device=query.device)
        for b in range(batch):
            row = self.table.state(b)
            start = None if position_ids is None else \
                int(position_ids[min(b, len(position_ids) - 1), 0])
            held = self._held(row, b, module.layer_idx, layer, start)
            if key.shape[2] == tokens:            # LibraryCache, or a first prompt chunk
                new_k, new_v = key[b, :, :tokens], value[b, :, :tokens]
                full = held == 0
            elif key.shape[2] >= held + tokens:   # a DynamicCache or StaticCache
                new_k, new_v = key[b, :, held:held + tokens], value[b, :, held:held + tokens]
                full = True
            else:
                raise ValueError(f"layer {module.layer_idx}: the cache returned {key.shape[2]} "
                                 f"keys for {tokens} new tokens at position {held}")
            targets = self.table.rows if self.table.broadcast else [row]
            if layer == 0:
                self.feed.give_classes(targets, b, held, tokens)
            mask = None
            if attention_mask is not None:
                mask = attention_mask[b:b + 1] if attention_mask.shape[0] > 1 else attention_mask
            # Every chunk of prefill_all_rows is prompt, whatever chunk_mode says
            # of forwards after it (and its tokens go to every row).
            prompt = tokens > 1 and (self.chunk_mode == "prefill" or self.table.broadcast)
            if held == 0 or prompt:
                if full:
                    k_all, v_all = key[b:b + 1], value[b:b + 1]
                else:  # earlier tokens live only in the library
                    k_old, v_old = _fetch_all(row, layer, held, g, key.dtype, key.device)
                    k_all = torch.cat([k_old, new_k], dim=1)[None]
                    v_all = torch.cat([v_old, new_v], dim=1)[None]
                _check_unpadded(mask, held + tokens, b)
                out[b] = sdpa_attention_forward(module, query[b:b + 1], k_all, v_all, mask,
                                                dropout=0.0, scaling=scaling, **kwargs)[0][0]
                for target in targets:
                    self._prefill(target, layer, query[b], new_k, new_v, scaling)
            else:
                self.feed.hand_over_window(row, layer)
                for i in range(tokens):
                    out[b, i] = self._decode_token(row, layer, query[b, :, i], new_k[:, i:i + 1],
                                                   new_v[:, i:i + 1], scaling)
        return out, None

    def _held(self, row, b: int, model_layer: int, layer: int, start: Optional[int]) -> int:
        """The tokens the library holds of batch row b in `layer` before
        this forward, which starts at position `start` (None: where the row
        is). A forward at position 0 starts the row anew."""
        held = row.lengths[layer]
        start = held if start is None else start
        if start == 0 and held > 0:
            if layer != 0:
                raise RuntimeError(f"batch row {b}: layer {model_layer} starts a new "
                                   "prompt but the first layer did not")
            self.table.reset(row)
            return 0
        if start != held:
            raise ValueError(_position_mismatch(b, model_layer, start, held))
        return held

    def _prefill(self, row, layer: int, query, new_k, new_v, scaling: float) -> None:
        row.ctx.prefill(row.seq, layer, _host_array(new_k), _host_array(new_v),
                        layout="head_major")
        row.lengths[layer] += new_k.shape[1]
        self.feed.observe_prompt(row, layer, query, scaling)

    def _selection(self, row, layer: int) -> SelectionResult:
        """The (reused) selection buffer of (row, layer), grown to the
        capacity the next select needs."""
        need = row.ctx.capacity(row.seq, layer)
        sel = row.selection.get(layer)
        if sel is None or sel.capacity < need:
            capacity = max(need, 2 * sel.capacity if sel is not None else need)
            sel = SelectionResult(self.geometry.num_kv_heads, capacity)
            row.selection[layer] = sel
        return sel

    def _fetch_buffers(self, row, layer: int, capacity: int):
        """The (reused) K and V buffers of (row, layer) for a selection of
        `capacity`; made only for rows that fetch (attending ones do not)."""
        bufs = row.fetched.get(layer)
        if bufs is None or bufs[0].shape[1] != capacity:
            g = self.geometry
            shape = (g.num_kv_heads, capacity, g.head_dim)
            np_dtype = _NUMPY_DTYPES[g.dtype]
            bufs = (np.zeros(shape, np_dtype), np.zeros(shape, np_dtype))
            row.fetched[layer] = bufs
        return bufs

    def _decode_token(self, row, layer: int, q, k1, v1, scaling: float) -> torch.Tensor:
        """One decode step of one row in one layer: q [q_heads, D], k1 and v1
        [kv_heads, 1, D]. Returns the attention output [q_heads, D]."""
        g = self.geometry
        ctx, seq = row.ctx, row.seq
        ctx.append(seq, layer, _host_array(k1), _host_array(v1), layout="head_major")
        row.lengths[layer] += 1
        sel = self._selection(row, layer)
        q_host = _host_array(q)
        ctx.select(seq, layer, q_host, out=sel)  # with a hint: counts its coverage
        sel = _take_hint(row, layer, sel, g.num_kv_heads)
        if row.selector not in ATTENTION_SELECTORS:
            # The library attends over its own store (pq_decode_attend): no
            # gathered copy, no torch operations per layer and token.
            out, _ = ctx.attend(seq, layer, q_host, sel, scale=scaling)
            return torch.from_numpy(out).to(q.device, q.dtype)
        # Selectors that learn from the attention weights need them per token.
        k_buf, v_buf = self._fetch_buffers(row, layer, sel.capacity)
        ctx.fetch(seq, layer, sel, out=(k_buf, v_buf))
        counts = sel.counts
        n = int(counts.max())
        keys = _from_host(k_buf[:, :n], g.dtype).to(q.device, torch.float32)
        values = _from_host(v_buf[:, :n], g.dtype).to(q.device, torch.float32)
        group = g.num_q_heads // g.num_kv_heads
        logits = torch.matmul(q.float().reshape(g.num_kv_heads, group, g.head_dim),
                              keys.transpose(1, 2)) * scaling          # [kv, group, n]
        if int(counts.min()) < n:
            invalid = torch.arange(n) >= torch.from_numpy(counts.astype(np.int64))[:, None]
            logits.masked_fill_(invalid.to(q.device)[:, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        observed = np.zeros(sel.positions.shape, np.float32)
        observed[:, :n] = probs.sum(dim=1).cpu().numpy()
        ctx.observe_attention(seq, layer, sel, observed)
        return torch.matmul(probs, values).reshape(g.num_q_heads, g.head_dim).to(q.dtype)


def _position_mismatch(row: int, layer: int, start: int, held: int) -> str:
    message = (f"batch row {row}, layer {layer}: the model is at position {start} but the "
               f"library holds {held} tokens of this sequence")
    if held == 0:
        return (message + ": a row new to the cache cannot continue a prompt; give a "
                "prefilled cache its extra rows first (cache.batch_repeat_interleave(n) for "
                "num_return_sequences or num_beams n)")
    if start < held:
        return (message + ": a DynamicCache or StaticCache cropped outside the Session leaves "
                "the library's tokens; crop a LibraryCache (session.cache()) instead, which "
                "truncates the library's sequences too")
    return message + ": rows must not be padded, and a new prompt starts at position 0"


def _check_unpadded(mask: Optional[torch.Tensor], visible: int, row: int) -> None:
    """A prompt's last query must see every earlier token: a padded row does not."""
    if mask is None:
        return
    last = mask[0, 0, -1, :visible]
    ok = bool(last.all()) if last.dtype == torch.bool else bool((last == 0).all())
    if not ok:
        raise ValueError(f"batch row {row} is padded (its mask hides earlier tokens): pqcache "
                         "rows must not be padded; run prompts of different lengths as "
                         "separate calls")
