"""Which commit of a Delta table's log took batchscore's files out of it, to say so by name.

A commit another writer makes (OPTIMIZE, Z-order, DELETE, an overwrite) removes the data
files it rewrites in a ``remove`` action, beside a ``commitInfo`` that names its operation.
The log's JSON commits (``_delta_log/<version>.json``, the Delta protocol's public format)
are read newest first, through the output's own store, until every file asked about is found
or `LOOKBACK` commits were read; a commit the log no longer has (cleaned up behind a
checkpoint) ends the search, and what was not found is said as "before" the oldest read.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import unquote

from batchscore.errors import BatchscoreError
from batchscore.storage.store import Store

log = logging.getLogger("batchscore")
LOG = "_delta_log"
LOOKBACK = 200  # commits read at most, newest first


def commit_name(version: int) -> str:
    """A commit's file in the table's log."""
    return f"{LOG}/{version:020d}.json"


def removals(store: Store, newest: int, names: set[str]) -> dict[str, tuple[int, str]]:
    """File name -> (version, operation) of the newest commit, at or below ``newest``, that
    removed it, for those of ``names`` found within `LOOKBACK` commits."""
    found: dict[str, tuple[int, str]] = {}
    for version in range(newest, max(newest - LOOKBACK, -1), -1):
        try:
            text = store.read_text(commit_name(version))
        except (OSError, BatchscoreError) as exc:  # never a reason to stop a run: a note
            log.debug("%s: not read (%s)", store.where(commit_name(version)), exc)
            break
        if text is None:
            break
        operation, removed = "a commit", []
        for line in text.splitlines():
            try:
                action = json.loads(line)
            except ValueError:
                continue
            if "commitInfo" in action:
                operation = str(action["commitInfo"].get("operation", operation))
            elif "remove" in action and unquote(action["remove"].get("path", "")) in names:
                removed.append(unquote(action["remove"]["path"]))
        for name in removed:
            found.setdefault(name, (version, operation))
        if len(found) == len(names):
            break
    return found


def by_whom(store: Store, newest: int, names: set[str]) -> str:
    """Which commits removed ``names``, in words: "OPTIMIZE at version 7, DELETE at version
    9", or "at a version up to N" for those the log no longer names."""
    found = removals(store, newest, names)
    commits = sorted(set(found.values()))
    said = [f"{operation} at version {version}" for version, operation in commits]
    if len(found) < len(names):
        said.append(f"{len(names) - len(found)} at a version up to {newest}")
    return ", ".join(said)
