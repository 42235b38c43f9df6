"""Each row's shard folder, for columns that name files relative to their shard (images).

An image column may hold paths like ``img/0001.jpg``: relative to the folder of the shard the
row came from, as a dataset's images sit beside its Parquet files. The encoding that opens them
sees a window of rows that may span several shards, and the quality gate's sample none at all,
so the reader's callers add the folder as one more column (`FOLDER`) wherever the task reads
images; rows without it (an in-memory frame) are relative to the working directory.
"""

from __future__ import annotations

import os.path
import posixpath

import pyarrow as pa

from batchscore.storage.fs import is_url

FOLDER = "_batchscore_folder"  # an input column name no dataset uses: the leading underscore


def shard_folder(path: str) -> str:
    """The folder of a shard's path or URL, for joining relative names to."""
    return posixpath.dirname(path) if is_url(path) else os.path.dirname(os.path.abspath(path))


def with_folder(table: pa.Table, shard_path: str, kinds: dict[str, str]) -> pa.Table:
    """``table`` with its shard's folder as column `FOLDER`, where the task reads images."""
    if "image" not in kinds.values() or FOLDER in table.column_names:
        return table
    folder = pa.array([shard_folder(shard_path)] * table.num_rows, pa.string())
    return table.append_column(FOLDER, folder)
