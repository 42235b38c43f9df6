"""Session-scoped tiny models (built once per test run, in a temporary folder)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.models import tiny
from tests.models.st_folders import save_st


@pytest.fixture(scope="session")
def tiny_texts(small_corpus: pa.Table) -> list[str]:
    """The texts tiny tokenizers are trained on."""
    return small_corpus.column("text").to_pylist()


@pytest.fixture(scope="session")
def gpt2_path(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.gpt2(tmp_path_factory.mktemp("gpt2"), tiny_texts)


@pytest.fixture(scope="session")
def t5_path(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.t5(tmp_path_factory.mktemp("t5"), tiny_texts)


@pytest.fixture(scope="session")
def bart_path(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.bart(tmp_path_factory.mktemp("bart"), tiny_texts)


@pytest.fixture(scope="session")
def bert_path(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    labels = ["function", "class", "module", "topic"]
    return tiny.bert_classifier(tmp_path_factory.mktemp("bert"), minilm_path, labels)


@pytest.fixture(scope="session")
def mlp(tmp_path_factory: pytest.TempPathFactory):
    """(the module, {format: file}) for a 4-feature, 3-class MLP."""
    return tiny.mlp_files(tmp_path_factory.mktemp("mlp"))


@pytest.fixture(scope="session")
def texts(small_corpus: pa.Table) -> list[str]:
    """Real docstrings, short and long (some past the models' windows), plus odd ones; a test
    module that needs other texts defines its own ``texts``."""
    picked = small_corpus.column("text").to_pylist()[::9][:40]
    return [*picked, "x", "Ünïcödé and CAPITALS, with    spaces."]


@pytest.fixture(scope="session")
def dense_model(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    """The real MiniLM with a Dense head (384 -> 128, tanh), Normalize and two prompts, saved
    by sentence-transformers."""
    return save_st(
        tmp_path_factory.mktemp("st") / "minilm-dense",
        minilm_path,
        dense=[(128, "Tanh", False)],
        normalize=True,
        prompts={"query": "query: ", "passage": "passage: "},
        default_prompt="query",
        max_seq_length=128,
    )
