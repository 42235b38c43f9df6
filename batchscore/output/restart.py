"""``--restart``: remove what batchscore wrote in an output folder and start over, resumably.

What a restart removes is listed first, in ``_batchscore/restart.json`` (written whole, then
renamed into place); only then is it removed: the commit records first (from then on nothing
is committed), then the data files they named, the rejected-row lists, the kept output of
gone shards, the measured settings and the claim. A run killed anywhere in between leaves the
list behind, and the next start, whatever it was asked to do, finishes it before it reads
anything else, so a folder is never left half cleared with batchscore's own files blocking
every later run. Files batchscore did not write are never listed: a data file is listed when a
commit record names it, or when its footer says batchscore wrote it for the chunk its name
says (a crashed attempt, or one a restart of an older version left); `_SUCCESS` is removed
only when batchscore wrote it. Run reports stay: they are the folder's history.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any

from batchscore import faults
from batchscore.errors import BookkeepingError
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.manifest import written_for
from batchscore.output.retire import retirements
from batchscore.storage.layout import (
    DONE,
    GONE,
    JOB,
    REJECTED,
    RESTART,
    SETTLED,
    part_key,
    part_name,
)

log = logging.getLogger("batchscore")


def start_over(ckpt: Checkpoint) -> None:
    """List what batchscore wrote here, then remove it (see the module's note)."""
    ckpt.sweep()
    plan = listing(ckpt)
    ckpt.write_json(RESTART, plan)
    carry_out(ckpt, plan)


def finish_restart(ckpt: Checkpoint, *, restarting: bool) -> None:
    """Finish a restart a killed run left half done. A list too damaged to read proves
    nothing: a new ``--restart`` lists the folder again, any other run stops (exit 10)."""
    try:
        plan = ckpt.read_json(RESTART, ("records", "files"))
    except Damaged as exc:
        if restarting:
            log.warning("%s; the folder is listed again", exc)
            return
        raise BookkeepingError(
            f"{exc}: it lists what an interrupted --restart was removing; run with --restart "
            "to finish starting over (files batchscore did not write are kept)"
        ) from None
    if plan is not None:
        log.warning("finishing the --restart that a killed run left half done")
        carry_out(ckpt, plan)


def listing(ckpt: Checkpoint) -> dict[str, Any]:
    """Every file batchscore wrote here that a restart removes, the records apart."""
    store = ckpt.store
    files = sorted(part_name(key) for key in ckpt.committed())
    for name in sorted(set(store.names("")) - set(files)):  # unrecorded: the footer tells
        key = part_key(name)
        if key is not None and written_for(store, name).get("batchscore.chunk") == key:
            files.append(name)  # a crashed attempt's, or named by a record too damaged to read
    files += [f"{REJECTED}/{name}" for name in store.names(REJECTED)]
    for rel, plan in retirements(ckpt):
        files += [target for _, target in plan["moves"]] + [rel]
    files += [f"{GONE}/{name}" for name in fnmatch.filter(store.names(GONE), "*.json")]
    records = sorted(f"{DONE}/{name}" for name in store.names(DONE))
    return {"records": records, "files": [*dict.fromkeys(files), SETTLED, JOB]}


def carry_out(ckpt: Checkpoint, plan: dict[str, Any]) -> None:
    """Remove what ``plan`` lists that is still there, records first, then the list itself."""
    store = ckpt.store
    for rel in plan["records"]:
        store.delete(rel)
    store.barrier(DONE)
    faults.hit("restart-unrecorded")
    for rel in plan["files"]:
        store.delete(rel)
    ckpt.drop_success()
    ckpt.damaged.clear()
    store.barrier("")
    store.delete(RESTART)
