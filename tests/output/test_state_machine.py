"""The output contract as a state machine: random sequences of shards added, removed and
renamed, committed files deleted or replaced, foreign files dropped into the output, runs, runs
SIGKILLed after a random commit, and restarts. After every step: foreign files are intact and
`status` agrees with the folder; after every completed run: the output equals scoring the
current input, every row of every shard exactly once.

A tiny MLP over 4 feature columns (the tensor task) keeps each run well under a second, so the
machine can try many sequences; kills run `batchscore run` in a real subprocess.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from safetensors.torch import save_file

from batchscore.job.load import load_job
from batchscore.models.factories import mlp
from batchscore.output.status import job_status
from batchscore.pipeline.driver import run_job
from tests.conftest import source_of, write_job

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NAMES = ["a", "b", "c", "d", "e", "zz", "0-first"]
FOREIGN = ["part-0.parquet", "part-00000-3f2a.snappy.parquet", "notes.txt", "nested/part-1.parquet"]
ARGS = {"in_features": 4, "out_features": 3, "hidden": [8]}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class OutputFolder(RuleBasedStateMachine):
    """The model: the current input shards (name -> table), the gone shards' tables, and the
    foreign files dropped into the output (path -> digest)."""

    @initialize()
    def setup(self) -> None:
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="bs-machine-"))
        self.inputs, self.out = self.root / "in", self.root / "out"
        self.inputs.mkdir()
        torch.manual_seed(0)
        self.model = mlp(**ARGS).eval()
        save_file(self.model.state_dict(), str(self.root / "mlp.safetensors"))
        self.job = write_job(
            self.root / "job.toml",
            input={"path": "in", "id": "id", "features": ["x0", "x1", "x2", "x3"]},
            model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
            batching={"max_rows": 8, "window_rows": 4},
            output={"path": "out", "chunk_rows": 4},
            tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
        )
        self.shards: dict[str, pa.Table] = {}  # current input, by file name
        self.contents: dict[str, pa.Table] = {}  # every shard ever written, by resolved path
        self.foreign: dict[str, str] = {}
        self.serial = 0
        self.add_shard("first", rows=6, seed=0)  # most rules need a shard to act on

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
        self.shards[path.name] = table
        self.contents[str(path.resolve())] = table

    @precondition(lambda self: self.shards)
    @rule(data=st.data())
    def remove_shard(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.shards)))
        (self.inputs / name).unlink()
        del self.shards[name]

    @precondition(lambda self: self.shards)
    @rule(data=st.data(), to=st.sampled_from(NAMES))
    def rename_shard(self, data: st.DataObject, to: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.shards)))
        target = self.inputs / f"{to}.parquet"
        (self.inputs / name).rename(target)
        self.shards[target.name] = self.shards.pop(name)
        self.contents[str(target.resolve())] = self.shards[target.name]

    # -- the output -------------------------------------------------------------------------

    def data_files(self) -> list[Path]:
        return sorted(p for p in self.out.glob("part-*.parquet") if p.name not in self.foreign)

    @precondition(lambda self: self.data_files())
    @rule(data=st.data())
    def delete_output_file(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.data_files())).unlink()

    @precondition(lambda self: self.data_files())
    @rule(data=st.data())
    def replace_output_file(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from(self.data_files()))
        pq.write_table(pa.table({"id": ["forged"], "x": [1.0]}), victim)

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
        run_job(load_job(self.job))
        self.check_complete()

    @precondition(lambda self: self.shards)
    @rule()
    def restart(self) -> None:
        run_job(load_job(self.job), restart=True)
        self.check_complete()

    @precondition(lambda self: self.shards)
    @rule(commits=st.integers(1, 3))
    def kill_after_a_commit(self, commits: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env["BATCHSCORE_FAULTS"] = f"after-record@{commits}:kill"
        command = [sys.executable, "-m", "batchscore", "run", str(self.job), "--progress", "off"]
        done = subprocess.run(command, env=env, capture_output=True, timeout=300)
        assert done.returncode in (0, -9), done.stderr.decode()[-2000:]

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
        """After a run that ended well: every current shard's rows exactly once, scored right."""
        found = self.files_by_shard()
        for name in self.shards:
            shard = str((self.inputs / name).resolve())
            assert self.holds_exactly(shard, found.get(shard, [])), name
        assert (self.out / "_SUCCESS").is_file()

    @invariant()
    def foreign_files_are_intact(self) -> None:
        for name, want in self.foreign.items():
            assert digest(self.out / name) == want, name

    @invariant()
    def status_agrees_with_the_folder(self) -> None:
        if not self.shards:
            return  # no input at all: status and run refuse the job (exit 2)
        status = job_status(load_job(self.job))
        found = self.files_by_shard()
        states = {s["shard"]: s["state"] for s in status["shards"]}
        for name in self.shards:
            shard = str((self.inputs / name).resolve())
            done = states[shard] == "done"
            assert done == self.holds_exactly(shard, found.get(shard, [])), (name, states[shard])
        gone = {s for s, state in states.items() if state == "gone"}
        assert not gone & {str((self.inputs / n).resolve()) for n in self.shards}
        assert status["complete"] == all(states[str((self.inputs / n).resolve())] == "done"
                                         for n in self.shards)  # fmt: skip


def start_of(path: Path) -> int:
    meta = pq.read_metadata(path).metadata
    return int(meta[b"batchscore.rows"].split(b"-")[0])


OutputFolder.TestCase.settings = settings(
    max_examples=int(os.environ.get("BATCHSCORE_MACHINE_EXAMPLES", "12")),
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestOutputFolder = OutputFolder.TestCase
