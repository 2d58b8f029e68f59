"""pqcache.transformers' parts: the transformers Cache of a Session
(LibraryCache): its selecting layers keep no keys or values (the library's
host store holds them), its others are transformers' own; crop, the batch
operations (beams) and checkpoints act on the Session's rows
(_session_rows.py)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, List

import torch
from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin,
                                      get_layer_types_and_kwargs)

from . import _Closing
from ._session_rows import _Row

if TYPE_CHECKING:
    from .transformers import Session


class _LibraryLayer(CacheLayerMixin):
    """A cache layer that keeps no keys or values: the library's host store
    holds them. update() returns just the new tokens' K/V; the attention
    function gets everything else from the library. crop and the batch
    operations only keep its count: LibraryCache does the library's part
    once for all layers (one truncate or fork covers every layer)."""

    is_sliding = False
    is_croppable = True

    def __init__(self):
        super().__init__()
        self.length = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.length += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int):
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0

    def reorder_cache(self, beam_idx) -> None:
        pass  # the rows are the library's sequences: LibraryCache reorders them

    def crop(self, tokens_to_remove: int) -> None:
        self.length += tokens_to_remove  # <= 0: LibraryCache.crop checked it and truncated

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass

    def batch_select_indices(self, indices) -> None:
        pass


class LibraryCache(Cache):
    """A transformers Cache for a Session's model: the selecting layers keep
    nothing (the library does), the others are transformers' dynamic layers
    of their type (sliding-window layers keep their window).

    Its rows are the Session's rows, which follow the cache that ran last:
    crop, the batch operations and checkpoint act on them, so use them on
    that cache. crop(-n) truncates the library's sequences; the batch
    operations (beam search, num_return_sequences) fork and remove them;
    checkpoint() and rewind() put the cache back exactly (see
    pqcache.transformers' module doc). A Session made with rows=[...] (a
    context per row) can crop and checkpoint but not move rows between
    contexts."""

    def __init__(self, session: "Session"):
        layer_types, layer_kwargs = get_layer_types_and_kwargs(session.text_config)
        layers = [_LibraryLayer() if i in session.library_layer
                  else DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs)
                  for i, (kind, kwargs) in enumerate(zip(layer_types, layer_kwargs))]
        super().__init__(layers=layers)
        self._session = session
        self._batch = 0  # rows of the forwards this cache ran (0 before the first)

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        # Every attention layer updates its cache before it attends: the
        # Session of this cache serves the forward, even where another
        # Session on the same model was made (or used) after it.
        self._session._serve()
        self._batch = key_states.shape[0]
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    # --- dropping tokens, moving rows --------------------------------------

    def library_length(self) -> int:
        """Tokens every row holds in the library: the selecting layers'
        count, which crop and rewind move with the library's sequences."""
        return next(layer.length for layer in self.layers if isinstance(layer, _LibraryLayer))

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last -tokens_to_remove tokens of every row (transformers
        5's convention: a negative count; 0 only trims sliding windows):
        pq_sequence_truncate on each row's sequence, and transformers' crop
        on the other layers. To go back to a length L:
        cache.crop(L - cache.library_length())."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): give the number of tokens to drop as "
                             "a negative count (transformers 5's crop); to keep L tokens, "
                             "crop(L - cache.library_length())")
        length = self.library_length()
        keep = length + tokens_to_remove
        if keep < 0:
            raise ValueError(f"crop({tokens_to_remove}): the cache holds {length} tokens")
        if tokens_to_remove == 0:
            super().crop(0)
            return
        for i, layer in enumerate(self.layers):
            # Checked before anything changes: transformers' own check would
            # come after the library had dropped its tokens.
            if (getattr(layer, "is_sliding", False) and layer.is_initialized
                    and layer.get_seq_length() >= layer.sliding_window
                    and not getattr(layer, "record_past", False)):
                raise RuntimeError(
                    f"crop({tokens_to_remove}): sliding-window layer {i} has dropped the tokens "
                    "before its window, so it cannot go back: call "
                    "cache.activate_past_recording() before the tokens to drop come, or use "
                    "cache.checkpoint() and cache.rewind()")
        self._session._forks.truncate(self._rows_in_use("crop", length), keep)
        super().crop(tokens_to_remove)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row becomes `repeats` adjacent rows (generate's expansion for
        num_beams and num_return_sequences, done on an already prefilled
        cache): the copies are forks of the row's sequence."""
        if repeats < 1:
            raise ValueError(f"batch_repeat_interleave({repeats}): expected repeats >= 1")
        self._move_rows([row for row in range(self._batch) for _ in range(repeats)],
                        "batch_repeat_interleave")
        super().batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices) -> None:
        """Keeps the rows `indices` (a sequence of row numbers or a boolean
        mask), in that order; a row named twice is forked."""
        rows = torch.as_tensor(indices)
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        self._move_rows(rows.tolist(), "batch_select_indices")
        super().batch_select_indices(indices)

    def reorder_cache(self, beam_idx) -> None:
        """Beam search: row i continues row beam_idx[i]. The first row to
        continue a row takes its sequence, each further one forks it, and a
        row no beam continues is removed."""
        self._move_rows(torch.as_tensor(beam_idx).tolist(), "reorder_cache")
        super().reorder_cache(beam_idx)

    def _move_rows(self, sources: List[int], operation: str) -> None:
        if self._batch == 0:
            return  # no forward yet: there are no rows to move
        self._session._forks.take(self._rows_in_use(operation, self.library_length()),
                                  sources, operation)
        self._batch = len(sources)

    def _rows_in_use(self, operation: str, length: int) -> int:
        """This cache's row count, after checking that the Session's rows
        still hold its tokens (another cache of the Session may have started
        a prompt since)."""
        for b in range(self._batch):
            held = self._session.length(b)
            if held != length:
                raise ValueError(
                    f"{operation}: this cache holds {length} tokens but the Session's row {b} "
                    f"holds {held}: another cache of the Session ran since; a Session's rows "
                    "follow the cache that ran last")
        return self._batch

    # --- exact reuse ---------------------------------------------------------

    def checkpoint(self) -> "CacheCheckpoint":
        """The cache as it is now, for rewind(): every row's sequence forked
        (full 256-token chunks are shared, not copied) and copies of
        transformers' own layers. Close it when done (the Session's close
        frees it too)."""
        session = self._session
        session._serve()
        rows = session._forks.checkpoint(self._rows_in_use("checkpoint", self.library_length()))
        layers = [None if isinstance(layer, _LibraryLayer) else copy.deepcopy(layer)
                  for layer in self.layers]
        return CacheCheckpoint(session, rows, layers, self.library_length(), self._batch)

    def rewind(self, checkpoint: "CacheCheckpoint") -> None:
        """Puts the cache back as it was at checkpoint() (its rows become
        forks of the checkpoint's, which stays usable for the next rewind).
        Unlike crop, nothing the selectors saw since survives."""
        if checkpoint.session is not self._session:
            raise ValueError("rewind: the checkpoint was made by another Session's cache")
        if checkpoint.rows is None:
            raise ValueError("rewind: the checkpoint is closed")
        self._session._forks.rewind(checkpoint.rows)
        for i, saved in enumerate(checkpoint.layers):
            if saved is None:
                self.layers[i].length = checkpoint.length
            else:
                self.layers[i] = copy.deepcopy(saved)  # the checkpoint stays as it was
        self._batch = checkpoint.batch

    def __deepcopy__(self, memo):
        raise TypeError(
            "a pqcache LibraryCache cannot be deep-copied: its rows are sequences in its "
            "Session's library contexts. To reuse a prefilled prompt, use "
            "checkpoint = cache.checkpoint() and cache.rewind(checkpoint), or "
            "cache.crop(L - cache.library_length())")


class CacheCheckpoint(_Closing):
    """What LibraryCache.checkpoint() returns: a fork of each row's sequence
    (held in the Session's contexts, not visible as rows), the Session's
    state of each row, and copies of the cache's transformers layers.
    close() (or a `with` block, or the garbage collector) frees the forked
    sequences."""

    def __init__(self, session: "Session", rows: List[_Row], layers: list, length: int,
                 batch: int):
        self.session, self.rows, self.layers = session, rows, layers
        self.length, self.batch = length, batch

    def close(self) -> None:
        """Frees the forked sequences; idempotent. After the Session's close
        there is nothing left to free."""
        rows, self.rows = self.rows, None
        if rows:
            self.session._table.remove(rows)

