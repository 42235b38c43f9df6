"""The output formats, in one table keyed by `[output].format` (see `batchscore.output.format`).

Each entry opens its format for one job's output folder; the recipes open it once, when the
job loads (`open_format`), and hand it to the folder's `Checkpoint`, whose callers never ask
which format they hold. Adding a format is one module holding its entry, and one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from batchscore.job.sections import Job
from batchscore.output.delta import delta_table
from batchscore.output.format import OutputFormat, ParquetFolder
from batchscore.output.iceberg import iceberg_table
from batchscore.storage.store import Store

# each entry: (the job, the output folder's store, the environment the front door passed in,
# whose AWS_* variables reach an object store where the format's library does not read them)
FORMATS: dict[str, Callable[[Job, Store, Mapping[str, str]], OutputFormat]] = {
    "parquet": lambda job, store, environ: ParquetFolder(store),
    "delta": lambda job, store, environ: delta_table(job, store),
    "iceberg": iceberg_table,
}


def open_format(job: Job, store: Store, environ: Mapping[str, str] | None = None) -> OutputFormat:
    """The job's output format over the folder's ``store``."""
    return FORMATS[job.output.format](job, store, environ or {})
