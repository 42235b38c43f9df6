"""One job per output folder: the job's identity, checked at the start of every run.

A folder belongs to the job that made its first commit: its resolved inputs plus the
fingerprint of everything that decides the output. Its name and job file are recorded only to
say who it is, so the same job from a moved or renamed job file keeps working. A run that
committed nothing claimed nothing, so a corrected job just runs.

`--restart` discards every committed row, so it is advised only where the settings truly
changed. Each of the model's files is recorded beside the fingerprint (with the folder they were
read from): a file the model had then and lacks now is the model's error, naming it, for the
user to put back; a job record that is damaged or gone is rewritten from the data files'
footers when they prove it; a footer that cannot be read now is a transient error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchscore.errors import (
    BatchscoreError,
    BookkeepingError,
    ModelError,
    OutputConflictError,
    TransientIOError,
)
from batchscore.job.paths import names_input
from batchscore.output.checkpoint import Checkpoint, Damaged, fingerprint
from batchscore.output.manifest import footer_keys, problems
from batchscore.output.restart import finish_restart, start_over
from batchscore.storage.layout import JOB
from batchscore.storage.retry import is_transient
from batchscore.version import __version__

log = logging.getLogger("batchscore")
FILES = "model_file_digests"  # job record: each model file's digest, by its path in the model
FOLDER = "model_folder"  # job record: where those files were read
NAMED = 5  # files named in a message, at most


@dataclass(frozen=True)
class Identity:
    """Who a job is, as far as its output is concerned."""

    name: str
    source: str  # the job file, for messages
    inputs: list[str]  # the resolved [input].path entries
    parts: dict[str, Any]  # what decides the output (see `batchscore.models.fingerprint`)
    # each model file's digest by its path in the model, and where they were read: recorded
    # beside the fingerprint (not in it), to name a file that goes missing later
    files: dict[str, str] | None = None
    model_path: str = ""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.parts)

    def record(self) -> dict[str, Any]:
        """The job record a claim writes."""
        files = {FILES: self.files, FOLDER: self.model_path} if self.files is not None else {}
        return {
            "name": self.name,
            "source": self.source,
            "inputs": self.inputs,
            "fingerprint": self.fingerprint,
            "parts": self.parts,
            **files,
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
    if recorded is None and proven(ckpt, identity):
        recorded = repair_claim(ckpt, identity, None)
    refusal = conflict(ckpt.output, recorded, identity)
    if refusal is not None:
        raise refusal
    known = identity.files is not None
    if recorded is not None and known and recorded.get(FOLDER) != identity.model_path:
        # a record of an earlier version, or the same files read elsewhere: record them now
        ckpt.claim({**recorded, FILES: identity.files, FOLDER: identity.model_path})


def refusal(ckpt: Checkpoint, identity: Identity) -> str | None:
    """Why a run of ``identity`` would refuse this folder as it is (None: it would not): the
    message of `refusal_error`."""
    found = refusal_error(ckpt, identity)
    return None if found is None else str(found)


def refusal_error(ckpt: Checkpoint, identity: Identity) -> BatchscoreError | None:
    """The error a run of ``identity`` would refuse this folder with, as it is (None: it would
    not), read without writing anything: what `status` and `plan` judge a folder by, so that
    they exit as the run would. `OutputConflictError` (exit 5) for another job's or other
    settings' output; `BookkeepingError` (exit 10) for a job record that is damaged and that
    the data files do not prove. A model file gone since the output was made raises its
    `ModelError`, as the run would."""
    if ckpt.restarting() or not ckpt.claimed():
        return None  # a restart's remains are removed at the next start: nothing is claimed
    try:
        recorded = ckpt.job()
    except Damaged as exc:
        if proven(ckpt, identity):
            return None  # the next run rewrites it from the data files
        return BookkeepingError(f"{exc}; the data files do not prove which job it belonged to")
    if recorded is None and proven(ckpt, identity):
        return None  # the next run rewrites it from the data files
    found = conflict(ckpt.output, recorded, identity)
    if isinstance(found, ModelError):
        raise found
    return found


def conflict(
    where: str, recorded: dict[str, Any] | None, identity: Identity
) -> BatchscoreError | None:
    """Why a claimed folder, holding ``recorded``'s output, is not this job's (None: it is):
    a `ModelError` when the model lacks a file it had when the output was made, else the
    `OutputConflictError` a run refuses the folder with."""
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
        missing = lost_files(recorded, identity)
        if missing is not None:
            return missing
        changed = differences(recorded["parts"], identity.parts)
        said = [
            f"{part} ({model_changes(recorded, identity)})" if part == "model_files" else part
            for part in changed
        ]
        advice = (
            "run with --restart to discard it and start over, or point [output].path at a "
            "new folder"
        )
        if "model_files" in changed and not isinstance(recorded.get(FILES), dict):
            # an earlier version's record: a file deleted and a model replaced look the same
            advice = (
                f"if the model was replaced on purpose, {advice}; if a file of the model was "
                "deleted or damaged, restore it instead: the output is kept"
            )
        return OutputConflictError(
            f"{where}: committed output was made with other settings "
            f"(changed: {', '.join(said)}); {advice}"
        )
    return None


def lost_files(recorded: dict[str, Any], identity: Identity) -> ModelError | None:
    """The model's error when the model, read where the output's was, lacks files it had when
    the output was made (None: it lacks none, or is another model, or the record is an
    earlier version's, which lists no files). Those files are to be put back, not the output
    discarded."""
    before = recorded.get(FILES)
    if not isinstance(before, dict) or identity.files is None or not same_model(recorded, identity):
        return None
    gone = sorted(set(before) - set(identity.files))
    if not gone:
        return None
    where = identity.model_path.rstrip("/")
    return ModelError(
        f"{listed([f'{where}/{rel}' for rel in gone])}: missing from the model, which had "
        f"{'them' if len(gone) > 1 else 'it'} when the committed output was made; put "
        f"{'them' if len(gone) > 1 else 'it'} back (copy, or download the model again): the "
        "output is kept, and the next run resumes it"
    )


def same_model(recorded: dict[str, Any], identity: Identity) -> bool:
    """Whether the model is the one the output was made with, by name (its id or path, and
    revision) and by folder name: a Hugging Face snapshot's is its commit, so a branch moved to
    another commit is another model, while the same snapshot in a cache mounted elsewhere (on
    another machine, say) is the same one."""
    same = all(recorded["parts"].get(k) == identity.parts.get(k) for k in ("model", "revision"))
    return same and Path(str(recorded.get(FOLDER))).name == Path(identity.model_path).name


def model_changes(recorded: dict[str, Any], identity: Identity) -> str:
    """Which of the model's files changed since the output was made, as far as the record
    tells (an earlier version's lists none)."""
    before, now, then = recorded.get(FILES), identity.files, recorded.get(FOLDER)
    if not isinstance(before, dict) or now is None:
        return "the model's files are not those the output was made with"
    if not same_model(recorded, identity):
        return f"the model is read from {identity.model_path}; the output was made from {then}"
    changed = sorted(rel for rel in before if rel in now and now[rel] != before[rel])
    added = sorted(set(now) - set(before))
    said = [f"{listed(changed)} changed"] if changed else []
    said += [f"{listed(added)} added"] if added else []
    return "; ".join(said) or "the model's files are not those the output was made with"


def listed(names: list[str]) -> str:
    """Names for a message: the first few, and how many more."""
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


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


def repair_claim(ckpt: Checkpoint, identity: Identity, damage: Damaged | None) -> dict[str, Any]:
    """Rewrite a damaged (or, ``damage`` None, deleted) job record from what the data files
    prove: every intact committed file's footer names this job's fingerprint and a shard under
    this job's inputs. Anything less proves nothing, and the run stops (`BookkeepingError`)
    rather than start over silently."""
    if not proven(ckpt, identity):
        raise BookkeepingError(
            f"{damage}; the data files do not prove which job it belonged to. Run with "
            "--restart to start over (files batchscore did not write are kept), or point "
            "[output].path at a new folder"
        )
    what = damage or f"{ckpt.store.where(JOB)}: missing"
    log.warning("%s; rewritten from the data files' footers, which all name this job", what)
    ckpt.claim(identity.record())
    return identity.record()


def proven(ckpt: Checkpoint, identity: Identity) -> bool:
    """Whether the committed data files prove the folder is this job's: some are intact, and
    every intact one's footer names this job's fingerprint and a shard under its inputs. A
    missing or changed file proves nothing either way (its chunk is scored again); a footer
    that cannot be read now is a `TransientIOError`, never a proof that fails."""
    records = ckpt.committed()
    broken = problems(ckpt.store, records)
    intact = [record for key, record in records.items() if key not in broken]
    for record in intact:
        try:
            footer = footer_keys(ckpt.store, record["file"])
        except OSError as exc:
            if not is_transient(exc):
                return False
            raise TransientIOError(
                f"{ckpt.store.where(record['file'])}: cannot read its footer now ({exc}); "
                "nothing was lost: run again later"
            ) from exc
        except (ValueError, pa.ArrowException):
            return False
        shard = footer.get("batchscore.shard", "")
        if footer.get("batchscore.fingerprint") != identity.fingerprint or not any(
            names_input(entry, shard) for entry in identity.inputs
        ):
            return False
    return bool(intact)
