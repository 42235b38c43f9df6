"""Checkpoints: what is committed, as facts in the output folder under ``_batchscore/``.

- ``done/<chunk>.json``: one record per committed chunk, written after its data file is in
  place; it names the file with its size and digests (see `batchscore.output.manifest`). The
  record is the commit point.
- ``writing/<chunk>.json``: the intent written just before data files are published, one
  entry per chunk of a group committed together (named by the group's first chunk). A file
  published by a crashed attempt is known by it (and by its size and footer), so clean-up
  deletes that file and nothing else: a file batchscore did not write is never touched.

Chunks finished at the same moment (a window's many small shards) commit as a group: their
files are fsynced together, one intent names them all, one folder fsync publishes them, and
their records (still one file per chunk) are made durable together.
- ``job.json``: the job that claimed the folder with its first commit (see `claim`).

Every step that deletes or moves a file here (`remove`, `move`: un-committing a chunk, the
clean-up after a crash, a shard's retirement to ``gone/``, a ``--restart``) first removes
the folder's `_SUCCESS` (`drop_success`), durably: a folder changed halfway (then killed,
or stopped by an error) never says it is complete. Only names batchscore gives its files are
ever deleted (`batchscore.storage.layout.own_names`); anything else in its folders is kept.

Every file operation goes through the output's `Store`, so the same protocol holds in a local
folder (rename) and in an object store (whole-object upload).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from batchscore import faults
from batchscore.errors import BookkeepingError, WriteError, write_error
from batchscore.job.ranges import unusable
from batchscore.output.format import OutputFormat, ParquetFolder
from batchscore.output.manifest import is_ours, problem
from batchscore.output.settled import Decision
from batchscore.storage import Store, open_store
from batchscore.storage.disk import empty_folder
from batchscore.storage.layout import (
    DONE,
    GONE,
    JOB,
    MAX_REPORTS,
    REJECTED,
    RESTART,
    RUNS,
    SETTLED,
    SUCCESS,
    WRITING,
    intent_name,
    is_own_name,
    own_names,
    part_name,
    record_name,
    rejected_name,
)
from batchscore.storage.retry import Retry

log = logging.getLogger("batchscore")
READERS = 16  # in an object store each record is a request, and a large job has thousands
# what an intent and a commit record must hold to be used; anything less is damaged
INTENT_KEYS = ("chunk", "file", "size", "rows", "footer")
RECORD_KEYS = (*INTENT_KEYS, "shard", "chunks", "start", "stop", "bad_rows")


class Damaged(ValueError):
    """A bookkeeping file that is truncated, not JSON, or lacks what it must hold."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: damaged ({why})")
        self.where = where


def fingerprint(parts: dict[str, Any]) -> str:
    """A short digest of everything that decides the output."""
    canonical = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


