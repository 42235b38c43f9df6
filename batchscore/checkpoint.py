"""Checkpoints: what is committed, as facts on disk under ``<output>/_batchscore/``.

- ``job.json``: the job's name and fingerprint. A run with another fingerprint refuses to mix
  its output with what is committed.
- ``done/<chunk>.json``: one record per committed chunk, written after its data file is in
  place. The record is the commit point: a data file without one is garbage from a crashed
  attempt and is deleted at the next start.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from batchscore import faults
from batchscore.errors import OutputConflictError, WriteError
from batchscore.fsio import fsync_dir, write_error, write_json

STATE = "_batchscore"


def fingerprint(parts: dict[str, Any]) -> str:
    """A short digest of everything that decides the output."""
    canonical = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def part_name(key: str) -> str:
    """The data file of a chunk; sorted names give shards in path order, chunks in row order."""
    return f"part-{key}.parquet"


class Checkpoint:
    """The bookkeeping of one output folder."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.state = output / STATE
        self.done_dir = self.state / "done"
        self.tmp_dir = self.state / "tmp"
        self.lock_path = self.state / "lock"
        self.runs_dir = self.state / "runs"
        self.rejected_dir = self.state / "rejected"

    def job(self) -> dict[str, Any] | None:
        """The recorded job identity, or None when nothing was ever started here."""
        path = self.state / "job.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def claim(self, name: str, parts: dict[str, Any], restart: bool) -> None:
        """Make this folder the job's, refusing to mix outputs of different settings or jobs."""
        for folder in (self.done_dir, self.tmp_dir, self.runs_dir, self.rejected_dir):
            folder.mkdir(parents=True, exist_ok=True)
        parts = json.loads(json.dumps(parts, default=str))  # compare as it will be stored
        recorded, digest = self.job(), fingerprint(parts)
        if recorded and restart:
            self.clear()
        elif recorded and recorded["name"] != name:
            raise OutputConflictError(
                f"{self.output}: holds the output of job {recorded['name']!r}, not {name!r}; "
                "give this job its own [output].path, or pass --restart to replace that output"
            )
        elif recorded and recorded["fingerprint"] != digest:
            changed = sorted(
                k
                for k in set(parts) | set(recorded["parts"])
                if parts.get(k) != recorded["parts"].get(k)
            )
            raise OutputConflictError(
                f"{self.output}: committed output was made with other settings "
                f"(changed: {', '.join(changed)}); run with --restart to discard it and start "
                "over, or point [output].path at a new folder"
            )
        write_json(self.state / "job.json", {"name": name, "fingerprint": digest, "parts": parts})

    def settled(self) -> dict[str, Any] | None:
        """What an earlier run measured and chose (precision, budget, agreement), if any."""
        path = self.state / "settled.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def settle(self, record: dict[str, Any]) -> None:
        """Pin measured choices, so every run of this output uses the same precision."""
        write_json(self.state / "settled.json", record)

    def committed(self) -> dict[str, dict[str, Any]]:
        """Every commit record, by chunk key."""
        records = {}
        for path in self.done_dir.glob("*.json"):
            record = json.loads(path.read_text())
            records[record["chunk"]] = record
        return records

    def commit(self, record: dict[str, Any]) -> None:
        """The commit point: record a chunk whose data file is already durably in place.

        If the record cannot be written, the data file is removed again, so a reader of the
        output never sees rows that are not committed.
        """
        faults.hit("before-record")
        path = self.done_dir / f"{record['chunk']}.json"
        try:
            try:
                faults.hit("write-record")
                write_json(path, record)
            except OSError as exc:
                raise write_error(path, exc) from exc
        except WriteError:
            (self.output / record["file"]).unlink(missing_ok=True)
            raise
        faults.hit("after-record")

    def forget(self, key: str) -> None:
        """Un-commit a chunk: drop its record first, so a crash in between leaves only garbage."""
        (self.done_dir / f"{key}.json").unlink(missing_ok=True)
        fsync_dir(self.done_dir)
        (self.output / part_name(key)).unlink(missing_ok=True)
        (self.rejected_dir / part_name(key)).unlink(missing_ok=True)

    def sweep(self) -> list[Path]:
        """Delete data files no record vouches for, and stale temporary files; return them."""
        keep = {part_name(key) for key in self.committed()}
        garbage = [p for p in self.output.glob("part-*.parquet") if p.name not in keep]
        garbage += [p for p in self.rejected_dir.glob("part-*.parquet") if p.name not in keep]
        garbage += list(self.tmp_dir.glob("*"))
        for path in garbage:
            path.unlink(missing_ok=True)
        return garbage

    def clear(self) -> None:
        """Start over: remove every record first, then every data file."""
        shutil.rmtree(self.done_dir, ignore_errors=True)
        self.done_dir.mkdir(parents=True)
        (self.state / "settled.json").unlink(missing_ok=True)
        fsync_dir(self.state)
        self.sweep()
