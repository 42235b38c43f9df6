"""The Python API: `batchscore.run` is the CLI's run as a call, `batchscore.score` scores frames
in memory with the same stages, and `import batchscore` stays cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import batchscore
from batchscore import api
from batchscore.errors import InputDataError, JobError, OutputConflictError, ShardsFailedError
from batchscore.precision.int8_linear import int8_available
from batchscore.recipes import score as recipe
from tests.conftest import ROOT, read_output

FAST = {"threads": 1, "max_length": 64, "precision": "fp32"}


def test_import_is_cheap():
    """Importing the package loads no torch, transformers, pyarrow, polars, huggingface_hub
    or prometheus_client."""
    code = (
        "import sys, batchscore; heavy = ('torch', 'transformers', 'pyarrow', 'polars', "
        "'huggingface_hub', 'prometheus_client', 'batchscore.api'); "
        "print(sorted({m.split('.')[0] for m in sys.modules "
        "if m.startswith(heavy)}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert set(batchscore.__all__) >= {"run", "score", "RunReport"}


def test_run_a_job_file_returns_its_report(embed_job: Path):
    report = batchscore.run(embed_job, overrides={"model.max_length": 64})
    assert isinstance(report, batchscore.RunReport)
    assert report.rows == 360 and report.outcome == "ok" and report.failures == ()
    assert 0 < report.padding_efficiency <= 1 and report.tokens > 0
    assert report.rows_per_s > 0 and report.wall_s > 0 and report.precision == "fp32"
    written = [
        json.loads(p.read_text()) for p in (embed_job.parent / "out/_batchscore/runs").iterdir()
    ]
    assert written[0]["rows"] == report.rows and written[0]["tokens"] == report.tokens
    again = batchscore.run(str(embed_job), overrides=["model.max_length=64"])
    assert again.rows == 0 and again.data["rows_already_done"] == 360  # resumed: nothing to do
    assert "nothing to do: every row is committed (360 rows in 9 chunks)" in str(again)
    assert batchscore.run(embed_job, overrides={"model.max_length": 64}, restart=True).rows == 360


def test_run_a_dict_of_tables(tmp_path: Path, shards: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths are relative to the working directory
    job = {
        "input": {"path": "in", "text": "text"},
        "model": {"task": "embed", **FAST},
        "batching": {"max_tokens": 2048},
        "output": {"path": "out/embedded"},
    }
    report = batchscore.run(job)
    assert report.rows == 360 and report.job == "embedded"
    assert read_output(tmp_path / "out/embedded").num_rows == 360
    assert job["output"] == {"path": "out/embedded"}  # the caller's dict is left as it was


def test_errors_are_the_packages_exceptions_never_system_exit(embed_job: Path, tmp_path: Path):
    with pytest.raises(JobError, match=r"embed.toml: \[model\]\.precision: expected one of"):
        batchscore.run(embed_job, overrides={"model.precision": "fp61"})
    with pytest.raises(JobError, match="job file not found"):
        batchscore.run(tmp_path / "missing.toml")
    with pytest.raises(JobError, match=r"<job dict>: \[inptu\]: unknown section"):
        batchscore.run({"inptu": {}, "model": {"task": "embed"}, "output": {"path": "o"}})
    with pytest.raises(JobError, match="progress"):
        batchscore.run(embed_job, progress="loud")


def test_failed_shards_raise_with_the_report(embed_job: Path, tmp_path: Path):
    (tmp_path / "in" / "docs-001.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ShardsFailedError) as caught:
        batchscore.run(embed_job, overrides={"model.max_length": 64})
    report = caught.value.report
    assert isinstance(report, batchscore.RunReport) and caught.value.exit_code == 3
    assert report.rows == 240 and [f["shard"] for f in report.failures] == [
        str(tmp_path / "in" / "docs-001.parquet")
    ]


@pytest.fixture(scope="module")
def texts(small_corpus: pa.Table) -> pa.Table:
    return small_corpus.slice(0, 48).select(["doc_id", "text", "kind"])


def test_score_returns_the_type_it_was_given(texts: pa.Table, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arrow = batchscore.score(texts, task="embed", **FAST)
    assert isinstance(arrow, pa.Table)
    assert arrow.column_names == ["doc_id", "text", "kind", "embedding"]
    assert arrow.select(["doc_id", "text", "kind"]).equals(texts)  # input columns untouched
    vectors = np.asarray(arrow.column("embedding").to_pylist(), dtype=np.float32)
    assert vectors.shape == (48, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)

    polars = batchscore.score(pl.from_arrow(texts), task="embed", **FAST)
    assert isinstance(polars, pl.DataFrame) and polars.columns == arrow.column_names
    assert np.allclose(np.stack(polars["embedding"].to_list()), vectors, atol=1e-6)

    frame = texts.to_pandas()
    frame.index = frame.index * 10 + 7  # an index of the caller's own
    pandas = batchscore.score(frame, task="embed", **FAST)
    assert isinstance(pandas, pd.DataFrame) and list(pandas.index) == list(frame.index)
    assert np.allclose(np.stack(pandas["embedding"].to_list()), vectors, atol=1e-6)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_score_matches_a_job_over_the_same_rows(texts: pa.Table, tmp_path: Path):
    """The same sampler, executor and model: a frame scores as its rows do in a job."""
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(texts, tmp_path / "in" / "part.parquet")
    job = {
        "input": {"path": str(tmp_path / "in"), "text": "text", "id": "doc_id"},
        "model": {"task": "embed", **FAST},
        "output": {"path": str(tmp_path / "out")},
    }
    batchscore.run(job)
    from_job = np.asarray(read_output(tmp_path / "out").column("embedding").to_pylist())
    scored = batchscore.score(texts, task="embed", **FAST)
    assert np.allclose(np.asarray(scored.column("embedding").to_pylist()), from_job, atol=1e-5)


def test_a_loaded_model_is_reused(texts: pa.Table, monkeypatch):
    loads = []
    real = recipe.load_at
    monkeypatch.setattr(recipe, "load_at", lambda *a, **k: loads.append(1) or real(*a, **k))
    recipe.LOADED.clear()
    batchscore.score(texts, task="embed", **FAST, max_tokens=16384)
    batchscore.score(texts.slice(0, 5), task="embed", **FAST, max_tokens=16384, on_error="skip")
    assert len(loads) == 1  # a second call, even with other row handling, does not reload
    batchscore.score(
        texts.slice(0, 5), task="embed", **{**FAST, "max_length": 32}, max_tokens=16384
    )
    assert len(loads) == 2  # another truncation is another model setting


def test_score_takes_the_gates_results_for_its_first_rows(texts: pa.Table, monkeypatch):
    """max_tokens = "auto" gates fp32 on the first 8 rows and times budgets with that model;
    the call takes its results for those rows (a spy on the real `score_table` sees them),
    the next call with the loaded model has none to take, and the vectors are a plain call's."""
    handed = []
    real = recipe.score_table
    monkeypatch.setattr(
        recipe, "score_table", lambda *a, **k: handed.append(k["known"]) or real(*a, **k)
    )
    recipe.LOADED.clear()
    options = {**FAST, "max_tokens": "auto", "sample_rows": 8}
    gated = batchscore.score(texts, task="embed", **options)
    batchscore.score(texts, task="embed", **options)
    assert handed[0] is not None and not handed[0]  # given, and all 8 taken
    assert handed[1] is None  # the gate's results go with the first call alone
    plain = batchscore.score(texts, task="embed", **FAST, max_tokens=16384)
    got, want = (np.asarray(t.column("embedding").to_pylist()) for t in (gated, plain))
    assert np.allclose(got, want, atol=1e-5)


