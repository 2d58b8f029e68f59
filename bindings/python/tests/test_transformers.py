"""pqcache.transformers: the library as the attention of Hugging Face
transformers models, checked on small random Llama, Qwen2, Mistral and
Gemma-3 models (no download). The real-model checks (SmolLM2) live in
tools/pqeval/tests/test_transformers_real.py.

The reference is transformers' own SDPA attention: with every token
selected (EXACT, topk_fraction 1.0) the integration must give the same
logits within float rounding, for every cache kind and architecture."""
import math
import pickle

import numpy as np

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh installs it)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(scripts/setup.sh installs it)")
from transformers import (DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, StaticCache)

import pqcache  # noqa: E402
import pqcache.transformers as pqt  # noqa: E402
from pqcache.selector_inputs import (ATTENTION_SELECTORS, TOKEN_CLASS_SELECTORS,  # noqa: E402
                                     token_class_table)

VOCAB = 320
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
SMALL = dict(sink_tokens=4, local_tokens=16)


def _model(arch: str):
    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**COMMON, num_hidden_layers=3)).eval()
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**COMMON, num_hidden_layers=2)).eval()
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(**COMMON, num_hidden_layers=2,
                                                sliding_window=None)).eval()
    if arch == "gemma3":  # two local layers of 32 tokens around each global one
        types = ["sliding_attention", "full_attention", "sliding_attention"] * 2
        return Gemma3ForCausalLM(Gemma3TextConfig(**COMMON, num_hidden_layers=6, head_dim=32,
                                                  sliding_window=32, layer_types=types)).eval()
    raise ValueError(arch)


ARCHS = ["llama", "qwen2", "mistral", "gemma3"]


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return request.param, _model(request.param)


def _ids(n: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, n), generator=g)  # no pad, bos or eos


def _cache(kind: str, session, model):
    if kind == "library":
        return session.cache()
    if kind == "dynamic":
        return DynamicCache(config=model.config)
    return StaticCache(config=model.config, max_cache_len=512)


@pytest.mark.parametrize("cache_kind", ["library", "dynamic", "static"])
def test_every_token_selected_gives_sdpa_logits(arch_model, cache_kind):
    """k = everything: prompt, then 24 decode tokens one at a time; every
    step's logits equal full attention's within float rounding."""
    _, model = arch_model
    ids = _ids(224)
    with torch.no_grad():
        reference = model(ids).logits  # SDPA over the whole sequence
        with pqt.Session(model, selector="exact", topk_fraction=1.0, **SMALL) as session:
            cache = _cache(cache_kind, session, model)
            got = [model(ids[:, :200], past_key_values=cache).logits]
            for p in range(200, 224):
                got.append(model(ids[:, p:p + 1], past_key_values=cache).logits)
            assert session.length() == 224
            assert session.stats()["select_calls"] == 24 * len(session.library_layer)
    got = torch.cat(got, dim=1)
    assert torch.allclose(got, reference, atol=2e-5, rtol=0), (got - reference).abs().max()


def test_generate_equals_generate_with_sdpa(arch_model):
    arch, model = arch_model
    ids = _ids(300, batch=2)
    with torch.no_grad():
        reference = model.generate(ids, max_new_tokens=16, do_sample=False)
        with pqt.Session(model, selector="exact", topk_fraction=1.0, **SMALL) as session:
            out = model.generate(ids, max_new_tokens=16, do_sample=False,
                                 past_key_values=session.cache())
            assert model.config._attn_implementation == pqt.ATTENTION_NAME
    assert torch.equal(out, reference)
    assert model.config._attn_implementation != pqt.ATTENTION_NAME  # close() restored it


def test_only_global_layers_select_on_gemma3():
    model = _model("gemma3")
    with pqt.Session(model, selector="pq", **SMALL) as session:
        assert sorted(session.library_layer) == [1, 4]  # the full_attention layers
        assert session.context().config()["num_layers"] == 2
        with torch.no_grad():
            model.generate(_ids(200), max_new_tokens=5, do_sample=False,
                           past_key_values=session.cache())
        assert session.stats()["select_calls"] == 4 * 2


