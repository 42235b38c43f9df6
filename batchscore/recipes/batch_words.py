"""run-batch's advice in run-batch's own options.

The jobs run-batch runs raise the errors `batchscore run` raises, whose remedies name `run`'s
flags and job keys: ``--restart``, ``--accept-quality``, ``[output].path``, ``[model].path``.
run-batch takes none of these: its jobs' output folders live in the work folder
(``--work-dir``), its model is ``--model``, a job key is set with ``--set``, and a job starts
over when its folder in the work folder is removed. Each error raised and each record logged
while a job is built or run is reworded here, once, so that every remedy it gives is one
run-batch accepts.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from batchscore.errors import BatchscoreError, JobError

log = logging.getLogger("batchscore")

# "run with --restart to discard it and start over", up to the clause's end (a parenthesis
# about which files a restart keeps goes too: removing the job's folder keeps none)
RESTART = re.compile(r"\b([Rr])un with --restart to [^,;]*?(?: \([^)]*\))?(?=[,;]|\.?$)")
WORDS = (  # run's words, and run-batch's
    ("--restart", "restart"),  # "an interrupted --restart": a restart run-batch never makes
    ("--accept-quality", "--set quality.accept=true"),
    ("[output].path", "--work-dir"),
    ("[model].path", "--model"),
    ("[model].name", "--model"),
    (
        "set chat = false and write the model's prompt format in [generate].prompt",
        "/v1/chat/completions needs a model that has one",
    ),
)


def batch_words(message: str, folder: str) -> str:
    """``message`` with the remedies of `run` as run-batch's; ``folder``: the job's own
    folder in the work folder, which removing starts that job over."""

    def remove(found: re.Match[str]) -> str:
        verb = "Remove" if found.group(1) == "R" else "remove"
        return f"{verb} {folder} to start its job over"

    message = RESTART.sub(remove, message)
    message = message.replace("need --restart", f"need {folder} removed")
    for word, ours in WORDS:
        message = message.replace(word, ours)
    return message


class Reworded(logging.Filter):
    """Log records said in run-batch's words (every module logs to the "batchscore" logger)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            said = record.getMessage()
        except (TypeError, ValueError):  # a record whose arguments do not fit: left as it is
            return True
        record.msg, record.args = batch_words(said, self.folder), None
        return True


@contextlib.contextmanager
def in_batch_words(folder: str) -> Iterator[None]:
    """Errors raised and warnings logged within are said in run-batch's words."""
    reworded = Reworded(folder)
    log.addFilter(reworded)
    try:
        yield
    except BatchscoreError as exc:
        exc.args = tuple(batch_words(a, folder) if isinstance(a, str) else a for a in exc.args)
        if isinstance(exc, JobError):
            exc.problems = [batch_words(p, folder) for p in exc.problems]
        raise
    finally:
        log.removeFilter(reworded)
