"""The whole pipeline on real shards and the real MiniLM: order, resume, and failure isolation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.errors import InputDataError, OutputConflictError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.work import shards as input_listing
from tests.conftest import output_files, read_output, record_of, source_of


def input_ids(folder: Path) -> list[str]:
    files = sorted(folder.glob("*.parquet"))
    return [i for f in files for i in pq.read_table(f, columns=["doc_id"])["doc_id"].to_pylist()]


def test_run_writes_every_row_in_input_order(embed_job: Path, shards: Path, tmp_path: Path):
    report = run_job(load_job(embed_job))
    out = read_output(tmp_path / "out")
    assert out.column_names == ["doc_id", "kind", "embedding"]
    assert out["doc_id"].to_pylist() == input_ids(shards)
    kind = out.schema.field("embedding").type
    assert pa.types.is_fixed_size_list(kind) and kind.list_size == 384
    assert kind.value_type == pa.float32()
    norms = np.linalg.norm(np.array(out["embedding"].to_pylist()), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5)
    assert report["rows"] == 360 and report["chunks_committed"] == 9  # 3 shards x 120 / 50
    assert 0.9 <= report["padding_efficiency"] <= 1.0
    assert 0 < report["model_busy_share"] <= 1.0
    saved = [json.loads(p.read_text()) for p in (tmp_path / "out/_batchscore/runs").glob("*")]
    assert [r["rows"] for r in saved] == [360]
    for key in ("tokens", "padding_efficiency", "rows_per_s", "tokens_per_s", "wall_s"):
        assert key in saved[0]


def test_resume_scores_only_what_is_missing(embed_job: Path, tmp_path: Path):
    job = load_job(embed_job)
    run_job(job)
    first = read_output(tmp_path / "out")
    again = run_job(job)
    assert again["rows"] == 0 and again["chunks_already_done"] == 9 and again["load_s"] == 0
    # lose one committed chunk: only its 50 rows are scored again
    record_of(tmp_path / "out", shard=1, chunk=1).unlink()
    resumed = run_job(job)
    assert resumed["rows"] == 50 and resumed["chunks_committed"] == 1
    again = read_output(tmp_path / "out")
    assert again["doc_id"].equals(first["doc_id"])
    # the 50 rows were batched with other neighbours than in the first run: float noise only
    a, b = (np.array(t["embedding"].to_pylist()) for t in (again, first))
    assert np.allclose(a, b, atol=1e-5)


def test_sorting_does_not_change_results(embed_job: Path, tmp_path: Path):
    sorted_out = read_output(Path(run_job(load_job(embed_job))["output"]))
    naive = run_job(load_job(embed_job, ["batching.sort=false", 'output.path="naive"']))
    naive_out = read_output(Path(naive["output"]))
    a = np.array(sorted_out["embedding"].to_pylist())
    b = np.array(naive_out["embedding"].to_pylist())
    assert (a * b).sum(axis=1).min() >= 0.9999
    assert naive["padding_efficiency"] < 0.7 < run_job(load_job(embed_job))["padding_efficiency"]


def test_changed_settings_refuse_then_restart(embed_job: Path, tmp_path: Path):
    run_job(load_job(embed_job))
    changed = load_job(embed_job, ["model.max_length=64"])
    with pytest.raises(OutputConflictError, match="changed: max_length"):
        run_job(changed)
    report = run_job(changed, restart=True)
    assert report["rows"] == 360


def test_changed_shard_is_scored_again(embed_job: Path, shards: Path, tmp_path: Path):
    run_job(load_job(embed_job))
    shard = sorted(shards.glob("*.parquet"))[1]
    table = pq.read_table(shard)
    pq.write_table(table.slice(0, 70), shard)  # fewer rows, other content
    report = run_job(load_job(embed_job))
    assert report["rows"] == 70
    assert read_output(tmp_path / "out")["doc_id"].to_pylist() == input_ids(shards)


def test_bad_shard_fails_alone_and_is_retried(embed_job: Path, shards: Path, tmp_path: Path):
    shard = sorted(shards.glob("*.parquet"))[1]
    good = shard.read_bytes()
    shard.write_bytes(good[: len(good) // 2])  # truncated in transit
    with pytest.raises(InputDataError, match=r"(?s)1 shard\(s\) failed.*docs-001\.parquet"):
        run_job(load_job(embed_job))
    done = (tmp_path / "out/_batchscore/done").glob("*.json")
    committed = {Path(json.loads(p.read_text())["shard"]["path"]).name for p in done}
    assert committed == {"docs-000.parquet", "docs-002.parquet"}
    shard.write_bytes(good)
    report = run_job(load_job(embed_job))
    assert report["rows"] == 120
    assert read_output(tmp_path / "out")["doc_id"].to_pylist() == input_ids(shards)


def test_null_text_names_shard_row_and_column(embed_job: Path, shards: Path):
    shard = sorted(shards.glob("*.parquet"))[0]
    table = pq.read_table(shard)
    texts = table["text"].to_pylist()
    texts[57] = None
    pq.write_table(table.set_column(2, "text", pa.array(texts)), shard)
    with pytest.raises(InputDataError, match=r"docs-000\.parquet: row 57, column 'text'"):
        run_job(load_job(embed_job))


def test_empty_shard_is_committed_empty(embed_job: Path, shards: Path, tmp_path: Path):
    first = sorted(shards.glob("*.parquet"))[0]
    pq.write_table(pq.read_table(first).slice(0, 0), shards / "docs-999.parquet")
    report = run_job(load_job(embed_job))
    assert report["rows"] == 360
    (empty,) = [f for f in output_files(tmp_path / "out") if "docs-999" in source_of(f)]
    assert pq.read_metadata(empty).num_rows == 0


def test_a_run_lists_its_input_once(embed_job: Path, monkeypatch: pytest.MonkeyPatch):
    """The pending work and the sample measured on ("auto" budget: the gate's fp32 pass, whose
    results the run adopts) come from one listing of the input, whoever asks for it."""
    listed = []
    real = input_listing.expand
    monkeypatch.setattr(input_listing, "expand", lambda p: listed.append(p) or real(p))
    report = run_job(load_job(embed_job, ["batching.max_tokens=auto", "quality.sample_rows=8"]))
    assert report["rows"] == 360 and report["from_gate"] == 8  # the sample was read and used
    assert len(listed) == len(load_job(embed_job).input.path)  # each pattern once