@pytest.mark.parametrize("selector", sorted(pqcache.SELECTORS))
def test_every_selector_runs_generate(selector):
    model = _model("llama")
    ids = _ids(400)
    tokenizer = _Tokenizer() if selector in TOKEN_CLASS_SELECTORS else None
    with pqt.Session(model, selector=selector, topk_fraction=0.2, tokenizer=tokenizer,
                     **SMALL) as session:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False,
                                 past_key_values=session.cache())
        stats = session.stats()
        info = session.context().layer_info(0, 0)
        capacity = session.context().capacity(0, 0)
        heads = session.context().config()["num_kv_heads"]
        layers = session.context().config()["num_layers"]
    assert out.shape == (1, 406)
    assert stats["select_calls"] == 5 * 3
    # A decode step attends in the library (pq_decode_attend, timed as a
    # fetch) unless the selector learns from the attention weights, which
    # need the fetched rows; H2O's and Scissorhands' seeds read the prompt's
    # keys back once per layer.
    fetched = 5 * 3 if selector in ATTENTION_SELECTORS else 0
    assert stats["fetch_calls"] == fetched + (3 if selector in ("h2o", "scissorhands") else 0)
    assert stats["fetch_seconds"] > 0
    assert info["tokens"] == 405
    if selector == "pq":
        assert info["index_ready"] == 1 and info["coded_tokens"] > 0
    topk = math.ceil(0.2 * (405 - 4 - 16))
    if selector in ("pyramidkv", "pyramidinfer"):  # the bottom layer gets the largest budget
        assert capacity > 4 + 16 + topk
    elif selector == "adakv":  # a head may take the others' budget beyond their safeguard
        assert capacity == 4 + 16 + min(405 - 20, heads * topk - (heads - 1) * int(0.2 * topk))
    elif selector == "fastgen":  # a full-cache head keeps the whole middle
        assert capacity == 405
    elif selector == "zigzagkv":  # a layer may take the others' budget beyond their floor
        assert capacity == 4 + 16 + min(405 - 20, round(0.2 * topk + 0.8 * topk * layers))
    else:
        assert capacity == 4 + 16 + topk  # sinks + top-k + local: a subset of the 405


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_speculation_changes_no_selection_and_counts_its_coverage(arch):
    """speculate=True: during layer L-1 the Session estimates layer L's query
    and hands it to pq_decode_speculate (L >= 2: llama's layer 2, Gemma-3's
    global layer 4). For H2O and PQ the hints change nothing (the same
    tokens as without them, H2O's drop marks included); every select after
    a hint counts its coverage. InfiniGen attends over its hints."""
    model = _model(arch)
    ids = _ids(300)
    steps = 5  # decode steps after the prompt's token; one speculated layer each
    # Each select after a hint counts its middle: 2 kv heads x k(n), k(n) =
    # ceil(0.2 x (n - 4 sinks - 16 local)), at n = 301 .. 305; the hint was
    # made a token earlier, for k(n - 1).
    def k(n):
        return math.ceil(0.2 * (n - 20))

    chosen = sum(2 * k(n) for n in range(301, 301 + steps))
    grown = sum(2 * (k(n) - k(n - 1)) for n in range(301, 301 + steps))
    for selector in ("h2o", "pq", "infinigen"):
        outs, stats = [], None
        for speculate in (False, True):
            with pqt.Session(model, selector=selector, topk_fraction=0.2, speculate=speculate,
                             **SMALL) as session:
                with torch.no_grad():
                    outs.append(model.generate(ids, max_new_tokens=steps + 1, do_sample=False,
                                               past_key_values=session.cache(),
                                               output_logits=True, return_dict_in_generate=True))
                stats = session.stats()
        assert 0 <= stats["hint_covered"] <= stats["hint_tokens"]
        if selector == "infinigen":  # its heads take n <= k
            assert 0 < stats["hint_tokens"] <= chosen
        else:
            assert stats["hint_tokens"] == chosen
        if selector == "h2o":  # its choice does not depend on the query: only
            assert stats["hint_covered"] == chosen - grown  # a grown k escapes the hint
        if selector != "infinigen":
            assert torch.equal(outs[0].sequences, outs[1].sequences), selector
            for a, b in zip(outs[0].logits, outs[1].logits):
                assert torch.equal(a, b), selector


