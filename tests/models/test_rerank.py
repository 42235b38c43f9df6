"""Rerankers: a one-logit cross-encoder with `[input].text_pair` writes `score`, equal to
sentence-transformers' own ``CrossEncoder.predict`` on tiny BERT rerankers built here from a
config (random weights), in the folder layouts sentence-transformers 6 saves and the hub serves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from batchscore.errors import JobError, ModelError
from batchscore.job.parse import load_job
from batchscore.job.sections import ClassifyConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.classify import ClassifyTask
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.models.tasks import check_model
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.precision.table import available
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from tests.conftest import read_output, write_job

IDENTITY = "torch.nn.modules.linear.Identity"
TANH = "torch.nn.modules.activation.Tanh"


def classic(folder: Path, minilm_path: Path, **fields: object) -> Path:
    """A one-logit BERT reranker as the hub serves ms-marco-MiniLM and bge-reranker: a plain
    Hugging Face folder, ``fields`` (CrossEncoder's activation, if any) in its config.json."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    torch.manual_seed(0)
    shape = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = BertConfig(vocab_size=30522, intermediate_size=64, num_labels=1, **shape)
    config.initializer_range = 0.2
    BertForSequenceClassification(config).save_pretrained(folder)
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**written, **fields}, indent=2))
    return folder


def saved(source: Path, folder: Path, **options: object) -> Path:
    """``CrossEncoder(source, **options).save(folder)``: the sentence-transformers 6 layout."""
    from sentence_transformers import CrossEncoder

    CrossEncoder(str(source), device="cpu", local_files_only=True, **options).save(str(folder))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> dict[str, Path]:
    """Rerankers in each layout, each naming its activation where that layout keeps it."""
    made = tmp_path_factory.mktemp("rerankers")
    plain = classic(made / "bge-style", minilm_path)  # names none: Sigmoid
    return {
        "classic, no activation (bge-reranker)": plain,
        "classic, sentence_transformers.activation_fn (ms-marco)": classic(
            made / "ms-marco-style",
            minilm_path,
            sentence_transformers={"activation_fn": IDENTITY, "version": "4.1.0"},
        ),
        "classic, sbert_ce_default_activation_function (< 4.0)": classic(
            made / "legacy", minilm_path, sbert_ce_default_activation_function=TANH
        ),
        "sentence-transformers 6, Sigmoid": saved(plain, made / "st6-sigmoid"),
        "sentence-transformers 6, Identity": saved(
            plain, made / "st6-identity", activation_fn=nn.Identity()
        ),
        "sentence-transformers 6, a default prompt": saved(
            plain,
            made / "st6-prompt",
            prompts={"query": "query: ", "passage": ""},
            default_prompt_name="query",
        ),
    }


@pytest.fixture(scope="module")
def pairs(small_corpus: pa.Table) -> pa.Table:
    """Short queries and passages of every length (some longer than the model's window)."""
    texts = small_corpus.column("text").to_pylist()
    queries = [" ".join(t.split()[:8]) for t in texts[:48]]
    return pa.table({"query": queries, "passage": texts[100:148]})


def make(
    path: Path, *, long_text: str = "truncate", max_length: int | None = None, **options: object
) -> ClassifyTask:
    model = ModelConfig(
        task="classify", precision="fp32", threads=1, long_text=long_text, max_length=max_length
    )
    inp = InputConfig(path=(), text="query", text_pair="passage")
    settings = ClassifyConfig(**options)
    return ClassifyTask(path, model=model, options=settings, inp=inp, executor=Executor(model))


def scores(task: ClassifyTask, table: pa.Table, budget: int = 2048) -> np.ndarray:
    """The task's scores, batched by length under ``budget`` tokens (several batches)."""
    encoded = task.encode(table)
    batches = form_batches(encoded.lengths, budget, 16)
    assert len(batches) > 1
    with torch.inference_mode():
        results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    return task.finish(encoded, results)["score"].to_numpy()


