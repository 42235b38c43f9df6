"""Increments by row as a state machine, beside the output folder's (`test_state_machine.py`):
random sequences of rows appended, edited and deleted, files renamed, split, merged and
compacted, committed files deleted, runs, and runs SIGKILLed at a hit of a fault point the run
really makes (`tests.kills`: the run is traced first, and the kill is asserted to have
happened). After every step: no id is in the data glob twice, and wherever batchscore acted last,
`_SUCCESS` present means the data glob holds exactly the current input's rows, each with its
current hash and score; after every run that ended well, that holds and `status` says complete.

The same machine runs over a Delta table (`RowsDeltaFolder`) and an Iceberg table
(`RowsIcebergFolder`), each shared with another writer, where what a reader reads is the
table: no id is in it twice after any step (a glob may hold a rewritten file beside the one it
replaces until the next start), and after every run that ended well it holds each current
input row once (but for a row the other writer deleted) and the other writer's rows.

Each machine runs until it has killed a run at every point in its list at least once (a
point never reached fails the test) and prints the points it reached. A tiny MLP over 4
feature columns (the tensor task) keeps runs short; kills run `batchscore run` in a real
subprocess. The long run: ``pytest -m soak tests/output/test_increments_machine.py`` (at least
``BATCHSCORE_MACHINE_EXAMPLES`` examples of ``_STEPS`` steps, 60 and 15 unless set).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pyiceberg.table import StaticTable

from batchscore.job.parse import load_job
from batchscore.models.numeric.factories import mlp
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from batchscore.storage.layout import is_chunk_name
from batchscore.work.row_hash import hash_column
from tests.kills import Kills, until_reached
from tests.output.formats import iceberg_agreed, iceberg_read, iceberg_table, table_format
from tests.output.neighbours import (
    append_foreign,
    iceberg_append_foreign,
    iceberg_neighbour,
    neighbour,
    table_rows,
)
from tests.output.tiny import ARGS, SCHEMA, rows_job, write_rows

pytestmark = pytest.mark.slow
FEATURES = [f"x{j}" for j in range(4)]
# every point an incremental run passes: a chunk's commit protocol, the model, the reader,
# a whole file's retirement, a file's rewrite, the deletes along the way
KILLS = [
    "after-temp-write",
    "write-chunk",
    "after-fsync",
    "after-rename",
    "before-record",
    "write-record",
    "after-record",
    "model-batch",
    "read-window",
    "retire-move",
    "rewrite",
    "remove",
]
TABLE_KILLS = ["after-table-commit", "rewrite-table", "rewrite-record"]  # a table's own


def by_spark(table: pa.Table, path: Path) -> None:
    """As Spark writes: large strings, doubles for floats, no dictionary, small row groups."""
    wide = pa.schema([("id", pa.large_string()), *[(f, pa.float64()) for f in FEATURES]])
    pq.write_table(
        table.cast(wide),
        path,
        use_dictionary=False,
        row_group_size=2,
        use_deprecated_int96_timestamps=True,
    )


# the input's neighbours: the same values written again by another tool, in its own layout
WRITERS = {
    "pandas": lambda table, path: table.to_pandas().to_parquet(path, index=False),
    "polars": lambda table, path: pl.from_arrow(table).write_parquet(path),
    "spark": by_spark,
}


class RowsFolder(RuleBasedStateMachine):
    """The model: the current input files (name -> table); ids are unique across them."""

    fmt = "parquet"  # [output].format
    kills = Kills(KILLS, KILLS)  # replaced by each test

    @initialize()
    def setup(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bs-rows-"))
        self.inputs, self.out = self.root / "in", self.root / "out"
        self.job = rows_job(self.root, fmt=self.fmt)
        torch.manual_seed(0)
        self.model = mlp(**ARGS).eval()  # the weights `rows_job` saved (the same seed)
        self.files: dict[str, pa.Table] = {}
        self.serial = 0
        self.touched = False  # the input or output changed since batchscore last acted
        self.append_rows("a.parquet", rows=5, seed=0)

    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)

    def put(self, name: str, table: pa.Table | None) -> None:
        """Write (or with None, delete) one input file, and remember it."""
        path = self.inputs / name
        if table is None:
            path.unlink()
            del self.files[name]
        else:
            write_rows(path, table)
            self.files[name] = pa.table(table).cast(SCHEMA)
        self.touched = True

    def names(self) -> st.SearchStrategy[str]:
        return st.sampled_from(sorted(self.files))

    # -- the input --------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(["a.parquet", "b.parquet", "c.parquet"]),
        rows=st.integers(1, 6),
        seed=st.integers(0, 2**16),
    )
    def append_rows(self, name: str, rows: int, seed: int) -> None:
        x = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
        ids = [f"r{self.serial + i}" for i in range(rows)]
        self.serial += rows
        new = pa.table({"id": ids, **{f: x[:, j] for j, f in enumerate(FEATURES)}})
        old = self.files.get(name)
        self.put(name, new if old is None else pa.concat_tables([old, new.cast(SCHEMA)]))

    @precondition(lambda self: self.files)
    @rule(data=st.data(), pick=st.integers(0, 2**16), delta=st.floats(0.5, 2.0))
    def edit_row(self, data: st.DataObject, pick: int, delta: float) -> None:
        name = data.draw(self.names())
        rows = self.files[name].to_pydict()
        if not rows["id"]:
            return
        rows["x1"][pick % len(rows["id"])] += delta
        self.put(name, rows)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), pick=st.integers(0, 2**16))
    def delete_row(self, data: st.DataObject, pick: int) -> None:
        name = data.draw(self.names())
        table = self.files[name]
        if table.num_rows:
            keep = [i for i in range(table.num_rows) if i != pick % table.num_rows]
            self.put(name, table.take(pa.array(keep, pa.int64())))  # typed: [] is null's

    @precondition(lambda self: len(self.files) > 1)
    @rule(data=st.data())
    def delete_file(self, data: st.DataObject) -> None:
        self.put(data.draw(self.names()), None)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), to=st.sampled_from(["d.parquet", "e.parquet", "f.parquet"]))
    def rename_file(self, data: st.DataObject, to: str) -> None:
        name = data.draw(self.names())
        if to in self.files:
            return
        (self.inputs / name).rename(self.inputs / to)
        self.files[to] = self.files.pop(name)
        self.touched = True

    @precondition(lambda self: self.files)
    @rule(data=st.data(), cut=st.integers(0, 2**16))
    def split_file(self, data: st.DataObject, cut: int) -> None:
        name = data.draw(self.names())
        table = self.files[name]
        at = cut % (table.num_rows + 1)
        self.put(name, None)
        self.put(f"s{self.serial}-0.parquet", table.slice(0, at))
        self.put(f"s{self.serial}-1.parquet", table.slice(at))
        self.serial += 1

    @precondition(lambda self: len(self.files) > 1)
    @rule(data=st.data())
    def merge_files(self, data: st.DataObject) -> None:
        first = data.draw(self.names())
        second = data.draw(self.names().filter(lambda n: n != first))
        merged = pa.concat_tables([self.files[second], self.files[first]])
        self.put(first, None)
        self.put(second, merged)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), writer=st.sampled_from(sorted(WRITERS)))
    def rewrite_in_another_layout(self, data: st.DataObject, writer: str) -> None:
        """Another tool writes a file again, the same values in its own layout (a neighbour:
        `WRITERS`); by rows, its rows keep their hashes and score nothing."""
        name = data.draw(self.names())
        WRITERS[writer](self.files[name], self.inputs / name)
        self.touched = True

    @precondition(lambda self: self.files)
    @rule()
    def compact(self) -> None:
        """Every file into one, rows reversed, under a new name."""
        everything = pa.concat_tables(self.files.values())
        for name in list(self.files):
            self.put(name, None)
        self.put(
            f"compact-{self.serial}.parquet",
            everything.take(pa.array(range(everything.num_rows)[::-1], pa.int64())),
        )
        self.serial += 1

    # -- the output and runs ----------------------------------------------------------------

    @rule(pick=st.integers(0, 2**16))
    def delete_output_file(self, pick: int) -> None:
        files = sorted(self.out.glob("part-*.parquet"))
        if files:
            files[pick % len(files)].unlink()
            self.touched = True

    @rule()
    def run(self) -> None:
        self.touched = False
        assert run_job(load_job(self.job))["outcome"] == "ok"
        self.check_complete()

    @rule(pick=st.integers(0, 2**16))
    def kill(self, pick: int) -> None:
        self.touched = False
        if not self.kills.kill(self.job, self.out, pick):
            self.check_complete()

    @precondition(lambda self: len(self.files) > 1)
    @rule(data=st.data(), pick=st.integers(0, 2**16))
    def kill_while_a_file_leaves(self, data: st.DataObject, pick: int) -> None:
        """A file's committed rows retire whole (after a run, where it has none): the kill
        lands among the moves of its data files to gone/ as often as among the rest."""
        if not (self.out / "_SUCCESS").is_file():
            self.run()
        self.delete_file(data)
        self.kill(pick)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), pick=st.integers(0, 2**16), delta=st.floats(0.5, 2.0))
    def kill_while_a_row_retires(self, data: st.DataObject, pick: int, delta: float) -> None:
        """A committed row edited (after a run, where none is committed), so that its file is
        rewritten without it: the kill lands among the rewrite's steps as often as elsewhere."""
        if not (self.out / "_SUCCESS").is_file():
            self.run()
        self.edit_row(data, pick, delta)
        self.kill(pick)

    # -- what must hold ---------------------------------------------------------------------

    def glob(self) -> pa.Table:
        tables = [pq.read_table(p) for p in sorted(self.out.rglob("*.parquet"))]
        if tables:
            return pa.concat_tables(tables)
        return pa.table({"id": [], "_row_hash": [], "prediction": []})  # every row retired

    def expected(self) -> dict[str, tuple[int, int]]:
        """The current input: id -> (its hash, its prediction)."""
        current = pa.concat_tables(self.files.values())
        x = torch.from_numpy(np.stack([current[f].to_numpy() for f in FEATURES], axis=1))
        with torch.inference_mode():
            predicted = self.model(x).argmax(dim=1).tolist()
        hashes = hash_column(current, FEATURES).to_pylist()
        return dict(
            zip(current["id"].to_pylist(), zip(hashes, predicted, strict=True), strict=True)
        )

    def holds_the_input(self) -> None:
        got = self.glob()
        found = zip(
            got["id"].to_pylist(),
            got["_row_hash"].to_pylist(),
            got["prediction"].to_pylist(),
            strict=True,
        )
        assert {i: (h, p) for i, h, p in found} == self.expected()

    def check_complete(self) -> None:
        self.holds_the_input()
        assert (self.out / "_SUCCESS").is_file()
        status = job_status(load_job(self.job))
        assert status["complete"] and status["increments"]["to_score"] == 0

    @invariant()
    def no_id_is_in_the_glob_twice(self) -> None:
        if self.out.exists() and self.fmt == "parquet":
            ids = self.glob()["id"].to_pylist()
            assert len(ids) == len(set(ids))

    @invariant()
    def success_means_the_current_input_once(self) -> None:
        if self.touched or not (self.out / "_SUCCESS").is_file():
            return
        event("_SUCCESS checked against the data glob")
        self.holds_the_input()


