"""One folder, one schema (`batchscore.output.drift`): a carried column whose type changes
between runs is cast to the folder's where that type holds its values exactly (checked value
by value where it may not), and refused otherwise, naming the column, before anything is
retired or rewritten; by rows and by shards, in a Parquet folder and in a table (Delta's,
Iceberg's). Each run
is the tiny tensor job's, for real; the folder is read back by polars, DuckDB and
pyarrow.dataset, which refuse a folder whose files disagree on a column's type."""

from __future__ import annotations

import decimal
import hashlib
from pathlib import Path

import deltalake
import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from batchscore.errors import InputDataError
from batchscore.job.parse import load_job
from batchscore.output.drift import SchemaDriftError
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import write_job
from tests.output.formats import TABLES, iceberg_table
from tests.output.tiny import ARGS, tiny_job

FEATURES = ["x0", "x1", "x2", "x3"]


def job(root: Path, *, by: str = "rows", fmt: str = "parquet", keep: tuple[str, ...] = ()) -> Path:
    """The tiny tensor job over ``root/in``, ``increments`` ``by``, `keep` columns ``keep``."""
    tiny_job(root)
    return write_job(
        root / "job.toml",
        input={"path": "in", "id": "id", "features": FEATURES, "increments": by, "keep": keep},
        model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
        batching={"max_rows": 8, "window_rows": 4},
        output={"path": "out", "chunk_rows": 4, "format": fmt},
        tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
    )


def rows(ids: pa.Array, **keep: pa.Array) -> pa.Table:
    """Input rows with these ids and `keep` columns; row i has the same features in every call."""
    x = np.random.default_rng(0).normal(size=(len(ids), 4)).astype(np.float32)
    return pa.table({"id": ids, **{f: x[:, j] for j, f in enumerate(FEATURES)}, **keep})


def scored(path: Path) -> tuple[int, int]:
    """A run's rows scored and rows retired, from its report."""
    report = run_job(load_job(path))
    assert report["outcome"] == "ok"
    return report["rows"], report.get("rows_retired", 0)