def test_a_later_session_owns_the_speculation():
    """Two Sessions on one model, the first left open: only the one the
    model's attention now goes through speculates (the first one's hooks
    would otherwise see the second's batch)."""
    model = _model("llama")
    first = pqt.Session(model, rows=[{"selector": "pq"}], speculate=True, **SMALL)
    try:
        with pqt.Session(model, rows=[{"selector": "pq"}, {"selector": "infinigen"}],
                         speculate=True, topk_fraction=0.2, **SMALL) as second:
            with torch.no_grad():
                model.generate(_ids(300, batch=2), max_new_tokens=4, do_sample=False,
                               past_key_values=second.cache())
            assert second.stats(1)["hint_tokens"] > 0
        assert first.stats()["hint_tokens"] == 0
    finally:
        first.close()


def _greedy(session, ids, rows: int, steps: int = 6) -> torch.Tensor:
    """prefill_all_rows, then `steps` greedy tokens of every row, as the
    evaluation's Runner decodes: [rows, steps]."""
    cache, logits = session.prefill_all_rows(ids, chunk_tokens=128)
    nxt = logits.argmax().repeat(rows)
    out = [nxt]
    with torch.no_grad():
        for _ in range(steps - 1):
            nxt = session.model(nxt[:, None], past_key_values=cache).logits[:, -1].argmax(-1)
            out.append(nxt)
    return torch.stack(out, dim=1)


def test_open_sessions_on_one_model_each_serve_their_own_cache():
    """Sessions of different row counts on one model, all open and used in
    turn (the evaluation keeps one per set of rows and reuses it prompt
    after prompt): each forward reaches the Session whose cache it runs,
    not the one made last, so the first Session answers the same before and
    after the second ran, and after the second closed. It failed: the
    second Session's speculation hook saw the first's batch ("batch row 2:
    this Session has 2 rows") and its attention got the first's tokens."""
    model = _model("llama")
    ids = _ids(300)
    first = pqt.Session(model, rows=[{"selector": "exact"}, {"selector": "pq"},
                                     {"selector": "infinigen"}],
                        speculate=True, topk_fraction=0.2, **SMALL)
    second = pqt.Session(model, rows=[{"selector": "snapkv"}, {"selector": "infinigen"}],
                         speculate=True, topk_fraction=0.2, **SMALL)
    try:
        with torch.no_grad():
            before = _greedy(first, ids, 3)
            other = _greedy(second, ids, 2)
            first.forget_prompt()
            assert torch.equal(_greedy(first, ids, 3), before)
            assert first.stats(2)["hint_tokens"] > 0
            # A cache made before the other Session ran still reaches its own.
            cache, logits = first.prefill_all_rows(ids, chunk_tokens=128)
            assert torch.equal(_greedy(second, ids, 2), other)
            nxt = logits.argmax().repeat(3)
            step = model(nxt[:, None], past_key_values=cache).logits[:, -1].argmax(-1)
            assert torch.equal(step, before[:, 1])
            second.close()
            assert model.config._attn_implementation == pqt.ATTENTION_NAME
            assert torch.equal(_greedy(first, ids, 3), before)
    finally:
        second.close()
        first.close()
    assert model.config._attn_implementation != pqt.ATTENTION_NAME


def test_the_last_session_to_close_restores_the_models_attention():
    """Closing the first of two open Sessions leaves the model on pqcache
    attention for the second; closing the second restores what the model
    had before either. A closed Session's cache is refused by name."""
    model = _model("llama")
    before = model.config._attn_implementation
    ids = _ids(200)
    first = pqt.Session(model, rows=[{"selector": "pq"}], topk_fraction=0.2, **SMALL)
    second = pqt.Session(model, rows=[{"selector": "pq"}], topk_fraction=0.2, **SMALL)
    with torch.no_grad():
        expected = _greedy(second, ids, 1)
        stale, _ = first.prefill_all_rows(ids, chunk_tokens=128)
        first.close()
        assert model.config._attn_implementation == pqt.ATTENTION_NAME
        assert torch.equal(_greedy(second, ids, 1), expected)
        with pytest.raises(ValueError, match="Session is closed"):
            model(_ids(1), past_key_values=stale)
        second.close()
    assert model.config._attn_implementation == before
    pickle.dumps(model)  # nothing of the Sessions is left on the model


