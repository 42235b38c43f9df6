"""Planning apart from acting, checked from outside: a plan changes no file of the folder, and
a run's plan, carried out, leaves nothing of itself for the next plan to do."""

from __future__ import annotations

import hashlib
from pathlib import Path

from batchscore.errors import BatchscoreError
from batchscore.job.sections import Job
from batchscore.models.fingerprint import identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import input_kinds
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.delta import delta_table
from batchscore.output.survey import Plan, Survey
from batchscore.output.todo import to_do
from batchscore.work.shards import find_shards


def folder_digest(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` by its relative path: a file's SHA-256, a folder's
    mark (a link is read as what it names)."""
    found: dict[str, str] = {}
    if not root.exists():
        return found
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        found[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return found


def survey_of(job: Job, *, label: str = "") -> Survey:
    """The survey `batchscore plan` makes of ``job`` (with its fingerprint: room is looked at)."""
    return Survey(
        inp=job.input,
        kinds=input_kinds(job.model.task, job.input, job.options),
        chunk_rows=job.output.chunk_rows,
        shards=tuple(find_shards(job.input)),
        fingerprint=identity(job, locate(job.model)).fingerprint,
        label=label,
    )


def plan_of(job: Job, *, label: str = "") -> Plan:
    """``job``'s plan, as `batchscore plan` reads the folder (its Delta table too)."""
    ckpt = Checkpoint(job.output.path)
    ckpt.table = delta_table(job, ckpt.store)
    return to_do(ckpt, survey_of(job, label=label))


def check_plan_changes_nothing(job: Job) -> Plan | None:
    """Plan ``job`` (None where planning refuses it: bad input, a folder another job made)
    and assert that no file of its output folder changed, appeared or went."""
    out = Path(job.output.path)
    before = folder_digest(out)
    try:
        plan = plan_of(job)
    except BatchscoreError:
        plan = None
    assert folder_digest(out) == before
    return plan


def chunk_keys(plan: object) -> list[tuple[str, int, int, int]]:
    """A plan's (or a run's `Pending`'s) chunks as comparable facts: key, start, stop, rows."""
    return [(c.key, c.start, c.stop, c.picked) for c in plan.chunks]  # type: ignore[attr-defined]
