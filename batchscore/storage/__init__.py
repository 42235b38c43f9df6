"""Where output goes and input comes from: a local folder, or an object store named by URL.

Every operation on an output folder goes through a `Store` (`LocalStore`: files, fsync and
rename, as always; `ObjectStore`: one whole-object upload per file over `pyarrow.fs`), so the
commit protocol is written once, in `batchscore.checkpoint` and `batchscore.writer`. Input
shards are listed and opened through `pyarrow.fs` when they are URLs.

Credentials and endpoints come from the standard chain of each store (for S3: the
``AWS_*`` variables, ``~/.aws/config`` and ``~/.aws/credentials``, instance roles; an
``AWS_ENDPOINT_URL`` for an S3-compatible server), never from the job file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from batchscore.errors import JobError

STATE = "_batchscore"  # bookkeeping folder inside an output; dataset readers skip "_" names
# Stores where an object becomes visible whole when its upload completes, and an upload that
# never completes never becomes visible: the publish step the commit protocol needs.
WHOLE_OBJECT_SCHEMES = {"s3", "gs", "gcs", "abfs", "abfss", "az"}


class Store(Protocol):
    """An output folder. ``rel`` paths are relative to it, with ``/`` separators."""

    url: str  # the folder as the job names it
    staging: Path  # a local folder for temporary files
    lock_path: Path  # the local file whose flock guards the job

    def where(self, rel: str) -> str:
        """The full path or URL of ``rel``, for messages."""
        ...

    def prepare(self, *rel_dirs: str) -> None:
        """Create the folders the run will write into (and the local staging folder)."""
        ...

    def read_text(self, rel: str) -> str | None:
        """A file's text, or None when it does not exist."""
        ...

    def write_json(self, rel: str, data: Any) -> None:
        """Replace ``rel`` with ``data`` as JSON, atomically."""
        ...

    def names(self, rel_dir: str) -> list[str]:
        """Names of the files directly in ``rel_dir`` (none when it does not exist)."""
        ...

    def delete(self, rel: str) -> None:
        """Remove a file; a missing one is fine."""
        ...

    def barrier(self, rel_dir: str) -> None:
        """Make earlier deletions in ``rel_dir`` durable before what follows."""
        ...

    def sync(self, local: Path) -> None:
        """Make a finished staging file durable, ready to publish."""
        ...

    def publish(self, local: Path, rel: str) -> None:
        """Move a finished staging file to ``rel``: visible whole, or not at all."""
        ...


def is_url(path: str) -> bool:
    """``scheme://...`` other than ``file://``: read and written through `pyarrow.fs`."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    """A local path, from a plain path or a ``file://`` URL."""
    return Path(urlsplit(path).path if path.startswith("file://") else path)


def open_store(output: str | Path) -> Store:
    """The store for an output folder or URL; a URL whose store cannot publish whole is refused."""
    text = str(output)
    if not is_url(text):
        from batchscore.storage.local import LocalStore

        return LocalStore(local_path(text))
    scheme = urlsplit(text).scheme
    if scheme not in WHOLE_OBJECT_SCHEMES:
        raise JobError(
            f"[output].path: {text}: cannot write output to {scheme}://, where a file is visible "
            f"before it is complete; use a local folder or one of "
            f"{', '.join(sorted(s + '://' for s in WHOLE_OBJECT_SCHEMES))}"
        )
    from batchscore.storage.objects import ObjectStore

    fs, base = filesystem(text)
    return ObjectStore(text, fs, base)


@functools.cache
def _filesystem(scheme: str, netloc: str) -> Any:
    """One filesystem per bucket: creating one may cost a request (region lookup)."""
    import pyarrow as pa
    import pyarrow.fs as pafs

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
