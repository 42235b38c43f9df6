"""Planning apart from acting: a plan (`output.todo.to_do`) changes no file, in every state the
output state machines reach (shards added, removed, renamed, rows edited and deleted, files
deleted and replaced, foreign files, runs killed at every fault point, a Delta table's other
writer); and a run's plan, carried out (`output.apply.apply`), is what a dry run of the folder
said before, and leaves nothing of itself for the next plan to do."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, rule, run_state_machine_as_test
from safetensors.torch import save_file

from batchscore.errors import OutputConflictError
from batchscore.job.parse import load_job
from batchscore.job.sections import Job
from batchscore.models.numeric.factories import mlp
from batchscore.output import apply as apply_module
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.survey import Plan
from batchscore.recipes import run as run_module
from batchscore.recipes.run import run_job
from tests.conftest import write_job
from tests.output import test_increments_machine as rows_machines
from tests.output import test_state_machine as shard_machine
from tests.output.planning import (
    check_plan_changes_nothing,
    chunk_keys,
    folder_digest,
    plan_of,
)
from tests.output.tiny import ARGS

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def checked_runs(job_file: Path) -> Iterator[None]:
    """Runs in this process whose plan is checked around its carrying out (`carried_out`)."""
    real = apply_module.apply

    def checked(ckpt: Checkpoint, plan: Plan, *, recovered: list) -> object:
        job = load_job(job_file)
        return carried_out(job, plan, lambda: real(ckpt, plan, recovered=recovered))

    with mock.patch.object(run_module, "apply", checked):
        yield


def carried_out(job: Job, plan: Plan, act: object) -> object:
    """The run's ``plan`` is the one a dry run makes of the folder now, and changed nothing;
    carrying it out (``act``) gives the run the plan's work and counts, and leaves the next
    plan nothing to do but the same chunks."""
    label = plan.survey.label
    out = Path(job.output.path)
    before = folder_digest(out)
    dry = plan_of(job, label=label)
    assert folder_digest(out) == before
    assert chunk_keys(dry) == chunk_keys(plan)
    assert (dry.uncommit, dry.leaving, dry.room) == (plan.uncommit, plan.leaving, plan.room)
    assert (dry.failures, dry.redone, dry.gone) == (plan.failures, plan.redone, plan.gone)
    assert (dry.done_rows, dry.total_rows, dry.increments) == (
        plan.done_rows,
        plan.total_rows,
        plan.increments,
    )
    todo = act()  # type: ignore[operator]
    assert chunk_keys(todo) == chunk_keys(plan)
    assert (todo.failures, todo.redone, todo.done_rows) == (
        plan.failures,
        plan.redone,
        plan.done_rows,
    )
    after = plan_of(job, label=label)
    assert chunk_keys(after) == chunk_keys(plan)
    assert not after.uncommit and not after.leaving and not after.room and not after.gone
    assert not after.retire and not after.damaged
    assert (after.done_chunks, after.bad_by_shard) == (todo.done_chunks, todo.bad_by_shard)
    assert not after.table.stray and not after.table.missing
    return todo


def planned(machine: type) -> type:
    """``machine`` with every state's plan checked to change nothing, and its runs in this
    process checked around their carrying out."""

    class Planned(machine):  # type: ignore[misc, valid-type]
        @invariant()
        def planning_changes_nothing(self) -> None:
            check_plan_changes_nothing(load_job(self.job))

        @rule()
        def run(self) -> None:  # the machine's rule, its run's plan checked
            with checked_runs(self.job):
                super().run()

    Planned.__name__ = f"Planned{machine.__name__}"
    return Planned


MACHINES = [
    shard_machine.OutputFolder,
    rows_machines.RowsFolder,
    rows_machines.RowsDeltaFolder,
]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_planning_changes_nothing_and_a_run_carries_its_plan_out(machine: type) -> None:
    """A few sequences of each machine (kills at random points among them): the folder is
    byte for byte the same after a plan of every state, and each run's plan holds."""
    drawn = settings(
        max_examples=5,
        stateful_step_count=12,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    run_state_machine_as_test(planned(machine), settings=drawn)


def shards_job(tmp_path: Path, names: list[str]) -> Path:
    """A tensor job by shards over ``names`` (six rows each, chunks of four), a tiny MLP."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for seed, name in enumerate(names):
        rows = pa.table({f"x{i}": [float(seed + r + i) for r in range(6)] for i in range(4)})
        pq.write_table(rows, inputs / name)
    torch.manual_seed(0)
    save_file(mlp(**ARGS).eval().state_dict(), str(tmp_path / "mlp.safetensors"))
    return write_job(
        tmp_path / "job.toml",
        input={"path": "in", "features": ["x0", "x1", "x2", "x3"]},
        model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
        output={"path": "out", "chunk_rows": 4},
        tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
    )


def test_the_plan_lists_what_a_run_will_change_and_changes_none_of_it(tmp_path: Path):
    """A shard gone, a committed file changed, a crashed attempt's file: the plan names each
    and the folder stays as it was; the run carries each out (`carried_out`). Then a foreign
    file at a pending name: the plan names it, and the run refuses, leaving it as it is."""
    job_file = shards_job(tmp_path, ["a.parquet", "b.parquet", "c.parquet"])
    run_job(load_job(job_file))
    out = tmp_path / "out"
    records = [json.loads(p.read_text()) for p in sorted(out.glob("_batchscore/done/*.json"))]
    of = {Path(r["shard"]["path"]).name: r for r in records if r["start"] == 0}
    lost = out / "_batchscore" / "done" / f"{of['c.parquet']['chunk']}.json"
    (tmp_path / "in" / "a.parquet").unlink()  # gone: its output retires
    (out / of["b.parquet"]["file"]).write_bytes(b"changed")  # damaged: scored again
    lost.unlink()  # its file is an unrecorded attempt's
    job = load_job(job_file)
    before = folder_digest(out)
    plan = plan_of(job)
    assert folder_digest(out) == before
    assert plan.uncommit == (of["b.parquet"]["chunk"],)
    assert [r["chunk"] for r in plan.redone] == list(plan.uncommit)
    assert plan.leaving == {r["chunk"] for r in records if r["shard"]["path"].endswith("a.parquet")}
    assert [Path(g["shard"]).name for g in plan.gone] == ["a.parquet"]
    assert [(r.name, r.ours) for r in plan.room] == [(of["c.parquet"]["file"], True)]
    with checked_runs(job_file):
        report = run_job(job)
    assert [Path(g["shard"]).name for g in report["gone_shards"]] == ["a.parquet"]
    foreign = out / of["c.parquet"]["file"]
    lost.unlink()
    pq.write_table(pq.read_table(foreign).replace_schema_metadata(None), foreign)
    planted = foreign.read_bytes()  # no footer of this job's: batchscore did not write it
    assert plan_of(job).blocking == [of["c.parquet"]["file"]]
    with pytest.raises(OutputConflictError, match="batchscore did not write"):
        run_job(job)
    assert foreign.read_bytes() == planted
