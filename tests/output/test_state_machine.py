"""The output contract as a state machine: random sequences of shards added, removed and
renamed, committed files deleted or replaced, foreign files dropped into the output, runs, runs
SIGKILLed at a point they really pass (`tests.kills`: each run traced first, each kill asserted
to have happened), among them after a commit and while they move a left shard's output to
`_batchscore/gone/`, restarts, and restarts SIGKILLed once their commit records are removed
(with new settings, as a restart is for). After every step: foreign files are intact, no row is
in the data glob twice, the output of a shard that left the input is recoverable under
`_batchscore/gone/` once a run started, `status` agrees with the folder, and wherever
batchscore was the last to act, `_SUCCESS` present means the data glob holds exactly the
current input's rows, once (every destructive step drops it first); after every completed run:
the data glob (``out/**/*.parquet``, the foreign files aside) equals scoring the current input,
every row of every shard exactly once, and nothing else. The machine runs until a run was
killed at every point of `KILLS` (a point never reached fails the test), and prints them.

A tiny MLP over 4 feature columns (the tensor task) keeps each run well under a second, so the
machine can try many sequences; kills run `batchscore run` in a real subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from safetensors.torch import save_file

from batchscore.job.parse import load_job
from batchscore.models.numeric.factories import mlp
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from batchscore.storage.layout import RESTART
from tests.conftest import source_of, write_job
from tests.kills import Kills, until_reached
from tests.reliability import committed_files, intended_files

pytestmark = pytest.mark.slow
NAMES = ["a", "b", "c", "d", "e", "zz", "0-first"]
FOREIGN = ["part-0.parquet", "part-00000-3f2a.snappy.parquet", "notes.txt", "nested/part-1.parquet"]
ARGS = {"in_features": 4, "out_features": 3, "hidden": [8]}
# the points a run passes (a retirement's moves and removals among them), and a restart's
RUN_KILLS = [
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
    "remove",
]
RESTART_KILLS = ["restart-unrecorded", "restart-remove"]
KILLS = [*RUN_KILLS, *RESTART_KILLS]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class OutputFolder(RuleBasedStateMachine):
    """The model: the current input shards (name -> table), the gone shards' tables, and the
    foreign files dropped into the output (path -> digest)."""

    kills = Kills(KILLS, KILLS)  # replaced by each test

    @initialize()
    def setup(self) -> None:
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="bs-machine-"))
        self.inputs, self.out = self.root / "in", self.root / "out"
        self.inputs.mkdir()
        torch.manual_seed(0)
        self.model = mlp(**ARGS).eval()
        save_file(self.model.state_dict(), str(self.root / "mlp.safetensors"))
        self.job = self.write_job(chunk_rows=4)
        self.shards: dict[str, pa.Table] = {}  # current input, by file name
        self.contents: dict[str, pa.Table] = {}  # every shard ever written, by resolved path
        self.foreign: dict[str, str] = {}
        self.serial = 0
        self.whole: dict[str, list[str]] = {}  # shard path -> ids, whole at the last full run
        self.leaving: dict[str, list[str]] = {}  # whole shards that left the input since
        self.retired: dict[str, list[str]] = {}  # left before a run started: kept in gone/
        self.restarting = False  # a --restart was killed and no run started since
        self.touched = False  # the input or the output changed since batchscore last acted
        self.add_shard("first", rows=6, seed=0)  # most rules need a shard to act on

    def write_job(self, chunk_rows: int) -> Path:
        return write_job(
            self.root / "job.toml",
            input={"path": "in", "id": "id", "features": ["x0", "x1", "x2", "x3"]},
            model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
            batching={"max_rows": 8, "window_rows": 4},
            output={"path": "out", "chunk_rows": chunk_rows},
            tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
        )

    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)

    # -- the input --------------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES), rows=st.integers(0, 9), seed=st.integers(0, 2**16))
    def add_shard(self, name: str, rows: int, seed: int) -> None:
        """Add (or overwrite) a shard; its ids are unique to this version of it."""
        self.serial += 1
        x = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
        ids = [f"{name}.{self.serial}-{i}" for i in range(rows)]
        table = pa.table({"id": ids, **{f"x{j}": x[:, j] for j in range(4)}})
        path = self.inputs / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=3)
        self.touched = True
        self.arrives(path)
        self.shards[path.name] = table
        self.contents[str(path.resolve())] = table

    @precondition(lambda self: self.shards)
    @rule(data=st.data())
    def remove_shard(self, data: st.DataObject) -> None:
        self.remove(data.draw(st.sampled_from(sorted(self.shards))))

    def remove(self, name: str) -> None:
        (self.inputs / name).unlink()
        self.touched = True
        self.leaves(self.inputs / name)
        del self.shards[name]

    @precondition(lambda self: self.shards)
    @rule(data=st.data(), to=st.sampled_from(NAMES))
    def rename_shard(self, data: st.DataObject, to: str) -> None:
        self.rename(data.draw(st.sampled_from(sorted(self.shards))), to)

    def rename(self, name: str, to: str) -> None:
        target = self.inputs / f"{to}.parquet"
        if target.name == name:
            return
        (self.inputs / name).rename(target)
        self.touched = True
        event("a shard renamed")
        self.leaves(self.inputs / name)
        self.arrives(target)
        self.shards[target.name] = self.shards.pop(name)
        self.contents[str(target.resolve())] = self.shards[target.name]

    def leaves(self, path: Path) -> None:
        """A shard left the input: whole, its output must be kept once a run starts."""
        key = str(path.resolve())
        if key in self.whole:
            self.leaving[key] = self.whole.pop(key)

    def arrives(self, path: Path) -> None:
        """A shard (back) at ``path``: new rows, or its old output counted again."""
        key = str(path.resolve())
        self.whole.pop(key, None)
        self.leaving.pop(key, None)

    # -- the output -------------------------------------------------------------------------

    def data_files(self) -> list[Path]:
        return sorted(p for p in self.out.glob("part-*.parquet") if p.name not in self.foreign)

    # Which files a killed run committed depends on timing, so a victim is picked by a number
    # drawn whatever is on disk: what Hypothesis draws never depends on the folder.
    @rule(pick=st.integers(0, 2**16))
    def delete_output_file(self, pick: int) -> None:
        files = self.data_files()
        if not files:
            return
        victim = files[pick % len(files)]
        self.damaged(victim)
        victim.unlink()

    @rule(pick=st.integers(0, 2**16))
    def replace_output_file(self, pick: int) -> None:
        """A hand replaces a committed data file (one a record names: a file in the window
        between its publishing and its record, or listed by a --restart that removed its
        record, is nobody's committed output, and a foreign file there is refused, exit 5)."""
        committed = committed_files(self.out)
        files = [f for f in self.data_files() if f.name in committed]
        if not files:
            return
        victim = files[pick % len(files)]
        self.damaged(victim)
        self.serial += 1
        pq.write_table(pa.table({"id": [f"forged-{self.serial}"], "x": [1.0]}), victim)

    def damaged(self, victim: Path) -> None:
        """Its shard's output is no longer whole: nothing of it is promised to be kept."""
        self.touched = True
        self.whole.pop(source_of(victim), None)
        self.leaving.pop(source_of(victim), None)

    @rule(name=st.sampled_from(FOREIGN), payload=st.binary(min_size=1, max_size=64))
    def drop_foreign_file(self, name: str, payload: bytes) -> None:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
        self.foreign[name] = digest(path)

    # -- runs -------------------------------------------------------------------------------

    @precondition(lambda self: self.shards)
    @rule()
    def run(self) -> None:
        self.started()
        run_job(load_job(self.job))
        self.check_complete()

    @precondition(lambda self: self.shards)
    @rule()
    def restart(self) -> None:
        self.started(restart=True)
        run_job(load_job(self.job), restart=True)
        self.check_complete()

    @precondition(lambda self: self.shards)
    @rule(pick=st.integers(0, 2**16))
    def kill_after_a_commit(self, pick: int) -> None:
        was = self.restarting
        self.started()
        self.killed(self.kills.kill(self.job, self.out, pick, among=["after-record"]), was)

    @precondition(lambda self: self.shards)
    @rule(pick=st.integers(0, 2**16))
    def kill(self, pick: int) -> None:
        """A run SIGKILLed at any point it passes: the commit protocol's, the model's, the
        reader's, a retirement's, or while it finishes a --restart a killed run left (among
        its removals: then the folder may still be restarting, as its list says)."""
        was = self.restarting
        self.started()
        self.killed(self.kills.kill(self.job, self.out, pick, among=RUN_KILLS), was)

    @precondition(lambda self: self.shards)
    @rule(chunk_rows=st.sampled_from([3, 4]), pick=st.integers(0, 2**16))
    def kill_a_restart_between_records_and_files(self, chunk_rows: int, pick: int) -> None:
        """A --restart with these settings, SIGKILLed once it removed the commit records (at
        that point, or at one of the removals of the data files batchscore wrote that follow),
        and the job now has the new settings."""
        self.job = self.write_job(chunk_rows)
        self.started(restart=True)
        among = ["restart-unrecorded", "restart-remove"]
        self.killed(self.kills.kill(self.job, self.out, pick, "--restart", among=among), True)

    def killed(self, point: str | None, restart: bool) -> None:
        """After a run killed at ``point`` (None: it ran to its end) that was a --restart or
        found one under way (``restart``): the restart is still under way where the kill cut
        its records or its removals short (at a removal that may be the list's own, as its
        list says), and done where the run was past them."""
        if point is None:
            self.check_complete()
        else:
            self.restarting = self.still_restarting(point, restart)

    def still_restarting(self, point: str, restart: bool) -> bool:
        if point in RESTART_KILLS:
            return True
        return restart and point == "remove" and (self.out / RESTART).is_file()

    def whole_shards(self) -> list[str]:
        """The current shards whose output was whole at the last full run."""
        return sorted(n for n in self.shards if str((self.inputs / n).resolve()) in self.whole)

    @precondition(lambda self: self.shards)
    @rule(data=st.data(), to=st.sampled_from([None, *NAMES]), pick=st.integers(0, 2**16))
    def kill_while_a_left_shard_moves(self, data: st.DataObject, to: str | None, pick: int):
        """A shard with whole output (after a run, where none has) removed (``to`` None) or
        renamed, then a run SIGKILLed after one of its moves of the shard's files to gone/ (it
        ends well where there is none to move): the output lies partly in the data files,
        partly under gone/, until the next start finishes the move."""
        if not self.whole_shards():
            self.run()
        name = data.draw(st.sampled_from(self.whole_shards()))
        if to is None and len(self.shards) > 1:  # the last one stays: no input is a job error
            self.remove(name)
        else:
            self.rename(name, to or "zz")
        leaving, was = dict(self.leaving), self.restarting
        self.started()
        point = self.kills.kill(self.job, self.out, pick, among=["retire-move"])
        if point is None:
            self.check_complete()
            return
        self.restarting = self.still_restarting(point, was)
        for shard in leaving:  # kept whole once a later start finishes the move
            self.retired.pop(shard, None)
        self.leaving.update(leaving)

    def started(self, *, restart: bool = False) -> None:
        """A run starts: it moves out the output of shards that left (a restart removes it)."""
        self.touched = False
        self.restarting = False
        if restart:
            self.whole, self.leaving, self.retired = {}, {}, {}
        self.retired.update(self.leaving)
        self.leaving = {}

    # -- what must hold ---------------------------------------------------------------------

    def files_by_shard(self) -> dict[str, list[Path]]:
        found: dict[str, list[Path]] = {}
        for path in self.data_files():
            found.setdefault(source_of(path), []).append(path)
        return found

    def holds_exactly(self, shard: str, files: list[Path]) -> bool:
        """Whether ``files`` hold exactly the shard's rows, in order, scored right."""
        want = self.contents[shard]
        try:
            tables = [pq.read_table(f) for f in files]
            ordered = sorted(zip(files, tables, strict=True), key=lambda ft: start_of(ft[0]))
            got = pa.concat_tables(t for _, t in ordered) if files else None
        except (OSError, pa.ArrowException):
            return False
        if got is None:
            return False  # a committed shard has a file, even when it has no rows
        if got.column_names != ["id", "prediction", "scores"]:
            return False
        if got["id"].to_pylist() != want["id"].to_pylist():
            return False
        x = torch.from_numpy(np.stack([want[f"x{j}"].to_numpy() for j in range(4)], axis=1))
        with torch.inference_mode():
            expected = self.model(x).argmax(dim=1).numpy()
        return bool((got["prediction"].to_numpy() == expected).all())

    def check_complete(self) -> None:
        """After a run that ended well: every current shard's rows exactly once, scored right,
        and nothing else in the data glob."""
        found = self.files_by_shard()
        for name in self.shards:
            shard = str((self.inputs / name).resolve())
            assert self.holds_exactly(shard, found.get(shard, [])), name
        assert sorted(self.glob_ids()) == sorted(self.current_ids())
        assert (self.out / "_SUCCESS").is_file()
        self.whole = {
            str((self.inputs / name).resolve()): table["id"].to_pylist()
            for name, table in self.shards.items()
        }

    def glob_ids(self) -> list[str]:
        """The ids a reader's ``out/**/*.parquet`` glob sees, the foreign files aside."""
        files = [
            path
            for path in self.out.rglob("*.parquet")
            if path.relative_to(self.out).as_posix() not in self.foreign
        ]
        return [i for f in files for i in pq.read_table(f, columns=["id"])["id"].to_pylist()]

    def current_ids(self) -> list[str]:
        return [i for t in self.shards.values() for i in t["id"].to_pylist()]

    @invariant()
    def no_row_is_in_the_glob_twice(self) -> None:
        ids = self.glob_ids()
        assert len(ids) == len(set(ids)), sorted(i for i in set(ids) if ids.count(i) > 1)

    @invariant()
    def left_output_is_kept_once_a_run_started(self) -> None:
        """Each whole shard that left before a run started is under ``gone/``, in order."""
        kept: dict[tuple[str, str], list[tuple[int, list[str]]]] = {}
        for path in self.out.glob("_batchscore/gone/*/part-*.parquet.gone"):
            key = (path.parent.name, source_of(path))
            if not key[1]:
                continue  # a file forged at a committed file's name: moved, not ours to read
            ids = pq.read_table(path, columns=["id"])["id"].to_pylist()
            kept.setdefault(key, []).append((start_of(path), ids))
        if self.retired:
            event("the output of a shard that left checked under gone/")
        for shard, ids in self.retired.items():
            held = [[i for _, part in sorted(kept[k]) for i in part] for k in kept if k[1] == shard]
            assert ids in held, shard

    @invariant()
    def success_means_the_current_input_once(self) -> None:
        """Wherever batchscore acted last (a run, a killed run, a restart), `_SUCCESS` present
        means the data glob holds exactly the current input's rows, once, scored right."""
        if self.touched or not (self.out / "_SUCCESS").is_file():
            return
        event("_SUCCESS checked against the data glob")
        assert sorted(self.glob_ids()) == sorted(self.current_ids())
        found = self.files_by_shard()
        for name in self.shards:
            shard = str((self.inputs / name).resolve())
            assert self.holds_exactly(shard, found.get(shard, [])), name

    @invariant()
    def foreign_files_are_intact(self) -> None:
        for name, want in self.foreign.items():
            assert digest(self.out / name) == want, name

    @invariant()
    def status_agrees_with_the_folder(self) -> None:
        if not self.shards:
            return  # no input at all: status and run refuse the job (exit 2)
        status = job_status(load_job(self.job))
        current = {str((self.inputs / n).resolve()) for n in self.shards}
        states = {s["shard"]: s["state"] for s in status["shards"] if s["shard"] in current}
        assert status["refused"] is None and status["restarting"] == self.restarting
        plans = [json.loads(p.read_text()) for p in self.out.glob("_batchscore/gone/*.json")]
        moving = any(plan["state"] == "moving" for plan in plans)
        assert status["retiring"] == moving
        if self.restarting:  # nothing counts as committed until the next start finishes it
            assert set(states.values()) == {"pending"} and not status["complete"]
            return
        found = self.files_by_shard()
        unrecorded = intended_files(self.out) - committed_files(self.out)
        for shard in current:
            done = states[shard] == "done"
            files = found.get(shard, [])
            # a kill between a group's renames and its records leaves whole files that no
            # record names (the next start replaces them): rows in place, the shard not done
            published = any(f.name in unrecorded for f in files)
            holds = self.holds_exactly(shard, files)
            assert done == holds or (holds and published), (shard, states[shard])
        in_place = {s["shard"] for s in status["shards"] if s["state"] == "gone" and not s["kept"]}
        assert not in_place & current
        # a reader sees it: status says so (but whole files a kill left between their
        # publishing and their records, which the next start replaces)
        unsettled = {
            shard for shard, files in found.items() if all(f.name in unrecorded for f in files)
        }
        assert set(found) - current - {""} - unsettled <= in_place
        records = [json.loads(p.read_text()) for p in self.out.glob("_batchscore/done/*.json")]
        settled = {r["shard"]["path"] for r in records} <= current
        everything = all(states[shard] == "done" for shard in current)
        assert status["complete"] == (everything and settled and not moving)
        if status["complete"]:
            assert sorted(self.glob_ids()) == sorted(self.current_ids())


def start_of(path: Path) -> int:
    meta = pq.read_metadata(path).metadata
    return int(meta[b"batchscore.rows"].split(b"-")[0])


def machine_settings(**more: int) -> settings:
    return settings(
        deadline=None,
        database=None,  # each round draws new sequences
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        **more,
    )


@pytest.mark.timeout(1800)  # rounds until every point is reached: minutes on a busy machine
def test_every_kill_point_is_reached_and_every_step_holds(monkeypatch):
    """Rounds of 4 sequences until a run was killed at each of ``KILLS``."""
    kills = Kills(KILLS, KILLS)
    monkeypatch.setattr(OutputFolder, "kills", kills)
    until_reached(
        OutputFolder, kills, examples=4, steps=12, rounds=25, settings_of=machine_settings
    )


@pytest.mark.soak
def test_the_long_run(monkeypatch):
    """The same, for as long as asked: ``pytest -m soak tests/output/test_state_machine.py``
    runs at least ``BATCHSCORE_MACHINE_EXAMPLES`` examples of ``_STEPS`` steps (60, 15)."""
    kills = Kills(KILLS, KILLS)
    monkeypatch.setattr(OutputFolder, "kills", kills)
    examples = int(os.environ.get("BATCHSCORE_MACHINE_EXAMPLES", "60"))
    until_reached(
        OutputFolder,
        kills,
        examples=10,
        steps=int(os.environ.get("BATCHSCORE_MACHINE_STEPS", "15")),
        rounds=max(examples // 10, 1),
        settings_of=machine_settings,
        at_least=examples,
    )
