"""pqcache.transformers: a LibraryCache cropped back and reused, forked for
beams and repeated rows, checkpointed and rewound, on small random models
(no download). The references are fresh runs through the same integration
(the same chunks: a context forward, then the question) and, with every
token selected, transformers' own SDPA attention and DynamicCache."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh installs it)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(scripts/setup.sh installs it)")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

import pqcache  # noqa: E402
import pqcache.transformers as pqt  # noqa: E402
from pqcache.selector_inputs import TOKEN_CLASS_SELECTORS  # noqa: E402
from test_transformers import COMMON, _ids, _model, _Tokenizer  # noqa: E402

PARTIAL = dict(topk_fraction=0.2, sink_tokens=4, local_tokens=16)
EVERY_TOKEN = dict(selector="exact", topk_fraction=1.0, sink_tokens=4, local_tokens=16)
CONTEXT = 200
# Shorter and longer than the default observation_window (32): a short
# question borrows the context's last queries for SnapKV-style selectors.
QUESTIONS = (40, 5)
DECODE_STEPS = 4
# What the library's truncate keeps of dropped steps (docs/integrations.md,
# "Caches"): accumulated attention on kept tokens and tokens dropped for good
# (H2O, Scissorhands, Keyformer, FastGen), clusters learnt from dropped tokens
# (ClusterKV), a random stream that goes on (Random). checkpoint and rewind
# are exact for them.
CROP_KEEPS_TRACES = {"h2o", "scissorhands", "keyformer", "fastgen", "clusterkv", "random"}


@pytest.fixture(scope="module")
def llama():
    return _model("llama")


def _session(model, **config):
    tokenizer = _Tokenizer() if config.get("selector") in TOKEN_CLASS_SELECTORS else None
    return pqt.Session(model, tokenizer=tokenizer, **config)


def _question_logits(model, cache, question, answer):
    """The question as one forward (a prompt chunk), then each answer token
    as a decode step: the logits of all of them [1, q + a, vocab]."""
    got = [model(question, past_key_values=cache).logits]
    for i in range(answer.shape[1]):
        got.append(model(answer[:, i:i + 1], past_key_values=cache).logits)
    return torch.cat(got, dim=1)


def _fresh_logits(model, config, context, question, answer):
    with _session(model, **config) as session:
        cache = session.cache()
        model(context, past_key_values=cache)
        return _question_logits(model, cache, question, answer)


def _questions():
    return [(_ids(n, seed=10 + i), _ids(DECODE_STEPS, seed=20 + i))
            for i, n in enumerate(QUESTIONS)]


# --- one context, many questions ----------------------------------------------

@pytest.mark.parametrize("selector", sorted(pqcache.SELECTORS))
def test_a_reused_context_matches_a_fresh_prefill(llama, selector):
    """One prefill of the context; for each question the cache goes back to
    the context, the question runs as a prompt chunk and 4 decode steps
    select at 1/5. Every logit equals a fresh Session's that prefilled the
    context and ran that question alone: back by crop (selectors whose
    state the library's truncate leaves exact), and back by rewind to a
    checkpoint (every selector)."""
    config = dict(selector=selector, **PARTIAL)
    context = _ids(CONTEXT)
    questions = _questions()
    with torch.no_grad():
        references = [_fresh_logits(llama, config, context, q, a) for q, a in questions]
        with _session(llama, **config) as session:
            cache = session.cache()
            llama(context, past_key_values=cache)
            with cache.checkpoint() as start:
                assert session.context().sequence_count() == 2  # the row and its fork
                if selector not in CROP_KEEPS_TRACES:
                    for (question, answer), reference in zip(questions, references):
                        got = _question_logits(llama, cache, question, answer)
                        assert (got - reference).abs().max() <= 1e-5, \
                            ("crop", (got - reference).abs().max())
                        cache.crop(CONTEXT - cache.library_length())
                        assert session.length() == cache.get_seq_length() == CONTEXT
                for (question, answer), reference in zip(questions, references):
                    cache.rewind(start)
                    assert cache.library_length() == session.length() == CONTEXT
                    got = _question_logits(llama, cache, question, answer)
                    assert (got - reference).abs().max() <= 1e-5, \
                        ("rewind", (got - reference).abs().max())
            assert session.context().sequence_count() == 1  # close() removed the fork


def test_crop_with_every_token_selected_gives_sdpa_logits(llama):
    """At k = everything a cropped and reused cache gives the logits of
    plain SDPA over context, question and answer in one forward."""
    context = _ids(CONTEXT)
    with torch.no_grad(), pqt.Session(llama, **EVERY_TOKEN) as session:
        cache = session.cache()
        llama(context, past_key_values=cache)
        for question, answer in _questions():
            cache.crop(CONTEXT - cache.library_length())
            got = _question_logits(llama, cache, question, answer)
            reference = llama(torch.cat([context, question, answer], dim=1)).logits[:, CONTEXT:]
            assert (got - reference).abs().max() <= 2e-5, (got - reference).abs().max()


def _generate(model, ids, cache, **kwargs):
    out = model.generate(ids, max_new_tokens=8, do_sample=False, past_key_values=cache,
                         output_logits=True, return_dict_in_generate=True, **kwargs)
    return out.sequences, torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("selector", ["pq", "snapkv"])
def test_one_context_many_questions_with_generate(llama, selector):
    """kvpress's pattern end to end: the context once, then generate for
    each question on the same cache, cropped back after each answer. Tokens
    and logits equal a fresh Session's generate for that question."""
    config = dict(selector=selector, **PARTIAL)
    context = _ids(CONTEXT)
    with torch.no_grad(), pqt.Session(llama, **config) as session:
        cache = session.cache()
        llama(context, past_key_values=cache)
        for question, _ in _questions():
            prompt = torch.cat([context, question], dim=1)
            tokens, logits = _generate(llama, prompt, cache)
            cache.crop(CONTEXT - cache.library_length())
            with pqt.Session(llama, **config) as fresh:
                fresh_cache = fresh.cache()
                llama(context, past_key_values=fresh_cache)
                fresh_tokens, fresh_logits = _generate(llama, prompt, fresh_cache)
            assert torch.equal(tokens, fresh_tokens)
            assert (logits - fresh_logits).abs().max() <= 1e-5
        assert session.stats()["select_calls"] == len(QUESTIONS) * 7 * 3  # 7 steps, 3 layers


def test_one_context_many_questions_with_every_token_selected_equals_sdpa(llama):
    """The same at k = everything: transformers' own generate with SDPA and
    its DynamicCache gives the same tokens and logits."""
    context = _ids(CONTEXT)
    prompts = [torch.cat([context, question], dim=1) for question, _ in _questions()]
    with torch.no_grad():
        references = [_generate(llama, prompt, DynamicCache(config=llama.config))
                      for prompt in prompts]
        with pqt.Session(llama, **EVERY_TOKEN) as session:
            cache = session.cache()
            llama(context, past_key_values=cache)
            for prompt, (sdpa_tokens, sdpa_logits) in zip(prompts, references):
                tokens, logits = _generate(llama, prompt, cache)
                cache.crop(CONTEXT - cache.library_length())
                assert torch.equal(tokens, sdpa_tokens)
                assert (logits - sdpa_logits).abs().max() <= 2e-5, \
                    (logits - sdpa_logits).abs().max()


def test_sliding_layers_crop_with_past_recording_and_rewind():
    """Gemma-3: transformers' sliding layers drop what leaves their window,
    so crop past the window needs activate_past_recording (else a named
    error, before anything changed); checkpoint and rewind need nothing."""
    model = _model("gemma3")
    config = dict(selector="pq", **PARTIAL)
    context = _ids(CONTEXT)
    with torch.no_grad(), pqt.Session(model, **config) as session:
        cache = session.cache()
        model(context, past_key_values=cache)
        references = [_fresh_logits(model, config, context, q, a) for q, a in _questions()]
        with cache.checkpoint() as start:
            for (question, answer), reference in zip(_questions(), references):
                cache.rewind(start)
                got = _question_logits(model, cache, question, answer)
                assert (got - reference).abs().max() <= 1e-5
            with pytest.raises(RuntimeError, match="activate_past_recording"):
                cache.crop(CONTEXT - cache.library_length())
            assert session.length() > CONTEXT  # the refused crop changed nothing
            cache.rewind(start)
            cache.activate_past_recording()
            for (question, answer), reference in zip(_questions(), references):
                got = _question_logits(model, cache, question, answer)
                cache.crop(CONTEXT - cache.library_length())
                assert (got - reference).abs().max() <= 1e-5


def test_assisted_generation_rolls_back_rejected_tokens(llama):
    """Assisted generation verifies an assistant's candidates in one forward
    (chunk_mode="decode": each a decode step that selects) and crops the
    rejected ones: the tokens equal plain greedy generate's, and the
    library selected for more tokens than it kept."""
    torch.manual_seed(5)
    assistant = LlamaForCausalLM(LlamaConfig(**COMMON, num_hidden_layers=1)).eval()
    prompt = _ids(CONTEXT)
    config = dict(selector="pq", chunk_mode="decode", **PARTIAL)
    kwargs = dict(max_new_tokens=12, do_sample=False)
    with torch.no_grad():
        with pqt.Session(llama, **config) as session:
            plain = llama.generate(prompt, past_key_values=session.cache(), **kwargs)
        with pqt.Session(llama, **config) as session:
            assisted = llama.generate(prompt, past_key_values=session.cache(),
                                      assistant_model=assistant, **kwargs)
            kept = session.length() - CONTEXT  # the last token never runs a forward
            selected = session.stats()["select_calls"] // 3
    assert torch.equal(assisted, plain)
    assert kept == 11 and selected > kept  # rejected candidates were truncated


# --- beams and repeated rows -------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_beam_search_with_every_token_selected_equals_transformers_own(arch):
    """num_beams=3: each step reorders the rows (reorder_cache forks and
    removes sequences); with every token selected the beams, their scores
    and the returned sequences are transformers' own with a DynamicCache."""
    model = _model(arch)
    prompt = _ids(120, batch=2)
    kwargs = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, do_sample=False,
                  output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        reference = model.generate(prompt, past_key_values=DynamicCache(config=model.config),
                                   **kwargs)
        with pqt.Session(model, **EVERY_TOKEN) as session:
            got = model.generate(prompt, past_key_values=session.cache(), **kwargs)
            assert session.context().sequence_count() == 6  # 2 prompts x 3 beams
    assert torch.equal(got.sequences, reference.sequences)
    assert torch.allclose(got.sequences_scores, reference.sequences_scores, atol=1e-5)


def test_reordered_rows_continue_as_their_sources_at_partial_selection(llama):
    """reorder_cache([2, 0, 0]) at 1/5 with H2O, whose state is the
    attention each row paid so far: row 0 continues row 2, rows 1 and 2
    continue row 0 (one takes its sequence, one forks it), row 1's sequence
    is removed. Their logits equal rows that ran those histories."""
    prompts, history, after = _ids(200, batch=3), _ids(4, batch=3, seed=2), _ids(5, batch=3, seed=3)
    sources = [2, 0, 0]
    config = dict(selector="h2o", **PARTIAL)
    with torch.no_grad():
        with pqt.Session(llama, **config) as session:
            cache = session.cache()
            llama(prompts, past_key_values=cache)
            for i in range(history.shape[1]):
                llama(history[:, i:i + 1], past_key_values=cache)
            before = [session.sequence(b) for b in range(3)]
            cache.reorder_cache(torch.tensor(sources))
            assert session.context().sequence_count() == 3
            assert [session.sequence(b) for b in range(3)][:2] == [before[2], before[0]]
            assert session.sequence(2) not in before  # a fork
            got = _question_logits(llama, cache, after[:, :1], after[:, 1:])
        with pqt.Session(llama, **config) as fresh:
            cache = fresh.cache()
            llama(prompts[sources], past_key_values=cache)
            for i in range(history.shape[1]):
                llama(history[sources, i:i + 1], past_key_values=cache)
            reference = _question_logits(llama, cache, after[:, :1], after[:, 1:])
    assert (got - reference).abs().max() <= 1e-5, (got - reference).abs().max()


def test_beams_on_a_prefilled_context(llama):
    """The context once, its row repeated for 3 beams by forks
    (batch_repeat_interleave), then beam search for a question at 1/5: the
    same beams as a fresh Session's beam search over context and question."""
    config = dict(selector="pq", **PARTIAL)
    context = _ids(CONTEXT)
    question, _ = _questions()[0]
    prompt = torch.cat([context, question], dim=1)
    kwargs = dict(max_new_tokens=6, num_beams=3, do_sample=False, output_scores=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        with pqt.Session(llama, **config) as session:
            cache = session.cache()
            llama(context, past_key_values=cache)
            cache.batch_repeat_interleave(3)
            assert session.context().sequence_count() == 3
            assert [session.length(b) for b in range(3)] == [CONTEXT] * 3
            got = llama.generate(prompt, past_key_values=cache, **kwargs)
        with pqt.Session(llama, **config) as fresh:
            cache = fresh.cache()
            llama(context.repeat(3, 1), past_key_values=cache)
            reference = llama.generate(prompt, past_key_values=cache, **kwargs)
    assert torch.equal(got.sequences, reference.sequences)
    assert torch.allclose(got.sequences_scores, reference.sequences_scores, atol=1e-5)


def test_sampled_return_sequences_on_a_prefilled_context(llama):
    """num_return_sequences=3 with sampling on a context repeated by forks:
    the same samples as a fresh Session that prefilled three rows."""
    config = dict(selector="pq", **PARTIAL)
    context = _ids(CONTEXT)
    prompt = torch.cat([context, _questions()[1][0]], dim=1)
    kwargs = dict(max_new_tokens=6, do_sample=True, num_return_sequences=3)
    with torch.no_grad():
        with pqt.Session(llama, **config) as session:
            cache = session.cache()
            llama(context, past_key_values=cache)
            cache.batch_repeat_interleave(3)
            torch.manual_seed(7)
            got = llama.generate(prompt, past_key_values=cache, **kwargs)
        with pqt.Session(llama, **config) as fresh:
            cache = fresh.cache()
            llama(context.repeat(3, 1), past_key_values=cache)
            torch.manual_seed(7)
            reference = llama.generate(prompt, past_key_values=cache, **kwargs)
    assert torch.equal(got, reference)
    assert len({tuple(row.tolist()) for row in got}) > 1  # the rows did sample apart


def test_batch_select_indices_keeps_and_forks_rows(llama):
    prompts = _ids(150, batch=3)
    with torch.no_grad(), pqt.Session(llama, selector="pq", **PARTIAL) as session:
        cache = session.cache()
        llama(prompts, past_key_values=cache)
        kept = session.sequence(2)
        cache.batch_select_indices(torch.tensor([False, False, True]))
        assert session.context().sequence_count() == 1 and session.sequence(0) == kept
        cache.batch_select_indices([0, 0])
        assert session.context().sequence_count() == 2
        out = llama(_ids(1).repeat(2, 1), past_key_values=cache).logits
        assert torch.equal(out[0], out[1])  # one history, one token
        with pytest.raises(IndexError, match="row 2 does not exist; the cache has 2 rows"):
            cache.batch_select_indices([2])


# --- what is refused -----------------------------------------------------------

def test_a_wider_batch_on_a_prefilled_cache_names_batch_repeat_interleave(llama):
    context = _ids(100)
    with torch.no_grad(), pqt.Session(llama, selector="pq", **PARTIAL) as session:
        cache = session.cache()
        llama(context, past_key_values=cache)
        with pytest.raises(ValueError, match=r"batch row 1.*batch_repeat_interleave"):
            llama.generate(torch.cat([context, _ids(4)], 1), past_key_values=cache,
                           max_new_tokens=2, num_beams=2, do_sample=False)


def test_rows_of_their_own_contexts_crop_but_do_not_fork(llama):
    """rows=[...] gives each row a context (and selector) of its own: crop
    works on each, moving a row into another's context does not."""
    with torch.no_grad(), pqt.Session(llama, rows=[{"selector": "pq"}, {"selector": "snapkv"}],
                                      **PARTIAL) as session:
        cache, _ = session.prefill_all_rows(_ids(120))
        llama(_ids(3, batch=2), past_key_values=cache)
        cache.crop(-3)
        assert [session.length(0), session.length(1)] == [120, 120]
        assert [session.context(b).length(session.sequence(b), 0) for b in (0, 1)] == [120, 120]
        with pytest.raises(ValueError, match="a context of its own"):
            cache.reorder_cache(torch.tensor([1, 1]))
        cache.reorder_cache(torch.tensor([0, 1]))  # no move: nothing to refuse


def test_crop_arguments_and_deepcopy_are_named_errors(llama):
    with torch.no_grad(), pqt.Session(llama, selector="pq", **PARTIAL) as session:
        cache = session.cache()
        llama(_ids(50), past_key_values=cache)
        with pytest.raises(ValueError, match=r"crop\(10\).*negative count"):
            cache.crop(10)
        with pytest.raises(ValueError, match=r"crop\(-51\): the cache holds 50 tokens"):
            cache.crop(-51)
        cache.crop(0)
        assert session.length() == 50
        with pytest.raises(TypeError, match="checkpoint"):
            copy.deepcopy(cache)
        other = session.cache()
        llama(_ids(20, seed=5), past_key_values=other)  # a new prompt: the rows follow it
        with pytest.raises(ValueError, match="another cache of the Session ran since"):
            cache.crop(-1)
        cache.crop(0)  # trims sliding windows only: nothing to check


def test_checkpoints_are_per_session_and_closed_ones_refused(llama):
    with torch.no_grad(), pqt.Session(llama, selector="pq", **PARTIAL) as session, \
            pqt.Session(llama, selector="pq", **PARTIAL) as other:
        cache = session.cache()
        llama(_ids(60), past_key_values=cache)
        start = cache.checkpoint()
        other_cache = other.cache()
        llama(_ids(60), past_key_values=other_cache)
        with pytest.raises(ValueError, match="another Session"):
            other_cache.rewind(start)
        start.close()
        start.close()  # idempotent
        with pytest.raises(ValueError, match="checkpoint is closed"):
            cache.rewind(start)
        kept = cache.checkpoint()
    kept.close()  # after the Session's close: nothing left to free, no error


def test_a_dynamic_cache_cropped_outside_the_session_is_refused(llama):
    """A DynamicCache's crop cannot reach the library: the next forward
    names the mismatch and the LibraryCache that would have truncated."""
    with torch.no_grad(), pqt.Session(llama, selector="pq", **PARTIAL):
        cache = DynamicCache(config=llama.config)
        llama(_ids(100), past_key_values=cache)
        cache.crop(-10)
        with pytest.raises(ValueError, match="position 90 but the library holds 100.*crop a "
                           "LibraryCache"):
            llama(_ids(1), past_key_values=cache)
