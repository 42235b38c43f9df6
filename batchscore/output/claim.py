"""One job per output folder: the job's identity, checked at the start of every run.

A folder belongs to the job that made its first commit: its resolved inputs plus the
fingerprint of everything that decides the output. Its name and job file are recorded only to
say who it is, so the same job from a moved or renamed job file keeps working. A run that
committed nothing claimed nothing, so a corrected job just runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from batchscore.errors import BookkeepingError, OutputConflictError
from batchscore.job.paths import names_input
from batchscore.output.checkpoint import Checkpoint, Damaged, fingerprint
from batchscore.output.manifest import written_for
from batchscore.output.restart import finish_restart, start_over
from batchscore.version import __version__

log = logging.getLogger("batchscore")


@dataclass(frozen=True)
class Identity:
    """Who a job is, as far as its output is concerned."""

    name: str
    source: str  # the job file, for messages
    inputs: list[str]  # the resolved [input].path entries
    parts: dict[str, Any]  # what decides the output (see `batchscore.models.fingerprint`)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.parts)

    def record(self) -> dict[str, Any]:
        """The job record a claim writes."""
        return {
            "name": self.name,
            "source": self.source,
            "inputs": self.inputs,
            "fingerprint": self.fingerprint,
            "parts": self.parts,
            "version": __version__,
        }


def check_claim(ckpt: Checkpoint, identity: Identity, restart: bool) -> None:
    """Refuse to mix this job's output with another job's or other settings'; with ``restart``,
    first remove what batchscore wrote here (files it did not write are kept). A restart a
    killed run left half done is finished first, whatever this run was asked."""
    finish_restart(ckpt, restarting=restart)
    if restart:
        start_over(ckpt)
        return
    if not ckpt.claimed():
        return
    try:
        recorded = ckpt.job()
    except Damaged as exc:
        recorded = repair_claim(ckpt, identity, exc)
    refusal = conflict(ckpt.output, recorded, identity)
    if refusal is not None:
        raise refusal


def refusal(ckpt: Checkpoint, identity: Identity) -> str | None:
    """Why a run of ``identity`` would refuse this folder as it is (None: it would not), read
    without writing anything: what `status` judges a folder's completeness by."""
    if ckpt.restarting() or not ckpt.claimed():
        return None  # a restart's remains are removed at the next start: nothing is claimed
    try:
        recorded = ckpt.job()
    except Damaged as exc:
        if proven(ckpt, identity):
            return None  # the next run rewrites it from the data files
        return f"{exc}; the data files do not prove which job it belonged to"
    found = conflict(ckpt.output, recorded, identity)
    return None if found is None else str(found)


def conflict(
    where: str, recorded: dict[str, Any] | None, identity: Identity
) -> OutputConflictError | None:
    """Why a claimed folder, holding ``recorded``'s output, is not this job's (None: it is)."""
    if recorded is None or "inputs" not in recorded:
        return OutputConflictError(
            f"{where}: holds committed output without a job record batchscore can read (an "
            "older version's, or a damaged one); run with --restart to replace batchscore's "
            "files there, or point [output].path at a new folder"
        )
    if recorded["inputs"] != identity.inputs:
        return OutputConflictError(
            f"{where}: holds the output of another job, {recorded['name']!r} "
            f"({recorded.get('source', 'its job file')}), which reads "
            f"{', '.join(recorded['inputs'])}; give this job its own [output].path, or run "
            "with --restart to replace that job's files there (other files are kept)"
        )
    if recorded["fingerprint"] != identity.fingerprint:
        changed = differences(recorded["parts"], identity.parts)
        return OutputConflictError(
            f"{where}: committed output was made with other settings "
            f"(changed: {', '.join(changed)}); run with --restart to discard it and start "
            "over, or point [output].path at a new folder"
        )
    return None


def differences(before: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """The parts that differ, named down to the key inside a section (``task_options.stop``),
    so the message points at the job key that changed."""
    found = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            found += differences(old, new, f"{prefix}{key}.")
        else:
            found.append(prefix + key)
    return found


def repair_claim(ckpt: Checkpoint, identity: Identity, damage: Damaged) -> dict[str, Any]:
    """Rewrite a damaged job record from what the data files prove: every committed file's
    footer names this job's fingerprint and a shard under this job's inputs. Anything less
    proves nothing, and the run stops (`BookkeepingError`) rather than start over silently."""
    if not proven(ckpt, identity):
        raise BookkeepingError(
            f"{damage}; the data files do not prove which job it belonged to. Run with "
            "--restart to start over (files batchscore did not write are kept), or point "
            "[output].path at a new folder"
        )
    log.warning("%s; rewritten from the data files' footers, which all name this job", damage)
    ckpt.claim(identity.record())
    return identity.record()


def proven(ckpt: Checkpoint, identity: Identity) -> bool:
    """Whether the committed data files prove the folder is this job's: there are some, and
    every one's footer names this job's fingerprint and a shard under its inputs."""
    records = ckpt.committed()
    for record in records.values():
        footer = written_for(ckpt.store, record["file"])
        shard = footer.get("batchscore.shard", "")
        if footer.get("batchscore.fingerprint") != identity.fingerprint or not any(
            names_input(entry, shard) for entry in identity.inputs
        ):
            return False
    return bool(records)
