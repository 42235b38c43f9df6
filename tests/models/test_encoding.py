"""Each task's encoding is one object: the adapter's `encode` runs it, and `batchscore plan`
builds it alone (`models.tasks.encoding`) with no weights loaded. Both routes must give the same
units, field by field, for every task and the ways a job can read its rows: prompts (a
sentence-transformers stack's, a generation template over two columns), text pairs, and long
texts in windows."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import safetensors.torch
import torch
import transformers

from batchscore.job.parse import job_from_dict
from batchscore.models.tasks import encoding, load_task
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded
from tests.models.st_folders import save_st, tiny_bert


@pytest.fixture(scope="module")
def table(small_corpus: pa.Table) -> pa.Table:
    """Real texts (some far past the models' windows), a second text column, and rows that
    cannot be read: a null text, a blank one, a null second text."""
    texts = small_corpus.column("text").to_pylist()[:40]
    contexts = small_corpus.column("text").to_pylist()[40:80][::-1]
    texts[5], texts[9], contexts[12] = None, "   ", None
    return pa.table({"text": texts, "context": contexts})


@pytest.fixture(scope="module")
def st_path(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    """A sentence-transformers stack (saved by sentence-transformers) with two prompts, a
    default one, prompt tokens left out of its pooling, and a Normalize."""
    folder = tmp_path_factory.mktemp("st")
    encoder = tiny_bert(folder / "bert", minilm_path)
    return save_st(folder / "stack", encoder, normalize=True, include_prompt=False,
                   prompts={"query": "query: ", "passage": "passage: the passage reads "},
                   default_prompt="query")  # fmt: skip


PAIR = {"input": {"text_pair": "context"}}
CHUNK = {"long_text": "chunk"}
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "embed": ("embed", "minilm_path", {"model": {"max_length": 64}}),
    "embed-stack-default-prompt": ("embed", "st_path", {"model": {"max_length": 48}}),
    "embed-stack-prompt-chunk": ("embed", "st_path", {"embed": {"prompt_name": "passage"},
                                                      "model": {"max_length": 32, **CHUNK}}),
    "summarize": ("summarize", "minilm_path", {"summarize": {"max_sentences": 5},
                                               "model": {"max_length": 32}}),
    "summarize-stack-chunk": ("summarize", "st_path", {"model": {"max_length": 16, **CHUNK}}),
    "classify": ("classify", "bert_path", {"model": {"max_length": 48}}),
    "classify-chunk": ("classify", "bert_path", {"model": {"max_length": 32, **CHUNK}}),
    "classify-pair": ("classify", "bert_path", {**PAIR, "model": {"max_length": 48}}),
    "classify-pair-chunk": ("classify", "bert_path", {**PAIR, "model": {"max_length": 64,
                                                                         **CHUNK}}),
    "generate-template": ("generate", "gpt2_path", {
        "generate": {"prompt": "Q: {text}\nContext: {context}\nA:", "max_new_tokens": 8},
        "model": {"max_length": 40}}),
    "generate-seq2seq": ("generate", "t5_path", {"generate": {"max_new_tokens": 6}}),
    "summarize-abstractive": ("summarize", "t5_path",
                              {"summarize": {"prompt": "summarize: {text}"}}),
}  # fmt: skip


def job_of(task: str, path: Path, sections: dict[str, Any], tmp_path: Path) -> Any:
    raw = {
        "input": {"path": "in", "text": "text", **sections.get("input", {})},
        "model": {
            "task": task,
            "path": str(path),
            "threads": 1,
            "precision": "fp32",
            **sections.get("model", {}),
        },
        "output": {"path": "out"},
        **{k: v for k, v in sections.items() if k not in ("input", "model")},
    }
    return job_from_dict(raw, tmp_path / "job.toml")


def refuse_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way batchscore loads weights fail: an encoding must need none of them."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the encoding loaded model weights")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", staticmethod(refuse))
    for owner, name in ((safetensors.torch, "load_file"), (torch, "load"), (torch.jit, "load"),
                        (torch.export, "load")):  # fmt: skip
        monkeypatch.setattr(owner, name, refuse)


def same(a: Any, b: Any) -> bool:
    """Equal, looking into dicts, lists and arrays (dtype included)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        ok = isinstance(b, list | tuple) and len(a) == len(b)
        return ok and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def assert_same_units(planned: Encoded, loaded: Encoded) -> None:
    for name in (f.name for f in dataclasses.fields(Encoded)):
        assert same(getattr(planned, name), getattr(loaded, name)), name


@pytest.mark.parametrize("case", CASES)
def test_plan_encodes_as_the_loaded_task_does(case, table, request, tmp_path, monkeypatch):
    task, fixture, sections = CASES[case]
    path = request.getfixturevalue(fixture)
    job = job_of(task, path, sections, tmp_path)
    with monkeypatch.context() as patch:
        refuse_weights(patch)
        alone = encoding(path, model=job.model, options=job.options, inp=job.input)
        planned = alone.encode(table)
    adapter = load_task(path, model=job.model, options=job.options, inp=job.input,
                        executor=Executor(job.model))  # fmt: skip
    loaded = adapter.encode(table)
    assert type(adapter.encoding) is type(alone)  # one implementation, whichever route
    assert (alone.inputs, alone.bucketing) == (adapter.inputs, adapter.bucketing)
    assert_same_units(planned, loaded)
    assert loaded.errors and len(loaded.rows) + len(loaded.errors) == table.num_rows
    if job.model.long_text == "chunk":
        assert loaded.chunked > 0 and loaded.windows > loaded.chunked
    if task == "generate":
        assert loaded.reserve == job.options.max_new_tokens


def test_tensor_rows_need_no_model_file(tmp_path: Path, mlp, monkeypatch):
    """Rows of features have no tokens: one unit each, no bucketing, bad rows named; and the
    encoding is built without the model file even existing."""
    table = pa.table({"a": [1.0, None, 2.0], "b": [3, 4, 5], "c": [0.5, 0.5, float("nan")],
                      "d": [1, 2, 3]})  # fmt: skip
    sections = {"input": {"features": ["a", "b", "c", "d"]}, "tensor": {"output": "class"}}
    missing = tmp_path / "none.pt"
    job = job_of("tensor", missing, sections, tmp_path)
    with monkeypatch.context() as patch:
        refuse_weights(patch)
        alone = encoding(missing, model=job.model, options=job.options, inp=job.input)
        planned = alone.encode(table)
    assert planned.lengths.tolist() == [1] and not alone.bucketing
    assert sorted(planned.errors) == [1, 2]
    path = mlp[1]["torchscript"]
    job = job_of("tensor", path, sections, tmp_path)
    adapter = load_task(path, model=job.model, options=job.options, inp=job.input,
                        executor=Executor(job.model))  # fmt: skip
    assert_same_units(planned, adapter.encode(table))
