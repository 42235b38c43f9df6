"""`batchscore plan` encodes without weights; its lengths must be the loaded adapters' own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from batchscore.job.load import job_from_dict
from batchscore.models.tasks import load_task
from batchscore.models.tokenize import tokenizer_of
from batchscore.pipeline.executor import Executor


@pytest.fixture(scope="module")
def table(small_corpus: pa.Table) -> pa.Table:
    texts = small_corpus.column("text").to_pylist()[:40]
    texts[5], texts[9] = None, "   "
    return pa.table({"text": texts})


CASES = {
    "embed": ("minilm_path", {"model": {"max_length": 64}}),
    "summarize": ("minilm_path", {"summarize": {"max_sentences": 5}, "model": {"max_length": 32}}),
    "classify": ("bert_path", {"model": {"max_length": 48}}),
    "generate": ("gpt2_path", {"generate": {"prompt": "Q: {text}\nA:", "max_new_tokens": 8},
                               "model": {"max_length": 40}}),
    "generate-seq2seq": ("t5_path", {"generate": {"max_new_tokens": 6}}),
    "summarize-abstractive": ("t5_path", {"summarize": {"prompt": "summarize: {text}"}}),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_plan_encodes_as_the_loaded_task_does(case: str, table: pa.Table, request, tmp_path: Path):
    fixture, sections = CASES[case]
    path = request.getfixturevalue(fixture)
    task = case.split("-")[0]
    raw = {
        "input": {"path": "in", "text": "text"},
        "model": {"task": task, "path": str(path), "threads": 1, **sections.pop("model", {})},
        "output": {"path": "out"},
        **sections,
    }
    job = job_from_dict(raw, tmp_path / "job.toml")
    loaded = load_task(path, model=job.model, options=job.task, inp=job.input,
                       executor=Executor(job.model)).encode(table)  # fmt: skip
    planned = tokenizer_of(job, path).encode(table)
    assert np.array_equal(planned.lengths, loaded.lengths)
    assert np.array_equal(planned.owners, loaded.owners)
    assert np.array_equal(planned.rows, loaded.rows) and planned.errors == loaded.errors
    assert planned.truncated == loaded.truncated and planned.reserve == loaded.reserve


def test_tensor_rows_have_no_tokens(tmp_path: Path):
    raw = {
        "input": {"path": "in", "features": ["a", "b"]},
        "model": {"task": "tensor", "path": str(tmp_path)},
        "tensor": {"output": "class"},
        "output": {"path": "out"},
    }
    job = job_from_dict(raw, tmp_path / "job.toml")
    encoded = tokenizer_of(job, tmp_path).encode(pa.table({"a": [1.0, 2.0], "b": [3, 4]}))
    assert encoded.lengths.tolist() == [1, 1] and not tokenizer_of(job, tmp_path).bucketing
