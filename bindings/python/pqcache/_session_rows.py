"""pqcache.transformers' parts: a Session's batch rows, each a sequence of
a libpqcache context (the contexts, the sequence ids, what the Session
knows of each row), and the operations LibraryCache runs on them (crop,
forks for beams, checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import Context, SelectionResult
from ._host_arrays import _Geometry
from .selector_inputs import selector_name


@dataclass
class _Row:
    """One batch row: a sequence of a context, and what the session knows of it."""
    ctx: Context
    seq: int
    selector: str
    lengths: List[int]                       # tokens the library holds, per library layer
    # The last queries of the latest prompt chunk, per library layer, handed
    # to SnapKV-style selectors at the first decode step (only then is it
    # known which chunk ended the prompt).
    pending_window: Dict[int, np.ndarray] = field(default_factory=dict)
    # The windows of the latest prompt chunks, kept after the hand over, for
    # crop (see _PromptWindows).
    prompt_windows: Dict[int, "_PromptWindows"] = field(default_factory=dict)  # noqa: F821
    selection: Dict[int, SelectionResult] = field(default_factory=dict)
    fetched: Dict[int, tuple] = field(default_factory=dict)
    # speculate=True: each library layer's hint for the coming token
    # (pq_decode_speculate, made during the model layer before it).
    hints: Dict[int, SelectionResult] = field(default_factory=dict)


class _RowTable:
    """The contexts of a Session and its rows: one shared context whose
    sequence b is row b (made as rows appear), or with rows=[...] one
    context per row, each made with its dict of fields. A context that
    fails to open closes the ones made before it."""

    def __init__(self, geometry: _Geometry, config: dict, rows: Optional[Sequence[dict]]):
        self.geometry = geometry
        self.config = config
        self.rows: List[_Row] = []
        # Sequence ids are never reused: forks (beams, checkpoints) take new
        # ones, so row b's sequence is not always b (sequence(b) says).
        self._next_seq = 0 if rows is None else 1
        self.shared: Optional[Context] = None
        self.per_row = rows is not None
        self.broadcast = False  # prefill_all_rows: batch row 0's prompt goes to every row
        self.contexts: List[Context] = []
        try:
            if rows is None:
                self.shared = self._new_context(config)
            else:
                for fields in rows:
                    ctx = self._new_context({**config, **fields})
                    ctx.add_sequence(0)
                    self.rows.append(self._make_row(ctx, 0, {**config, **fields}))
        except BaseException:
            self.close()
            raise

    def _new_context(self, fields: dict) -> Context:
        ctx = Context(*self.geometry.context_args(), **fields)
        self.contexts.append(ctx)
        return ctx

    def _make_row(self, ctx: Context, seq: int, fields: dict) -> _Row:
        return _Row(ctx, seq, selector_name(fields.get("selector", "pq")),
                    [0] * self.geometry.layers)

    def new_seq(self) -> int:
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        return seq

    @property
    def open(self) -> bool:
        return bool(self.contexts)

    def close(self) -> None:
        """Frees the contexts (every row's sequence with them). Idempotent."""
        for ctx in self.contexts:
            ctx.close()
        self.contexts = []
        self.rows = []

    def state(self, b: int) -> _Row:
        """Batch row b, made (a new sequence of the shared context) if new."""
        while b >= len(self.rows):
            if self.per_row:
                raise ValueError(f"batch row {b}: this Session has {len(self.rows)} rows "
                                 "(one per dict in rows=)")
            seq = self.new_seq()
            self.shared.add_sequence(seq)
            self.rows.append(self._make_row(self.shared, seq, self.config))
        return self.rows[b]

    def reset(self, row: _Row) -> None:
        """A new prompt on this row: the library forgets the old sequence."""
        row.ctx.remove_sequence(row.seq)
        row.ctx.add_sequence(row.seq)
        row.lengths = [0] * len(row.lengths)
        row.pending_window.clear()
        row.prompt_windows.clear()
        row.hints.clear()

    def context(self, row: int) -> Context:
        return self.rows[row].ctx if self.per_row else self.shared

    def sequence(self, row: int) -> int:
        return self.rows[row].seq if self.per_row or row < len(self.rows) else row

    def length(self, row: int) -> int:
        return self.rows[row].lengths[0] if row < len(self.rows) else 0

    def remove(self, rows: Sequence[_Row]) -> None:
        """Removes the rows' sequences from their contexts."""
        for row in rows:
            if row.ctx in self.contexts:  # after close() the contexts hold nothing
                row.ctx.remove_sequence(row.seq)


class _RowForks:
    """crop, forks and checkpoints: LibraryCache's operations on a table's
    rows. A fork (pq_sequence_fork) shares the full chunks of its source
    copy-on-write. `feed` (the Session's _SelectorFeed) moves the prompt
    windows along with a crop."""

    def __init__(self, table: _RowTable, feed):
        self.table, self.feed = table, feed

    def truncate(self, batch: int, tokens: int) -> None:
        """Rows 0..batch-1 keep their first `tokens` tokens."""
        for row in self.table.rows[:batch]:
            if max(row.lengths) > tokens:
                row.ctx.truncate(row.seq, tokens)
            row.lengths = [min(n, tokens) for n in row.lengths]
            self.feed.crop_windows(row, tokens)

    def _fork(self, row: _Row) -> _Row:
        """A new sequence holding what `row` holds (pq_sequence_fork), with
        the Session's state of it; selection and fetch buffers are its own."""
        child = self.table.new_seq()
        row.ctx.fork(row.seq, child)
        return replace(row, seq=child, lengths=list(row.lengths),
                       pending_window=dict(row.pending_window),
                       prompt_windows={layer: windows.copy()
                                       for layer, windows in row.prompt_windows.items()},
                       selection={}, fetched={},
                       hints=dict(row.hints))

    def fork_all(self, rows: Sequence[_Row]) -> List[_Row]:
        """A fork of each row; none if one fails."""
        forks: List[_Row] = []
        try:
            for row in rows:
                forks.append(self._fork(row))
        except BaseException:
            self.table.remove(forks)
            raise
        return forks

    def take(self, batch: int, sources: List[int], operation: str) -> None:
        """Row i becomes row sources[i] of rows 0..batch-1. The first row
        to take a row keeps its sequence, each further one forks it; once
        rows move, the sequences of rows nothing takes are removed (and of
        rows past `batch`, left by an earlier, wider batch)."""
        bad = [s for s in sources if not 0 <= s < batch]
        if bad:
            raise IndexError(f"{operation}: row {bad[0]} does not exist; the cache has "
                             f"{batch} rows")
        if sources == list(range(batch)):
            return
        table = self.table
        if table.per_row:
            raise ValueError(
                f"{operation}: this Session gives each row a context of its own (rows=[...]), "
                "and a sequence forks only within its context; beam search and repeated rows "
                "need a Session with one context (no rows=)")
        repeated = [i for i, s in enumerate(sources) if s in sources[:i]]
        forks = self.fork_all([table.rows[sources[i]] for i in repeated])
        taken = {i: fork for i, fork in zip(repeated, forks)}
        rows = [taken[i] if i in taken else table.rows[s] for i, s in enumerate(sources)]
        kept = set(sources)
        table.remove([row for b, row in enumerate(table.rows) if b not in kept])
        table.rows = rows

    def checkpoint(self, batch: int) -> List[_Row]:
        """Forks of rows 0..batch-1, for a CacheCheckpoint."""
        return self.fork_all(self.table.rows[:batch])

    def rewind(self, saved: Sequence[_Row]) -> None:
        """The rows become forks of `saved` (a checkpoint's rows)."""
        table = self.table
        if table.per_row and len(saved) != len(table.rows):
            raise ValueError(f"rewind: the checkpoint has {len(saved)} rows, this Session "
                             f"{len(table.rows)} (one per dict in rows=)")
        forks = self.fork_all(saved)
        table.remove(table.rows)
        table.rows = forks
