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
import pyarrow.compute as pc

from batchscore.storage.fs import is_url
from batchscore.work.shards import is_text

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


IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets' Image layout


def image_layout(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """An image column as Hugging Face datasets lays one out, a struct of ``bytes`` and ``path``
    (one of them set per row), whether it holds bytes, paths or such structs: so rows of shards
    that hold images differently join in one table (the quality gate's sample) and a path stays
    a path, where Arrow's own joining would cast paths to bytes."""
    kind = column.type
    if kind == IMAGE:
        return column
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        parts = [
            column.combine_chunks().field(name).cast(IMAGE.field(name).type)
            if name in names
            else pa.nulls(len(column), IMAGE.field(name).type)
            for name in ("bytes", "path")
        ]
    elif pa.types.is_null(kind) or is_text(kind):
        parts = [pa.nulls(len(column), pa.binary()), column.combine_chunks().cast(pa.string())]
    else:
        parts = [column.combine_chunks().cast(pa.binary()), pa.nulls(len(column), pa.string())]
    mask = pc.and_(pc.is_null(parts[0]), pc.is_null(parts[1]))
    return pa.chunked_array([pa.StructArray.from_arrays(parts, fields=list(IMAGE), mask=mask)])
