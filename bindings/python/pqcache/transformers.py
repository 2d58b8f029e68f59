"""libpqcache inside Hugging Face transformers: selective attention for
`model.generate` and any forward pass.

    import pqcache.transformers as pqt

    with pqt.Session(model, selector="pq", topk_fraction=0.2) as session:
        out = model.generate(input_ids, max_new_tokens=64, do_sample=False,
                             past_key_values=session.cache())

A Session registers the attention implementation "pqcache" (transformers'
AttentionInterface) and switches the model to it. In every layer that
attends over the whole sequence:

- a prompt (or a prompt chunk) runs full attention (SDPA), as PQCache's
  prefill does, and its keys and values are handed to the library
  (pq_prefill_layer), which copies them to host memory and builds the PQ
  index in the background;
- each decode token is appended to the library (pq_decode_append), the
  library selects the sink tokens, the top-k middle tokens and the local
  window for the token's query (pq_decode_select), fetches their keys and
  values (pq_fetch_kv), and the token attends over those rows only.

Sliding-window layers (Gemma-3's local layers) keep their own attention and
cache: selection applies to the global layers. Llama, Qwen2, Mistral (with
sliding_window None) and Gemma-3 are tested; any decoder whose attention
goes through AttentionInterface and passes position_ids should work.

Caches. `session.cache()` returns a LibraryCache: its selecting layers hold
no keys or values at all (the library's host store holds them, which is the
point of PQCache), its sliding layers are transformers' own. A DynamicCache
or StaticCache works too (then the model keeps a full copy as well).

Reuse and beams. A LibraryCache's crop(-n) truncates every row's sequence in
the library (pq_sequence_truncate), so a cache prefilled with one context
can be cropped back to it and asked another question (kvpress's
one-context-many-questions pattern, assisted generation's rollback). Its
batch_repeat_interleave, batch_select_indices and reorder_cache (beam
search, num_return_sequences on a prefilled cache) fork sequences
(pq_sequence_fork: full chunks shared copy-on-write) and remove the rows no
longer used. checkpoint() and rewind() put a cache back exactly, for every
selector, through forks; crop leaves H2O, Scissorhands, Keyformer, FastGen,
ClusterKV and Random with what they learnt from the dropped steps (the
library's truncate keeps it).

Several Sessions on one model. Each may stay open: a forward reaches the
Session whose cache it runs (the LibraryCache binds the model's attention
layers to its Session as the forward enters them), whichever was made
last, and the model returns to its previous attention implementation when
the last open Session closes. A forward with another cache, or none, goes
to the Session that served the model last.

Batches. Row b of the batch is sequence b of one context, or, with
`rows=[{...}, {...}]`, row b gets a context of its own configured by
rows[b] (compare selectors in one batched forward). Rows must not be padded:
all rows of a call have the same positions.

Rotary layout. The Session tells the library how the model lays out its
rotary pairs (config.key_rotary), so that each PQ subspace holds both halves
of every pair: "half" (x_i with x_{i+D/2}, transformers' rotate-half RoPE:
Llama, Qwen2, Mistral, Gemma-3) for models whose RoPE turns every dimension,
"interleaved" for GPT-J-style models, "none" for partial rotary embeddings
(the pairing would not cover the head) and models without RoPE. Keys,
queries and what the library returns keep the model's order; only which
tokens PQ picks changes (docs/quality.md measures it). key_rotary=... in the
config overrides the choice.

A multi-token forward after the prompt (a new turn, chunked prefill) is
another prompt chunk by default (chunk_mode="prefill": full attention, the
index rebuilt over all tokens). With chunk_mode="decode" each of its tokens
is a decode step with its own selection, exactly as if the tokens came one
at a time: teacher-forced scoring and speculative-decoding verification in
one forward.

Requires torch and transformers (5.x); `import pqcache` alone does not.
Device tensors work but cross host memory: the Python binding hands the
library host buffers (the CUDA backend's device path is the C API's).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence

import numpy as np

# The versions requirements-eval.txt pins (a test keeps the two in step): the
# message below names them for a wheel user, who has no requirements file.
_REQUIRED = ("torch==2.15.0", "transformers==5.23.0")
try:
    import torch
    from transformers import AttentionInterface
    from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin,
                                          get_layer_types_and_kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in ("torch", "transformers"):
        raise
    raise ModuleNotFoundError(
        f"pqcache.transformers needs torch and transformers, and {missing.name!r} is not "
        f"installed: pip install {' '.join(_REQUIRED)} (the tested versions; in a source tree, "
        "pip install -r requirements-eval.txt installs them). `import pqcache` works without "
        "them.", name=missing.name) from missing

from . import Context, SelectionResult, _Closing
from .selector_inputs import (ATTENTION_SELECTORS, LAYER_SHARING_SELECTORS, PROMPT_QUERY_SELECTORS,
                              TOKEN_CLASS_SELECTORS, selector_name, token_class_table)

__all__ = ["ATTENTION_NAME", "Session", "LibraryCache", "CacheCheckpoint", "register",
           "attention_forward", "model_key_rotary", "prompt_column_sums"]

ATTENTION_NAME = "pqcache"
CHUNK_MODES = ("prefill", "decode")
_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}


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
    return session._attend(module, query, key, value, attention_mask, scaling, dropout, kwargs)


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a tensor on the host (a copy only for device tensors);
    bf16 as its uint16 bits, the binding's convention."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _from_host(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


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
    prompt_windows: Dict[int, "_PromptWindows"] = field(default_factory=dict)
    selection: Dict[int, SelectionResult] = field(default_factory=dict)
    fetched: Dict[int, tuple] = field(default_factory=dict)
    # speculate=True: each library layer's hint for the coming token
    # (pq_decode_speculate, made during the model layer before it).
    hints: Dict[int, SelectionResult] = field(default_factory=dict)


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
    checkpoint() and rewind() put the cache back exactly (see the module
    doc). A Session made with rows=[...] (a context per row) can crop and
    checkpoint but not move rows between contexts."""

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
        self._session._truncate_rows(self._rows_in_use("crop", length), keep)
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
        self._session._take_rows(self._rows_in_use(operation, self.library_length()), sources,
                                 operation)
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
        rows = session._checkpoint_rows(self._rows_in_use("checkpoint", self.library_length()))
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
        self._session._rewind_rows(checkpoint.rows)
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
            self.session._remove_rows(rows)


