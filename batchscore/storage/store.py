"""The `Store` protocol: every operation the commit protocol needs from an output folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

# The most of a bookkeeping file `Store.read_text` reads. The largest batchscore writes is a
# --restart's list, about 100 bytes a chunk: this is millions of chunks, and a file past it was
# not written by batchscore (nor is it read into memory, a few threads at once).
READ_LIMIT = 256 << 20


class Store(Protocol):
    """An output folder. ``rel`` paths are relative to it, with ``/`` separators."""

    url: str  # the folder as the job names it
    staging: Path  # a local folder for temporary files
    lock_path: Path  # the local file whose flock guards the job

    def check(self) -> None:
        """Refuse, before anything is written, a place the output cannot be written to."""
        ...

    def where(self, rel: str) -> str:
        """The full path or URL of ``rel``, for messages."""
        ...

    def prepare(self, *rel_dirs: str) -> None:
        """Create the folders the run will write into (and the local staging folder)."""
        ...

    def read_text(self, rel: str) -> str | None:
        """A bookkeeping file's text, or None when it does not exist (bytes that are not
        UTF-8 come back as lone surrogates, for the reader to call the file damaged).

        Raises:
            WriteError: it is a symbolic link (never followed, as in every operation).
            BookkeepingError: it is not a regular file (a FIFO, a device, a folder), or it
                holds more than `READ_LIMIT` bytes: batchscore did not write it, and reads
                nothing of it.
        """
        ...

    def write_json(self, rel: str, data: Any) -> None:
        """Replace ``rel`` with ``data`` as JSON, atomically."""
        ...

    def write_text(self, rel: str, text: str) -> None:
        """Replace ``rel`` with ``text``, atomically."""
        ...

    def write_many(self, files: dict[str, Any]) -> None:
        """Replace each ``rel`` with its data as JSON, each atomically, all durable on return
        (a group commit's records: one wait for the disk, not one per file)."""
        ...

    def size(self, rel: str) -> int | None:
        """A file's size in bytes, or None when it does not exist."""
        ...

    def open_input(self, rel: str) -> BinaryIO:
        """A file open for random-access reading (a Parquet footer is read through it)."""
        ...

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """A data file's rows (only ``columns``, when given: a Parquet projection)."""
        ...

    def tail(self, rel: str, count: int) -> bytes:
        """A file's last ``count`` bytes (a Parquet footer is read this way, not the data)."""
        ...

    def names(self, rel_dir: str) -> list[str]:
        """Names of the files directly in ``rel_dir`` (none when it does not exist)."""
        ...

    def delete(self, rel: str) -> None:
        """Remove a file; a missing one is fine."""
        ...

    def move(self, rel: str, to: str) -> None:
        """Move the file ``rel`` (which exists) to ``to``, replacing it: a rename in a folder
        (made durable by a `barrier` of both folders), a copy then a delete in an object store
        (a crash in between leaves both, and the caller's plan finishes the move)."""
        ...

    def barrier(self, rel_dir: str) -> None:
        """Make earlier deletions and renames in ``rel_dir`` durable before what follows."""
        ...

    def sync(self, local: Path) -> None:
        """Make a finished staging file durable, ready to publish."""
        ...

    def stage(self, local: Path, data: pa.Buffer) -> None:
        """Write a staging file whole from ``data``, as durable as `sync` makes one."""
        ...

    def publish(self, local: Path, rel: str, *, durable: bool = True) -> None:
        """Move a finished staging file to ``rel``: visible whole, or not at all.

        ``durable=False`` leaves making the move durable to a later `barrier` of its folder,
        so a group of files published together waits for the disk once.
        """
        ...
