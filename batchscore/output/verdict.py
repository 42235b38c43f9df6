"""Whether a job's output is complete: the bad-row gate over the whole job, and `_SUCCESS`.

The gate counts rows recorded with an error across every run of the job, against the job's
total input rows (known from the footers): a run stops early only once failure is certain (the
bad rows already exceed the limit times the total, however the rest turns out), and fails at
the end whenever the job's share is over, so a re-run of a failed job fails again until the
input or the limit changes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from batchscore.errors import BadRowsError
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.manifest import is_ours, success_text
from batchscore.storage.layout import REJECTED

log = logging.getLogger("batchscore")


def bad_share_error(
    bad_by_shard: dict[str, int], *, total: int, limit: float, ckpt: Checkpoint
) -> BadRowsError | None:
    """The gate's verdict: an error when the job's bad rows exceed ``limit`` of ``total``."""
    bad = sum(bad_by_shard.values())
    if not bad or bad <= limit * total:
        return None
    worst = sorted(((n, s) for s, n in bad_by_shard.items() if n), reverse=True)[:3]
    shown = ", ".join(f"{Path(shard).name} ({count:,})" for count, shard in worst)
    return BadRowsError(
        f"{bad:,} of the job's {total:,} input rows failed ({bad / max(total, 1):.1%}), above "
        f"[output].max_bad_share = {limit}; most in {shown}; each row's error is listed in "
        f"{ckpt.store.where(REJECTED)}. Fix the input, or raise the limit"
    )


def mark_complete(ckpt: Checkpoint, job_name: str) -> None:
    """Write `_SUCCESS` (the Hadoop convention schedulers poll for): every input row is
    committed. Another writer's `_SUCCESS` is left as it is, with a warning."""
    present = ckpt.success()
    if present is not None and not is_ours(present):
        log.warning("%s: a _SUCCESS batchscore did not write is there; left as it is", ckpt.output)
    elif present is None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ckpt.mark_success(success_text(job_name, when))
