"""run-batch's files: the request file read, the results published whole, each job's shard
written only when it changed, and a job's committed rows read back; local paths (``file://``
too) or object-store URLs alike.

The results never go where the requests are: ``-o`` naming the request file itself (as
written, spelled another way, through a link, or a hard link to it) is refused before
anything is read, since publishing the results would replace the requests with them. A work
folder that is a file is refused then too, rather than met when the first job writes there.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from batchscore.errors import JobError, WriteError, write_error
from batchscore.files import replace_durably
from batchscore.storage.fs import filesystem, is_url, local_path


def check_paths(source: str, target: str, work: str) -> None:
    """A `JobError` (exit 2) for the files named where they cannot be: the results over the
    requests, or a work folder that is a file."""
    refuse_same_file(source, target)
    if not is_url(work) and local(work).exists() and not local(work).is_dir():
        raise JobError(
            f"--work-dir {work}: is a file, not a folder; run-batch keeps its jobs there: "
            "name a folder (the default is the results file's name with .work added)"
        )


def refuse_same_file(source: str, target: str) -> None:
    """A `JobError` (exit 2) naming both when ``target`` is the request file ``source``."""
    if is_url(source) or is_url(target):
        same = is_url(source) and is_url(target) and located(source) == located(target)
    else:
        given, results = local(source), local(target)
        same = given.resolve() == results.resolve() or same_inode(given, results)
    if same:
        raise JobError(
            f"-o {target}: is the request file -i {source} (the same file); the results "
            "would be written over the requests: name another results file"
        )


def located(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc, parts.path


def local(path: str) -> Path:
    return local_path(path).expanduser()


def same_inode(first: Path, second: Path) -> bool:
    """Whether two existing paths are one file (a hard link, or a link to it)."""
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them is not there yet: not the same file
        return False


def read_bytes(source: str) -> bytes:
    """The request file, local or by URL; one that cannot be read is a `JobError`."""
    try:
        if is_url(source):
            fs, path = filesystem(source)
            with fs.open_input_stream(path) as stream:
                return stream.read()
        return local(source).read_bytes()
    except OSError as exc:
        raise JobError(f"{source}: cannot read the request file: {exc}") from None


def write_if_changed(path: str, table: pa.Table) -> None:
    """A group's shard, written only when its bytes differ from the one in place: a resumed
    run leaves the shard its commits were made from as it is."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    if is_url(path):
        fs, key = filesystem(path)
        try:
            with fs.open_input_stream(key) as stream:
                if stream.read() == data:
                    return
        except OSError:
            pass
        write_whole(path, data)
        return
    shard = Path(path)
    try:
        if shard.is_file() and shard.read_bytes() == data:
            return
        shard.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(shard, data)
    except OSError as exc:  # the work folder's disk, permissions, or a file where a folder goes
        raise write_error(shard, exc) from None


def write_whole(target: str, data: bytes) -> None:
    """Publish ``data`` at ``target`` whole: a temporary file renamed over it, or one upload
    (an object is visible only when its upload completes)."""
    try:
        if is_url(target):
            fs, path = filesystem(target)
            with fs.open_output_stream(path) as stream:
                stream.write(data)
            return
        replace_durably(local(target), data)
    except OSError as exc:
        raise WriteError(f"{target}: cannot write the results: {exc}") from None


def committed(output: str) -> pa.Table:
    """A complete job's output rows: every data file of the folder (bookkeeping under
    ``_batchscore/`` and temporary files are skipped by their leading ``_`` and ``.``)."""
    if is_url(output):
        fs, path = filesystem(output)
        return ds.dataset(path, format="parquet", filesystem=fs).to_table()
    return ds.dataset(output, format="parquet").to_table()
