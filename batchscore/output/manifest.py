"""The manifest: what batchscore knows of each data file it wrote, enough to recognise it again.

Each commit record names its data file with the file's size, row count, a digest of its Parquet
footer and a digest of the whole file as written. Checking a committed file reads its size and
its footer, never its data: a missing file, or one whose size or footer changed, no longer
holds the chunk's rows, and the chunk goes back to pending. batchscore only ever deletes or
replaces files named in its records (and a `_SUCCESS` it wrote); every other file in the output
folder is left as it is.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchscore.storage.store import Store

MAGIC = b"PAR1"
SUCCESS_MARK = "written by batchscore"
CHECKERS = 16  # in an object store each check is a request or two


@dataclass(frozen=True)
class FileFacts:
    """A data file as written: what a later run compares it with."""

    size: int
    rows: int
    footer: str  # sha256 of the Parquet footer (schema, row groups, key-value metadata)
    sha256: str  # of the whole file

    def as_record(self) -> dict[str, Any]:
        return dict(vars(self))  # `asdict` deep-copies, field by field: slow per chunk


def footer_of(tail: bytes) -> int:
    """The footer length a Parquet file's last 8 bytes announce; 0 when it is not Parquet."""
    if len(tail) < 8 or tail[-4:] != MAGIC:
        return 0
    return int.from_bytes(tail[-8:-4], "little")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def facts_of(path: Path) -> FileFacts:
    """The facts of a finished local file (a staged chunk, while it is still in the page cache)."""
    with path.open("rb") as fh:
        whole = hashlib.file_digest(fh, "sha256").hexdigest()
        size = fh.seek(0, 2)
        fh.seek(max(size - 8, 0))
        length = footer_of(fh.read(8))
        fh.seek(max(size - length - 8, 0))
        footer = fh.read(length + 8)
    return facts_from(size, footer, whole)


def facts_of_bytes(data: pa.Buffer, rows: int) -> FileFacts:
    """The facts of a file from the bytes written to it (a small chunk encoded in memory) and
    the row count its writer put in the footer."""
    view = memoryview(data)
    length = footer_of(bytes(view[-8:]))
    footer = bytes(view[max(len(view) - length - 8, 0) :])
    return FileFacts(len(view), rows, digest(footer), hashlib.sha256(view).hexdigest())


def facts_from(size: int, footer: bytes, whole: str) -> FileFacts:
    """Facts from a file's footer (its last bytes, length and magic included): the row count
    is read from the footer itself, so the file is not opened again."""
    rows = pq.read_metadata(pa.BufferReader(footer)).num_rows
    return FileFacts(size, rows, digest(footer), whole)


def problem(store: Store, record: dict[str, Any]) -> str | None:
    """What is wrong with a committed data file now, or None when it is as written."""
    size = store.size(record["file"])
    if size is None:
        return "missing"
    if size != record["size"]:
        return f"damaged (now {size:,} bytes; {record['size']:,} were committed)"
    length = footer_of(store.tail(record["file"], 8))
    if not length or digest(store.tail(record["file"], length + 8)) != record["footer"]:
        return "damaged (its contents changed since it was committed)"
    return None


def written_for(store: Store, rel: str) -> dict[str, str]:
    """The ``batchscore.*`` key-value metadata in a file's Parquet footer ({} when it has none,
    is not Parquet, or cannot be read): which job, fingerprint and chunk wrote it."""
    try:
        return footer_keys(store, rel)
    except (OSError, ValueError, pa.ArrowException):
        return {}


def footer_keys(store: Store, rel: str) -> dict[str, str]:
    """`written_for`'s metadata, raising what reading it raised (for a caller that must tell a
    file that proves nothing from one that cannot be read now)."""
    with store.open_input(rel) as fh:
        meta = pq.read_metadata(fh).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"batchscore.")}


def footers(store: Store, files: list[str]) -> list[dict[str, str]]:
    """`written_for` of each of ``files``, read side by side (in an object store each is a
    request or two)."""
    with ThreadPoolExecutor(max_workers=CHECKERS) as pool:
        return list(pool.map(lambda rel: written_for(store, rel), files))


def problems(store: Store, records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Chunk key -> what is wrong with its data file, for every record whose file is not intact."""
    keys = sorted(records)
    with ThreadPoolExecutor(max_workers=CHECKERS) as pool:
        found = pool.map(lambda key: problem(store, records[key]), keys)
        return {key: found for key, found in zip(keys, found, strict=True) if found}


def success_text(job: str, when: str) -> str:
    """The body of a `_SUCCESS` batchscore writes (empty ones are other writers')."""
    return f"{SUCCESS_MARK} for job {job}: every input row committed, {when}\n"


def is_ours(success: str | None) -> bool:
    """Whether a `_SUCCESS` (its text, None when absent) is one batchscore wrote."""
    return success is not None and success.startswith(SUCCESS_MARK)
