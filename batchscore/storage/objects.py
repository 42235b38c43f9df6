"""An output folder in an object store (S3 and the like) over `pyarrow.fs`.

There is no rename in an object store; what makes publishing safe instead is that an object
becomes visible only when its upload completes, whole, and an upload that is cut off (the
process killed, the network gone) never completes. So a file is staged locally, checked, and
uploaded in one piece to its final key. Two cautions that shape the code:

- pyarrow completes an upload when its stream is closed, also from a ``with`` block that is
  unwinding an exception, or from the stream's destructor. So the stream is never closed
  early: the staged file is handed to a single ``write`` as one buffer (no Python code runs
  between the bytes), and a failure of any part upload makes ``close`` fail without
  completing. The size of the published object is then checked against the staged file.
- A killed upload leaves an incomplete multipart upload that is not visible but is billed until
  aborted: give the bucket a lifecycle rule that aborts incomplete uploads after a day.

The lock is local (see `batchscore.output.lock`): it guards a job on one machine, not across
machines. It lives with the staged files in this user's private folder under the temp folder
(`batchscore.storage.private`), checked before the lock is opened. Every request goes through
the run's bounded retries; one that still fails transiently stops the run with exit 7, naming
the URL (`batchscore.storage.retry.GiveUp`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batchscore.errors import BookkeepingError, WriteError
from batchscore.files import write_new
from batchscore.storage.fs import to_url
from batchscore.storage.private import private_folder, private_root
from batchscore.storage.retry import GiveUp, Retry
from batchscore.storage.store import READ_LIMIT
from batchscore.storage.tail import TailFile, fetch_end

UPLOADERS = 16  # a group commit's records: each is a request, so a few go at once


def local_folder(url: str) -> Path:
    """This machine's folder for an object-store output: its lock and staged files.

    Keyed by the output URL, so every run of one job on this machine meets the same lock.
    """
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return private_root() / digest


class ObjectStore:
    """An output "folder" that is a key prefix in a bucket."""

    def __init__(self, url: str, fs: pafs.FileSystem, base: str, retry: Retry) -> None:
        self.url, self.fs, self.base, self.retry = url.rstrip("/"), fs, base, GiveUp(retry)
        self.local = local_folder(self.url)
        self.staging = self.local / "tmp"
        self.lock_path = self.local / "lock"

    def key(self, rel: str) -> str:
        return f"{self.base}/{rel}".rstrip("/")

    def check(self) -> None:
        """This machine's private folder for the output, made or found safe before the lock in
        it is opened (`private_folder`). The bucket is not asked: a key that cannot be written
        fails its first upload with a `WriteError` naming it, an unreachable store its first
        request with a `TransientIOError`."""
        private_folder(self.local)

    def where(self, rel: str) -> str:
        return to_url(self.url, self.key(rel))

    def prepare(self, *rel_dirs: str) -> None:
        private_folder(self.staging)  # prefixes need no creating

    def read_text(self, rel: str) -> str | None:
        def read() -> bytes | None:
            try:
                with self.fs.open_input_stream(self.key(rel)) as fh:
                    return fh.read(READ_LIMIT + 1)  # never more: see `READ_LIMIT`
            except FileNotFoundError:
                return None

        data = self.retry.call(read, self.where(rel))
        if data is not None and len(data) > READ_LIMIT:
            raise BookkeepingError(
                f"{self.where(rel)}: holds more than the {READ_LIMIT:,} bytes read; "
                "batchscore did not write it, so it stopped without using it: remove it and "
                "run again"
            )
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def write_json(self, rel: str, data: Any) -> None:
        self.write_text(rel, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def write_text(self, rel: str, text: str) -> None:
        self.upload(pa.py_buffer(text.encode()), rel)

    def write_many(self, files: dict[str, Any]) -> None:
        """One upload per file, a few at once (each is a request, durable when it returns)."""
        with ThreadPoolExecutor(max_workers=UPLOADERS) as pool:
            list(pool.map(lambda rel: self.write_json(rel, files[rel]), files))

    def size(self, rel: str) -> int | None:
        info = self.retry.call(lambda: self.fs.get_file_info(self.key(rel)), self.where(rel))
        return info.size if info.type == pafs.FileType.File else None

    def open_input(self, rel: str) -> Any:
        """The object's end, fetched with retries, as a file of its size (`TailFile`): a
        footer read through it makes no request that could fail unretried."""
        size = self.size(rel)
        if size is None:
            raise FileNotFoundError(errno.ENOENT, "no such object", self.where(rel))
        return TailFile(fetch_end(size, lambda count: self.tail(rel, count)), size)

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        def read() -> pa.Table:
            with self.fs.open_input_file(self.key(rel)) as fh:
                return pq.ParquetFile(fh).read(
                    columns=columns, use_threads=False
                )  # no dataset, no pandas

        return self.retry.call(read, self.where(rel))

    def tail(self, rel: str, count: int) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_file(self.key(rel)) as fh:
                size = fh.size()
                return fh.read_at(min(count, size), max(size - count, 0))

        return self.retry.call(read, self.where(rel))

    def names(self, rel_dir: str) -> list[str]:
        selector = pafs.FileSelector(self.key(rel_dir), allow_not_found=True)
        infos = self.retry.call(lambda: self.fs.get_file_info(selector), self.where(rel_dir))
        return [i.base_name for i in infos if i.type == pafs.FileType.File]

    def delete(self, rel: str) -> None:
        def delete() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(self.key(rel))

        self.retry.call(delete, self.where(rel))

    def move(self, rel: str, to: str) -> None:
        """A server-side copy, then a delete: there is no rename in an object store."""
        self.retry.call(lambda: self.fs.copy_file(self.key(rel), self.key(to)), self.where(to))
        self.delete(rel)

    def barrier(self, rel_dir: str) -> None:
        """Nothing to wait for: deletes are strongly consistent in S3 (and GCS, Azure)."""

    def sync(self, local: Path) -> None:
        """Nothing: the staged file is only a source for the upload, which is the durable step."""

    def stage(self, local: Path, data: pa.Buffer) -> None:
        """Write the staged file, made new (not fsynced: the upload is the durable step)."""
        write_new(local, data, durable=False)

    def publish(self, local: Path, rel: str, *, durable: bool = True) -> None:
        """An upload is durable when it returns, whatever ``durable`` asks."""
        with pa.memory_map(str(local)) as source:
            self.upload(source.read_buffer(), rel)
        local.unlink(missing_ok=True)

    def upload(self, buffer: pa.Buffer, rel: str) -> None:
        """Upload ``buffer`` as the whole object ``rel`` (again, whole, after a transient
        failure: an upload that failed never became visible), then check what landed."""
        key = self.key(rel)

        def send() -> None:
            stream = self.fs.open_output_stream(key)
            stream.write(buffer)  # one call: the bytes go out as a whole, or the close fails
            stream.close()  # completes the upload: the object becomes visible here

        self.retry.call(send, self.where(rel))
        landed = self.size(rel)
        if landed != buffer.size:
            self.delete(rel)
            raise WriteError(
                f"{self.where(rel)}: {landed} bytes landed, {buffer.size} were sent; removed it"
            )
