"""Input shards: find the Parquet files a job names, open their footers, check their columns.

Only footers are read here. Shards named by URL (``s3://bucket/docs/``) are listed and opened
through `pyarrow.fs`. An error says whether retrying may help: corrupt data fails its shard, an
I/O error that may pass fails the run, to retry later.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batchscore.errors import BatchscoreError, InputDataError, JobError, TransientIOError
from batchscore.job.sections import InputConfig
from batchscore.storage.fs import filesystem, is_url, to_url
from batchscore.storage.retry import Retry, is_transient
from batchscore.work.units import Shard

log = logging.getLogger("batchscore")
GLOB_CHARS = set("*?[")


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


def expand_url(pattern: str, retry: Retry) -> dict[str, tuple[int, int]]:
    """The shards a URL names (a prefix, a glob or an object), each with its size and mtime."""
    fs, path = filesystem(pattern)
    glob_at = min((path.index(c) for c in GLOB_CHARS if c in path), default=None)
    root = path if glob_at is None else path[:glob_at].rsplit("/", 1)[0]
    try:
        info = retry.call(lambda: fs.get_file_info(root), f"[input].path: {pattern}")
        if info.type == pafs.FileType.File and glob_at is None:
            return {to_url(pattern, info.path): (info.size, info.mtime_ns)}
        if info.type == pafs.FileType.NotFound:
            raise JobError(f"[input].path: {pattern}: no such file or folder")
        selector = pafs.FileSelector(root, recursive=True)
        infos = retry.call(lambda: fs.get_file_info(selector), f"[input].path: {pattern}")
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


def real_paths(paths: list[Path]) -> list[str]:
    """Each path with every link resolved (`os.path.realpath`), resolving each folder once:
    thousands of shards in one folder would otherwise walk the same folders thousands of times."""
    folders: dict[Path, str] = {}
    real = []
    for path in paths:
        if path.parent not in folders:
            folders[path.parent] = os.path.realpath(path.parent)
        full = os.path.join(folders[path.parent], path.name)
        real.append(os.path.realpath(full) if os.path.islink(full) else full)
    return real


def find_shards(inp: InputConfig, retry: Retry | None = None) -> list[Shard]:
    """Every shard the job names, in sorted path order, each once; its reads are retried
    (and counted) by ``retry``."""
    retry = retry or Retry()
    files: dict[str, tuple[int, int]] = {}
    for pattern in inp.path:
        if is_url(pattern):
            found = expand_url(pattern, retry)
        else:
            found = {}
            for path in real_paths(expand(pattern)):
                st = os.stat(path)
                found[path] = (st.st_size, st.st_mtime_ns)
        if not found:
            raise JobError(f"[input].path: {pattern}: matches no Parquet files")
        files.update(found)
    return [Shard(i, path, *files[path], retry) for i, path in enumerate(sorted(files))]


def read_error(shard: Shard, what: str, exc: Exception) -> BatchscoreError:
    """Corrupt data fails the shard; an I/O error that may pass, still failing after its
    retries, fails the run, to run again later."""
    if is_transient(exc):
        tries = shard.retry.attempts
        return TransientIOError(f"{shard.path}: {what}: {exc} ({tries} tries); run again later")
    return InputDataError(f"{shard.path}: {what}: {exc}")


class ShardChangedError(InputDataError):
    """A shard is no longer the file the run found: its rows read since cannot be trusted to
    be of one version, nor of the version its commit records would name."""


def check_unchanged(shard: Shard, cause: Exception | None = None) -> None:
    """Raise `ShardChangedError` when the shard's size or mtime differ from those the run found
    it with, or it is gone (``cause``: the read error it explains, if any).

    An object store's listing gives mtimes to the millisecond and its HEAD to the second, so
    there they are compared to the second (a rewritten object also gets a new size, or a later
    second, but for one written the same second at the same size).
    """
    try:
        if is_url(shard.path):
            fs, path = filesystem(shard.path)
            info = shard.retry.call(lambda: fs.get_file_info(path), f"{shard.path}: checking")
            found = (info.size, info.mtime_ns) if info.type == pafs.FileType.File else None
        else:
            stat = os.stat(shard.path)
            found = (stat.st_size, stat.st_mtime_ns)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise read_error(shard, "cannot check that it is unchanged", exc) from exc
    then = (shard.size, shard.mtime_ns)
    if found is not None and is_url(shard.path):
        found, then = (found[0], found[1] // 10**9), (then[0], then[1] // 10**9)
    if found == then:
        return
    how = "it is gone" if found is None else f"{then[0]} bytes then, {found[0]} now"
    if found is not None and found[0] == then[0]:
        how = "rewritten: same size, another modification time"
    raise ShardChangedError(
        f"{shard.path}: changed while the run read it ({how}); no chunk read from it since is "
        "committed: run again to score it whole"
    ) from cause


def open_shard(shard: Shard) -> pq.ParquetFile:
    """Open a shard's footer, turning a corrupt file into an error that names it."""

    def footer() -> pq.ParquetFile:
        if is_url(shard.path):
            fs, path = filesystem(shard.path)
            return pq.ParquetFile(fs.open_input_file(path))
        return pq.ParquetFile(shard.path)

    try:
        return shard.retry.call(footer, f"{shard.path}: opening")
    except (OSError, pa.ArrowException) as exc:
        raise read_error(shard, "not a readable Parquet file", exc) from exc