def predict(path: Path, table: pa.Table, **options: object) -> np.ndarray:
    """The reference: sentence-transformers' ``CrossEncoder(path).predict`` of every pair."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(path), device="cpu", local_files_only=True)
    both = zip(table["query"].to_pylist(), table["passage"].to_pylist(), strict=True)
    return model.predict(list(both), batch_size=16, **options)


@pytest.mark.parametrize(
    "layout",
    [
        "classic, no activation (bge-reranker)",
        "classic, sentence_transformers.activation_fn (ms-marco)",
        "classic, sbert_ce_default_activation_function (< 4.0)",
        "sentence-transformers 6, Sigmoid",
        "sentence-transformers 6, Identity",
        "sentence-transformers 6, a default prompt",
    ],
)
def test_scores_equal_cross_encoder_predict(folders, pairs, layout):
    task = make(folders[layout])
    assert [f.name for f in task.columns] == ["score"] and task.columns[0].type == pa.float32()
    ours, expected = scores(task, pairs), predict(folders[layout], pairs)
    print(f"\n{layout}: max |ours - CrossEncoder.predict| {np.abs(ours - expected).max():.1e}")
    assert np.abs(ours - expected).max() < 1e-4
    assert np.ptp(expected) > 0.05  # scores that differ, not one constant


def test_each_layout_applies_its_own_activation(folders, pairs):
    """The folders share their weights: only what they say of activation and prompt differs."""
    logits = scores(make(folders["sentence-transformers 6, Sigmoid"], activation="none"), pairs)
    got = [scores(make(path), pairs) for path in folders.values()]
    bge, ms_marco, legacy, sigmoid, identity, prompted = got
    assert np.abs(bge - 1 / (1 + np.exp(-logits))).max() < 1e-6
    assert np.abs(sigmoid - bge).max() < 1e-6
    assert np.abs(ms_marco - logits).max() < 1e-6 and np.abs(identity - logits).max() < 1e-6
    assert np.abs(legacy - np.tanh(logits)).max() < 1e-6
    assert np.abs(prompted - sigmoid).max() > 1e-3  # "query: " before each query


@pytest.mark.parametrize(
    ("activation", "module"),
    [("none", nn.Identity()), ("sigmoid", nn.Sigmoid()), ("tanh", nn.Tanh())],
)
def test_the_job_chooses_the_activation(folders, pairs, activation, module):
    st6 = folders["sentence-transformers 6, Sigmoid"]
    for path in (st6, folders["classic, sentence_transformers.activation_fn (ms-marco)"]):
        ours = scores(make(path, activation=activation), pairs)
        assert np.abs(ours - predict(path, pairs, activation_fn=module)).max() < 1e-4


def test_long_passages_meet_at_their_best_window(folders, pairs):
    """With long_text = "chunk", windows of the passage, each after the whole query, as
    transformers cuts them; the pair's score is its best window's CrossEncoder score."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    path = folders["sentence-transformers 6, Sigmoid"]
    task = make(path, long_text="chunk", max_length=64)
    encoded = task.encode(pairs)
    assert encoded.chunked > 10 and encoded.windows > encoded.chunked
    ours = scores(task, pairs)
    tok = AutoTokenizer.from_pretrained(path)
    model = CrossEncoder(str(path), device="cpu", local_files_only=True)
    cut = {"max_length": 64, "truncation": "only_second", "stride": 64 // 8, "padding": True}
    expected = []
    with torch.inference_mode():
        both = zip(pairs["query"].to_pylist(), pairs["passage"].to_pylist(), strict=True)
        for query, passage in both:
            windows = tok(
                query, passage, return_overflowing_tokens=True, return_tensors="pt", **cut
            )
            inputs = {k: windows[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
            logits = model.model(**inputs).logits
            expected.append(float(model.activation_fn(logits).max()))
    assert np.abs(ours - np.array(expected)).max() < 1e-4
    first = scores(make(path, max_length=64), pairs)  # truncated: the first window alone
    assert (ours >= first - 1e-5).all() and (ours > first + 1e-3).any()


def test_a_reranker_job(tmp_path, folders, pairs):
    path = folders["classic, sentence_transformers.activation_fn (ms-marco)"]
    (tmp_path / "in").mkdir()
    ids = pa.array([f"q{i:02d}" for i in range(pairs.num_rows)])
    pq.write_table(pairs.add_column(0, "pair_id", ids), tmp_path / "in/pairs.parquet")
    job = write_job(
        tmp_path / "rerank.toml",
        input={"path": "in", "text": "query", "text_pair": "passage", "id": "pair_id"},
        model={"task": "classify", "path": str(path), "threads": 1},
        batching={"max_tokens": 2048},
        output={"path": "out", "chunk_rows": 20},
    )
    loaded = load_job(job)
    parts = fingerprint_parts(loaded, path)
    # activation at its default ("auto") leaves the fingerprint as classify's always was
    assert parts["task_options"] == {"all_scores": False}
    none = load_job(job, ['classify.activation="none"'])
    assert fingerprint_parts(none, path)["task_options"] == {
        "all_scores": False,
        "activation": "none",
    }
    report = run_job(loaded)
    out = read_output(tmp_path / "out")
    assert report["rows"] == pairs.num_rows and report["chunks_committed"] == 3
    assert out.schema.names == ["pair_id", "score"]
    assert out.schema.field("score").type == pa.float32()
    assert np.abs(out["score"].to_numpy() - predict(path, pairs)).max() < 1e-4
    raw = load_job(job, ["classify.activation=sigmoid"])
    assert fingerprint_parts(raw, path)["task_options"]["activation"] == "sigmoid"
    with pytest.raises(JobError, match=r"\[classify\].activation: expected one of .*none"):
        load_job(job, ["classify.activation=relu"])


FAST = [p for p in available(torch.device("cpu")) if p != "fp32"]


@pytest.mark.skipif(not FAST, reason="this CPU runs no precision faster than fp32")
def test_the_gate_compares_a_rerankers_scores(tmp_path, folders, pairs):
    """The gate scores the first rows in fp32 and at the job's precision and compares the
    scores (their largest change relative to their scale), which it then writes (`from_gate`)."""
    path = folders["classic, no activation (bge-reranker)"]
    (tmp_path / "in").mkdir()
    pq.write_table(pairs, tmp_path / "in/pairs.parquet")
    job = write_job(
        tmp_path / "rerank.toml",
        input={"path": "in", "text": "query", "text_pair": "passage"},
        model={"task": "classify", "path": str(path), "threads": 1, "precision": FAST[0]},
        quality={"sample_rows": 24, "accept": True},  # recorded either way: measured, not luck
        output={"path": "out"},
    )
    report = run_job(load_job(job))
    measured = report["settled"]["precision"]["agreement"]
    assert set(measured) == {"max_score_error", "order_kept"}
    fp32 = predict(path, pairs.slice(0, 24))
    written = read_output(tmp_path / "out")["score"].to_numpy()[:24]
    expected = np.abs(written - fp32).max() / np.abs(fp32).max()
    print(f"\n{FAST[0]}: max_score_error {measured['max_score_error']:.2e}")
    assert measured["max_score_error"] == pytest.approx(expected, rel=0.05, abs=1e-6)
    # the tiny model's Sigmoid scores lie close together, so some neighbours swap: recorded
    assert 0 < measured["max_score_error"] < 0.05 and 0.5 < measured["order_kept"] <= 1


def test_scores_are_gated_by_their_scale():
    """Logits that cross zero: each one's own relative error is huge, the order intact."""
    gate = QualityConfig(max_relative_error=0.01)
    reference = {"score": pa.array([-4.0, -0.001, 0.002, 2.5, 6.0], pa.float32())}
    close = {"score": pa.array([-4.01, 0.003, 0.004, 2.49, 6.02], pa.float32())}
    result = agreement.scores(reference, close, "score", gate)
    assert result.passed and result.metrics["max_score_error"] == pytest.approx(0.02 / 6, rel=1e-3)
    assert result.metrics["order_kept"] == 1.0
    assert not agreement.values(reference, close, "score", gate).passed  # per row: 400% off
    far = {"score": pa.array([-4.0, 0.1, -0.1, 2.5, 6.0], pa.float32())}
    missed = agreement.scores(reference, far, "score", gate)
    assert not missed.passed and missed.metrics["order_kept"] == 0.75
    assert "max_score_error 0.0170 > 0.01" in missed.describe()  # 0.102 / 6
    errors = {"score": pa.array([None, 1.0, 1.0, 2.0], pa.float32())}  # a row error, a tie
    swapped = {"score": pa.array([None, 1.001, 0.999, 2.0], pa.float32())}
    tied = agreement.scores(errors, swapped, "score", gate)
    assert tied.passed and tied.metrics["order_kept"] == 1.0
    lost = {"score": pa.array([None, float("nan"), 1.0, 2.0], pa.float32())}  # fp16's overflow
    assert agreement.scores(errors, lost, "score", gate).metrics["max_score_error"] == np.inf


def test_what_a_reranker_is_refused(tmp_path, folders, pairs, bert_path, minilm_path):
    path = folders["sentence-transformers 6, Sigmoid"]
    single = ModelConfig(task="classify", precision="fp32", threads=1)
    alone = InputConfig(path=())
    with pytest.raises(ModelError, match=r"scores pairs of texts; set \[input\].text_pair"):
        ClassifyTask(
            path, model=single, options=ClassifyConfig(), inp=alone, executor=Executor(single)
        )
    with pytest.raises(ModelError, match=r"\[classify\].all_scores: .* has one output"):
        check_model("classify", path, options=ClassifyConfig(all_scores=True))
    with pytest.raises(ModelError, match=r"\[classify\].activation: .* a classifier of 4 labels"):
        check_model("classify", bert_path, options=ClassifyConfig(activation="none"))
    check_model("classify", path, options=ClassifyConfig())  # validate passes a good one
    named = {"activation_fn": "torch.nn.modules.activation.Softmax"}
    softmax = classic(tmp_path / "softmax", minilm_path, sentence_transformers=named)
    with pytest.raises(ModelError, match=r"activation_fn: activation torch.nn.modules.activation"):
        check_model("classify", softmax, options=ClassifyConfig())
    check_model("classify", softmax, options=ClassifyConfig(activation="sigmoid"))  # overridden
    legacy = {"sbert_ce_default_activation_function": "mypackage.Scale"}
    foreign = classic(tmp_path / "foreign", minilm_path, **legacy)
    # passed over as CrossEncoder passes it over (it would import it only with remote code on)
    assert np.abs(scores(make(foreign), pairs) - predict(foreign, pairs)).max() < 1e-4
    trusting = ModelConfig(task="classify", precision="fp32", threads=1, trust_remote_code=True)
    inp = InputConfig(path=(), text="query", text_pair="passage")
    with pytest.raises(ModelError, match=r"mypackage\.Scale, code from outside torch"):
        ClassifyTask(
            foreign, model=trusting, options=ClassifyConfig(), inp=inp, executor=Executor(trusting)
        )
    stacked = tmp_path / "stacked"
    saved(path, stacked)
    modules = json.loads((stacked / "modules.json").read_text())
    dense = "sentence_transformers.base.modules.dense.Dense"
    modules.append({"idx": 1, "name": "1", "path": "1_Dense", "type": dense})
    (stacked / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelError, match="saves one; this model chains Transformer -> Dense"):
        check_model("classify", stacked, options=ClassifyConfig())
