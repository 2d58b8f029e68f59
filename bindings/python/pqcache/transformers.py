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

from typing import Dict, Optional, Sequence

# The versions requirements-eval.txt pins (a test keeps the two in step): the
# message below names them for a wheel user, who has no requirements file.
_REQUIRED = ("torch==2.15.0", "transformers==5.23.0")
try:
    # Everything of torch and transformers the Session's parts import, so
    # that a missing one is reported here, with what to install.
    import torch
    from transformers import AttentionInterface  # noqa: F401
    from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, Cache,  # noqa: F401
                                          CacheLayerMixin, get_layer_types_and_kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: F401
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: F401
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in ("torch", "transformers"):
        raise
    from ._install_hint import install_command, pip
    raise ModuleNotFoundError(
        f"pqcache.transformers needs torch and transformers, and {missing.name!r} is not "
        f"installed: {install_command(_REQUIRED)} (the tested versions; in a source tree, "
        f"{pip()} install -r requirements-eval.txt installs them). `import pqcache` works "
        "without them.", name=missing.name) from missing

from . import Context, SelectionResult, _Closing  # noqa: F401
# A Session is made of parts, one concern each (this module keeps Session and
# re-exports every name it had before the split):
#   _session_rows.py   the contexts, each row's sequence, crop/fork/checkpoint
#   _session_cache.py  LibraryCache, the transformers Cache glue
#   _forward_hook.py   the "pqcache" attention: the model's switch to it, its work
#   _speculation.py    speculate=True (InfiniGen's estimated queries)
#   _selector_feed.py  what selectors observe: token classes, prompt attention
#                      and queries
#   _host_arrays.py    tensors to and from host arrays; the shared geometry
from ._forward_hook import (ATTENTION_NAME, _check_unpadded, _LibraryAttention,  # noqa: F401
                            _ModelBinding, _position_mismatch, attention_forward, register)
from ._host_arrays import (_DTYPES, _NUMPY_DTYPES, _all_positions, _from_host,  # noqa: F401
                           _Geometry, _host_array)
from ._selector_feed import _PromptWindows, _SelectorFeed, prompt_column_sums  # noqa: F401
from ._session_cache import CacheCheckpoint, LibraryCache, _LibraryLayer
from ._session_rows import _Row, _RowForks, _RowTable  # noqa: F401
from ._speculation import _Speculation
from .selector_inputs import (ATTENTION_SELECTORS, LAYER_SHARING_SELECTORS,  # noqa: F401
                              PROMPT_QUERY_SELECTORS, TOKEN_CLASS_SELECTORS, selector_name,
                              token_class_table)

__all__ = ["ATTENTION_NAME", "Session", "LibraryCache", "CacheCheckpoint", "register",
           "attention_forward", "model_key_rotary", "prompt_column_sums"]

