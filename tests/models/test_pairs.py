"""`[input].text_pair`: classify reads (text, pair) as cross-encoders and NLI models are trained
to, checked against plain transformers row by row on a tiny cross-encoder built from a config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.errors import JobError
from batchscore.job.parse import load_job
from batchscore.job.sections import ClassifyConfig, InputConfig, ModelConfig
from batchscore.models.classify import ClassifyTask
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from tests.conftest import read_output, write_job
from tests.models import tiny

LABELS = ["entailment", "neutral", "contradiction"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, minilm_path) -> Path:
    """A 2-layer BERT NLI head (3 labels) with segment embeddings, random weights."""
    return tiny.bert_classifier(tmp_path_factory.mktemp("nli"), minilm_path, LABELS)


@pytest.fixture(scope="module")
def pairs(small_corpus) -> pa.Table:
    texts = small_corpus.column("text").to_pylist()
    return pa.table({"premise": texts[:40], "hypothesis": texts[40:80][::-1]})


def make(path: Path, long_text: str = "truncate") -> ClassifyTask:
    model = ModelConfig(
        task="classify", precision="fp32", max_length=64, threads=1, long_text=long_text
    )
    inp = InputConfig(path=(), text="premise", text_pair="hypothesis")
    return ClassifyTask(
        path,
        model=model,
        options=ClassifyConfig(all_scores=True),
        inp=inp,
        executor=Executor(model),
    )


def scores(task: ClassifyTask, table: pa.Table) -> tuple[np.ndarray, object]:
    encoded = task.encode(table)
    batches = form_batches(encoded.lengths, 1024, 16)
    with torch.inference_mode():
        results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    return np.array(task.finish(encoded, results)["scores"].to_pylist()), encoded


def reference(path: Path, table: pa.Table, *, windows: bool = False) -> np.ndarray:
    """Each pair alone through plain transformers: truncated longest first, or (``windows``)
    transformers' own windows of the second text, their probabilities averaged."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    firsts, seconds = table["premise"].to_pylist(), table["hypothesis"].to_pylist()
    out = []
    with torch.inference_mode():
        for a, b in zip(firsts, seconds, strict=True):
            if windows:
                enc = tok(
                    a,
                    b,
                    max_length=64,
                    truncation="only_second",
                    stride=64 // 8,
                    return_overflowing_tokens=True,
                )
                units = list(zip(enc["input_ids"], enc["token_type_ids"], strict=True))
            else:
                enc = tok(a, b, max_length=64, truncation=True)
                units = [(enc["input_ids"], enc["token_type_ids"])]
            probs = [
                model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
                .logits.softmax(-1)[0]
                .numpy()
                for ids, types in units
            ]
            out.append(np.mean(probs, axis=0))
    return np.stack(out)


def test_pairs_equal_plain_transformers_row_by_row(cross_encoder, pairs):
    from transformers import AutoTokenizer

    task = make(cross_encoder)
    ours, encoded = scores(task, pairs)
    expected = reference(cross_encoder, pairs)
    print(
        f"\npairs vs transformers row by row: max |difference| {np.abs(ours - expected).max():.2e}"
    )
    assert np.abs(ours - expected).max() < 1e-5
    # the sampler sees each pair's joint length, and the model its segments
    tok = AutoTokenizer.from_pretrained(cross_encoder)
    both = zip(pairs["premise"].to_pylist(), pairs["hypothesis"].to_pylist(), strict=True)
    joint = [len(tok(a, b, truncation=True, max_length=64)["input_ids"]) for a, b in both]
    assert encoded.lengths.tolist() == joint and encoded.truncated > 0
    assert all(t.max() == 1 for t in encoded.type_ids)
    same = pa.table({"premise": pairs["premise"], "hypothesis": pairs["premise"]})
    alone = reference(cross_encoder, same)
    assert np.abs(alone - expected).max() > 1e-3  # the pair really is read


def test_long_pairs_in_windows_of_the_second_text(cross_encoder, pairs):
    short = pa.table(
        {
            "premise": ["Is the answer in the text?"] * 12,
            "hypothesis": pairs["hypothesis"].to_pylist()[:12],
        }
    )
    ours, encoded = scores(make(cross_encoder, "chunk"), short)
    expected = reference(cross_encoder, short, windows=True)
    assert encoded.chunked > 0 and encoded.windows > encoded.chunked
    assert np.abs(ours - expected).max() < 1e-5
    too_long = pa.table({"premise": ["word " * 70, "fine"], "hypothesis": ["more " * 80] * 2})
    encoded = make(cross_encoder, "chunk").encode(too_long)
    assert encoded.rows.tolist() == [1] and "takes 70 of the model's 64 tokens" in encoded.errors[0]


def test_a_missing_pair_is_a_row_error(cross_encoder):
    table = pa.table({"premise": ["a", "b", None], "hypothesis": ["x", " ", "z"]})
    encoded = make(cross_encoder).encode(table)
    assert encoded.rows.tolist() == [0]
    assert encoded.errors == {
        1: "column 'hypothesis': text is empty",
        2: "column 'premise': text is null",
    }


def test_a_cross_encoder_job(tmp_path, shards, cross_encoder, small_corpus):
    path = write_job(
        tmp_path / "nli.toml",
        input={"path": str(shards), "text": "text", "text_pair": "doc_id", "id": "doc_id"},
        model={"task": "classify", "path": str(cross_encoder), "max_length": 64, "threads": 1},
        batching={"max_tokens": 2048},
        output={"path": "out"},
        classify={"all_scores": True},
    )
    job = load_job(path)
    parts = fingerprint_parts(job, cross_encoder)
    assert parts["columns"]["inputs"] == [("text", "text"), ("doc_id", "text")]
    report = run_job(job)
    out = read_output(tmp_path / "out")
    assert report["rows"] == 360 and set(out["label"].to_pylist()) <= set(LABELS)
    sample = small_corpus.take([0, 100, 200, 300])
    table = pa.table({"premise": sample["text"], "hypothesis": sample["doc_id"]})
    row = {doc: i for i, doc in enumerate(out["doc_id"].to_pylist())}
    got = np.array([out["scores"][row[doc]].as_py() for doc in sample["doc_id"].to_pylist()])
    assert np.abs(got - reference(cross_encoder, table)).max() < 1e-5
    embed = write_job(
        tmp_path / "e.toml",
        input={"path": "in", "text_pair": "doc_id"},
        model={"task": "embed"},
        output={"path": "o"},
    )
    with pytest.raises(JobError, match=r"\[input\].text_pair: task embed reads one text"):
        load_job(embed)
