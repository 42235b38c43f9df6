"""Helpers for the fault-injection suite: a small real job, subprocess runs, and the checks every
fault must pass (each input row exactly once, in order, equal to a clean run, nothing half-done
visible)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sample_corpus

from tests.conftest import read_output, write_job


def make_job(folder: Path, corpus: pa.Table, chunk_rows: int = 15) -> Path:
    """Real texts in 3 shards, small chunks (15 rows: 3 per shard of 40), short max_length."""
    sample_corpus.write_shards(corpus, folder / "in", shards=3, row_group_size=10)
    return write_job(
        folder / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "threads": 1},
        batching={"max_tokens": 1024, "window_rows": chunk_rows},
        output={"path": "out", "chunk_rows": chunk_rows},
    )


def committed_files(out: Path) -> set[str]:
    return {f"part-{p.stem}.parquet" for p in (out / "_batchscore/done").glob("*.json")}


def intended_files(out: Path) -> set[str]:
    """The data files the intents in ``_batchscore/writing`` name (a group's, or one chunk's;
    a rewrite under a new key names the file it replaces too)."""
    names = set()
    for path in (out / "_batchscore/writing").glob("*.json"):
        intent = json.loads(path.read_text())
        for entry in intent.get("chunks", [intent]):
            names |= {entry["file"], *([entry["replaces"]["file"]] if "replaces" in entry else [])}
    return names


def assert_complete_and_equal(out: Path, clean: pa.Table) -> None:
    """Every input row exactly once, in input order, with a clean run's values."""
    got = read_output(out)
    assert got["doc_id"].to_pylist() == clean["doc_id"].to_pylist()
    a = np.array(got["embedding"].to_pylist())
    b = np.array(clean["embedding"].to_pylist())
    assert a.shape == b.shape and np.allclose(a, b, atol=1e-5)
    assert sorted(p.name for p in out.glob("*.parquet")) == sorted(committed_files(out))
    assert not list((out / "_batchscore/tmp").glob("*"))


def assert_nothing_uncommitted_visible(out: Path) -> None:
    """After any crash: every visible data file is whole and committed, or about to be swept
    (an Iceberg table's log, ``metadata/``, is the table's: no data file of batchscore's)."""
    visible = {p.name for p in out.glob("*") if not p.name.startswith(("_", "."))}
    if (out / "metadata/version-hint.text").is_file():
        visible.discard("metadata")
    assert all(name.startswith("part-") and name.endswith(".parquet") for name in visible)
    stray = visible - committed_files(out)
    # A crash between rename and record (the order DESIGN.md fixes) leaves whole files with no
    # record, each named by the intent of its group (the chunks one window completed); the next
    # start deletes them. Anything else means the protocol broke.
    assert stray <= intended_files(out), stray
    for name in stray:
        assert pq.read_metadata(out / name).num_rows > 0