def fingerprints(out: Path) -> dict[str, str]:
    """Every file under the output folder but `_batchscore/runs` (its run reports) and the
    lock, with its content's digest: what a refused run must leave as it was."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "runs" not in p.parts and p.name != "lock"
    }


def read_by_every_reader(out: Path) -> int:
    """The data glob's rows as polars, DuckDB and pyarrow.dataset count them (they agree), once
    every data file is checked to hold one schema."""
    files = sorted(out.glob("*.parquet"))
    schemas = {pq.read_schema(f).remove_metadata() for f in files}
    assert len(schemas) == 1, schemas
    polars = pl.read_parquet(str(out / "*.parquet")).height
    duck = duckdb.sql(f"select count(*) from '{out}/*.parquet'").fetchone()[0]
    arrow = ds.dataset([str(f) for f in files]).to_table().num_rows
    assert polars == duck == arrow
    return polars


def test_by_rows_an_id_rewritten_as_strings_is_refused_before_anything_is_retired(
    tmp_path: Path,
):
    path = job(tmp_path)
    pq.write_table(rows(pa.array(range(10))), tmp_path / "in/a.parquet")
    assert scored(path) == (10, 0)
    before = fingerprints(tmp_path / "out")
    # the ids as strings, one row deleted and one appended: there would be rows to retire
    pq.write_table(rows(pa.array([str(i) for i in [*range(1, 10), 10]])), tmp_path / "in/a.parquet")
    with pytest.raises(SchemaDriftError, match=r"a\.parquet: column 'id' is string here but int64"):
        run_job(load_job(path))
    assert fingerprints(tmp_path / "out") == before  # nothing retired, rewritten or written
    result = invoke("run", str(path), "--progress", "off")
    assert result.exit_code == 5  # the folder holds another configuration's output
    assert "column 'id' is string here but int64" in result.output
    assert "Traceback" not in result.output
    planned = invoke("plan", str(path))  # the dry run says so too, and changes nothing
    assert planned.exit_code == 5 and "column 'id'" in planned.output
    assert fingerprints(tmp_path / "out") == before
    assert read_by_every_reader(tmp_path / "out") == 10


def test_by_rows_a_keep_column_from_booleans_to_integers_is_refused(tmp_path: Path):
    path = job(tmp_path, keep=("flag",))
    ids = pa.array([f"r{i}" for i in range(6)])
    pq.write_table(rows(ids, flag=pa.array([True, False] * 3)), tmp_path / "in/a.parquet")
    assert scored(path) == (6, 0)
    before = fingerprints(tmp_path / "out")
    flags = pa.array([1, 0] * 3, pa.int8())
    pq.write_table(rows(ids, flag=flags), tmp_path / "in/a.parquet")
    with pytest.raises(SchemaDriftError, match=r"column 'flag' is int8 here but bool"):
        run_job(load_job(path))
    assert fingerprints(tmp_path / "out") == before


def test_by_rows_exact_drifts_are_cast_and_the_folder_keeps_one_schema(tmp_path: Path):
    """int32 ids written again as int64, float32 as float64, text as large strings, seconds as
    microseconds, a decimal at a wider precision: nothing scores again, and an appended row
    is written in the folder's types."""
    path = job(tmp_path, keep=("w", "s", "t", "m"))
    first = rows(
        pa.array(range(6), pa.int32()),
        w=pa.array(np.arange(6) / 4, pa.float64()),
        s=pa.array(list("abcdef")),
        t=pa.array([i * 10**6 for i in range(6)], pa.timestamp("us")),
        m=pa.array([decimal.Decimal(f"{i}.5") for i in range(6)], pa.decimal128(5, 1)),
    )
    pq.write_table(first, tmp_path / "in/a.parquet")
    assert scored(path) == (6, 0)
    folder = pq.read_schema(next((tmp_path / "out").glob("*.parquet"))).remove_metadata()
    again = rows(
        pa.array(range(7), pa.int64()),
        w=pa.array(np.arange(7) / 4, pa.float32()),
        s=pa.array(list("abcdefg"), pa.large_string()),
        t=pa.array(range(7), pa.timestamp("s")),
        m=pa.array([decimal.Decimal(f"{i}.5") for i in range(7)], pa.decimal128(38, 1)),
    )
    pq.write_table(again.slice(0, 6), tmp_path / "in/a.parquet")
    assert scored(path) == (0, 0)
    pq.write_table(again, tmp_path / "in/a.parquet")  # one row appended
    assert scored(path) == (1, 0)
    assert read_by_every_reader(tmp_path / "out") == 7
    written = [pq.read_schema(f).remove_metadata() for f in (tmp_path / "out").glob("*.parquet")]
    assert written == [folder] * 3  # two files of the first run's, one of the appended row


def test_by_rows_a_narrower_type_is_checked_value_by_value_before_anything_is_retired(
    tmp_path: Path,
):
    """Microseconds (as Spark and polars write them) rewritten as pandas' nanoseconds: the
    same instants are cast, and nothing scores again; an instant the folder's microseconds
    cannot hold refuses the run, naming the file, row and column, before the edited and the
    deleted rows retire."""
    path = job(tmp_path, keep=("t",))
    ids = pa.array([f"r{i}" for i in range(6)])
    moments = pa.array([1_700_000_000_000_000 + i for i in range(6)], pa.timestamp("us"))
    pq.write_table(rows(ids, t=moments), tmp_path / "in/a.parquet")
    assert scored(path) == (6, 0)
    nanos = moments.cast(pa.timestamp("ns"))
    pq.write_table(rows(ids, t=nanos), tmp_path / "in/a.parquet")
    assert scored(path) == (0, 0)
    before = fingerprints(tmp_path / "out")
    finer = pa.array([*nanos.cast(pa.int64()).to_pylist()[:4], 5], pa.timestamp("ns"))
    pq.write_table(rows(ids[:5], t=finer), tmp_path / "in/a.parquet")  # edited, deleted
    with pytest.raises(
        SchemaDriftError,
        match=r"a\.parquet: row 4: column 't': 1970-01-01 00:00:00.000000005 is not exactly",
    ):
        run_job(load_job(path))
    assert fingerprints(tmp_path / "out") == before
    assert read_by_every_reader(tmp_path / "out") == 6


