"""URLs (``s3://bucket/key``) as `pyarrow.fs` filesystems, for input shards and output folders.

Credentials and endpoints come from the standard chain of each store (for S3: the
``AWS_*`` variables, ``~/.aws/config`` and ``~/.aws/credentials``, instance roles; an
``AWS_ENDPOINT_URL`` for an S3-compatible server), never from the job file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from batchscore.errors import JobError


def is_url(path: str) -> bool:
    """``scheme://...`` other than ``file://``: read and written through `pyarrow.fs`."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    """A local path, from a plain path or a ``file://`` URL."""
    return Path(urlsplit(path).path if path.startswith("file://") else path)


@functools.cache
def _filesystem(scheme: str, netloc: str) -> Any:
    """One filesystem per bucket: creating one may cost a request (region lookup)."""
    try:
        fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{netloc}/")
        return fs
    except pa.ArrowInvalid:
        pass
    try:
        import fsspec
    except ImportError:
        raise JobError(
            f"{scheme}://: pyarrow has no such filesystem; for fsspec's, "
            "install the extra: pip install 'batchscore[fsspec]'"
        ) from None
    try:
        return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme)))
    except (ImportError, ValueError) as exc:
        raise JobError(f"{scheme}://: no filesystem for this scheme: {exc}") from None


def filesystem(url: str) -> tuple[Any, str]:
    """A `pyarrow.fs.FileSystem` for ``url`` and the path within it (``bucket/key``)."""
    parts = urlsplit(url)
    fs = _filesystem(parts.scheme, parts.netloc)
    return fs, f"{parts.netloc}{parts.path}".rstrip("/")


def to_url(url: str, path: str) -> str:
    """The URL of ``path`` (``bucket/key``) in the filesystem ``url`` belongs to."""
    return f"{urlsplit(url).scheme}://{path}"
