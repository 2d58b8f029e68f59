"""pqcache.transformers' parts: what a Session's selectors need from the
model besides keys, values and the step's query (selector_inputs.py says
which selector needs what): the token classes of each forward's input ids
(FastGen), the prompt's attention (H2O's and Scissorhands' seeds), and the
prompt's last queries (SnapKV-style selectors), kept per prompt chunk so
that a crop hands over the queries that end the kept prompt."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ._host_arrays import _all_positions, _fetch_all, _Geometry, _host_array
from .selector_inputs import (LAYER_SHARING_SELECTORS, PROMPT_QUERY_SELECTORS,
                              TOKEN_CLASS_SELECTORS, token_class_table)


class _PromptWindows:
    """The last `size` prompt queries at the end of each of the latest
    prompt chunks of one library layer: runs (start, end, window), window
    [<= size, q_heads, D] ending at position end, borrowed from the chunk
    before where the chunk is shorter. A crop back to the end of a context
    after its question, or into the last chunk, so finds the queries that a
    single prefill of the kept tokens would hand to SnapKV-style selectors.
    Two runs cover a context and its question; a crop further back (or
    deeper than `size` tokens into a chunk) finds fewer queries or none."""

    KEPT = 2

    def __init__(self, size: int, runs: Sequence[tuple] = ()):
        self.size, self.runs = size, list(runs)

    def copy(self) -> "_PromptWindows":
        return _PromptWindows(self.size, self.runs)  # windows are never written to

    def add(self, start: int, end: int, latest: np.ndarray) -> np.ndarray:
        """A prompt chunk of positions start..end-1 whose last queries are
        `latest`; returns the window at its end."""
        if self.runs and self.runs[-1][1] == start and len(latest) < self.size:
            latest = np.concatenate([self.runs[-1][2], latest])[-self.size:]
        latest = np.ascontiguousarray(latest)
        self.runs = (self.runs + [(start, end, latest)])[-self.KEPT:]
        return latest

    def crop(self, tokens: int) -> Optional[np.ndarray]:
        """Forgets the queries at or after `tokens`. Returns the window that
        now ends the kept prompt where the cut removed a prompt chunk or
        fell inside one (to hand over again), else None."""
        cut = False
        while self.runs and self.runs[-1][0] >= tokens:
            self.runs.pop()
            cut = True
        if not self.runs or self.runs[-1][1] < tokens:
            return None  # decode tokens follow the last prompt chunk
        start, end, window = self.runs[-1]
        if end > tokens:
            own = end - start  # the chunk's queries are the window's last ones
            if own <= len(window) and len(self.runs) > 1 and self.runs[-2][1] == start:
                window = np.concatenate([self.runs[-2][2],
                                         window[len(window) - own:][:tokens - start]])
                window = window[-self.size:]
            else:
                window = window[:len(window) - (end - tokens)]
            self.runs.pop()
            if len(window) == 0:
                return None
            self.runs.append((start, tokens, np.ascontiguousarray(window)))
            cut = True
        return self.runs[-1][2] if cut else None


class _SelectorFeed:
    """Feeds a Session's rows what their selectors observe. `selectors`:
    the names of every row's selector; a selector that keeps tokens by class
    needs the tokenizer (the Session reads each forward's input_ids through
    a hook on the input embeddings, start())."""

    def __init__(self, tokenizer, selectors: set, geometry: _Geometry):
        classed = sorted(selectors & TOKEN_CLASS_SELECTORS)
        if classed and tokenizer is None:
            raise ValueError(f"selector {classed[0]} keeps special and punctuation tokens: pass "
                             "the model's tokenizer (Session(model, tokenizer=tok, ...))")
        self.geometry = geometry
        # Token id -> pq_token_class, and the ids of the forward in progress.
        self.class_table = token_class_table(tokenizer) if classed else None
        self._input_ids: Optional[torch.Tensor] = None
        self._ids_hook = None

    def start(self, model) -> None:
        """Reads the input ids of the model's forwards, where a row keeps
        tokens by class."""
        if self.class_table is not None:
            self._ids_hook = model.get_input_embeddings().register_forward_pre_hook(
                self._record_ids, with_kwargs=True)

    def close(self) -> None:
        if self._ids_hook is not None:
            self._ids_hook.remove()
            self._ids_hook = None

    def _record_ids(self, module, args, kwargs):
        ids = args[0] if args else kwargs.get("input")
        self._input_ids = ids if torch.is_tensor(ids) else None

    def give_classes(self, rows: Sequence, b: int, start: int, tokens: int) -> None:
        """The classes of this forward's tokens of batch row b, to those of
        `rows` whose selector keeps tokens by class (at the first library
        layer, before its K/V: FastGen profiles at the prompt's
        prefill_queries)."""
        if self.class_table is None:
            return
        for row in rows:
            if row.selector not in TOKEN_CLASS_SELECTORS:
                continue
            ids = self._input_ids
            if ids is None or ids.shape[-1] != tokens:
                raise ValueError(f"selector {row.selector} needs the token ids of every forward "
                                 "(the model was called without input_ids, e.g. with "
                                 "inputs_embeds)")
            ids = ids[min(b, ids.shape[0] - 1)].detach().cpu().numpy()
            row.ctx.token_classes(row.seq, start, self.class_table[ids])

    def observe_prompt(self, row, layer: int, query, scaling: float) -> None:
        """After a prompt chunk's prefill of (row, layer), its queries
        [q_heads, T, D]: H2O's and Scissorhands' seeds, the window of
        SnapKV-style selectors."""
        kv_heads = self.geometry.num_kv_heads
        if row.selector == "h2o":
            # H2O starts from the attention every prompt query paid (its
            # code accumulates the whole prompt's attention matrix).
            n = row.lengths[layer]
            keys, _ = _fetch_all(row, layer, n, self.geometry, torch.float32, query.device)
            sums = prompt_column_sums(query.float(), keys, n, scaling)
            row.ctx.observe_attention(row.seq, layer, _all_positions(kv_heads, n),
                                      sums.cpu().numpy())
        if row.selector == "scissorhands":
            # One step per prompt chunk, as cold-compress's Scissorhands cache
            # takes the prompt: each token's attention averaged over the
            # chunk's queries that see it (a hit: at least uniform).
            n = row.lengths[layer]
            tokens = query.shape[1]
            keys, _ = _fetch_all(row, layer, n, self.geometry, torch.float32, query.device)
            sums = prompt_column_sums(query.float(), keys, n, scaling).cpu().numpy()
            seen_by = n - np.maximum(np.arange(n), n - tokens)  # chunk queries at or after each token
            row.ctx.observe_attention(row.seq, layer, _all_positions(kv_heads, n),
                                      sums / seen_by)
        if row.selector in PROMPT_QUERY_SELECTORS:
            window = int(row.ctx.config()["observation_window"])
            # [q_heads, T, D] -> the last queries as [w, q_heads, D]; a short
            # last chunk borrows the rest from the prompt chunk just before
            # it (none when decode tokens came between: their queries are
            # not kept).
            latest = _host_array(query[:, -window:].transpose(0, 1))
            windows = row.prompt_windows.setdefault(layer, _PromptWindows(window))
            end = row.lengths[layer]
            row.pending_window[layer] = windows.add(end - query.shape[1], end, latest)

    def hand_over_window(self, row, layer: int) -> None:
        """Before a decode step of (row, layer): the prompt's last queries,
        if not handed over yet (pq_prefill_queries)."""
        # A selector that shares its budget across layers (ZigZagKV) needs
        # every layer's window before the first layer's first step: the
        # prompt has passed through every layer once a decode step starts.
        layers = (sorted(row.pending_window) if row.selector in LAYER_SHARING_SELECTORS
                  else [layer])
        for held in layers:
            window = row.pending_window.pop(held, None)
            if window is not None:
                row.ctx.prefill_queries(row.seq, held, window)

    def crop_windows(self, row, tokens: int) -> None:
        """The row was cut to `tokens` tokens."""
        for layer, windows in row.prompt_windows.items():
            # A prompt's end moved: its selector gets the queries that
            # end the kept prompt before the next decode step.
            window = windows.crop(tokens)
            if window is not None:
                row.pending_window[layer] = window
            elif not windows.runs or windows.runs[-1][1] != tokens:
                row.pending_window.pop(layer, None)


def prompt_column_sums(query: torch.Tensor, keys: torch.Tensor, n: int, scale: float,
                       block: int = 128) -> torch.Tensor:
    """H2O's seed: per kv head, the causal softmax attention of every query of
    a prompt chunk summed over the chunk and the GQA group, for each of the n
    stored tokens. query [q_heads, T, D] at positions n - T .. n - 1, keys
    [kv_heads, n, D] (float). Blocks of `block` queries keep the memory at
    q_heads x block x n floats; the work is the chunk's attention once more.
    Returns float32 [kv_heads, n]."""
    q_heads, tokens, dim = query.shape
    kv_heads = keys.shape[0]
    q = query.reshape(kv_heads, q_heads // kv_heads, tokens, dim)
    first = n - tokens
    sums = torch.zeros(kv_heads, n, dtype=torch.float32, device=query.device)
    for a in range(0, tokens, block):
        b = min(tokens, a + block)
        end = first + b  # the keys the block's last query sees
        logits = torch.einsum("hgtd,hnd->hgtn", q[:, :, a:b], keys[:, :end]) * scale
        positions = torch.arange(first + a, first + b, device=query.device)
        future = torch.arange(end, device=query.device)[None, :] > positions[:, None]
        logits.masked_fill_(future, float("-inf"))
        sums[:, :end] += torch.softmax(logits, dim=-1).sum(dim=(1, 2))
    return sums