class RowsDeltaFolder(RowsFolder):
    """The same, writing a Delta table, killed at its own fault points too, and shared with
    another writer (`tests.output.test_delta_neighbours.neighbour`, deltalake's own calls):
    compaction, Z-order, vacuum, a delete, an added column and rows of its own, between runs
    and kills. What a reader reads is the table: every current input row at most once, and
    exactly once but for a row the other writer deleted while its input row is unchanged;
    the other writer's rows are never lost."""

    fmt = "delta"

    @initialize()
    def setup(self) -> None:
        super().setup()
        self.deleted: set[tuple[str, int]] = set()  # (id, hash) the other writer deleted
        self.foreign: dict[str, list[float]] = {}  # its own rows: id -> scores
        self.columns = False  # it added a column

    def readable(self) -> bool:
        """A table whose every file is there (one a hand deleted fails every reader, and the
        other writer's maintenance too, until the next run takes it out)."""
        if not (self.out / "_delta_log").is_dir():
            return False
        return all(Path(uri).is_file() for uri in deltalake.DeltaTable(str(self.out)).file_uris())

    # -- the other writer -------------------------------------------------------------------

    @precondition(lambda self: self.readable())
    @rule(operation=st.sampled_from(["compact", "z_order", "vacuum"]))
    def neighbour_maintains(self, operation: str) -> None:
        neighbour(self.out, operation)
        event(f"the other writer: {operation}")

    @precondition(lambda self: self.readable() and not self.columns)
    @rule()
    def neighbour_adds_a_column(self) -> None:
        neighbour(self.out, "add_column")
        self.columns = True

    @precondition(lambda self: self.readable())
    @rule()
    def neighbour_appends(self) -> None:
        if deltalake.DeltaTable(str(self.out)).to_pyarrow_table(columns=["id"]).num_rows < 2:
            return
        self.foreign.update(append_foreign(self.out, (f"f{self.serial}-0", f"f{self.serial}-1")))
        self.serial += 1

    @precondition(lambda self: self.readable())
    @rule(pick=st.integers(0, 2**16))
    def neighbour_deletes_a_row(self, pick: int) -> None:
        found = deltalake.DeltaTable(str(self.out)).to_pyarrow_table(columns=["id", "_row_hash"])
        if not found.num_rows:
            return
        i = pick % found.num_rows
        row_id, row_hash = found["id"][i].as_py(), found["_row_hash"][i].as_py()
        deltalake.DeltaTable(str(self.out)).delete(f"id = '{row_id}'")
        if row_id in self.foreign:
            del self.foreign[row_id]
        else:
            self.deleted.add((row_id, row_hash))
        event("the other writer deleted a row")

    @rule(pick=st.integers(0, 2**16))
    def delete_output_file(self, pick: int) -> None:
        """A hand deletes one of batchscore's own chunk files (never the other writer's)."""
        files = sorted(p for p in self.out.glob("part-*.parquet") if is_chunk_name(p.name))
        if files:
            files[pick % len(files)].unlink()
            self.touched = True

    # -- what must hold ---------------------------------------------------------------------

    def holds_the_input(self) -> None:
        """The table, as deltalake, polars and DuckDB read it, holds each current input row
        once with its hash and score (but those the other writer deleted while unchanged),
        and the other writer's rows as it wrote them."""
        if not (self.out / "_delta_log").is_dir():
            assert not self.expected(), "rows committed, and no table"
            return
        table = deltalake.DeltaTable(str(self.out)).to_pyarrow_table(
            columns=["id", "_row_hash", "prediction", "scores"]
        )
        ids = table["id"].to_pylist()
        assert len(ids) == len(set(ids)), "an id twice in the table"
        assert sorted(i for i, _ in table_rows(self.out)) == sorted(ids)  # the readers agree
        hashes, predicted = table["_row_hash"].to_pylist(), table["prediction"].to_pylist()
        ours = {i: (h, p) for i, h, p in zip(ids, hashes, predicted, strict=True)}
        theirs = {i: ours.pop(i) for i in list(ours) if i in self.foreign}
        want = {i: v for i, v in self.expected().items() if (i, v[0]) not in self.deleted}
        assert ours == want
        assert set(theirs) == set(self.foreign)
        scores = dict(zip(ids, table["scores"].to_pylist(), strict=True))
        assert all(scores[i] == s for i, s in self.foreign.items())

    def check_complete(self) -> None:
        self.holds_the_input()
        assert (self.out / "_SUCCESS").is_file()
        status = job_status(load_job(self.job))
        assert status["complete"] and status["increments"]["to_score"] == 0

    @invariant()
    def no_id_is_in_the_table_twice(self) -> None:
        if self.readable():
            ids = deltalake.DeltaTable(str(self.out)).to_pyarrow_table(columns=["id"])["id"]
            assert len(ids) == len(set(ids.to_pylist()))

    @invariant()
    def success_means_the_current_input_once(self) -> None:
        if self.touched or not (self.out / "_SUCCESS").is_file() or not self.readable():
            return
        event("_SUCCESS checked against the table")
        self.holds_the_input()


