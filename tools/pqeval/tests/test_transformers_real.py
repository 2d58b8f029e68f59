"""The transformers runtime on the real SmolLM2-135M: it agrees with the
project's numpy model (the reference forward pass; both read the file with
the gguf package and tokenise with tokenizers, which tools/tests/
test_pqmodel_reference.py checks against the hand-written code they
replaced), and the integration drives it end to end."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh installs it)")
pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh)")
import numpy as np  # noqa: E402

import pqcache.transformers as pqt  # noqa: E402
from pqeval import hf  # noqa: E402

SPEC = hf.MODELS["smollm2-135m"]


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):  # conftest: skips without the model, torch or transformers
    return hf_smollm2


def test_transformers_and_the_numpy_model_agree(hf_model, model, text):
    """Same tokens, same logits: transformers dequantises the GGUF and runs
    rotate-half RoPE on un-permuted Q/K rows, the numpy model runs
    llama.cpp's adjacent-pair RoPE on the file's rows; q.k is the same."""
    hf_m, tok = hf_model
    ids = model.tokenizer.encode(text)[:384]
    assert hf.encode(SPEC, tok, text)[:384] == ids
    reference = model.prefill(ids, model.new_cache(400), logits="all")
    with torch.no_grad():
        got = hf_m(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(got - reference).max() < 2e-3 * np.abs(reference).max()  # measured 6e-6 rel.
    assert (got.argmax(-1) == reference.argmax(-1)).mean() > 0.99


def test_every_token_selected_matches_full_attention_on_the_real_model(hf_model, text):
    hf_m, tok = hf_model
    ids = torch.tensor([hf.encode(SPEC, tok, text)[:1056]])
    with torch.no_grad():
        reference = hf_m(ids).logits[0, 1024:]
        with pqt.Session(hf_m, selector="exact", topk_fraction=1.0, chunk_mode="decode") as s:
            cache = s.cache()
            hf_m(ids[:, :1024], past_key_values=cache, logits_to_keep=1)
            got = hf_m(ids[:, 1024:], past_key_values=cache).logits[0]
            assert s.stats()["select_calls"] == 32 * 30
    assert (got - reference).abs().max() < 1e-3


def test_generate_with_pq_on_the_real_model(hf_model, text):
    """model.generate with PQ at 1/5 in all 30 layers: every layer built its
    index and selected a fifth of the middle tokens."""
    hf_m, tok = hf_model
    ids = torch.tensor([hf.encode(SPEC, tok, text)[:1500]])
    with pqt.Session(hf_m, selector="pq", topk_fraction=0.2) as s:
        out = hf_m.generate(ids, max_new_tokens=12, do_sample=False,
                            past_key_values=s.cache())
        ctx = s.context()
        infos = [ctx.layer_info(0, layer) for layer in range(30)]
        capacity = ctx.capacity(0, 0)
        assert s.stats()["select_calls"] == 11 * 30
    assert out.shape == (1, 1512)
    assert all(i["index_ready"] == 1 and i["tokens"] == 1511 for i in infos)
    assert capacity == 4 + 128 + int(np.ceil(0.2 * (1511 - 4 - 128)))
    assert tok.decode(out[0, 1500:]).strip()  # some text came out
