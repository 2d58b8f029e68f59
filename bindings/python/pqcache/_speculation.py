"""pqcache.transformers' parts: speculation (Session(speculate=True)). At
each decode step, during model layer L-1, layer L's query is estimated from
layer L-1's attention input through layer L's query projection (its norm
and RoPE) and handed to pq_decode_speculate, as InfiniGen does; model
layers 0 and 1 are not speculated, as in its code. An InfiniGen row then
attends over the hint's tokens and the step's own (_take_hint)."""

from __future__ import annotations

import inspect

import torch

from . import SelectionResult
from ._host_arrays import _Geometry, _host_array


class _Speculation:
    """Hooks the attention module of every model layer L-1 whose layer L
    selects (L >= 2) to speculate for L. `session`: the Session whose
    forwards it serves (another open Session's forward passes by); `table`
    and `feed`: that Session's rows and selector feed."""

    def __init__(self, session, model, modules, library_layer: dict, geometry: _Geometry,
                 table, feed):
        base = getattr(model, "model", model)
        rotary = getattr(base, "rotary_emb", None)
        if rotary is None:
            raise ValueError("speculate=True needs the model's rotary embedding (model.model."
                             "rotary_emb) to place the estimated queries")
        typed = len(inspect.signature(rotary.forward).parameters) >= 3  # Gemma-3: per layer type
        self._rope = (lambda x, pos: rotary(x, pos, "full_attention")) if typed else rotary
        self._session, self._geometry, self._table, self._feed = session, geometry, table, feed
        self._hooks = []
        by_index = {m.layer_idx: m for m in modules}
        try:
            for layer, j in library_layer.items():
                if layer < 2 or layer - 1 not in by_index or layer not in by_index:
                    continue
                target = by_index[layer]
                self._hooks.append(by_index[layer - 1].register_forward_pre_hook(
                    lambda module, args, kwargs, target=target, j=j:
                        self._speculate(target, j, args, kwargs), with_kwargs=True))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Removes the hooks; idempotent."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _speculate(self, target, j: int, args, kwargs) -> None:
        if getattr(target, "_pqcache_session", None) is not self._session:
            return  # another open Session's cache runs this forward
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hidden is None or hidden.shape[1] != 1 or not self._table.rows:
            return  # a prompt chunk, or no rows yet: nothing to speculate for
        head_dim = self._geometry.head_dim
        with torch.no_grad():
            q = target.q_proj(hidden).view(hidden.shape[0], 1, -1, head_dim)
            if getattr(target, "q_norm", None) is not None:
                q = target.q_norm(q)
            q = q.transpose(1, 2)                                  # [B, H, 1, D]
            for b in range(hidden.shape[0]):
                row = self._table.state(b)
                position = row.lengths[j]
                if position == 0:
                    continue
                estimate = self._rotate(q[b:b + 1], hidden[b:b + 1], position)
                self._feed.hand_over_window(row, j)
                row.hints[j] = row.ctx.speculate(
                    row.seq, j, _host_array(estimate.to(self._geometry.dtype)))

    def _rotate(self, qb, hidden, position: int) -> torch.Tensor:
        """A row's projected query [1, H, 1, D] turned by RoPE to
        `position` (rotate-half): [H, D]."""
        pos = torch.tensor([[position]], device=hidden.device)
        cos, sin = self._rope(hidden, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        half = self._geometry.head_dim // 2
        rotated = torch.cat((-qb[..., half:], qb[..., :half]), dim=-1)
        return (qb * cos + rotated * sin)[0, :, 0]


def _take_hint(row, layer: int, sel: SelectionResult, kv_heads: int) -> SelectionResult:
    """A decode step of (row, layer) after its select: takes the layer's
    hint. InfiniGen attends over what it speculated, and the step's token;
    every other selector over `sel`."""
    hint = row.hints.pop(layer, None)
    if hint is None or row.selector != "infinigen":
        return sel
    n = row.lengths[layer]
    sel = SelectionResult(kv_heads, hint.capacity + 1)
    for h in range(kv_heads):
        c = int(hint.counts[h])
        sel.positions[h, :c] = hint.positions[h, :c]
        sel.positions[h, c] = n - 1
        sel.counts[h] = c + 1
    return sel