class Session:
    """Binds libpqcache contexts to a model's attention layers.

    model: a transformers causal LM (float32, float16 or bfloat16 weights).
    config: pq_config fields by name (selector, topk_fraction, sink_tokens,
        local_tokens, pq_subspaces, ...); one context for every batch row.
    rows: instead, one dict of fields per batch row, each row its own context
        (fields in `config` are the defaults of every row).
    rope_pairs: the pre-0.7 spelling of key_rotary: True is "half", False
        "none"; None (default) leaves key_rotary to the config or to the
        model's rotary layout (see the module doc).
    chunk_mode: what a multi-token forward after the prompt is: "prefill"
        (default) or "decode" (every token selects; see the module doc).
    tokenizer: the model's tokenizer, for selectors that keep tokens by
        class (FastGen: special tokens, punctuation); required for them.
        The Session reads each forward's input_ids (a hook on the input
        embeddings) and gives the library their classes.
    speculate: at each decode step, during model layer L-1, estimate layer
        L's query from layer L-1's attention input through layer L's query
        projection (its norm and RoPE) and hand it to pq_decode_speculate,
        as InfiniGen does (model layers 0 and 1 are not speculated, as in
        its code). An InfiniGen row then attends over the hint's tokens and
        the step's own; every row's select counts the hint's coverage
        (stats: hint_tokens, hint_covered).

    Threading: a Session serves one forward at a time, like the model.
    """

    def __init__(self, model, *, rows: Optional[Sequence[dict]] = None,
                 chunk_mode: str = "prefill", rope_pairs: Optional[bool] = None,
                 tokenizer=None, speculate: bool = False, **config):
        if chunk_mode not in CHUNK_MODES:
            raise ValueError(f"chunk_mode {chunk_mode!r}; expected one of {CHUNK_MODES}")
        if rows is not None and len(rows) == 0:
            raise ValueError("rows is empty: give one dict of pq_config fields per batch row")
        text_config = model.config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(text_config)
        selecting = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
        if not selecting:
            raise ValueError(
                f"no layer of this model attends over the whole sequence (layer types "
                f"{sorted(set(layer_types))}): nothing for pqcache to select. A Mistral-style "
                "config with sliding_window set makes every layer local; set it to None")
        dtype = getattr(model, "dtype", torch.float32)
        if dtype not in _DTYPES:
            raise ValueError(f"model dtype {dtype}: expected float32, float16 or bfloat16")
        q_heads = text_config.num_attention_heads
        kv_heads = getattr(text_config, "num_key_value_heads", None) or q_heads
        head_dim = (getattr(text_config, "head_dim", None)
                    or text_config.hidden_size // text_config.num_attention_heads)
        self.model = model
        self.text_config = text_config
        self.chunk_mode = chunk_mode
        self.dtype = dtype
        self.num_q_heads, self.num_kv_heads, self.head_dim = q_heads, kv_heads, head_dim
        # model layer index -> library layer index (only selecting layers).
        self.library_layer = {layer: j for j, layer in enumerate(selecting)}
        self._geometry = (len(selecting), q_heads, kv_heads, head_dim, _DTYPES[dtype])
        if rope_pairs is not None:
            if "key_rotary" in config:
                raise ValueError("give key_rotary or rope_pairs, not both")
            config["key_rotary"] = "half" if rope_pairs else "none"
        config.setdefault("key_rotary", model_key_rotary(text_config, head_dim))
        self._config = dict(config)
        selectors = {selector_name(fields.get("selector", config.get("selector", "pq")))
                     for fields in (rows if rows is not None else [config])}
        classed = sorted(selectors & TOKEN_CLASS_SELECTORS)
        if classed and tokenizer is None:
            raise ValueError(f"selector {classed[0]} keeps special and punctuation tokens: pass "
                             "the model's tokenizer (Session(model, tokenizer=tok, ...))")
        # Token id -> pq_token_class, and the ids of the forward in progress.
        self._class_table = token_class_table(tokenizer) if classed else None
        self._input_ids: Optional[torch.Tensor] = None
        self._ids_hook = None
        self._rows: List[_Row] = []
        # Sequence ids are never reused: forks (beams, checkpoints) take new
        # ones, so row b's sequence is not always b (sequence(b) says).
        self._next_seq = 0 if rows is None else 1
        self._shared: Optional[Context] = None
        self._per_row = rows is not None
        self._broadcast = False  # prefill_all_rows: batch row 0's prompt goes to every row
        self._contexts: List[Context] = []
        try:
            if rows is None:
                self._shared = self._new_context(self._config)
            else:
                for fields in rows:
                    ctx = self._new_context({**self._config, **fields})
                    ctx.add_sequence(0)
                    self._rows.append(self._row(ctx, 0, {**self._config, **fields}))
        except BaseException:
            self._close_contexts()
            raise
        register()
        # The model's open Sessions: the attention implementation it had
        # before the first of them comes back when the last one closes (a
        # Session dropped without close leaves "pqcache" set: not taken as
        # the model's own).
        if not getattr(model, "_pqcache_open_sessions", None):
            model._pqcache_open_sessions = weakref.WeakSet()
            if model.config._attn_implementation != ATTENTION_NAME or \
                    not hasattr(model, "_pqcache_previous_attention"):
                model._pqcache_previous_attention = model.config._attn_implementation
        model._pqcache_open_sessions.add(self)
        self._modules: list = []
        self._speculation_hooks = []
        try:
            model.set_attn_implementation(ATTENTION_NAME)
            self._modules = [m for m in model.modules()
                             if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
            self._serve()
            if self._class_table is not None:
                self._ids_hook = model.get_input_embeddings().register_forward_pre_hook(
                    self._record_ids, with_kwargs=True)
            if speculate:
                self._start_speculating(model)
        except BaseException:
            self.close()
            raise

    # --- lifetime ----------------------------------------------------------

    def _new_context(self, fields: dict) -> Context:
        ctx = Context(*self._geometry, **fields)
        self._contexts.append(ctx)
        return ctx

    def _row(self, ctx: Context, seq: int, fields: dict) -> _Row:
        return _Row(ctx, seq, selector_name(fields.get("selector", "pq")),
                    [0] * len(self.library_layer))

    def _close_contexts(self) -> None:
        for ctx in self._contexts:
            ctx.close()
        self._contexts = []

    def _serve(self) -> None:
        """Points the model's attention layers at this Session (cheap when
        they already are)."""
        if not self._contexts:
            raise ValueError("this pqcache.transformers.Session is closed: its cache cannot "
                             "run a forward; make a new Session")
        if self._modules and getattr(self._modules[0], "_pqcache_session", None) is not self:
            for m in self._modules:
                m._pqcache_session = self

    def close(self) -> None:
        """Frees the contexts; the last open Session on the model restores
        its previous attention implementation. Idempotent."""
        for m in self._modules:
            if getattr(m, "_pqcache_session", None) is self:
                del m._pqcache_session
        self._modules = []
        if self._ids_hook is not None:
            self._ids_hook.remove()
            self._ids_hook = None
        for hook in getattr(self, "_speculation_hooks", []):
            hook.remove()
        self._speculation_hooks = []
        open_sessions = getattr(self.model, "_pqcache_open_sessions", None)
        if self._contexts and open_sessions is not None:
            open_sessions.discard(self)
            if not open_sessions:
                self.model.set_attn_implementation(self.model._pqcache_previous_attention)
                # Nothing of the Sessions stays on the model (a WeakSet would
                # not pickle with it).
                del self.model._pqcache_open_sessions, self.model._pqcache_previous_attention
        self._close_contexts()
        self._rows = []

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- what callers use ---------------------------------------------------

    def cache(self) -> LibraryCache:
        """A new LibraryCache for one generate call or forward series (a
        forward at position 0 starts the rows anew). To reuse a prefilled
        prompt, keep the cache and crop it, or checkpoint and rewind it."""
        return LibraryCache(self)

    def context(self, row: int = 0) -> Context:
        """The context serving batch row `row`."""
        return self._rows[row].ctx if self._per_row else self._shared

    def sequence(self, row: int = 0) -> int:
        """The library sequence id of batch row `row` within context(row)
        (a fork, for beams or a rewind, gets a new one)."""
        return self._rows[row].seq if self._per_row or row < len(self._rows) else row

    def length(self, row: int = 0) -> int:
        """Tokens the library holds for batch row `row` (0 before its prompt)."""
        return self._rows[row].lengths[0] if row < len(self._rows) else 0

    def prefill_all_rows(self, input_ids: torch.Tensor, chunk_tokens: int = 2048):
        """Runs one prompt once (batch 1, full attention, in chunks of
        chunk_tokens) and hands its keys and values to the context of every
        row, so that all rows (all selectors of `rows=`) continue from the
        same prompt without each paying its prefill. Returns the
        LibraryCache for a batch of all rows and the logits of the prompt's
        last token [vocab]."""
        if not self._per_row:
            raise ValueError("prefill_all_rows needs a Session made with rows=[...]")
        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
            raise ValueError(f"prefill_all_rows takes one prompt, got input_ids of shape "
                             f"{tuple(input_ids.shape)}")
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens {chunk_tokens}: expected >= 1")
        for row in self._rows:
            self._reset(row)
        cache = LibraryCache(self)
        self._broadcast = True
        try:
            for start in range(0, input_ids.shape[1], chunk_tokens):
                with torch.no_grad():  # no autograd graph across chunks
                    out = self.model(input_ids[:, start:start + chunk_tokens],
                                     past_key_values=cache, use_cache=True, logits_to_keep=1)
        finally:
            self._broadcast = False
        for layer in cache.layers:
            if not isinstance(layer, _LibraryLayer) and layer.is_initialized:
                layer.batch_repeat_interleave(len(self._rows))
        cache._batch = len(self._rows)  # its forwards ran one row, for all of them
        return cache, out.logits[0, -1]

    # --- the attention function's work -----------------------------------

    def _start_speculating(self, model) -> None:
        """Hooks the attention module of every model layer L-1 whose layer L
        selects (L >= 2) to speculate for L."""
        base = getattr(model, "model", model)
        rotary = getattr(base, "rotary_emb", None)
        if rotary is None:
            raise ValueError("speculate=True needs the model's rotary embedding (model.model."
                             "rotary_emb) to place the estimated queries")
        import inspect

        typed = len(inspect.signature(rotary.forward).parameters) >= 3  # Gemma-3: per layer type
        self._rope = (lambda x, pos: rotary(x, pos, "full_attention")) if typed else rotary
        by_index = {m.layer_idx: m for m in self._modules}
        for layer, j in self.library_layer.items():
            if layer < 2 or layer - 1 not in by_index or layer not in by_index:
                continue
            target = by_index[layer]
            self._speculation_hooks.append(by_index[layer - 1].register_forward_pre_hook(
                lambda module, args, kwargs, target=target, j=j:
                    self._speculate(target, j, args, kwargs), with_kwargs=True))

    def _speculate(self, target, j: int, args, kwargs) -> None:
        if getattr(target, "_pqcache_session", None) is not self:
            return  # another open Session's cache runs this forward
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hidden is None or hidden.shape[1] != 1 or not self._rows:
            return  # a prompt chunk, or no rows yet: nothing to speculate for
        with torch.no_grad():
            q = target.q_proj(hidden).view(hidden.shape[0], 1, -1, self.head_dim)
            if getattr(target, "q_norm", None) is not None:
                q = target.q_norm(q)
            q = q.transpose(1, 2)                                  # [B, H, 1, D]
            for b in range(hidden.shape[0]):
                row = self._row_state(b)
                position = row.lengths[j]
                if position == 0:
                    continue
                pos = torch.tensor([[position]], device=hidden.device)
                cos, sin = self._rope(hidden[b:b + 1], pos)
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
                half = self.head_dim // 2
                qb = q[b:b + 1]
                rotated = torch.cat((-qb[..., half:], qb[..., :half]), dim=-1)
                estimate = (qb * cos + rotated * sin)[0, :, 0]      # [H, D]
                self._hand_over_window(row, j)
                row.hints[j] = row.ctx.speculate(row.seq, j, _host_array(estimate.to(self.dtype)))

    def _record_ids(self, module, args, kwargs):
        ids = args[0] if args else kwargs.get("input")
        self._input_ids = ids if torch.is_tensor(ids) else None

    def _give_classes(self, row: _Row, b: int, start: int, tokens: int) -> None:
        """The classes of this forward's tokens of batch row b (at the first
        library layer, before its K/V: FastGen profiles at the prompt's
        prefill_queries)."""
        ids = self._input_ids
        if ids is None or ids.shape[-1] != tokens:
            raise ValueError(f"selector {row.selector} needs the token ids of every forward "
                             "(the model was called without input_ids, e.g. with inputs_embeds)")
        ids = ids[min(b, ids.shape[0] - 1)].detach().cpu().numpy()
        row.ctx.token_classes(row.seq, start, self._class_table[ids])

    def _row_state(self, b: int) -> _Row:
        while b >= len(self._rows):
            if self._per_row:
                raise ValueError(f"batch row {b}: this Session has {len(self._rows)} rows "
                                 "(one per dict in rows=)")
            seq = self._new_seq()
            self._shared.add_sequence(seq)
            self._rows.append(self._row(self._shared, seq, self._config))
        return self._rows[b]

    def _new_seq(self) -> int:
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        return seq

    def _reset(self, row: _Row) -> None:
        """A new prompt on this row: the library forgets the old sequence."""
        row.ctx.remove_sequence(row.seq)
        row.ctx.add_sequence(row.seq)
        row.lengths = [0] * len(row.lengths)
        row.pending_window.clear()
        row.prompt_windows.clear()
        row.hints.clear()

    # --- crop, forks and checkpoints (LibraryCache's operations) -----------

    def _truncate_rows(self, batch: int, tokens: int) -> None:
        """Rows 0..batch-1 keep their first `tokens` tokens."""
        for row in self._rows[:batch]:
            if max(row.lengths) > tokens:
                row.ctx.truncate(row.seq, tokens)
            row.lengths = [min(n, tokens) for n in row.lengths]
            for layer, windows in row.prompt_windows.items():
                # A prompt's end moved: its selector gets the queries that
                # end the kept prompt before the next decode step.
                window = windows.crop(tokens)
                if window is not None:
                    row.pending_window[layer] = window
                elif not windows.runs or windows.runs[-1][1] != tokens:
                    row.pending_window.pop(layer, None)

    def _fork_row(self, row: _Row) -> _Row:
        """A new sequence holding what `row` holds (pq_sequence_fork), with
        the Session's state of it; selection and fetch buffers are its own."""
        child = self._new_seq()
        row.ctx.fork(row.seq, child)
        return replace(row, seq=child, lengths=list(row.lengths),
                       pending_window=dict(row.pending_window),
                       prompt_windows={layer: windows.copy()
                                       for layer, windows in row.prompt_windows.items()},
                       selection={}, fetched={},
                       hints=dict(row.hints))

    def _fork_rows(self, rows: Sequence[_Row]) -> List[_Row]:
        forks: List[_Row] = []
        try:
            for row in rows:
                forks.append(self._fork_row(row))
        except BaseException:
            self._remove_rows(forks)
            raise
        return forks

    def _remove_rows(self, rows: Sequence[_Row]) -> None:
        for row in rows:
            if row.ctx in self._contexts:  # after close() the contexts hold nothing
                row.ctx.remove_sequence(row.seq)

    def _take_rows(self, batch: int, sources: List[int], operation: str) -> None:
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
        if self._per_row:
            raise ValueError(
                f"{operation}: this Session gives each row a context of its own (rows=[...]), "
                "and a sequence forks only within its context; beam search and repeated rows "
                "need a Session with one context (no rows=)")
        repeated = [i for i, s in enumerate(sources) if s in sources[:i]]
        forks = self._fork_rows([self._rows[sources[i]] for i in repeated])
        taken = {i: fork for i, fork in zip(repeated, forks)}
        rows = [taken[i] if i in taken else self._rows[s] for i, s in enumerate(sources)]
        kept = set(sources)
        self._remove_rows([row for b, row in enumerate(self._rows) if b not in kept])
        self._rows = rows

    def _checkpoint_rows(self, batch: int) -> List[_Row]:
        return self._fork_rows(self._rows[:batch])

    def _rewind_rows(self, saved: Sequence[_Row]) -> None:
        """The rows become forks of `saved` (a checkpoint's rows)."""
        if self._per_row and len(saved) != len(self._rows):
            raise ValueError(f"rewind: the checkpoint has {len(saved)} rows, this Session "
                             f"{len(self._rows)} (one per dict in rows=)")
        forks = self._fork_rows(saved)
        self._remove_rows(self._rows)
        self._rows = forks

    def _attend(self, module, query, key, value, attention_mask, scaling, dropout, kwargs):
        if module.layer_idx not in self.library_layer:  # a sliding-window layer stays local
            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          dropout=dropout, scaling=scaling, **kwargs)
        if module.training and dropout > 0:
            raise ValueError("pqcache attention is for inference: call model.eval()")
        if kwargs.get("softcap") is not None:
            raise ValueError("pqcache attention does not support attention logit soft-capping")
        layer = self.library_layer[module.layer_idx]
        scaling = self.head_dim ** -0.5 if scaling is None else scaling
        batch, _, tokens, _ = query.shape
        position_ids = kwargs.get("position_ids")
        out = torch.empty(batch, tokens, self.num_q_heads, self.head_dim,
                          dtype=query.dtype, device=query.device)
        for b in range(batch):
            row = self._row_state(b)
            held = row.lengths[layer]
            start = held if position_ids is None else int(position_ids[min(b, len(position_ids) - 1), 0])
            if start == 0 and held > 0:
                if layer != 0:
                    raise RuntimeError(f"batch row {b}: layer {module.layer_idx} starts a new "
                                       "prompt but the first layer did not")
                self._reset(row)
                held = 0
            elif start != held:
                raise ValueError(_position_mismatch(b, module.layer_idx, start, held))
            if key.shape[2] == tokens:            # LibraryCache, or a first prompt chunk
                new_k, new_v = key[b, :, :tokens], value[b, :, :tokens]
                full = held == 0
            elif key.shape[2] >= held + tokens:   # a DynamicCache or StaticCache
                new_k, new_v = key[b, :, held:held + tokens], value[b, :, held:held + tokens]
                full = True
            else:
                raise ValueError(f"layer {module.layer_idx}: the cache returned {key.shape[2]} "
                                 f"keys for {tokens} new tokens at position {held}")
            if layer == 0 and self._class_table is not None:
                for target in (self._rows if self._broadcast else [row]):
                    if target.selector in TOKEN_CLASS_SELECTORS:
                        self._give_classes(target, b, held, tokens)
            mask = None
            if attention_mask is not None:
                mask = attention_mask[b:b + 1] if attention_mask.shape[0] > 1 else attention_mask
            # Every chunk of prefill_all_rows is prompt, whatever chunk_mode says
            # of forwards after it (and its tokens go to every row).
            prompt = tokens > 1 and (self.chunk_mode == "prefill" or self._broadcast)
            if held == 0 or prompt:
                if full:
                    k_all, v_all = key[b:b + 1], value[b:b + 1]
                else:  # earlier tokens live only in the library
                    k_old, v_old = self._fetch_all(row, layer, held, key.dtype, key.device)
                    k_all = torch.cat([k_old, new_k], dim=1)[None]
                    v_all = torch.cat([v_old, new_v], dim=1)[None]
                _check_unpadded(mask, held + tokens, b)
                out[b] = sdpa_attention_forward(module, query[b:b + 1], k_all, v_all, mask,
                                                dropout=0.0, scaling=scaling, **kwargs)[0][0]
                for target in (self._rows if self._broadcast else [row]):
                    self._prefill(target, layer, query[b], new_k, new_v, scaling)
            else:
                self._hand_over_window(row, layer)
                for i in range(tokens):
                    out[b, i] = self._decode_token(row, layer, query[b, :, i], new_k[:, i:i + 1],
                                                   new_v[:, i:i + 1], scaling)
        return out, None

    def _prefill(self, row: _Row, layer: int, query, new_k, new_v, scaling: float) -> None:
        row.ctx.prefill(row.seq, layer, _host_array(new_k), _host_array(new_v),
                        layout="head_major")
        row.lengths[layer] += new_k.shape[1]
        if row.selector == "h2o":
            # H2O starts from the attention every prompt query paid (its
            # code accumulates the whole prompt's attention matrix).
            n = row.lengths[layer]
            keys, _ = self._fetch_all(row, layer, n, torch.float32, query.device)
            sums = prompt_column_sums(query.float(), keys, n, scaling)
            row.ctx.observe_attention(row.seq, layer, _all_positions(self.num_kv_heads, n),
                                      sums.cpu().numpy())
        if row.selector == "scissorhands":
            # One step per prompt chunk, as cold-compress's Scissorhands cache
            # takes the prompt: each token's attention averaged over the
            # chunk's queries that see it (a hit: at least uniform).
            n = row.lengths[layer]
            tokens = query.shape[1]
            keys, _ = self._fetch_all(row, layer, n, torch.float32, query.device)
            sums = prompt_column_sums(query.float(), keys, n, scaling).cpu().numpy()
            seen_by = n - np.maximum(np.arange(n), n - tokens)  # chunk queries at or after each token
            row.ctx.observe_attention(row.seq, layer, _all_positions(self.num_kv_heads, n),
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
            row.pending_window[layer] = windows.add(end - new_k.shape[1], end, latest)

    def _hand_over_window(self, row: _Row, layer: int) -> None:
        # A selector that shares its budget across layers (ZigZagKV) needs
        # every layer's window before the first layer's first step: the
        # prompt has passed through every layer once a decode step starts.
        layers = (sorted(row.pending_window) if row.selector in LAYER_SHARING_SELECTORS
                  else [layer])
        for held in layers:
            window = row.pending_window.pop(held, None)
            if window is not None:
                row.ctx.prefill_queries(row.seq, held, window)

    def _fetch_all(self, row: _Row, layer: int, n: int, dtype, device):
        """Every stored token's K and V of (row, layer): [kv_heads, n, D] each."""
        k, v = row.ctx.fetch(row.seq, layer, _all_positions(self.num_kv_heads, n))
        return (_from_host(k, self.dtype).to(device=device, dtype=dtype),
                _from_host(v, self.dtype).to(device=device, dtype=dtype))

    def _selection(self, row: _Row, layer: int) -> SelectionResult:
        """The (reused) selection buffer of (row, layer), grown to the
        capacity the next select needs."""
        need = row.ctx.capacity(row.seq, layer)
        sel = row.selection.get(layer)
        if sel is None or sel.capacity < need:
            capacity = max(need, 2 * sel.capacity if sel is not None else need)
            sel = SelectionResult(self.num_kv_heads, capacity)
            row.selection[layer] = sel
        return sel

    def _fetch_buffers(self, row: _Row, layer: int, capacity: int):
        """The (reused) K and V buffers of (row, layer) for a selection of
        `capacity`; made only for rows that fetch (attending ones do not)."""
        bufs = row.fetched.get(layer)
        if bufs is None or bufs[0].shape[1] != capacity:
            shape = (self.num_kv_heads, capacity, self.head_dim)
            np_dtype = _NUMPY_DTYPES[self.dtype]
            bufs = (np.zeros(shape, np_dtype), np.zeros(shape, np_dtype))
            row.fetched[layer] = bufs
        return bufs

    def _decode_token(self, row: _Row, layer: int, q, k1, v1, scaling: float) -> torch.Tensor:
        """One decode step of one row in one layer: q [q_heads, D], k1 and v1
        [kv_heads, 1, D]. Returns the attention output [q_heads, D]."""
        ctx, seq = row.ctx, row.seq
        ctx.append(seq, layer, _host_array(k1), _host_array(v1), layout="head_major")
        row.lengths[layer] += 1
        sel = self._selection(row, layer)
        q_host = _host_array(q)
        ctx.select(seq, layer, q_host, out=sel)  # with a hint: counts its coverage
        hint = row.hints.pop(layer, None)
        if hint is not None and row.selector == "infinigen":
            # InfiniGen attends over what it speculated, and the step's token.
            n = row.lengths[layer]
            sel = SelectionResult(self.num_kv_heads, hint.capacity + 1)
            for h in range(self.num_kv_heads):
                c = int(hint.counts[h])
                sel.positions[h, :c] = hint.positions[h, :c]
                sel.positions[h, c] = n - 1
                sel.counts[h] = c + 1
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
        keys = _from_host(k_buf[:, :n], self.dtype).to(q.device, torch.float32)
        values = _from_host(v_buf[:, :n], self.dtype).to(q.device, torch.float32)
        group = self.num_q_heads // self.num_kv_heads
        logits = torch.matmul(q.float().reshape(self.num_kv_heads, group, self.head_dim),
                              keys.transpose(1, 2)) * scaling          # [kv, group, n]
        if int(counts.min()) < n:
            invalid = torch.arange(n) >= torch.from_numpy(counts.astype(np.int64))[:, None]
            logits.masked_fill_(invalid.to(q.device)[:, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if row.selector in ATTENTION_SELECTORS:
            observed = np.zeros(sel.positions.shape, np.float32)
            observed[:, :n] = probs.sum(dim=1).cpu().numpy()
            ctx.observe_attention(seq, layer, sel, observed)
        return torch.matmul(probs, values).reshape(self.num_q_heads, self.head_dim).to(q.dtype)

    # --- introspection ----------------------------------------------------

    def forget_prompt(self) -> None:
        """Frees what every row holds of the last prompt (its sequence's K/V
        and index in the library) before the next prefill_all_rows would: a
        caller that runs a prompt through several Sessions in turn keeps only
        one Session's prompt in memory."""
        for row in self._rows:
            self._reset(row)

    def stats(self, row: int = 0) -> Dict[str, object]:
        """pq_sequence_stats of batch row `row` (selects, fetches, bytes, builds)."""
        return self.context(row).sequence_stats(self.sequence(row))


def model_key_rotary(text_config, head_dim: int) -> str:
    """The library's key_rotary for a transformers model: "half" where RoPE
    turns every dimension in transformers' rotate-half layout, "interleaved"
    for GPT-J-style rotation, "none" for partial rotary embeddings (only
    some dimensions turn) and models without RoPE."""
    has_rope = any(getattr(text_config, name, None) is not None
                   for name in ("rope_parameters", "rope_theta", "rope_scaling"))
    partial = getattr(text_config, "partial_rotary_factor", None)
    if partial is None:
        partial = getattr(text_config, "rotary_pct", None)
    rotary_dim = getattr(text_config, "rotary_dim", None)
    if (not has_rope or head_dim % 2 or (partial is not None and partial != 1.0)
            or (rotary_dim is not None and rotary_dim != head_dim)):
        return "none"
    if getattr(text_config, "model_type", "") in ("gptj", "codegen"):
        return "interleaved"
    return "half"


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


def _all_positions(kv_heads: int, n: int) -> SelectionResult:
    sel = SelectionResult(kv_heads, n)
    sel.positions[:] = np.arange(n, dtype=np.int32)
    sel.counts[:] = n
    return sel


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
