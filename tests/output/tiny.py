"""A tiny real job for the output folder's tests: an MLP over 4 feature columns (the tensor
task), so a run takes well under a second and a subprocess run a few (torch's start-up)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import deltalake
import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from duckdb_extensions import import_extension
from safetensors.torch import save_file

from batchscore.models.numeric.factories import mlp
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.delta import app_id
from batchscore.storage.layout import part_name
from tests.conftest import write_job

ARGS = {"in_features": 4, "out_features": 3, "hidden": [8]}


def tiny_job(root: Path, output: str = "out", chunk_rows: int = 4) -> Path:
    """The job file (``root/job.toml``) reading ``root/in``, writing ``output``."""
    (root / "in").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    save_file(mlp(**ARGS).eval().state_dict(), str(root / "mlp.safetensors"))
    return write_job(
        root / "job.toml",
        input={"path": "in", "id": "id", "features": ["x0", "x1", "x2", "x3"]},
        model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
        batching={"max_rows": 8, "window_rows": 4},
        output={"path": output, "chunk_rows": chunk_rows},
        tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
    )


def rows_job(root: Path, output: str = "out", fmt: str = "parquet", **extra: str) -> Path:
    """The tiny tensor job, by rows (`[input].increments = "rows"`), writing ``fmt``
    (`[output].format`: one of `tests.output.formats.FORMATS`); ``extra`` [input] keys."""
    tiny_job(root)
    return write_job(
        root / "job.toml",
        input={
            "path": "in",
            "id": "id",
            "features": ["x0", "x1", "x2", "x3"],
            "increments": "rows",
            **extra,
        },
        model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
        batching={"max_rows": 8, "window_rows": 4},
        output={"path": output, "chunk_rows": 4, "format": fmt},
        tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
    )


def rows_table(ids: list[str], seed: int = 0) -> pa.Table:
    """Rows of the tiny job's input with these ids (features drawn from ``seed``)."""
    x = np.random.default_rng(seed).normal(size=(len(ids), 4)).astype(np.float32)
    return pa.table({"id": ids, **{f"x{j}": x[:, j] for j in range(4)}})


SCHEMA = pa.schema([("id", pa.string()), *[(f"x{j}", pa.float32()) for j in range(4)]])


def write_rows(path: Path, rows: pa.Table | dict) -> None:
    """``rows`` as a shard of row groups of 3 rows (features float32, as `table` makes them)."""
    pq.write_table(pa.table(rows).cast(SCHEMA), path, row_group_size=3)


def write_shard(path: Path, rows: int, seed: int = 0) -> list[str]:
    """A shard of ``rows`` rows whose ids name it (``<stem>-<i>``); returns the ids."""
    x = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
    ids = [f"{path.stem}-{i}" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, **{f"x{j}": x[:, j] for j in range(4)}}), path)
    return ids


def glob_ids(out: Path, foreign: tuple[str, ...] = ()) -> list[str]:
    """The ids a reader's ``out/**/*.parquet`` glob sees (but for the ``foreign`` files, by
    path in ``out``), in the order the footers give."""
    found = [p for p in out.rglob("*.parquet") if p.relative_to(out).as_posix() not in foreign]
    return ids_of(sorted(found, key=order))


def kept_ids(out: Path) -> list[str]:
    """The ids kept under ``_batchscore/gone/`` (every retirement, oldest first)."""
    return ids_of(sorted((out / "_batchscore/gone").glob("*/part-*.parquet.gone"), key=order))


def ids_of(files: list[Path]) -> list[str]:
    return [i for f in files for i in pq.read_table(f, columns=["id"])["id"].to_pylist()]


def order(path: Path) -> tuple[str, str, int]:
    """A data file's place: its folder (a retirement's), its source shard, its first row."""
    meta = pq.read_metadata(path).metadata
    start = int(meta[b"batchscore.rows"].split(b"-")[0])
    return path.parent.name, meta[b"batchscore.shard"].decode(), start


@contextmanager
def undeletable(path: Path, fallback: str) -> Iterator[str]:
    """Make ``path`` undeletable for real while the block runs (``chattr +i``: the kernel
    refuses to unlink an immutable file, with EPERM, even to root, who ignores a read-only
    folder). Yields the fault spec a test arms instead: "" where the failure is real, and
    ``fallback`` (an OSError injected at the removal call) where this machine cannot make it
    (not root, no chattr, a file system without the attribute)."""
    made = (
        os.geteuid() == 0
        and shutil.which("chattr") is not None
        and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    )
    try:
        yield "" if made else fallback
    finally:
        if made:
            subprocess.run(["chattr", "-i", str(path)], check=True)


def delta_rows(out: Path) -> list[tuple[str, int]]:
    """The (id, `_row_hash`) pairs of the Delta table at ``out``, sorted, as deltalake, polars'
    ``read_delta`` and DuckDB's ``delta_scan`` each read them (they must agree), once the
    table's live files are checked to be exactly the committed chunks' files, each committed
    chunk's application transaction odd (its file in the table)."""
    dt = deltalake.DeltaTable(str(out))
    committed = Checkpoint(out).committed()
    assert {Path(uri).name for uri in dt.file_uris()} == {part_name(k) for k in committed}
    assert all(dt.transaction_version(app_id(key)) % 2 == 1 for key in committed)
    table = dt.to_pyarrow_table(columns=["id", "_row_hash"])
    found = sorted(zip(table["id"].to_pylist(), table["_row_hash"].to_pylist(), strict=True))
    frame = pl.read_delta(str(out), columns=["id", "_row_hash"])
    assert sorted(frame.iter_rows()) == found
    con = duckdb.connect()
    import_extension("delta", con=con)
    con.execute("LOAD delta")
    scanned = con.execute(f"select id, _row_hash from delta_scan('{out}')").fetchall()
    assert sorted(scanned) == found
    return found


def committed_rows(out: Path) -> list[tuple[str, int]]:
    """The (id, `_row_hash`) pairs of the folder's committed data files, sorted."""
    pairs = []
    for record in Checkpoint(out).committed().values():
        t = pq.read_table(out / record["file"], columns=["id", "_row_hash"])
        pairs += zip(t["id"].to_pylist(), t["_row_hash"].to_pylist(), strict=True)
    return sorted(pairs)
