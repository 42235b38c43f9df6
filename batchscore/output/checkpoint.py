"""Checkpoints: what is committed, as facts in the output folder under ``_batchscore/``.

- ``job.json``: the job's name and fingerprint. A run with another fingerprint refuses to mix
  its output with what is committed.
- ``done/<chunk>.json``: one record per committed chunk, written after its data file is in
  place. The record is the commit point: a data file without one is garbage from a crashed
  attempt and is deleted at the next start.

Every file operation goes through the output's `Store`, so the same protocol holds in a local
folder (rename) and in an object store (whole-object upload).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from batchscore import faults
from batchscore.errors import OutputConflictError, WriteError, write_error
from batchscore.output.layout import (
    DONE,
    JOB,
    REJECTED,
    RUNS,
    SETTLED,
    part_name,
    record_name,
    rejected_name,
)
from batchscore.storage import Store, open_store

READERS = 16


def fingerprint(parts: dict[str, Any]) -> str:
    """A short digest of everything that decides the output."""
    canonical = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


class Checkpoint:
    """The bookkeeping of one output folder (a local path, a URL, or an open `Store`)."""

    def __init__(self, output: str | Path | Store) -> None:
        self.store = open_store(output) if isinstance(output, str | Path) else output
        self.output = self.store.url
        self.tmp_dir = self.store.staging
        self.lock_path = self.store.lock_path

    def job(self) -> dict[str, Any] | None:
        """The recorded job identity, or None when nothing was ever started here."""
        text = self.store.read_text(JOB)
        return json.loads(text) if text is not None else None

    def claim(self, name: str, parts: dict[str, Any], restart: bool) -> None:
        """Make this folder the job's, refusing to mix outputs of different settings or jobs."""
        self.store.prepare(DONE, RUNS, REJECTED)
        parts = json.loads(json.dumps(parts, default=str))  # as recorded: tuples become lists
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
        self.write_json(JOB, {"name": name, "fingerprint": digest, "parts": parts})

    def settled(self) -> dict[str, Any] | None:
        """What an earlier run measured and chose (precision, budget, agreement), if any."""
        text = self.store.read_text(SETTLED)
        return json.loads(text) if text is not None else None

    def settle(self, record: dict[str, Any]) -> None:
        """Pin measured choices, so every run of this output uses the same precision."""
        self.write_json(SETTLED, record)

    def committed(self) -> dict[str, dict[str, Any]]:
        """Every commit record, by chunk key.

        Read by a few threads at once: in an object store each record is a request, and a
        large job has thousands.
        """
        rels = [f"{DONE}/{name}" for name in fnmatch.filter(self.store.names(DONE), "*.json")]
        records = {}
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            for text in pool.map(self.store.read_text, rels):
                if text is not None:  # deleted since it was listed
                    record = json.loads(text)
                    records[record["chunk"]] = record
        return records

    def commit(self, record: dict[str, Any]) -> None:
        """The commit point: record a chunk whose data file is already durably in place.

        If the record cannot be written, the data file is removed again, so a reader of the
        output never sees rows that are not committed.
        """
        faults.hit("before-record")
        rel = record_name(record["chunk"])
        try:
            try:
                faults.hit("write-record")
            except OSError as exc:
                raise write_error(self.store.where(rel), exc) from exc
            self.write_json(rel, record)
        except WriteError:
            self.store.delete(record["file"])
            raise
        faults.hit("after-record")

    def forget(self, key: str) -> None:
        """Un-commit a chunk: drop its record first, so a crash in between leaves only garbage."""
        self.store.delete(record_name(key))
        self.store.barrier(DONE)
        self.store.delete(part_name(key))
        self.store.delete(rejected_name(key))

    def sweep(self) -> list[str]:
        """Delete data files no record vouches for, and stale temporary files; return them."""
        keep = {part_name(key) for key in self.committed()}
        garbage = []
        for folder in ("", REJECTED):
            for name in fnmatch.filter(self.store.names(folder), "part-*.parquet"):
                if name not in keep:
                    self.store.delete(f"{folder}/{name}".lstrip("/"))
                    garbage.append(self.store.where(f"{folder}/{name}".lstrip("/")))
        if self.tmp_dir.is_dir():
            for path in self.tmp_dir.iterdir():
                path.unlink(missing_ok=True)
                garbage.append(str(path))
        return garbage

    def clear(self) -> None:
        """Start over: remove every record first, then every data file."""
        for name in self.store.names(DONE):
            self.store.delete(f"{DONE}/{name}")
        self.store.barrier(DONE)
        self.store.delete(SETTLED)
        self.sweep()

    def save_report(self, rel: str, report: dict[str, Any]) -> None:
        """Keep a run's report (``rel``: its `layout.report_name`)."""
        self.write_json(rel, report)

    def reports(self) -> Iterator[dict[str, Any]]:
        """Run reports, newest first (names start with the run's UTC start time)."""
        for name in sorted(fnmatch.filter(self.store.names(RUNS), "*.json"), reverse=True):
            text = self.store.read_text(f"{RUNS}/{name}")
            if text is not None:
                yield json.loads(text)

    def write_json(self, rel: str, data: Any) -> None:
        """Write bookkeeping atomically; a failure is a `WriteError` naming the file."""
        try:
            self.store.write_json(rel, data)
        except OSError as exc:
            raise write_error(self.store.where(rel), exc) from exc
