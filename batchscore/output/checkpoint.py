"""Checkpoints: what is committed, as facts in the output folder under ``_batchscore/``.

- ``done/<chunk>.json``: one record per committed chunk, written after its data file is in
  place; it names the file with its size and digests (see `batchscore.output.manifest`). The
  record is the commit point.
- ``writing/<chunk>.json``: the intent written just before a data file is published. A file
  published by a crashed attempt is known by it (and by its size and footer), so clean-up
  deletes that file and nothing else: a file batchscore did not write is never touched.
- ``job.json``: the job that claimed the folder with its first commit (see `claim`).

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
from batchscore.errors import WriteError, write_error
from batchscore.output.layout import (
    DONE,
    JOB,
    MAX_REPORTS,
    REJECTED,
    RUNS,
    SETTLED,
    SUCCESS,
    WRITING,
    intent_name,
    record_name,
    rejected_name,
)
from batchscore.output.manifest import is_ours, problem
from batchscore.storage import Store, open_store

READERS = 16  # in an object store each record is a request, and a large job has thousands


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

    def prepare(self) -> None:
        """Create the bookkeeping folders a run writes into."""
        self.store.prepare(DONE, WRITING, RUNS, REJECTED)

    def job(self) -> dict[str, Any] | None:
        """The job record of the last claim, or None when there is none."""
        return self.read_json(JOB)

    def claim(self, record: dict[str, Any]) -> None:
        """Record the job that owns the folder (written just before its first commit)."""
        self.write_json(JOB, record)

    def claimed(self) -> bool:
        """Whether anything was ever committed here (or was being published)."""
        return bool(self.store.names(DONE) or self.store.names(WRITING))

    def settled(self) -> dict[str, Any] | None:
        """What an earlier run measured and chose (precision, budget, agreement), if any."""
        return self.read_json(SETTLED)

    def settle(self, record: dict[str, Any]) -> None:
        """Pin measured choices, so every run of this output uses the same precision."""
        self.write_json(SETTLED, record)

    def committed(self) -> dict[str, dict[str, Any]]:
        """Every commit record, by chunk key."""
        return {r["chunk"]: r for r in self.read_all(DONE)}

    def intents(self) -> dict[str, dict[str, Any]]:
        """Every intent whose publish may not have finished, by chunk key."""
        return {r["chunk"]: r for r in self.read_all(WRITING)}

    def intend(self, record: dict[str, Any]) -> None:
        """Say which file is about to be published, and what it holds, before publishing it."""
        self.write_json(intent_name(record["chunk"]), record)

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
        self.store.delete(intent_name(record["chunk"]))

    def forget(self, key: str, record: dict[str, Any]) -> None:
        """Un-commit a chunk: drop its record first, so a crash in between leaves only an
        unrecorded file, then the files the record names (batchscore's by the record)."""
        self.store.delete(record_name(key))
        self.store.barrier(DONE)
        self.store.delete(record["file"])
        self.store.delete(rejected_name(key))

    def sweep(self) -> list[str]:
        """Clean up after an interrupted run; return what was removed.

        A data file an intent names is the crashed attempt's only while it is what the intent
        says (same size and footer); anything else at that name is left alone.
        """
        garbage = []
        committed = set(self.store.names(DONE))
        for key, intent in self.intents().items():
            if f"{key}.json" not in committed and problem(self.store, intent) is None:
                self.store.delete(intent["file"])
                garbage.append(self.store.where(intent["file"]))
            self.store.delete(intent_name(key))
        if self.tmp_dir.is_dir():
            for path in self.tmp_dir.iterdir():
                path.unlink(missing_ok=True)
                garbage.append(str(path))
        return garbage

    def clear(self) -> None:
        """Start over: remove what batchscore wrote (records first, then their files)."""
        self.sweep()
        records = self.committed()
        for key in records:
            self.store.delete(record_name(key))
        self.store.barrier(DONE)
        for key, record in records.items():
            self.store.delete(record["file"])
            self.store.delete(rejected_name(key))
        self.store.delete(SETTLED)
        self.store.delete(JOB)
        self.drop_success()

    def success(self) -> str | None:
        """The text of the folder's `_SUCCESS`, or None when there is none."""
        return self.store.read_text(SUCCESS)

    def drop_success(self) -> None:
        """Remove `_SUCCESS` if batchscore wrote it (another writer's is left alone)."""
        if is_ours(self.success()):
            self.store.delete(SUCCESS)

    def save_report(self, rel: str, report: dict[str, Any]) -> None:
        """Keep a run's report (``rel``: its `layout.report_name`); prune the oldest beyond
        `MAX_REPORTS`, so a job re-run from cron for years keeps a bounded folder."""
        self.write_json(rel, report)
        names = sorted(fnmatch.filter(self.store.names(RUNS), "*.json"))
        for name in names[: max(len(names) - MAX_REPORTS, 0)]:
            self.store.delete(f"{RUNS}/{name}")

    def reports(self) -> Iterator[dict[str, Any]]:
        """Run reports, newest first (names start with the run's UTC start time)."""
        for name in sorted(fnmatch.filter(self.store.names(RUNS), "*.json"), reverse=True):
            report = self.read_json(f"{RUNS}/{name}")
            if report is not None:
                yield report

    def read_json(self, rel: str) -> dict[str, Any] | None:
        """A bookkeeping file's JSON, or None when it does not exist."""
        text = self.store.read_text(rel)
        return json.loads(text) if text is not None else None

    def read_all(self, folder: str) -> list[dict[str, Any]]:
        """Every JSON record in ``folder``, read by a few threads at once."""
        rels = [f"{folder}/{name}" for name in fnmatch.filter(self.store.names(folder), "*.json")]
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            texts = pool.map(self.store.read_text, rels)
            return [json.loads(text) for text in texts if text is not None]  # None: just deleted

    def write_json(self, rel: str, data: Any) -> None:
        """Write bookkeeping atomically; a failure is a `WriteError` naming the file."""
        try:
            self.store.write_json(rel, data)
        except OSError as exc:
            raise write_error(self.store.where(rel), exc) from exc
