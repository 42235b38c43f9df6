"""Embeddings from the real all-MiniLM-L6-v2 equal a plain transformers reference, row by row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig
from batchscore.models.embed import EmbedTask
from batchscore.models.stack.pooling import pool
from batchscore.models.stack.stack import read_stack
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.runtime.executor import Executor


@pytest.fixture(scope="module")
def task(minilm_path):
    model = ModelConfig(task="embed", precision="fp32", max_length=256)
    return EmbedTask(
        minilm_path,
        model=model,
        options=EmbedConfig(),
        inp=InputConfig(path=()),
        executor=Executor(model),
    )


def reference(path, texts: list[str]) -> np.ndarray:
    """The textbook recipe, one row at a time, no padding at all."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            out.append(torch.nn.functional.normalize(hidden.mean(0), dim=0).numpy())
    return np.stack(out)


def test_batched_embeddings_match_row_alone_reference(task, small_corpus, minilm_path):
    texts = small_corpus.column("text").to_pylist()[:120]
    encoded = task.encode(pa.table({"text": texts}))
    batches = form_batches(encoded.lengths, 2048, 64)
    assert len(batches) > 3  # really batched, with padding between lengths
    with torch.inference_mode():
        outputs = [task.forward(encoded, b) for b in batches]
    results = restore(batches, outputs, np.empty(0))
    column = task.finish(encoded, results)["embedding"]
    assert column.type == pa.list_(pa.float32(), 384) and len(column) == len(texts)
    vectors = np.array(column.to_pylist())
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = (vectors * reference(minilm_path, texts)).sum(axis=1)
    assert cosine.min() >= 0.9999


def test_minilm_prescribes_mean_pooling_then_normalize(minilm_path):
    stack = read_stack(minilm_path)
    assert stack.modes == ("mean",) and stack.head == ("normalize",) and stack.plain
    assert stack.encoder == minilm_path and stack.prompt(None) == ""


def test_pooling_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 4.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]
    assert pool(hidden, mask, "lasttoken").tolist() == [[3.0, 4.0]]
    weighted = pool(hidden, mask, "weightedmean")  # positions 1 and 2 weigh 1 and 2
    assert torch.allclose(weighted, torch.tensor([[(1 + 6) / 3, (2 + 8) / 3]]))
    assert pool(hidden, mask, ("cls", "max")).tolist() == [[1.0, 2.0, 3.0, 4.0]]
    assert pool(hidden, mask, "mean", skip=1).tolist() == [[3.0, 4.0]]  # a prompt left out


def test_truncation_is_counted(task):
    encoded = task.encode(pa.table({"text": ["word " * 1000, "short"]}))
    assert encoded.lengths.tolist()[0] == 256
    assert encoded.truncated == 1


def test_null_texts_are_row_errors_not_units(task):
    encoded = task.encode(pa.table({"text": ["a", None, "b"]}))
    assert encoded.rows.tolist() == [0, 2] and len(encoded.lengths) == 2
    assert encoded.errors == {1: "column 'text': text is null"}