CHUNK_MODES = ("prefill", "decode")


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

    Its parts: _table (the contexts and rows), _forks (crop, forks,
    checkpoints), _feed (what selectors observe), _binding (the model's
    switch to the "pqcache" attention), _attention (that attention's work),
    _speculation (speculate=True, else None).
    """

    def __init__(self, model, *, rows: Optional[Sequence[dict]] = None,
                 chunk_mode: str = "prefill", rope_pairs: Optional[bool] = None,
                 tokenizer=None, speculate: bool = False, **config):
        if chunk_mode not in CHUNK_MODES:
            raise ValueError(f"chunk_mode {chunk_mode!r}; expected one of {CHUNK_MODES}")
        if rows is not None and len(rows) == 0:
            raise ValueError("rows is empty: give one dict of pq_config fields per batch row")
        text_config = model.config.get_text_config(decoder=True)
        selecting = _selecting_layers(text_config)
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
        geometry = _Geometry(len(selecting), q_heads, kv_heads, head_dim, dtype)
        if rope_pairs is not None:
            if "key_rotary" in config:
                raise ValueError("give key_rotary or rope_pairs, not both")
            config["key_rotary"] = "half" if rope_pairs else "none"
        config.setdefault("key_rotary", model_key_rotary(text_config, head_dim))
        config = dict(config)
        selectors = {selector_name(fields.get("selector", config.get("selector", "pq")))
                     for fields in (rows if rows is not None else [config])}
        self._feed = _SelectorFeed(tokenizer, selectors, geometry)
        self._table = _RowTable(geometry, config, rows)
        self._forks = _RowForks(self._table, self._feed)
        self._attention = _LibraryAttention(self.library_layer, geometry, chunk_mode,
                                            self._table, self._feed)
        self._speculation: Optional[_Speculation] = None
        self._binding = _ModelBinding(model, self)
        try:
            self._binding.attach()
            self._serve()
            self._feed.start(model)
            if speculate:
                self._speculation = _Speculation(self, model, self._binding.modules,
                                                 self.library_layer, geometry, self._table,
                                                 self._feed)
        except BaseException:
            self.close()
            raise

    # --- lifetime ----------------------------------------------------------

    def _serve(self) -> None:
        """Points the model's attention layers at this Session (cheap when
        they already are)."""
        if not self._table.open:
            raise ValueError("this pqcache.transformers.Session is closed: its cache cannot "
                             "run a forward; make a new Session")
        self._binding.serve(self)

    def close(self) -> None:
        """Frees the contexts; the last open Session on the model restores
        its previous attention implementation. Idempotent."""
        self._feed.close()
        if self._speculation is not None:
            self._speculation.close()
            self._speculation = None
        self._binding.release(self, still_open=self._table.open)
        self._table.close()

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
        return self._table.context(row)

    def sequence(self, row: int = 0) -> int:
        """The library sequence id of batch row `row` within context(row)
        (a fork, for beams or a rewind, gets a new one)."""
        return self._table.sequence(row)

    def length(self, row: int = 0) -> int:
        """Tokens the library holds for batch row `row` (0 before its prompt)."""
        return self._table.length(row)

    def prefill_all_rows(self, input_ids: torch.Tensor, chunk_tokens: int = 2048):
        """Runs one prompt once (batch 1, full attention, in chunks of
        chunk_tokens) and hands its keys and values to the context of every
        row, so that all rows (all selectors of `rows=`) continue from the
        same prompt without each paying its prefill. Returns the
        LibraryCache for a batch of all rows and the logits of the prompt's
        last token [vocab]."""
        table = self._table
        if not table.per_row:
            raise ValueError("prefill_all_rows needs a Session made with rows=[...]")
        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
            raise ValueError(f"prefill_all_rows takes one prompt, got input_ids of shape "
                             f"{tuple(input_ids.shape)}")
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens {chunk_tokens}: expected >= 1")
        for row in table.rows:
            table.reset(row)
        cache = LibraryCache(self)
        table.broadcast = True
        try:
            for start in range(0, input_ids.shape[1], chunk_tokens):
                with torch.no_grad():  # no autograd graph across chunks
                    out = self.model(input_ids[:, start:start + chunk_tokens],
                                     past_key_values=cache, use_cache=True, logits_to_keep=1)
        finally:
            table.broadcast = False
        for layer in cache.layers:
            if not isinstance(layer, _LibraryLayer) and layer.is_initialized:
                layer.batch_repeat_interleave(len(table.rows))
        cache._batch = len(table.rows)  # its forwards ran one row, for all of them
        return cache, out.logits[0, -1]

    # --- introspection ----------------------------------------------------

    def forget_prompt(self) -> None:
        """Frees what every row holds of the last prompt (its sequence's K/V
        and index in the library) before the next prefill_all_rows would: a
        caller that runs a prompt through several Sessions in turn keeps only
        one Session's prompt in memory."""
        for row in self._table.rows:
            self._table.reset(row)

    def stats(self, row: int = 0) -> Dict[str, object]:
        """pq_sequence_stats of batch row `row` (selects, fetches, bytes, builds)."""
        return self.context(row).sequence_stats(self.sequence(row))


def _selecting_layers(text_config) -> list:
    """The model layers that attend over the whole sequence: the ones the
    library selects for."""
    layer_types, _ = get_layer_types_and_kwargs(text_config)
    selecting = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if not selecting:
        raise ValueError(
            f"no layer of this model attends over the whole sequence (layer types "
            f"{sorted(set(layer_types))}): nothing for pqcache to select. A Mistral-style "
            "config with sliding_window set makes every layer local; set it to None")
    return selecting


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