def test_by_shards_a_new_shard_of_a_drifted_type_is_refused_before_anything_is_retired(
    tmp_path: Path,
):
    """The folder's ids are int64; a shard of string ids arrives (sorting first, so it would
    have set the run's types) while a committed shard leaves: nothing is retired, the run
    refused naming the column."""
    path = job(tmp_path, by="shards")
    pq.write_table(rows(pa.array(range(6))), tmp_path / "in/a.parquet")
    pq.write_table(rows(pa.array(range(6, 9))), tmp_path / "in/b.parquet")
    assert scored(path) == (9, 0)
    before = fingerprints(tmp_path / "out")
    (tmp_path / "in/b.parquet").unlink()  # left the input: its output would retire
    pq.write_table(rows(pa.array(["x", "y"])), tmp_path / "in/0.parquet")
    with pytest.raises(SchemaDriftError, match=r"0\.parquet: column 'id' is string here but int64"):
        run_job(load_job(path))
    assert fingerprints(tmp_path / "out") == before
    assert read_by_every_reader(tmp_path / "out") == 9


def test_by_shards_an_exact_drift_is_cast_and_a_value_that_does_not_fit_fails_its_shard(
    tmp_path: Path,
):
    path = job(tmp_path, by="shards", keep=("w",))
    pq.write_table(
        rows(pa.array(range(4)), w=pa.array([0.5] * 4, pa.float32())), tmp_path / "in/a.parquet"
    )
    assert scored(path) == (4, 0)
    wider = pa.array([0.25, 0.5, 0.75], pa.float64())  # float32 holds these exactly
    pq.write_table(rows(pa.array(range(4, 7)), w=wider), tmp_path / "in/b.parquet")
    assert scored(path) == (3, 0)
    assert read_by_every_reader(tmp_path / "out") == 7
    inexact = pa.array([0.5, 0.1], pa.float64())  # 0.1 is no float32: Arrow's cast would round
    pq.write_table(rows(pa.array([7, 8]), w=inexact), tmp_path / "in/c.parquet")
    with pytest.raises(InputDataError, match=r"c\.parquet: rows 0-2: column 'w': 0\.1 is not"):
        run_job(load_job(path))
    assert read_by_every_reader(tmp_path / "out") == 7  # nothing of c written


def test_the_first_run_settles_the_type_that_holds_every_shards(tmp_path: Path):
    """Before the fix the first shard's float32 was the folder's, and the second shard's
    float64 values were rounded to it without a word."""
    path = job(tmp_path, by="shards", keep=("w",))
    pq.write_table(
        rows(pa.array(range(2)), w=pa.array([0.5, 1.5], pa.float32())), tmp_path / "in/a.parquet"
    )
    pq.write_table(rows(pa.array(range(2, 4)), w=pa.array([0.1, 0.2])), tmp_path / "in/b.parquet")
    assert scored(path) == (4, 0)
    assert read_by_every_reader(tmp_path / "out") == 4
    glob = pl.read_parquet(str(tmp_path / "out/*.parquet")).sort("id")
    assert glob.schema["w"] == pl.Float64
    assert glob["w"].to_list() == [0.5, 1.5, 0.1, 0.2]


def log_version(out: Path, fmt: str) -> object:
    """Where the table's log stands: Delta's version, Iceberg's current metadata file."""
    if fmt == "delta":
        return deltalake.DeltaTable(str(out)).version()
    return iceberg_table(out).metadata_location


@pytest.mark.parametrize("fmt", TABLES)
def test_in_a_table_a_drifted_id_is_refused_before_anything_is_retired(tmp_path: Path, fmt: str):
    """A table refuses a column's new type itself (Delta does), but only when the run appends
    its rows, after it retired the edited ones (a rewrite transaction): the plan refuses
    first, in Delta and Iceberg alike, the table's log and catalog untouched."""
    path = job(tmp_path, fmt=fmt)
    pq.write_table(rows(pa.array(range(6))), tmp_path / "in/a.parquet")
    assert scored(path) == (6, 0)
    version = log_version(tmp_path / "out", fmt)
    before = fingerprints(tmp_path / "out")
    again = rows(pa.array([str(i) for i in range(7)]))  # the same rows, and one appended
    again = again.set_column(1, "x0", pa.array([9.0, *again["x0"].to_pylist()[1:]], pa.float32()))
    pq.write_table(again, tmp_path / "in/a.parquet")  # row 0 edited: its old score would retire
    with pytest.raises(SchemaDriftError, match=r"column 'id' is string here but int64"):
        run_job(load_job(path))
    assert log_version(tmp_path / "out", fmt) == version
    assert fingerprints(tmp_path / "out") == before
