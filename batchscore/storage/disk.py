"""A local output folder: files published by temporary file, fsync and rename.

A rename within one folder is atomic on POSIX, so a reader sees the old file or the new one,
never half of either; fsyncing the folder afterwards makes the rename itself survive a power cut.
Files written as a group are fsynced by a few threads at once: the file system's journal then
commits them together, so a group waits for the disk about once, not once per file.

Nothing is written, renamed or deleted through a symbolic link inside the folder: a link where
``_batchscore``, one of its folders, a temporary file, a data file or ``_SUCCESS`` goes would
send the write (or the start-up clean-up of ``_batchscore/tmp``) to wherever it points. Every
such operation checks its path first (an ``lstat`` per step below the folder), files are
opened with ``O_NOFOLLOW``, and a link stops the run with a `WriteError` naming it, the link
and its target left as they are. The folder itself may be a link: it is the job's choice.
Bookkeeping is read the same way (`batchscore.files.read_shared`): never through a link, only
a regular file (a FIFO would make the run wait forever holding its lock), never past
`READ_LIMIT`; and every temporary file is made new (``O_EXCL``), never through anything planted
at its name.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from batchscore.errors import BookkeepingError, JobError, WriteError, write_error
from batchscore.files import (
    Refused,
    fsync_dir,
    read_shared,
    replace_durably,
    stage_temp,
    write_new,
)
from batchscore.storage.layout import FIXED, LOCK, STAGING, is_chunk_name
from batchscore.storage.store import READ_LIMIT
from batchscore.threads import available_cores, in_shares

if TYPE_CHECKING:
    import pyarrow as pa

# Files written and fsynced at once, two per core, each thread working through its share: the
# fsyncs overlap, and a journal commits concurrent ones together. More threads only contend for
# the GIL (2,000 one-row chunks on 2 cores: 16 used 0.2 s more CPU than 4, and no less time).
SYNCERS = min(16, 2 * available_cores())


def linked(path: Path) -> WriteError:
    """The error for a symbolic link where batchscore would write, rename or delete."""
    return WriteError(
        f"{path}: is a symbolic link; batchscore never writes, renames or deletes through a "
        "link in its output folder, so it stopped and left the link and what it points to as "
        "they are: replace the link with a real folder or file, or point [output].path at "
        "another folder"
    )


def unlinked(root: Path, rel: str) -> Path:
    """``root / rel``, once no step of it below ``root`` is a symbolic link (`linked` if one
    is); a step that does not exist ends the check, as nothing below it exists either."""
    path = root
    for part in filter(None, rel.split("/")):
        path = path / part
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise linked(path)
        except (FileNotFoundError, NotADirectoryError):
            break
    return root / rel


def empty_folder(folder: Path) -> list[str]:
    """Delete the files in ``folder`` (a staging folder), never following a link: a link as
    the folder or in it stops the clean-up (`linked`) before anything is deleted."""
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            raise linked(folder)
        with os.scandir(folder) as found:
            entries = list(found)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        if entry.is_symlink():
            raise linked(Path(entry.path))
    removed = [entry.path for entry in entries if entry.is_file(follow_symlinks=False)]
    for path in removed:
        Path(path).unlink(missing_ok=True)
    return removed


def fsync_file(path: Path) -> None:
    """Force a file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Atomically move a finished, fsynced temporary file into place and persist the rename."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_text(path: Path, text: str) -> None:
    """Atomically and durably replace ``path`` with ``text`` (a new temp file, fsync, rename,
    the folder fsynced)."""
    try:
        replace_durably(path, text.encode())
    except OSError as exc:
        raise write_error(path, exc) from exc


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Atomically replace ``path`` with ``data`` as JSON."""
    write_text(path, as_json(data))


def write_many(files: dict[Path, Any]) -> None:
    """Replace each file with its data as JSON: all written to new temporary files and fsynced
    a few at once (creating a file waits on the journal too), renamed, then each folder
    fsynced once. A crash leaves each file old or new."""
    temps: dict[Path, Path] = {}
    failed = next(iter(files))  # the file named when something fails

    def stage(path: Path) -> None:
        try:
            temps[path] = stage_temp(path, as_json(files[path]).encode())
        except OSError as exc:
            raise write_error(path, exc) from exc

    try:
        in_shares(stage, list(files), SYNCERS)
        for failed in files:
            os.replace(temps[failed], failed)
            del temps[failed]
        for failed in {path.parent for path in files}:
            fsync_dir(failed)
    except (OSError, WriteError) as exc:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        if isinstance(exc, WriteError):
            raise
        raise write_error(failed, exc) from exc


class LocalStore:
    """An output folder on this machine; its staging folder is inside it, so renames are atomic."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        self.staging = root / STAGING
        self.lock_path = root / LOCK

    def check(self) -> None:
        """A file where the folder goes is the job's mistake (exit 2); a read-only or
        unwritable place, or a symbolic link where batchscore's own files go, the machine's
        (exit 6): checked before the lock file is opened or anything is written."""
        where = f"[output].path: {self.root}"
        if self.root.exists() and not self.root.is_dir():
            raise JobError(f"{where} is a file, not a folder; point it at a folder")
        existing = self.root
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise JobError(f"{where}: {existing} is a file, so the folder cannot be made there")
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            raise WriteError(f"{where}: {existing} is on a read-only file system")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise WriteError(f"{where}: cannot write in {existing}: permission denied")
        for rel in FIXED:
            self.path(rel)
        if self.root.is_dir():  # a link where a chunk's data file goes, too
            with os.scandir(self.root) as entries:
                for entry in entries:
                    if entry.is_symlink() and is_chunk_name(entry.name):
                        raise linked(Path(entry.path))

    def path(self, rel: str) -> Path:
        """Where ``rel`` is, to write, rename or delete it: never through a link (`linked`)."""
        return unlinked(self.root, rel)

    def staged(self, local: Path) -> Path:
        """A staging file's path, checked like `path`."""
        return self.path(local.relative_to(self.root).as_posix())

    def where(self, rel: str) -> str:
        return str(self.root / rel)

    def prepare(self, *rel_dirs: str) -> None:
        for rel in (*rel_dirs, STAGING):
            self.path(rel).mkdir(parents=True, exist_ok=True)

    def read_text(self, rel: str) -> str | None:
        path = self.path(rel)
        try:
            data = read_shared(path, READ_LIMIT)
        except Refused as exc:
            if exc.link:
                raise linked(path) from None
            raise BookkeepingError(
                f"{exc}; it is where batchscore keeps its own record, and it did not write "
                "this, so it stopped without reading it: remove it (a --restart cannot, as "
                "batchscore removes only what it wrote) and run again"
            ) from None
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def write_json(self, rel: str, data: Any) -> None:
        write_json(self.path(rel), data)

    def write_text(self, rel: str, text: str) -> None:
        write_text(self.path(rel), text)

    def write_many(self, files: dict[str, Any]) -> None:
        write_many({self.path(rel): data for rel, data in files.items()})

    def size(self, rel: str) -> int | None:
        try:
            return self.path(rel).stat().st_size  # a link there is refused, not followed
        except FileNotFoundError:
            return None

    def open_input(self, rel: str) -> BinaryIO:
        return self.path(rel).open("rb")

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.parquet as pq

        with self.path(rel).open("rb") as fh:  # a link there is refused, not followed
            return pq.ParquetFile(fh).read(
                columns=columns, use_threads=False
            )  # no dataset, no pandas

    def tail(self, rel: str, count: int) -> bytes:
        with self.path(rel).open("rb") as fh:
            fh.seek(max(fh.seek(0, os.SEEK_END) - count, 0))
            return fh.read(count)

    def names(self, rel_dir: str) -> list[str]:
        folder = self.root / rel_dir
        if not folder.is_dir():
            return []
        # a JSON file being replaced has a ".name.pid.tmp" sibling for a moment: not a file yet
        return [p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]

    def delete(self, rel: str) -> None:
        self.path(rel).unlink(missing_ok=True)

    def move(self, rel: str, to: str) -> None:
        target = self.path(to)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path(rel), target)

    def barrier(self, rel_dir: str) -> None:
        if (self.root / rel_dir).is_dir():  # no folder: nothing was deleted from it
            fsync_dir(self.path(rel_dir))

    def sync(self, local: Path) -> None:
        fsync_file(self.staged(local))

    def stage(self, local: Path, data: pa.Buffer) -> None:
        write_new(self.staged(local), data)

    def publish(self, local: Path, rel: str, *, durable: bool = True) -> None:
        if durable:
            publish(self.staged(local), self.path(rel))
        else:
            os.replace(self.staged(local), self.path(rel))