class _Tokenizer:
    """What token_class_table reads of a tokenizer: ids 0-2 are special,
    every seventh id decodes to punctuation."""
    all_special_ids = [0, 1, 2]

    def __len__(self):
        return VOCAB

    def batch_decode(self, ids, **kwargs):
        return ["." if i % 7 == 0 else f" w{i}" for (i,) in ids]


def test_fastgen_gets_the_classes_of_every_forward():
    """At a recovery ratio this low every kv head keeps the special tokens
    only: the middle is the two special ids placed in the prompt. Without a
    tokenizer the Session refuses FastGen."""
    model = _model("llama")
    ids = _ids(400)
    ids[0, [50, 100]] = 1
    table = token_class_table(_Tokenizer())
    assert table[1] == pqcache.TOKEN_SPECIAL and table[14] == pqcache.TOKEN_PUNCTUATION
    assert table[15] == pqcache.TOKEN_PLAIN
    with pqt.Session(model, tokenizer=_Tokenizer(), selector="fastgen", fastgen_recovery=1e-6,
                     topk_fraction=0.2, **SMALL) as session:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=6, do_sample=False,
                           past_key_values=session.cache())
        n = session.length()
        for layer in range(3):
            selection = session.context().select(0, layer, np.zeros((4, 16), np.float32))
            for positions in selection.heads():
                assert [p for p in positions if 4 <= p < n - 16] == [50, 100]
    with pytest.raises(ValueError, match="tokenizer"):
        pqt.Session(model, selector="fastgen")


@pytest.mark.parametrize("selector", ["pq", "h2o", "scope", "snapkv"])
def test_decode_chunk_equals_one_token_at_a_time(selector):
    """chunk_mode="decode": a 12-token forward gives the logits of 12
    single-token forwards (teacher forcing, speculative verification)."""
    model = _model("llama")
    ids = _ids(412)
    logits = {}
    with torch.no_grad():
        for mode in ("chunk", "steps"):
            with pqt.Session(model, selector=selector, topk_fraction=0.2, chunk_mode="decode",
                             **SMALL) as session:
                cache = session.cache()
                model(ids[:, :400], past_key_values=cache)
                if mode == "chunk":
                    logits[mode] = model(ids[:, 400:], past_key_values=cache).logits
                else:
                    logits[mode] = torch.cat([model(ids[:, p:p + 1], past_key_values=cache).logits
                                              for p in range(400, 412)], dim=1)
    assert torch.allclose(logits["chunk"], logits["steps"], atol=1e-5, rtol=0)


def test_prefill_chunks_in_prefill_mode_attend_fully():
    """A multi-token forward after the prompt is another prompt chunk by
    default: full attention, and the library appends it."""
    model = _model("llama")
    ids = _ids(300)
    with torch.no_grad():
        reference = model(ids).logits
        with pqt.Session(model, selector="pq", topk_fraction=0.1, **SMALL) as session:
            cache = session.cache()
            got = torch.cat([model(ids[:, :100], past_key_values=cache).logits,
                             model(ids[:, 100:250], past_key_values=cache).logits,
                             model(ids[:, 250:], past_key_values=cache).logits], dim=1)
            assert session.length() == 300
            assert session.context().layer_info(0, 0)["prefill_tokens"] == 300
    assert torch.allclose(got, reference, atol=2e-5, rtol=0)


def test_rows_each_with_its_own_selector_match_separate_runs():
    """Session(rows=...) + prefill_all_rows: one prompt run once, then every
    row decodes as if it had been prefilled on its own."""
    model = _model("llama")
    ids = _ids(500)
    selectors = ["pq", "h2o", "snapkv", "window"]
    separate = []
    with torch.no_grad():
        for s in selectors:
            with pqt.Session(model, selector=s, topk_fraction=0.2, **SMALL) as session:
                out = model.generate(ids, max_new_tokens=8, do_sample=False,
                                     past_key_values=session.cache())
                separate.append(out[0, 500:])
        with pqt.Session(model, rows=[{"selector": s} for s in selectors], topk_fraction=0.2,
                         **SMALL) as session:
            cache, logits = session.prefill_all_rows(ids, chunk_tokens=128)
            assert [session.length(r) for r in range(4)] == [500] * 4
            nxt = logits.argmax().repeat(4)
            batched = [nxt]
            for _ in range(7):
                nxt = model(nxt[:, None], past_key_values=cache).logits[:, -1].argmax(-1)
                batched.append(nxt)
            batched = torch.stack(batched, dim=1)
            for r, s in enumerate(selectors):
                assert session.context(r).config()["selector"] == pqcache.SELECTORS[s]
    for r in range(len(selectors)):
        assert torch.equal(batched[r], separate[r]), selectors[r]


