"""A local output folder: files published by temp file, fsync and rename (see `batchscore.fsio`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchscore.fsio import fsync_dir, fsync_file, publish, write_json
from batchscore.storage import STATE


class LocalStore:
    """An output folder on this machine; its staging folder is inside it, so renames are atomic."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        self.staging = root / STATE / "tmp"
        self.lock_path = root / STATE / "lock"

    def where(self, rel: str) -> str:
        return str(self.root / rel)

    def prepare(self, *rel_dirs: str) -> None:
        for rel in rel_dirs:
            (self.root / rel).mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)

    def read_text(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def write_json(self, rel: str, data: Any) -> None:
        write_json(self.root / rel, data)

    def names(self, rel_dir: str) -> list[str]:
        folder = self.root / rel_dir
        if not folder.is_dir():
            return []
        # a JSON file being replaced has a ".name.pid.tmp" sibling for a moment: not a file yet
        return [p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]

    def delete(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    def barrier(self, rel_dir: str) -> None:
        fsync_dir(self.root / rel_dir)

    def sync(self, local: Path) -> None:
        fsync_file(local)

    def publish(self, local: Path, rel: str) -> None:
        publish(local, self.root / rel)
