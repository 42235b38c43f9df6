"""Embeddings from the real all-MiniLM-L6-v2 equal a plain transformers reference, row by row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig
from batchscore.models.embed import EmbedTask, pool, pooling_mode
from batchscore.pipeline.executor import Executor
from batchscore.pipeline.sampler import form_batches, restore


@pytest.fixture(scope="module")
def task(minilm_path):
    model = ModelConfig(task="embed", max_length=256)
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
    expected = reference(minilm_path, texts)
    cosine = (results * expected).sum(axis=1)
    assert cosine.min() >= 0.9999
    column = task.finish(encoded, results)["embedding"]
    assert column.type == pa.list_(pa.float32(), 384) and len(column) == len(texts)
    assert np.allclose(np.array(column.to_pylist()), results)


def test_minilm_prescribes_mean_pooling(minilm_path):
    assert pooling_mode(minilm_path) == "mean"


def test_pooling_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 4.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]
    assert pool(hidden, mask, "last").tolist() == [[3.0, 4.0]]


def test_truncation_is_counted(task):
    encoded = task.encode(pa.table({"text": ["word " * 1000, "short"]}))
    assert encoded.lengths.tolist()[0] == 256
    assert encoded.truncated == 1


def test_null_texts_are_row_errors_not_units(task):
    encoded = task.encode(pa.table({"text": ["a", None, "b"]}))
    assert encoded.rows.tolist() == [0, 2] and len(encoded.lengths) == 2
    assert encoded.errors == {1: "column 'text': text is null"}