def test_forget_prompt_frees_every_rows_sequence():
    """forget_prompt leaves no token of the prompt in any row's context, and
    the next prompt runs as on a new Session."""
    model = _model("llama")
    ids = _ids(300)
    with torch.no_grad():
        with pqt.Session(model, rows=[{"selector": "exact"}, {"selector": "pq"}],
                         topk_fraction=0.2, **SMALL) as session:
            _, first = session.prefill_all_rows(ids, chunk_tokens=128)
            assert [session.context(r).stats()["tokens"] for r in range(2)] == \
                [300 * model.config.num_hidden_layers] * 2
            session.forget_prompt()
            assert [session.context(r).stats()["tokens"] for r in range(2)] == [0, 0]
            assert [session.length(r) for r in range(2)] == [0, 0]
            _, again = session.prefill_all_rows(ids, chunk_tokens=128)
    assert torch.equal(first, again)


def test_prefill_all_rows_in_chunks_with_chunk_mode_decode():
    """A prompt longer than chunk_tokens reaches every row in full with
    chunk_mode="decode" too (the mode of the perplexity runs): every chunk of
    prefill_all_rows is prompt. Rows then match a Session prefilled alone."""
    model = _model("llama")
    ids = _ids(300)
    with torch.no_grad():
        with pqt.Session(model, selector="exact", topk_fraction=1.0, **SMALL) as alone:
            reference = model(ids, past_key_values=alone.cache()).logits[0, -1]
        with pqt.Session(model, rows=[{"selector": "exact"}, {"selector": "pq"}],
                         topk_fraction=1.0, chunk_mode="decode", **SMALL) as session:
            _, logits = session.prefill_all_rows(ids, chunk_tokens=128)
            assert [session.length(r) for r in range(2)] == [300, 300]
    assert torch.allclose(logits, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models(dtype):
    model = _model("llama").to(dtype)
    ids = _ids(200)
    with torch.no_grad():
        reference = model(ids).logits.float()
        with pqt.Session(model, selector="exact", topk_fraction=1.0, **SMALL) as session:
            assert session.context().dtype == {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
            cache = session.cache()
            got = [model(ids[:, :190], past_key_values=cache).logits]
            got += [model(ids[:, p:p + 1], past_key_values=cache).logits for p in range(190, 200)]
    got = torch.cat(got, dim=1).float()
    assert (got - reference).abs().max() < 0.05 * reference.abs().max()


def test_a_new_prompt_on_a_row_starts_a_new_sequence():
    model = _model("llama")
    with torch.no_grad(), pqt.Session(model, selector="pq", **SMALL) as session:
        model.generate(_ids(300, seed=1), max_new_tokens=4, do_sample=False,
                       past_key_values=session.cache())
        assert session.length() == 303
        model.generate(_ids(120, seed=2), max_new_tokens=4, do_sample=False,
                       past_key_values=session.cache())
        assert session.length() == 123
        assert session.context().sequence_count() == 1


# --- errors ------------------------------------------------------------------

def test_attention_without_a_session_is_a_clear_error():
    model = _model("llama")
    pqt.register()
    model.set_attn_implementation(pqt.ATTENTION_NAME)
    with pytest.raises(RuntimeError, match="no open pqcache.transformers.Session serves"):
        model(_ids(8))


def test_padded_rows_are_refused():
    model = _model("llama")
    ids = _ids(64, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding on row 1
    with pqt.Session(model, selector="pq", **SMALL), pytest.raises(ValueError, match="padded"):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)


def test_bad_session_arguments():
    model = _model("llama")
    with pytest.raises(ValueError, match="chunk_mode"):
        pqt.Session(model, chunk_mode="sometimes")
    with pytest.raises(ValueError, match="rows is empty"):
        pqt.Session(model, rows=[])
    with pytest.raises(pqcache.PQError, match="topk_fraction"):
        pqt.Session(model, topk_fraction=2.5)
    with pytest.raises(ValueError, match="unknown selector"):
        pqt.Session(model, rows=[{"selector": "oracle"}])
    with pqt.Session(model, selector="pq") as session, \
            pytest.raises(ValueError, match="needs a Session made with rows"):
        session.prefill_all_rows(_ids(10))
    local = MistralForCausalLM(MistralConfig(**COMMON, num_hidden_layers=1, sliding_window=64))
    with pytest.raises(ValueError, match="nothing for pqcache to select"):
        pqt.Session(local)
    assert model.config._attn_implementation != pqt.ATTENTION_NAME


@pytest.mark.parametrize("selector", ["exact", "pq", "h2o", "snapkv"])
def test_key_rotary_is_declared_not_applied(selector):
    """The Session declares the model's rotary layout (config.key_rotary) and
    hands keys and queries in the model's order: attention is unchanged at
    k = everything, the stored keys are the model's, and later prompt chunks
    still attend fully. rope_pairs is the old spelling of key_rotary."""
    model = _model("llama")
    ids = _ids(330)
    fraction = 1.0 if selector == "exact" else 0.2
    with torch.no_grad():
        reference = model(ids).logits
        with pqt.Session(model, selector=selector, topk_fraction=fraction, **SMALL) as session:
            assert session.context().config()["key_rotary"] == pqcache.KEY_ROTARY["half"]
            cache = session.cache()
            got = [model(ids[:, :150], past_key_values=cache).logits,
                   model(ids[:, 150:300], past_key_values=cache).logits]  # chunk 2: fetched K
            got += [model(ids[:, p:p + 1], past_key_values=cache).logits for p in range(300, 330)]
            stored = session.context().fetch(0, 0, pqt._all_positions(2, 4))[0]  # [kv, 4, D]
        plain = DynamicCache(config=model.config)
        model(ids[:, :4], past_key_values=plain)
    prompt = torch.cat(got[:2], dim=1)
    assert torch.allclose(prompt, reference[:, :300], atol=2e-5, rtol=0)
    if selector == "exact":
        assert torch.allclose(torch.cat(got, dim=1), reference, atol=2e-5, rtol=0)
    assert torch.equal(torch.from_numpy(stored), plain.layers[0].keys[0])
    for pairs, want in ((True, "half"), (False, "none")):
        with pqt.Session(model, selector=selector, rope_pairs=pairs, **SMALL) as session:
            assert session.context().config()["key_rotary"] == pqcache.KEY_ROTARY[want]
    with pytest.raises(ValueError, match="key_rotary or rope_pairs"):
        pqt.Session(model, rope_pairs=True, key_rotary="half")


def test_model_key_rotary_follows_the_config():
    llama = LlamaConfig(**COMMON)
    assert pqt.model_key_rotary(llama, 16) == "half"
    llama.partial_rotary_factor = 0.5  # only some dimensions turn: no pairing
    assert pqt.model_key_rotary(llama, 16) == "none"
    assert pqt.model_key_rotary(LlamaConfig(**COMMON), 15) == "none"


def test_h2o_is_seeded_with_every_prompt_query():
    """prompt_column_sums: the causal attention of every query of a prompt
    chunk, summed per kv head, equals the window sums with the whole prompt
    as the window, in blocks smaller than the chunk and for a second chunk."""
    from pqcache.selector_inputs import prompt_attention_sums

    gen = torch.Generator().manual_seed(3)
    q_heads, kv_heads, dim, n = 4, 2, 8, 300
    queries = torch.randn(q_heads, n, dim, generator=gen)
    keys = torch.randn(kv_heads, n, dim, generator=gen)
    reference = prompt_attention_sums(queries.transpose(0, 1).numpy(),
                                      keys.transpose(0, 1).numpy(), 0.35)
    got = pqt.prompt_column_sums(queries, keys, n, 0.35, block=64)
    assert np.allclose(got.numpy(), reference, rtol=1e-4, atol=1e-5)
    # A second chunk (positions 200..299) sees every earlier key.
    second = pqt.prompt_column_sums(queries[:, 200:], keys, n, 0.35, block=37)
    first = pqt.prompt_column_sums(queries[:, :200], keys[:, :200], 200, 0.35)
    assert np.allclose(first.numpy(), reference[:, :200] - second.numpy()[:, :200],
                       rtol=1e-4, atol=1e-4)
    assert abs(float(got.sum()) - q_heads * n) < 1e-2  # each query's weights sum to 1
