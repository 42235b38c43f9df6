"""The output formats, in one table keyed by `[output].format` (see `batchscore.output.format`).

Each entry opens its format for one job's output folder; the recipes open it once, when the
job loads (`open_format`), and hand it to the folder's `Checkpoint`, whose callers never ask
which format they hold. Adding a format is one module holding its entry, and one line here.
"""

from __future__ import annotations

from collections.abc import Callable

from batchscore.job.sections import Job
from batchscore.output.delta import delta_table
from batchscore.output.format import OutputFormat, ParquetFolder
from batchscore.storage.store import Store

FORMATS: dict[str, Callable[[Job, Store], OutputFormat]] = {
    "parquet": lambda job, store: ParquetFolder(store),
    "delta": delta_table,
}


def open_format(job: Job, store: Store) -> OutputFormat:
    """The job's output format over the folder's ``store``."""
    return FORMATS[job.output.format](job, store)
