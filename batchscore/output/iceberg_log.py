"""Which snapshot of an Iceberg table took batchscore's files out of it, to say so by name.

A snapshot that removes data files (another writer's compaction, overwrite or delete) writes
them into a manifest of its own as DELETED entries, beside a summary that names its operation.
The table's snapshots are walked from the current one back through their parents, until every
file asked about is found or `LOOKBACK` snapshots were read; a snapshot expired since (another
tool's ``expire_snapshots``) ends the walk, and what was not found is said as "before" the
oldest snapshot kept. (Iceberg's Delta counterpart is `batchscore.output.delta_log`.)
"""

from __future__ import annotations

from typing import Any

LOOKBACK = 200  # snapshots read at most, newest first


def removals(table: Any, paths: set[str]) -> dict[str, tuple[int, str]]:
    """File path -> (snapshot id, operation) of the newest snapshot that removed it, for those
    of ``paths`` found within `LOOKBACK` snapshots (``table``: a `pyiceberg.table.Table`)."""
    from pyiceberg.manifest import ManifestEntryStatus

    found: dict[str, tuple[int, str]] = {}
    snapshot, read = table.current_snapshot(), 0
    while snapshot is not None and read < LOOKBACK and len(found) < len(paths):
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue  # carried over from an older snapshot: none of this one's removals
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                path = entry.data_file.file_path
                if entry.status == ManifestEntryStatus.DELETED and path in paths:
                    found.setdefault(path, (snapshot.snapshot_id, snapshot.summary.operation.value))
        parent = snapshot.parent_snapshot_id
        snapshot, read = (table.snapshot_by_id(parent) if parent is not None else None), read + 1
    return found


def by_whom(table: Any, paths: set[str]) -> str:
    """Which snapshots removed ``paths``, in words: "overwrite at snapshot 123", or "in a
    snapshot expired since" for those the table no longer names."""
    found = removals(table, paths)
    said = [f"{op} at snapshot {sid}" for sid, op in sorted(set(found.values()))]
    if len(found) < len(paths):
        said.append(f"{len(paths) - len(found)} in a snapshot no longer kept")
    return ", ".join(said)
