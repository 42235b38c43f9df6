"""Input shards: find the Parquet files a job names, open their footers, check their columns.

Only footers are read here. Shards named by URL (``s3://bucket/docs/``) are listed and opened
through `pyarrow.fs`. An error says whether retrying may help: corrupt data fails its shard, an
I/O error that may pass fails the run, to retry later.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batchscore.errors import BatchscoreError, InputDataError, JobError, TransientIOError
from batchscore.job.sections import InputConfig
from batchscore.output.layout import shard_key
from batchscore.storage.fs import filesystem, is_url, to_url

log = logging.getLogger("batchscore")
GLOB_CHARS = set("*?[")
# Errors that say nothing about the data: retrying later may succeed. pyarrow reports corrupt
# data as ArrowException or as an OSError without an errno, which is never retried.
TRANSIENT = {
    errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
    errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ESTALE, errno.EINTR,
}  # fmt: skip


@dataclass(frozen=True)
class Shard:
    """One input Parquet file; `index` is its place in sorted path order (this run's only)."""

    index: int
    path: str
    size: int
    mtime_ns: int

    @property
    def key(self) -> str:
        """The shard's part of its output names (see `batchscore.output.layout`)."""
        return shard_key(self.path)

    @property
    def identity(self) -> dict[str, int | str]:
        """What must stay equal for committed chunks of this shard to remain valid."""
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns}


def is_hidden(path: Path, root: Path) -> bool:
    """Names starting with ``.`` or ``_`` are not shards, as dataset readers treat them."""
    parts = path.relative_to(root).parts if path.is_relative_to(root) else (path.name,)
    return any(p.startswith((".", "_")) for p in parts)


def expand(pattern: str) -> list[Path]:
    """The shard files one `[input].path` entry names: a folder, a glob or a file."""
    path = Path(pattern)
    if any(c in pattern for c in GLOB_CHARS):
        root = Path(pattern.split("*")[0].split("?")[0].split("[")[0]).parent
        found = [Path(p) for p in glob.glob(pattern, recursive=True)]
        return [p for p in found if p.is_file() and not is_hidden(p, root)]
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and not is_hidden(p, path)]
        others = sorted(str(p.relative_to(path)) for p in files if p.suffix != ".parquet")
        if others:
            log.warning(
                "%s: ignoring %d non-Parquet file(s): %s",
                path,
                len(others),
                ", ".join(others[:5]) + (" ..." if len(others) > 5 else ""),
            )
        return [p for p in files if p.suffix == ".parquet"]
    if path.is_file():
        return [path]
    raise JobError(f"[input].path: {pattern}: no such file or folder")


def expand_url(pattern: str) -> dict[str, tuple[int, int]]:
    """The shards a URL names (a prefix, a glob or an object), each with its size and mtime."""
    fs, path = filesystem(pattern)
    glob_at = min((path.index(c) for c in GLOB_CHARS if c in path), default=None)
    root = path if glob_at is None else path[:glob_at].rsplit("/", 1)[0]
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File and glob_at is None:
            return {to_url(pattern, info.path): (info.size, info.mtime_ns)}
        if info.type == pafs.FileType.NotFound:
            raise JobError(f"[input].path: {pattern}: no such file or folder")
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except OSError as exc:
        raise TransientIOError(f"[input].path: {pattern}: cannot list: {exc}; run again") from exc
    found = {}
    for info in infos:
        rel = info.path[len(root) :].lstrip("/")
        if info.type != pafs.FileType.File or any(p.startswith((".", "_")) for p in rel.split("/")):
            continue
        if glob_at is None and not rel.endswith(".parquet"):
            continue
        if glob_at is not None and not fnmatch.fnmatchcase(info.path, path):
            continue
        found[to_url(pattern, info.path)] = (info.size, info.mtime_ns)
    return found


def find_shards(inp: InputConfig) -> list[Shard]:
    """Every shard the job names, in sorted path order, each once."""
    files: dict[str, tuple[int, int]] = {}
    for pattern in inp.path:
        if is_url(pattern):
            found = expand_url(pattern)
        else:
            found = {}
            for p in expand(pattern):
                st = os.stat(p.resolve())
                found[str(p.resolve())] = (st.st_size, st.st_mtime_ns)
        if not found:
            raise JobError(f"[input].path: {pattern}: matches no Parquet files")
        files.update(found)
    return [Shard(i, path, *files[path]) for i, path in enumerate(sorted(files))]


def is_transient(exc: Exception) -> bool:
    """An I/O error that says nothing about the data: a local errno, or an object store's
    network, throttling or server error (pyarrow reports those without an errno)."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in TRANSIENT:
        return True
    text = str(exc)
    return "AWS Error" in text and not any(s in text for s in STORE_DATA_ERRORS)


# object-store errors that a retry will not fix: the shard is gone or may not be read
STORE_DATA_ERRORS = ("ACCESS_DENIED", "NO_SUCH_KEY", "NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND")


def read_error(shard: Shard, what: str, exc: Exception) -> BatchscoreError:
    """Corrupt data fails the shard; an I/O error that may pass fails the run, to retry later."""
    if is_transient(exc):
        return TransientIOError(f"{shard.path}: {what}: {exc}; run again to retry")
    return InputDataError(f"{shard.path}: {what}: {exc}")


def open_shard(shard: Shard) -> pq.ParquetFile:
    """Open a shard's footer, turning a corrupt file into an error that names it."""
    try:
        if is_url(shard.path):
            fs, path = filesystem(shard.path)
            return pq.ParquetFile(fs.open_input_file(path))
        return pq.ParquetFile(shard.path)
    except (OSError, pa.ArrowException) as exc:
        raise read_error(shard, "not a readable Parquet file", exc) from exc


def check_columns(
    shard: Shard, schema: pa.Schema, carried: tuple[str, ...], kinds: dict[str, str]
) -> None:
    """Fail early, naming shard and column, when a needed column is absent or of the wrong kind.

    ``carried`` columns may hold anything; ``kinds`` maps each column a task reads to "text"
    (a string column) or "numeric" (numbers, or a list of numbers).
    """
    missing = [c for c in dict.fromkeys([*carried, *kinds]) if c not in schema.names]
    if missing:
        raise InputDataError(
            f"{shard.path}: missing column(s) {', '.join(missing)}; "
            f"it has {', '.join(schema.names)}"
        )
    for name, kind in kinds.items():
        found = schema.field(name).type
        check, wanted = KINDS[kind]
        if not check(found):
            raise InputDataError(f"{shard.path}: column {name!r} is {found}, expected {wanted}")


def is_numeric(kind: pa.DataType) -> bool:
    """Numbers, or a list of numbers (a feature vector in one column)."""
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        return is_numeric(kind.value_type)
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


KINDS = {
    "text": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "a string column"),
    "numeric": (is_numeric, "numbers or a list of numbers"),
}