def check_columns(
    shard: Shard, schema: pa.Schema, needed: tuple[str, ...], kinds: dict[str, str]
) -> None:
    """Fail early, naming shard and column, when a needed column is absent, appears more than
    once, or is of the wrong kind.

    ``needed`` columns (carried ones, those `where` reads) may hold anything; ``kinds`` maps
    each column a task reads to "text" (a string column, any layout), "numeric" (numbers, or
    a list of numbers) or "image" (`is_image`).
    """
    wanted = list(dict.fromkeys([*needed, *kinds]))
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise InputDataError(
            f"{shard.path}: missing column(s) {', '.join(missing)}; "
            f"it has {', '.join(schema.names)}"
        )
    twice = [c for c in wanted if len(schema.get_all_field_indices(c)) > 1]
    if twice:
        count = len(schema.get_all_field_indices(twice[0]))
        raise InputDataError(
            f"{shard.path}: column {twice[0]!r} appears {count} times; a column the job reads "
            "must have one name of its own"
        )
    for name, kind in kinds.items():
        found = schema.field(name).type
        check, wanted_kind = KINDS[kind]
        if not check(found):
            raise InputDataError(
                f"{shard.path}: column {name!r} is {found}, expected {wanted_kind}"
            )


def is_text(kind: pa.DataType) -> bool:
    """Every Arrow layout of strings: string, large_string, string_view, dictionary-encoded."""
    if pa.types.is_dictionary(kind):
        return is_text(kind.value_type)
    types = pa.types
    return types.is_string(kind) or types.is_large_string(kind) or types.is_string_view(kind)


def is_numeric(kind: pa.DataType) -> bool:
    """Numbers, or a list of numbers (a feature vector in one column)."""
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        return is_numeric(kind.value_type)
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def is_text_or_nulls(kind: pa.DataType) -> bool:
    """A text column, or one of nulls only: what pandas writes for a categorical with no
    category (an empty frame's, say). Its rows are then each a null text: a row error."""
    return is_text(kind) or pa.types.is_null(kind)


def is_image(kind: pa.DataType) -> bool:
    """Images: encoded bytes, paths or URIs as text, or a Hugging Face datasets ``Image``
    column (a struct of ``bytes`` and ``path``); nulls only are each a row error."""
    types = pa.types
    if types.is_struct(kind):
        names = {kind.field(i).name for i in range(kind.num_fields)}
        return "bytes" in names or "path" in names
    binary = types.is_binary(kind) or types.is_large_binary(kind) or types.is_binary_view(kind)
    return binary or is_text_or_nulls(kind)


def is_messages(kind: pa.DataType) -> bool:
    """Conversations: a list of {role, content} structs (as Hugging Face datasets hold chat
    messages), or their JSON text; nulls only are each a row error."""
    types = pa.types
    if types.is_list(kind) or types.is_large_list(kind) or types.is_list_view(kind):
        item = kind.value_type
        names = (
            {item.field(i).name for i in range(item.num_fields)} if types.is_struct(item) else ()
        )
        return {"role", "content"} <= set(names)
    return is_text_or_nulls(kind)


KINDS = {
    "text": (is_text_or_nulls, "a string column"),
    "messages": (is_messages, "a list of {role, content} messages, or their JSON text"),
    "image": (is_image, "encoded image bytes, or image paths or URIs as strings"),
    "numeric": (is_numeric, "numbers or a list of numbers"),
}
