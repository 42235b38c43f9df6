"""One root for every error batchscore reports, each with the exit status the CLI turns it into.

The CLI is the only place that maps errors to exit codes and messages, so library callers can catch
`BatchscoreError` and read `.exit_code` without parsing text.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any


class BatchscoreError(Exception):
    """Root of every error batchscore expects; anything else is a bug (exit 1)."""

    exit_code = 1


class JobError(BatchscoreError):
    """A bad command line or job file: nothing was scored."""

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class InputDataError(BatchscoreError):
    """An input shard could not be read or scored; other shards still commit."""

    exit_code = 3


class ShardsFailedError(InputDataError):
    """Some shards could not be read and were not committed; every other shard was.

    ``report`` is the run's report (the Python API's `RunReport`), whose ``failures`` name them.
    """

    def __init__(self, message: str, report: Any) -> None:
        super().__init__(message)
        self.report = report


class BadRowsError(InputDataError):
    """More rows failed than `[output].max_bad_share` allows; committed chunks are kept."""


class TransientIOError(BatchscoreError):
    """Reading input, or fetching a model, failed for a reason that may pass (I/O error,
    timeout, the hub out of reach): retry later."""

    exit_code = 7


class ModelError(BatchscoreError):
    """The model could not be found or loaded."""

    exit_code = 4


class OutputConflictError(BatchscoreError):
    """The output folder holds another job's or another configuration's committed work, or a
    file batchscore did not write where its output goes."""

    exit_code = 5


class WriteError(BatchscoreError):
    """Writing an output chunk or a checkpoint failed (disk full, permissions)."""

    exit_code = 6


def write_error(path: Path | str, exc: OSError, *, doing: str = "write") -> WriteError:
    """A `WriteError` that says what failed (``doing``: write, remove, move) and what the user
    can do about it."""
    hint = {
        errno.ENOSPC: "the disk is full; free space and run again",
        errno.EDQUOT: "the disk quota is exceeded; free space and run again",
        errno.EACCES: "permission denied; check the output folder's permissions",
        errno.EPERM: "not permitted; check the file's owner and attributes (lsattr: immutable?)",
        errno.EROFS: "the file system is read-only",
    }.get(exc.errno or 0, "run again once the cause is fixed")
    return WriteError(f"{path}: cannot {doing}: {exc.strerror or exc}; {hint}")


class QualityGateError(BatchscoreError):
    """The job's precision moves outputs further from fp32 than `[quality]` allows."""

    exit_code = 8


class EngineError(BatchscoreError):
    """The Ray cluster could not be reached, or its model actors kept dying."""

    exit_code = 9


class BookkeepingError(BatchscoreError):
    """A bookkeeping file of the output folder is damaged, and the data files do not prove
    what it said, or is not a file batchscore wrote (a FIFO, a device, a folder, past the
    cap): the run cannot tell what is committed."""

    exit_code = 10


class MetricsError(BatchscoreError):
    """The run succeeded, but its `--metrics-file` could not be written (cron must notice)."""

    exit_code = 11

    def __init__(self, message: str, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report


class OverLimitError(BatchscoreError):
    """`batchscore plan` found the job over a limit it was given (time or tokens): a
    scheduler's signal not to start the run now."""

    exit_code = 12


class IncompleteError(BatchscoreError):
    """`batchscore status --check`: the output is not complete for the job as given, for a
    scheduler to gate the next step on without parsing the status."""

    exit_code = 13


class LockHeldError(BatchscoreError):
    """Another run of the same job holds the output folder's lock (EX_TEMPFAIL: try again later)."""

    exit_code = 75


# What became of stdout, decided at the process's end (`batchscore.observe.streams.answered`),
# for a command whose product is what it prints (status, plan, validate, check, --json, --help):
WRITE_FAILED = 74  # EX_IOERR (sysexits.h): stdout could not be written, closed or the disk full
BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader left (`| head -1`), as a shell reports SIGPIPE

EXIT_CODES: dict[int, str] = {
    0: "every input row is committed",
    1: "internal error (a bug: please report it with the message)",
    JobError.exit_code: "bad command line or job file; nothing was scored",
    InputDataError.exit_code: "an input shard could not be read, or too many rows were bad; "
    "everything else was committed (run-batch: not one request could be served, every result "
    "line an error)",
    ModelError.exit_code: "the model could not be found or loaded (fetch: the hub has no such "
    "model or revision, or HF_HUB_OFFLINE forbids the network)",
    OutputConflictError.exit_code: "the output folder holds work from another job or "
    "configuration, or a file batchscore did not write where a chunk's output goes",
    WriteError.exit_code: "an output chunk or checkpoint could not be written (disk full, "
    "permissions, or a symbolic link inside the output folder)",
    TransientIOError.exit_code: "reading input, or fetching a model, failed transiently (I/O "
    "error, the hub out of reach); run again later",
    QualityGateError.exit_code: "the precision fails its quality gate against fp32; nothing scored",
    EngineError.exit_code: "the Ray cluster could not be reached, or its model actors kept dying",
    BookkeepingError.exit_code: "a bookkeeping file of the output folder is damaged beyond what "
    "the data files prove (--restart starts over), or is not a file batchscore wrote (remove it)",
    MetricsError.exit_code: "every row is committed, but the --metrics-file could not be written",
    OverLimitError.exit_code: "plan: the job is over a --max-wall-s or --max-tokens limit",
    IncompleteError.exit_code: "status --check: the output is not complete for the job as given",
    WRITE_FAILED: "stdout could not be written (closed, or the disk full) by a command whose "
    "product is what it prints: validate, status, plan, check, models, report --json, fetch "
    "--json, --help, --version",
    LockHeldError.exit_code: "another run of the same job is still running",
    129: "stopped by SIGHUP; committed chunks are kept, the next run resumes",
    130: "interrupted (Ctrl-C); committed chunks are kept",
    BROKEN_PIPE: "the reader of stdout left before the printed product ended (`| head -1`)",
    143: "stopped by SIGTERM; committed chunks are kept, the next run resumes",
}