class RowsIcebergFolder(RowsDeltaFolder):
    """The same, writing an Iceberg table, killed at a table's own fault points too, and
    shared with another writer through the folder's catalog (pyiceberg's own calls,
    `tests.output.neighbours.iceberg_neighbour`): a compaction (an overwrite of the whole
    table, batchscore's files replaced by the writer's own), every older snapshot expired, a
    column added, a row deleted and rows of its own appended, between runs and kills. What a
    reader reads is the table (pyiceberg, polars and DuckDB agree; after a run that ended
    well, also from the folder alone by its version hint)."""

    fmt = "iceberg"

    def readable(self) -> bool:
        """A table whose every data file is there (one a hand deleted fails every reader, and
        the other writer's maintenance too, until the next run takes it out)."""
        if table_format(self.out) != "iceberg":
            return False
        table = iceberg_table(self.out)
        if table.current_snapshot() is None:
            return True
        return all(Path(t.file.file_path).is_file() for t in table.scan().plan_files())

    def rows(self) -> int:
        return iceberg_read(self.out, ("id",)).num_rows

    # -- the other writer -------------------------------------------------------------------

    @precondition(lambda self: self.readable())
    @rule(operation=st.sampled_from(["compact", "expire"]))
    def neighbour_maintains(self, operation: str) -> None:
        iceberg_neighbour(self.out, operation)
        event(f"the other writer: {operation}")

    @precondition(lambda self: self.readable() and not self.columns)
    @rule()
    def neighbour_adds_a_column(self) -> None:
        iceberg_neighbour(self.out, "add_column")
        self.columns = True

    @precondition(lambda self: self.readable())
    @rule()
    def neighbour_appends(self) -> None:
        if self.rows() < 2:
            return
        ids = (f"f{self.serial}-0", f"f{self.serial}-1")
        self.foreign.update(iceberg_append_foreign(self.out, ids))
        self.serial += 1

    @precondition(lambda self: self.readable())
    @rule(pick=st.integers(0, 2**16))
    def neighbour_deletes_a_row(self, pick: int) -> None:
        found = iceberg_read(self.out, ("id", "_row_hash"))
        if not found.num_rows:
            return
        i = pick % found.num_rows
        row_id, row_hash = found["id"][i].as_py(), found["_row_hash"][i].as_py()
        iceberg_table(self.out).delete(f"id == '{row_id}'")
        if row_id in self.foreign:
            del self.foreign[row_id]
        else:
            self.deleted.add((row_id, row_hash))
        event("the other writer deleted a row")

    # -- what must hold ---------------------------------------------------------------------

    def holds_the_input(self) -> None:
        """The table, as pyiceberg, polars and DuckDB read it, holds each current input row
        once with its hash and score (but those the other writer deleted while unchanged),
        and the other writer's rows as it wrote them."""
        if table_format(self.out) != "iceberg":
            assert not self.expected(), "rows committed, and no table"
            return
        table = iceberg_read(self.out, ("id", "_row_hash", "prediction", "scores"))
        ids = table["id"].to_pylist()
        assert len(ids) == len(set(ids)), "an id twice in the table"
        agreed = iceberg_agreed(self.out, ("id", "scores"))  # the readers agree
        assert sorted(i for i, _ in agreed) == sorted(ids)
        hashes, predicted = table["_row_hash"].to_pylist(), table["prediction"].to_pylist()
        ours = {i: (h, p) for i, h, p in zip(ids, hashes, predicted, strict=True)}
        theirs = {i: ours.pop(i) for i in list(ours) if i in self.foreign}
        want = {i: v for i, v in self.expected().items() if (i, v[0]) not in self.deleted}
        assert ours == want
        assert set(theirs) == set(self.foreign)
        scores = dict(zip(ids, table["scores"].to_pylist(), strict=True))
        assert all(scores[i] == s for i, s in self.foreign.items())

    def check_complete(self) -> None:
        super().check_complete()
        if table_format(self.out) == "iceberg":  # the folder alone reads the same table
            alone = StaticTable.from_metadata(str(self.out)).scan(selected_fields=("id",))
            assert sorted(alone.to_arrow()["id"].to_pylist()) == sorted(
                iceberg_read(self.out, ("id",))["id"].to_pylist()
            )

    @invariant()
    def no_id_is_in_the_table_twice(self) -> None:
        if self.readable():
            ids = iceberg_read(self.out, ("id",))["id"].to_pylist()
            assert len(ids) == len(set(ids))