class Checkpoint:
    """The bookkeeping of one output folder (a local path, a URL, or an open `Store`)."""

    def __init__(self, output: str | Path | Store, retry: Retry | None = None) -> None:
        self.store = open_store(output, retry) if isinstance(output, str | Path) else output
        self.output = self.store.url
        self.tmp_dir = self.store.staging
        self.lock_path = self.store.lock_path
        self.damaged: dict[str, str] = {}  # bookkeeping file -> why, found by the last reads
        self.unmarked = False  # `_SUCCESS` is removed (see `drop_success`) and not written since
        # what readers see of the data files (`batchscore.output.format_table`, set by the
        # recipe from the job): a file leaves a table's log before it is deleted or moved
        self.format: OutputFormat = ParquetFolder(self.store)

    def prepare(self) -> None:
        """Create the bookkeeping folders a run writes into."""
        self.store.prepare(DONE, WRITING, RUNS, REJECTED, GONE)

    def job(self) -> dict[str, Any] | None:
        """The job record of the last claim, or None when there is none; `Damaged` when it
        cannot be read."""
        return self.read_json(JOB, ("name", "inputs", "fingerprint", "parts"))

    def claim(self, record: dict[str, Any]) -> None:
        """Record the job that owns the folder (written just before its first commit)."""
        self.write_json(JOB, record)

    def restarting(self) -> bool:
        """Whether a --restart was cut off and not yet finished (see `batchscore.output.restart`):
        nothing here counts as committed until the next start finishes it."""
        return self.store.size(RESTART) is not None

    def claimed(self) -> bool:
        """Whether anything was ever committed here (or was being published)."""
        return bool(
            own_names(DONE, self.store.names(DONE)) or own_names(WRITING, self.store.names(WRITING))
        )

    def settled(self) -> Decision | None:
        """What an earlier run measured and chose (precision, budget, agreement), if any;
        `Damaged` when it cannot be read, is not the shape a run writes, or holds ranges no run
        could have measured (`batchscore.job.ranges`): such a record is rebuilt from the data
        files (`batchscore.measure.decide.recorded_decision`), never followed."""
        record = self.read_json(SETTLED, ("precision",))
        if record is None:
            return None
        try:
            decision = Decision.from_json(record)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            why = f"not the shape a run writes: {type(exc).__name__}: {exc}"
            raise Damaged(self.store.where(SETTLED), why) from None
        ranges = decision.ranges
        if ranges is not None:
            shaped = len(ranges) == 2 and len(ranges[0]) == len(ranges[1]) and ranges[0]
            flat = unusable(ranges) if shaped else "not two lists of one number per dimension"
            if flat:
                raise Damaged(self.store.where(SETTLED), f"its ranges: {flat}")
        return decision

    def settle(self, decision: Decision) -> None:
        """Pin measured choices, so every run of this output uses the same precision."""
        self.write_json(SETTLED, decision.to_json())

    def committed(self) -> dict[str, dict[str, Any]]:
        """Every readable commit record, by chunk key (a damaged one is left out and named in
        `damaged`: its chunk is not committed as far as anyone can prove)."""
        return {r["chunk"]: r for r in self.read_all(DONE, RECORD_KEYS)}

    def intents(self) -> dict[str, dict[str, Any]]:
        """Every readable intent whose publish may not have finished, by chunk key."""
        return {r["chunk"]: r for _, entries in self.intent_files() for r in entries}

    def intent_files(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Each readable intent file with its entries (one file of an earlier version holds
        a single intent, not a list); a file with a damaged entry is damaged as a whole."""
        found = []
        for rel, data in self.read_all(WRITING, (), with_names=True):
            entries = data["chunks"] if isinstance(data.get("chunks"), list) else [data]
            bad = next((e for e in entries if not all(k in e for k in INTENT_KEYS)), None)
            if bad is None:
                found.append((rel, entries))
            else:
                why = f"an entry lacks {', '.join(k for k in INTENT_KEYS if k not in bad)}"
                self.damaged[rel] = str(Damaged(self.store.where(rel), why))
        return found

    def drop_damaged(self) -> list[str]:
        """Remove the damaged records and intents the last reads found (batchscore's own files,
        which prove nothing); their chunks are scored again. Returns what was removed."""
        dropped = [rel for rel in self.damaged if rel.startswith((DONE, WRITING))]
        for rel in dropped:
            self.remove(rel)
            self.damaged.pop(rel)
        return [self.store.where(rel) for rel in dropped]

    def intend(self, records: list[dict[str, Any]]) -> None:
        """Say which files are about to be published, and what each holds, before publishing
        them: one durable intent for the group, named by its first chunk."""
        self.write_json(intent_name(records[0]["chunk"]), {"chunks": records})

    def commit(self, records: list[dict[str, Any]]) -> None:
        """The commit point: record chunks whose data files are already durably in place, one
        record file per chunk, made durable together; then drop the group's intent.

        If the records cannot be written, those written and the data files are removed again,
        so a reader of the output never sees rows that are not committed.
        """
        for _ in records:
            faults.hit("before-record")
        files = {record_name(r["chunk"]): r for r in records}
        try:
            try:
                faults.hit("write-record")
            except OSError as exc:
                raise write_error(self.store.where(next(iter(files))), exc) from exc
            self.write_many(files)
        except WriteError:
            for rel, record in files.items():  # as far as it can: the first error is the one
                for each in (rel, record["file"]):
                    with contextlib.suppress(OSError, WriteError):
                        self.remove(each)
            raise
        for _ in records:
            faults.hit("after-record")
        self.remove(intent_name(records[0]["chunk"]))

    def forget(self, key: str, record: dict[str, Any]) -> None:
        """Un-commit a chunk: drop its record first, so a crash in between leaves only an
        unrecorded file, then the files the record names (batchscore's by the record, and
        only at the chunk's own name: a record edited to name another file removes nothing).
        One that cannot be removed (a folder now stands at its name) stops the run naming it."""
        self.remove(record_name(key))
        self.barrier(DONE)
        if record["file"] == part_name(key):
            self.remove(record["file"])
        self.remove(rejected_name(key))

    def sweep(self) -> list[str]:
        """Clean up after an interrupted run; return what was removed.

        A data file an intent names is the crashed attempt's only while it is the chunk's own
        name and what the intent says (same size and footer); anything else is left alone.
        Staged files (under ``tmp/``) are no reader's: removing them leaves `_SUCCESS`. A
        rewrite under a new chunk key (in a table) is `output.rewrite`'s to finish.
        """
        garbage = []
        committed = set(self.store.names(DONE))
        for rel, intents in self.intent_files():
            if any("replaces" in intent for intent in intents):
                continue  # `batchscore.output.rewrite.finish_rewrites` ends it
            for intent in intents:
                key, file = intent["chunk"], intent["file"]
                if "record" in intent:  # a rewrite in place (`output.rewrite`): roll it forward
                    self.roll_forward(intent)
                elif (
                    f"{key}.json" not in committed
                    and is_own_name(DONE, f"{key}.json")
                    and file == part_name(key)
                    and problem(self.store, intent) is None
                ):
                    self.remove(file)
                    garbage.append(self.store.where(file))
            self.remove(rel)
        return garbage + empty_folder(self.tmp_dir)  # never through a link: see `empty_folder`

    def roll_forward(self, intent: dict[str, Any]) -> None:
        """Commit a rewritten file whose record a killed run did not write: when the file at
        the chunk's name is the one the intent describes, its record is the intent's. Else the
        file is as its old record says (the rewrite never happened), or neither (its chunk is
        then found damaged and un-committed, as any other)."""
        key, record = intent["chunk"], intent["record"]
        if (
            isinstance(record, dict)
            and all(k in record for k in RECORD_KEYS)
            and record["chunk"] == key
            and intent["file"] == record["file"] == part_name(key)
            and is_own_name(DONE, f"{key}.json")
            and problem(self.store, intent) is None
        ):
            self.write_json(record_name(key), record)

    def success(self) -> str | None:
        """The text of the folder's `_SUCCESS`, or None when there is none."""
        return self.store.read_text(SUCCESS)

    def drop_success(self) -> None:
        """Remove `_SUCCESS` if batchscore wrote it (another writer's is left alone), durably,
        before anything of the folder is deleted or moved; once, until `mark_success`. A
        failure is a `WriteError` naming it (and nothing after it is removed)."""
        if self.unmarked:
            return
        if is_ours(self.success()):
            try:
                self.store.delete(SUCCESS)
                self.store.barrier("")
            except OSError as exc:
                raise write_error(self.store.where(SUCCESS), exc, doing="remove") from exc
        self.unmarked = True

    def mark_success(self, text: str) -> None:
        """Write `_SUCCESS` (every input row is committed; see `batchscore.output.verdict`)."""
        self.store.write_text(SUCCESS, text)
        self.unmarked = False

    def remove(self, rel: str, *, fault: str = "remove") -> None:
        """Delete a file batchscore wrote, `_SUCCESS` first (`drop_success`); a missing one is
        fine, a failure a `WriteError` naming the file. ``fault``: the tests' fault point."""
        self.drop_success()
        self.format.retire_files([rel])
        try:
            faults.hit(fault)
            self.store.delete(rel)
        except OSError as exc:
            raise write_error(self.store.where(rel), exc, doing="remove") from exc

    def move(self, rel: str, to: str) -> None:
        """Move a file batchscore wrote to ``to`` (`Store.move`), `_SUCCESS` first; a failure
        is a `WriteError` naming the file."""
        self.drop_success()
        self.format.retire_files([rel])
        try:
            self.store.move(rel, to)
        except OSError as exc:
            raise write_error(self.store.where(rel), exc, doing="move") from exc

    def barrier(self, folder: str) -> None:
        """Make the deletions and moves in ``folder`` durable (`Store.barrier`); a failure is
        a `WriteError` naming the folder."""
        try:
            self.store.barrier(folder)
        except OSError as exc:
            raise write_error(self.store.where(folder), exc, doing="sync") from exc

    def save_report(self, rel: str, report: dict[str, Any]) -> None:
        """Keep a run's report (``rel``: its `storage.layout.report_name`); prune the oldest beyond
        `MAX_REPORTS`, so a job re-run from cron for years keeps a bounded folder. Reports are
        the folder's history, not its output: pruning them leaves `_SUCCESS` (a run that just
        completed writes its report after it), and only reports named as batchscore names
        them are pruned."""
        self.write_json(rel, report)
        names = sorted(own_names(RUNS, self.store.names(RUNS)))
        for name in names[: max(len(names) - MAX_REPORTS, 0)]:
            self.store.delete(f"{RUNS}/{name}")

    def reports(self) -> Iterator[dict[str, Any]]:
        """Run reports, newest first (names start with the run's UTC start time); a damaged
        one, or one that is not read (a link, not a regular file, past the cap), is skipped
        with a warning: it only ever described a run."""
        for name in sorted(fnmatch.filter(self.store.names(RUNS), "*.json"), reverse=True):
            try:
                report = self.read_json(f"{RUNS}/{name}", ("outcome",))
            except (Damaged, WriteError, BookkeepingError) as exc:
                log.warning("%s; skipped", exc)
                continue
            if report is not None:
                yield report

    def read_json(self, rel: str, keys: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """A bookkeeping file's JSON object, or None when it does not exist; `Damaged` when it
        is not JSON or lacks one of ``keys``."""
        return self.parse(rel, self.store.read_text(rel), keys)

    def parse(self, rel: str, text: str | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
        if text is None:
            return None
        try:
            text.encode("utf-8")  # a store keeps bytes that are not UTF-8 as lone surrogates
            data = json.loads(text)
        except UnicodeEncodeError:
            raise Damaged(self.store.where(rel), "not UTF-8 text") from None
        except ValueError as exc:
            raise Damaged(self.store.where(rel), f"not JSON: {exc}") from None
        missing = [k for k in keys if not isinstance(data, dict) or k not in data]
        if missing:
            raise Damaged(self.store.where(rel), f"it lacks {', '.join(missing)}")
        return data

    def read_all(
        self, folder: str, keys: tuple[str, ...], *, with_names: bool = False
    ) -> list[Any]:
        """Every readable record in ``folder`` (`DONE`, `WRITING`; with its name: ``(rel,
        record)``), read by a few threads at once; damaged ones are noted in `damaged` and
        left out. A file not named as batchscore names its records there is not read."""
        rels = [f"{folder}/{name}" for name in own_names(folder, self.store.names(folder))]
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            texts = list(pool.map(self.store.read_text, rels))
        records = []
        for rel, text in zip(rels, texts, strict=True):
            try:
                record = self.parse(rel, text, keys)
            except Damaged as exc:
                self.damaged[rel] = str(exc)
                continue
            if record is not None:  # None: deleted since it was listed
                records.append((rel, record) if with_names else record)
        return records

    def write_json(self, rel: str, data: Any) -> None:
        """Write bookkeeping atomically; a failure is a `WriteError` naming the file."""
        try:
            self.store.write_json(rel, data)
        except OSError as exc:
            raise write_error(self.store.where(rel), exc) from exc

    def write_many(self, files: dict[str, Any]) -> None:
        """Write several bookkeeping files, durable together (see `Store.write_many`)."""
        try:
            self.store.write_many(files)
        except OSError as exc:
            raise write_error(self.store.where(next(iter(files))), exc) from exc
