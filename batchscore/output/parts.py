"""One side of the increments diff (`batchscore.output.diff`) split by its ids' hash into parts
that are joined one at a time: kept in memory when there is one part, spilled to Arrow IPC files
in a local scratch folder when there are more, so memory is bounded by a part."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from batchscore.work.columns import int64s
from batchscore.work.row_hash import value_words


class Parts:
    """One side of the diff split by its ids' hash, in memory (one part) or in IPC files."""

    def __init__(self, count: int, folder: Path, name: str) -> None:
        self.count, self.tables = count, [[] for _ in range(count)]
        self.files = [folder / f"diff-{name}-{i}.arrow" for i in range(count)] if count > 1 else []
        self.writers: list[Any] = [None] * len(self.files)
        self.id_type: pa.DataType | None = None  # the first table's, for parts left empty

    def add(self, table: pa.Table) -> None:
        self.id_type = self.id_type or table.schema.field("id").type
        if self.count == 1:
            self.tables[0].append(table)
            return
        part = (value_words(table.column("id").combine_chunks()) % np.uint64(self.count)).astype(
            np.int64
        )
        for i in np.unique(part):
            chosen = table.take(int64s(np.flatnonzero(part == i)))
            if self.writers[i] is None:
                self.writers[i] = ipc.new_file(str(self.files[i]), chosen.schema)
            self.writers[i].write_table(chosen)

    def part(self, i: int, schema: pa.Schema) -> pa.Table:
        if self.count == 1:
            return pa.concat_tables(self.tables[0]) if self.tables[0] else schema.empty_table()
        if self.writers[i] is None:
            return schema.empty_table()
        self.writers[i].close()
        self.writers[i] = None
        with ipc.open_file(str(self.files[i])) as reader:
            table = reader.read_all()
        self.files[i].unlink()
        return table

    def close(self) -> None:
        for writer, path in zip(self.writers, self.files, strict=True):
            if writer is not None:
                with contextlib.suppress(OSError):
                    writer.close()
            path.unlink(missing_ok=True)
