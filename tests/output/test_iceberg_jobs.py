"""Iceberg jobs end to end (`[output].format = "iceberg"`), through `batchscore run`: by shards
with another writer's compaction, expired snapshots, a column it added and rows of its own
between runs, and through a REST catalog. Each run is counted from its report; each check is
a reader's (pyiceberg, polars' ``scan_iceberg``, DuckDB's ``iceberg_scan``: they agree), every
current input row once with the score a clean run gives it, the other writer's rows intact.
(The suites over every format, `tests.output.formats.FORMATS`, hold an Iceberg table to the
rest: every change of input, a kill at every fault point, the increments state machine; an
``s3://`` table is `tests/storage/test_iceberg_s3.py`'s.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.storage.layout import CATALOG
from tests.commands import invoke
from tests.output.tiny import SCHEMA, rows_job, rows_table, tiny_job, write_rows

pyiceberg = pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg (dev extra)")

from tests.output.formats import (  # noqa: E402
    duckdb_iceberg,
    iceberg_agreed,
    iceberg_table,
)
from tests.output.neighbours import iceberg_append_foreign, iceberg_neighbour  # noqa: E402


def iceberg_job(root: Path, **output: object) -> Path:
    """The tiny tensor job by shards, writing an Iceberg table (``output``: more keys)."""
    job = tiny_job(root)
    keys = "".join(f"{k} = {v}\n" for k, v in {"format": '"iceberg"', **output}.items())
    job.write_text(job.read_text().replace("[output]\n", f"[output]\n{keys}", 1))
    return job


def scored(job: Path) -> tuple[int, int]:
    """A run's rows scored and rows retired, from its report."""
    report = run_job(load_job(job), environ=os.environ)
    assert report["outcome"] == "ok"
    return report["rows"], report["rows_retired"]


def clean(root: Path, inputs: Path) -> dict[str, list[float]]:
    """Each row of ``inputs`` with its scores, from a clean run into a Parquet folder."""
    shutil.copytree(inputs, root / "in")
    assert scored(tiny_job(root))[0] > 0
    rows = pa.concat_tables(pq.read_table(p) for p in (root / "out").glob("*.parquet"))
    return dict(zip(rows["id"].to_pylist(), rows["scores"].to_pylist(), strict=True))


def assert_holds(
    out: Path, want: dict[str, list[float]], foreign: list[tuple[str, list[float]]]
) -> None:
    """Every row of ``want`` once with its scores, the ``foreign`` rows as they were, no
    other row, as every reader reads the table: through the catalog, and from the folder
    alone by its version hint (a run that ended well left it naming the current metadata)."""
    found = iceberg_agreed(out, ("id", "scores"))
    assert duckdb_iceberg(str(out), ("id", "scores")) == found
    ids = [i for i, _ in found]
    assert len(ids) == len(set(ids)), f"rows twice: {sorted(i for i in ids if ids.count(i) > 1)}"
    got = dict(found)
    assert sorted(got) == sorted([*want, *(i for i, _ in foreign)])
    for i, scores in want.items():
        assert np.allclose(got[i], scores, atol=1e-5), i
    for i, scores in foreign:
        assert got[i] == scores, i


def test_by_shards_another_writers_maintenance_between_runs_never_doubles_rows(tmp_path: Path):
    """Another writer appends rows of its own, compacts the table (batchscore's files
    replaced by its own), expires every older snapshot and adds a column: the next run has
    nothing to do and adds nothing back; a run after the input changed (a shard edited, so
    scored again whole; one removed; one new) retires the old rows wherever the table now
    holds them and appends the new, each row once with a clean run's score, the writer's
    rows and column kept; then nothing is left to do."""
    root, inputs = tmp_path / "job", tmp_path / "job/in"
    job, out = iceberg_job(root), root / "out"
    write_rows(inputs / "a.parquet", rows_table([f"a-{i}" for i in range(10)], seed=1))
    write_rows(inputs / "b.parquet", rows_table([f"b-{i}" for i in range(6)], seed=2))
    assert scored(job) == (16, 0)
    foreign = iceberg_append_foreign(out)
    for operation in ("compact", "expire", "add_column"):
        iceberg_neighbour(out, operation)
    files = [t.file.file_path for t in iceberg_table(out).scan().plan_files()]
    assert files and not any(path.startswith(f"{out}/part-") for path in files)

    assert scored(job) == (0, 0)
    assert_holds(out, clean(tmp_path / "before", inputs), foreign)

    a = pq.read_table(inputs / "a.parquet").to_pydict()
    a["x0"][1] += 1.0
    write_rows(inputs / "a.parquet", pa.table(a).cast(SCHEMA).take([0, 1, *range(3, 10)]))
    (inputs / "b.parquet").unlink()
    write_rows(inputs / "c.parquet", rows_table([f"c-{i}" for i in range(5)], seed=3))
    report = run_job(load_job(job), environ=os.environ)
    assert report["outcome"] == "ok" and report["rows"] == 9 + 5  # a whole again, c new
    [why] = {r["why"] for r in report["redone"]}
    assert "a.parquet changed since it was scored" in why
    assert len(report["redone"]) == 3  # a's three chunks of 4 rows, its old rows out
    [gone] = report["gone_shards"]  # b's rows out, its two chunks kept under gone/
    assert gone["shard"].endswith("b.parquet") and gone["rows_done"] == 6

    assert_holds(out, clean(tmp_path / "after", inputs), foreign)
    assert "note" in iceberg_table(out).schema().column_names
    assert scored(job) == (0, 0)


def test_a_job_writes_its_table_through_a_rest_catalog(tmp_path: Path):
    """`[output].catalog = {type = "rest", uri = ...}` (the tests' REST catalog server on
    loopback, `tests.output.rest_catalog`) and `[output].table_name`: `batchscore run`
    creates the table at the output's location through it and commits every change there
    (by rows: an edit, a delete, an append), counted from the run's report; no catalog of
    batchscore's own is made; readers through the REST catalog read the input's rows once."""
    from pyiceberg.catalog.rest import RestCatalog

    from tests.output.rest_catalog import rest_catalog

    inputs, out = tmp_path / "in", tmp_path / "out"
    with rest_catalog(tmp_path / "server") as uri:
        job = rows_job(tmp_path, fmt="iceberg")
        catalog = f'{{ type = "rest", uri = "{uri}" }}'
        extra = f'catalog = {catalog}\ntable_name = "team.scores"\n'
        job.write_text(job.read_text().replace("[output]\n", f"[output]\n{extra}", 1))
        write_rows(inputs / "a.parquet", rows_table([f"a{i}" for i in range(10)]))
        result = invoke("run", str(job))
        assert result.exit_code == 0, result.output
        a = pq.read_table(inputs / "a.parquet").to_pydict()
        a["x0"][4] += 1.0
        write_rows(inputs / "a.parquet", pa.table(a).cast(SCHEMA).take([*range(9)]))
        write_rows(inputs / "b.parquet", rows_table(["b0", "b1"], seed=1))
        assert scored(job) == (3, 2)  # a4 again, b new; a4's old row and a9 out

        assert not (out / CATALOG).exists()
        table = RestCatalog("team", uri=uri).load_table(("team", "scores"))
        assert table.location() == str(out)
        ids = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        assert sorted(ids) == sorted([f"a{i}" for i in range(9)] + ["b0", "b1"])
        want = [(i,) for i in sorted(ids)]
        assert duckdb_iceberg(table.metadata_location, ("id",)) == want
        assert duckdb_iceberg(str(out), ("id",)) == want  # the folder alone, by its hint
        assert scored(job) == (0, 0)
