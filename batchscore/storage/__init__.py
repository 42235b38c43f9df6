"""Where output goes: a local folder, or an object store named by URL, chosen by scheme.

Every operation on an output folder goes through a `Store` (`LocalStore`: files, fsync and
rename; `ObjectStore`: one whole-object upload per file over `pyarrow.fs`), so the commit
protocol is written once, in `batchscore.output`. Every name a folder holds is given in one
place (`batchscore.storage.layout`), which the stores read too: they refuse links where those
names go. Input shards named by URL are listed and opened through the same filesystems
(`batchscore.storage.fs`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from batchscore.errors import JobError
from batchscore.storage.disk import LocalStore
from batchscore.storage.fs import filesystem, is_url, local_path
from batchscore.storage.objects import ObjectStore
from batchscore.storage.retry import Retry
from batchscore.storage.store import Store


def object_store(url: str, retry: Retry) -> Store:
    fs, base = filesystem(url)
    return ObjectStore(url, fs, base, retry)


# URL scheme -> the store for it. Object stores qualify when an object becomes visible whole
# when its upload completes, and an upload that never completes never becomes visible: the
# publish step the commit protocol needs.
STORES: dict[str, Callable[[str, Retry], Store]] = {
    "file": lambda url, retry: LocalStore(local_path(url)),
    **dict.fromkeys(("s3", "gs", "gcs", "abfs", "abfss", "az"), object_store),
}


def open_store(output: str | Path, retry: Retry | None = None) -> Store:
    """The store for an output folder or URL; a URL whose store cannot publish whole is refused.
    An object store retries transient errors with ``retry`` (which counts them)."""
    text = str(output)
    scheme = urlsplit(text).scheme if is_url(text) else "file"
    if scheme not in STORES:
        raise JobError(
            f"[output].path: {text}: cannot write output to {scheme}://, where a file is visible "
            f"before it is complete; use a local folder or one of "
            f"{', '.join(sorted(s + '://' for s in STORES if s != 'file'))}"
        )
    return STORES[scheme](text, retry or Retry())


__all__ = ["STORES", "Store", "open_store"]