def test_bad_rows_fail_or_are_kept_with_their_error(texts: pa.Table):
    broken = texts.slice(0, 6).set_column(1, "text", pa.array(["a", None, "b", " ", "c", "d"]))
    with pytest.raises(InputDataError, match=r"the data: row 1, column 'text': text is null"):
        batchscore.score(broken, task="embed", **FAST)
    kept = batchscore.score(broken, task="embed", **FAST, on_error="skip")
    assert kept.column("error").to_pylist()[:4] == [
        None, "column 'text': text is null", None, "column 'text': text is empty"
    ]  # fmt: skip
    assert kept.column("embedding").null_count == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"precison": "fp32"}, r"unknown option 'precison' \(did you mean \"precision\"\?\)"),
        ({"where": "kind = 'x'"}, r"\[input\]\.where does not apply to in-memory data"),
        ({"precision": "fp61"}, r"score\(\): \[model\]\.precision: expected one of"),
        ({"batching": {"max_tokens": 0}}, r"\[batching\]\.max_tokens"),
    ],
)
def test_bad_options_are_named(texts: pa.Table, options, message):
    with pytest.raises(JobError, match=message):
        batchscore.score(texts, task="embed", **options)


def test_bad_data_is_named(texts: pa.Table):
    with pytest.raises(JobError, match=r"task: expected one of embed.*did you mean \"embed\""):
        batchscore.score(texts, task="embedd")
    with pytest.raises(JobError, match="item 0 of the texts is a dict, not a string"):
        batchscore.score([{"text": "a"}], task="embed")
    with pytest.raises(JobError, match=r"must be texts .*, a pyarrow Table, a polars DataFrame"):
        batchscore.score({"text": ["a"]}, task="embed")
    with pytest.raises(InputDataError, match=r"missing column.*body; it has doc_id, text, kind"):
        batchscore.score(texts, task="embed", text="body")
    clash = texts.append_column("embedding", pa.array([1] * 48))
    with pytest.raises(JobError, match=r"already has column.*embedding"):
        batchscore.score(clash, task="embed", **FAST)


@pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")
def test_score_gates_and_calibrates_like_a_job(texts: pa.Table):
    out = batchscore.score(texts, task="embed", **{**FAST, "precision": "int8"}, sample_rows=32)
    reference = batchscore.score(texts, task="embed", **FAST)
    cosines = np.sum(
        np.asarray(out.column("embedding").to_pylist())
        * np.asarray(reference.column("embedding").to_pylist()),
        axis=1,
    )
    assert cosines.min() >= 0.98


# -- texts alone, as sentence-transformers' encode takes them -----------------------------------


@pytest.fixture(scope="module")
def st_model(minilm_path: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def test_score_takes_texts_as_encode_does(texts: pa.Table, st_model):
    """A list of strings in, a numpy array out, in order: encode's call, encode's vectors."""
    sentences = texts.column("text").to_pylist()
    vectors = batchscore.score(sentences, task="embed", precision="fp32")
    expected = st_model.encode(sentences)
    assert isinstance(vectors, np.ndarray) and vectors.dtype == np.float32
    assert vectors.shape == expected.shape == (48, 384)
    cosines = np.sum(vectors * expected, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    )
    print(f"\nscore vs encode on {len(sentences)} texts: min cosine {cosines.min():.6f}")
    assert cosines.min() >= 0.9999
    first = batchscore.score(["hello", "world"], task="embed")  # the first call people type
    assert first.shape == (2, 384)
    assert np.allclose(first, st_model.encode(["hello", "world"]), atol=1e-4)
    one = batchscore.score("hello", task="embed")
    assert one.shape == (384,) and np.allclose(one, first[0], atol=1e-5)
    for series in (pd.Series(sentences, index=range(100, 148)), pl.Series("s", sentences)):
        again = batchscore.score(series, task="embed", precision="fp32", batch_size=16)
        assert np.allclose(again, vectors, atol=1e-5)


def test_texts_of_other_tasks_come_back_as_lists(texts: pa.Table):
    sentences = texts.column("text").to_pylist()[:6]
    summaries = batchscore.score(sentences, task="summarize", precision="fp32", sentences=1)
    assert isinstance(summaries, list) and len(summaries) == 6
    assert all(isinstance(s, str) and s for s in summaries)
    framed = batchscore.score(texts.slice(0, 6), task="summarize", precision="fp32", sentences=1)
    assert summaries == framed.column("summary").to_pylist()  # in order, as a frame scores


def test_texts_name_what_cannot_be_done_with_them(texts: pa.Table):
    with pytest.raises(JobError, match=r"text=\'body\' names a frame\'s column"):
        batchscore.score(["a"], task="embed", text="body")
    with pytest.raises(JobError, match='on_error="skip" writes each bad row'):
        batchscore.score(["a"], task="embed", on_error="skip")
    with pytest.raises(InputDataError, match=r"row 1, column 'text': text is null"):
        batchscore.score(["a", None], task="embed", **FAST)


def test_familiar_names_do_what_they_do_elsewhere(texts: pa.Table, monkeypatch):
    jobs = []
    real = api.score_frame
    spy = lambda frame, job, **k: jobs.append(job) or real(frame, job, **k)  # noqa: E731
    monkeypatch.setattr(api, "score_frame", spy)
    batchscore.score(texts.slice(0, 4), task="embed", **FAST, batch_size=2)
    assert jobs[-1].batching.max_rows == 2  # encode's batch_size: rows per batch
    batchscore.score(texts.slice(0, 4), task="embed", **FAST, accept_quality=True)
    assert jobs[-1].quality.accept
    with pytest.raises(JobError, match="batch_size and max_rows are the same option"):
        batchscore.score(texts, task="embed", batch_size=2, max_rows=4)
    budget = r"max_tokens is the batch token budget .* max_new_tokens=64"
    with pytest.raises(JobError, match=budget):
        batchscore.score(texts, task="generate", max_tokens=64)


def test_messages_name_python_arguments(embed_job: Path):
    batchscore.run(embed_job, overrides={"model.max_length": 64})
    with pytest.raises(OutputConflictError) as caught:
        batchscore.run(embed_job, overrides={"model.max_length": 32})
    assert "run with restart=True" in str(caught.value) and "--restart" not in str(caught.value)
    bare = r"overrides: model\.max_length: expected section\.key=value"
    with pytest.raises(JobError, match=bare):
        batchscore.run(embed_job, overrides=["model.max_length"])
    assert batchscore.run(embed_job, overrides={"model.max_length": 32}, restart=True).rows == 360


def test_a_job_of_another_type_is_named_briefly():
    """A job that is neither a path nor a dict (10,000 numbers, say) is not echoed whole."""
    with pytest.raises(JobError) as info:
        batchscore.run(list(range(10_000)))
    message = str(info.value)
    assert message.startswith("run(): job must be a job file's path or a dict")
    assert len(message) < 140
