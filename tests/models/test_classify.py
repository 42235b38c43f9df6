"""Sequence classification with a tiny BERT: labels, probabilities, and padding-free batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from batchscore.errors import JobError, ModelError
from batchscore.job.parse import load_job
from batchscore.job.sections import ClassifyConfig, InputConfig, ModelConfig
from batchscore.models.classify import ClassifyTask, label_names
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from tests.conftest import read_output, write_job


def make_task(path: Path, all_scores: bool = True) -> ClassifyTask:
    model = ModelConfig(task="classify", precision="fp32", max_length=128, threads=1)
    options = ClassifyConfig(all_scores=all_scores)
    return ClassifyTask(
        path, model=model, options=options, inp=InputConfig(path=()), executor=Executor(model)
    )


def probabilities(task: ClassifyTask, encoded, batches: list[np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))


def test_batched_probabilities_equal_row_alone(bert_path, tiny_texts):
    task = make_task(bert_path)
    texts = tiny_texts[:60]
    encoded = task.encode(pa.table({"text": texts}))
    batches = form_batches(encoded.lengths, 1024, 64)
    assert len(batches) > 2 and encoded.lengths.max() > 4 * encoded.lengths.min()
    batched = probabilities(task, encoded, batches)
    alone = probabilities(task, encoded, [np.array([i]) for i in range(len(texts))])
    assert np.abs(batched - alone).max() < 1e-5
    one_batch = probabilities(task, encoded, [np.arange(len(texts))])  # all padded together
    assert np.abs(one_batch - alone).max() < 1e-5


def test_label_score_and_scores_columns(bert_path, tiny_texts):
    task = make_task(bert_path)
    encoded = task.encode(pa.table({"text": tiny_texts[:20]}))
    probs = probabilities(task, encoded, [np.arange(20)])
    columns = task.finish(encoded, probs)
    assert [f.name for f in task.columns] == ["label", "score", "scores"]
    labels, scores = columns["label"].to_pylist(), np.array(columns["scores"].to_pylist())
    assert set(labels) <= {"function", "class", "module", "topic"}
    assert len(set(labels)) > 1  # random weights, but not a constant
    assert np.allclose(scores.sum(axis=1), 1.0, atol=1e-6)  # order = label ids
    assert np.allclose(columns["score"].to_numpy(), scores.max(axis=1))
    order = ["function", "class", "module", "topic"]
    assert [order[i] for i in scores.argmax(axis=1)] == labels
    assert columns["score"].type == pa.float32()


def test_scores_column_is_optional(bert_path):
    task = make_task(bert_path, all_scores=False)
    encoded = task.encode(pa.table({"text": ["one", None]}))
    assert encoded.errors == {1: "column 'text': text is null"}
    columns = task.finish(encoded, probabilities(task, encoded, [np.arange(1)]))
    assert list(columns) == ["label", "score"]
    empty = task.finish(task.encode(pa.table({"text": pa.array([], pa.string())})), np.empty(0))
    assert len(empty["label"]) == 0


def test_heads_it_cannot_score_are_refused(tmp_path, minilm_path):
    """Several regression outputs are neither labels nor a reranker's score; one output (a
    reranker, `test_rerank.py`) scores pairs, so a job of one text column is pointed at them."""
    from transformers import BertConfig, BertForSequenceClassification

    for outputs, problem in ((3, "regression"), (1, None)):
        shape = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}
        config = BertConfig(intermediate_size=8, num_labels=outputs, problem_type=problem, **shape)
        BertForSequenceClassification(config).save_pretrained(tmp_path / str(outputs))
        tokenizer = (minilm_path / "tokenizer.json").read_bytes()
        (tmp_path / str(outputs) / "tokenizer.json").write_bytes(tokenizer)
    with pytest.raises(ModelError, match="a regression head of 3 outputs, neither a classifier"):
        make_task(tmp_path / "3", all_scores=False)
    with pytest.raises(ModelError, match=r"scores pairs of texts; set \[input\].text_pair"):
        make_task(tmp_path / "1", all_scores=False)


def test_classify_job_runs_and_resumes(tmp_path, shards, bert_path):
    path = write_job(
        tmp_path / "classify.toml",
        input={"path": "in", "id": "doc_id", "keep": ["kind"]},
        model={"task": "classify", "path": str(bert_path), "max_length": 64, "threads": 1},
        batching={"max_tokens": 4096, "window_rows": 64},
        output={"path": "out", "chunk_rows": 50},
        classify={"all_scores": True},
    )
    report = run_job(load_job(path))
    assert report["rows"] == 360 and report["chunks_committed"] == 9
    out = read_output(tmp_path / "out")
    assert out.column_names == ["doc_id", "kind", "label", "score", "scores"]
    kind = out.schema.field("scores").type
    assert pa.types.is_fixed_size_list(kind) and kind.value_type == pa.float32()
    again = run_job(load_job(path))
    assert again["rows"] == 0 and again["chunks_already_done"] == 9
    assert read_output(tmp_path / "out").equals(out)


def test_a_bare_encoder_is_not_taken_for_a_classifier(minilm_path, tmp_path):
    # transformers would bolt on a randomly initialised head; its modules.json says what it is
    with pytest.raises(ModelError, match=r'Normalize \(an embedding model: task "embed"'):
        make_task(minilm_path)
    bare = tmp_path / "bare"  # the Hugging Face folder alone: no modules.json to say so
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (bare / name).write_bytes((minilm_path / name).read_bytes())
    with pytest.raises(ModelError, match="incomplete weights for this task; they lack classifier"):
        make_task(bare)
    path = write_job(tmp_path / "c.toml", input={"path": "in"}, model={"task": "classify"},
                     output={"path": "out"})  # fmt: skip
    with pytest.raises(JobError, match=r"\[model\].path: task classify needs its own model"):
        load_job(path)


def test_every_data_file_names_its_labels_in_score_order(tmp_path, shards, bert_path):
    """Issue 51: `scores` was a bare array "in label-id order", the names only in the model's
    config.json. Every data file's footer now carries them (`batchscore.labels`, a JSON list),
    read back with pyarrow and polars as docs/output-folder.md shows, and they are the ones
    the model's own head names its labels with: `scores`' argmax, named, is `label`."""
    path = write_job(
        tmp_path / "classify.toml",
        input={"path": "in/docs-000.parquet", "id": "doc_id"},
        model={"task": "classify", "path": str(bert_path), "max_length": 64, "threads": 1},
        batching={"max_tokens": 4096, "window_rows": 64},
        output={"path": "out", "chunk_rows": 50},
        classify={"all_scores": True},
    )
    run_job(load_job(path))
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert len(files) == 3
    loaded = make_task(bert_path).head.labels.tolist()
    for file in files:
        labels = json.loads(pq.read_metadata(file).metadata[b"batchscore.labels"])
        assert labels == loaded == ["function", "class", "module", "topic"]
        assert json.loads(pl.read_parquet_metadata(file)["batchscore.labels"]) == labels
        table = pq.read_table(file)
        best = np.array(table["scores"].to_pylist()).argmax(axis=1)
        assert [labels[i] for i in best] == table["label"].to_pylist()


def test_label_names_are_read_as_transformers_reads_them():
    """By id, whatever the order of config.json's keys; unnamed labels as LABEL_i."""
    assert label_names({"id2label": {"1": "pos", "0": "neg"}}) == ["neg", "pos"]
    assert label_names({"num_labels": 3}) == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert label_names({}) == ["LABEL_0", "LABEL_1"]