def machine_settings(**more: int) -> settings:
    return settings(
        deadline=None,
        database=None,  # each round draws new sequences
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        **more,
    )


MACHINES = [
    (RowsFolder, KILLS),
    (RowsDeltaFolder, KILLS + TABLE_KILLS),
    (RowsIcebergFolder, KILLS + TABLE_KILLS),
]


@pytest.mark.timeout(1800)  # rounds until every point is reached: minutes on a busy machine
@pytest.mark.parametrize("machine, points", MACHINES)
def test_every_kill_point_is_reached_and_every_step_holds(machine, points, monkeypatch):
    """Rounds of 4 sequences until a run was killed at each of ``points``."""
    kills = Kills(points, points)
    monkeypatch.setattr(machine, "kills", kills)
    until_reached(machine, kills, examples=4, steps=10, rounds=20, settings_of=machine_settings)


@pytest.mark.soak
@pytest.mark.parametrize("machine, points", MACHINES)
def test_the_long_run(machine, points, monkeypatch):
    """The same, for as long as asked (``make soak`` runs the folder's own soak instead)."""
    kills = Kills(points, points)
    monkeypatch.setattr(machine, "kills", kills)
    examples = int(os.environ.get("BATCHSCORE_MACHINE_EXAMPLES", "60"))
    steps = int(os.environ.get("BATCHSCORE_MACHINE_STEPS", "15"))
    until_reached(
        machine,
        kills,
        examples=10,
        steps=steps,
        rounds=max(examples // 10, 1),
        settings_of=machine_settings,
        at_least=examples,
    )
