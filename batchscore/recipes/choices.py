"""What a run says of its choices: the precision in one plain line, the reasoning behind it
and the budget, device and threads with ``-v``.

The line a run shows by default is what was chosen and what it measured, e.g. ``precision
bf16: 2.60x fp32, cosine min 0.9999 on 256 rows`` (`Chosen.plainly`); the weighing behind it
(each precision tried or not, and why) is the decision's ``why``, kept in the folder's
``settled.json`` and the run report, and said with ``-v``. JSON logs carry both, in the
"precision chosen" event.
"""

from __future__ import annotations

import logging

from batchscore.engines import Engine
from batchscore.job.sections import Job
from batchscore.output.settled import Decision
from batchscore.runtime.device import device_reason, torch_threads

log = logging.getLogger("batchscore")
DETAIL = {"detail": True}  # text logs show it with -v only


def explain(
    job: Job,
    engine: Engine,
    *,
    decision: Decision | None,
    recorded: Decision | None,
    asked: str,
) -> None:
    """Say which precision the run uses, plainly (an event, shown when this run decided it),
    and why (with ``-v``); the budget, device and threads at debug level. ``asked``: the
    job's `[model].precision` as written ("auto", or the one it fixed)."""
    settled = decision or recorded
    if settled is not None:
        plain, why = settled.precision.plainly(asked), settled.precision.why
        if not decision:
            plain += " (settled by the output folder's first run)"
    else:
        plain = "the job's: the reference, nothing to gate"
        why = "the job's [model].precision; fp32 is the reference, so there is nothing to gate"
    event = {"event": "precision chosen", "precision": engine.precision, "why": why}
    log.info("precision %s: %s", engine.precision, plain, extra={**event, "detail": not decision})
    if why != plain:
        log.info("precision %s, why: %s", engine.precision, why, extra=DETAIL)
    budget = "the job's [batching].max_tokens"
    if settled is not None and settled.batching is not None:
        budget = settled.batching.why
    log.debug("max_tokens %s: %s", job.batching.max_tokens, budget)
    log.debug("device %s: %s", engine.device, device_reason(job.model.device))
    if job.engine == "local" and engine.device == "cpu":
        threads = "[model].threads" if job.model.threads else "the cores this process may use"
        log.debug("torch threads %d: %s", torch_threads(), threads)
