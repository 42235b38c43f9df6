"""``--restart``: remove what batchscore wrote in an output folder and start over, resumably.

What a restart removes is listed first, in ``_batchscore/restart.json`` (written whole, then
renamed into place); only then is it removed: the commit records first (from then on nothing
is committed), then the data files they named, the rejected-row lists, the kept output of
gone shards, the measured settings and the claim. A run killed anywhere in between leaves the
list behind, and the next start, whatever it was asked to do, finishes it before it reads
anything else, so a folder is never left half cleared with batchscore's own files blocking
every later run. Files batchscore did not write are never listed: a data file is listed when a
commit record names it, or when its footer says batchscore wrote it for the chunk its name
says (a crashed attempt, or one a restart of an older version left); in its own folders,
only files named as batchscore names them (a rejected-rows list, a chunk's keys, a
retirement's plan and what it kept), never every file there. `_SUCCESS` goes first (only
when batchscore wrote it), before the list is written: a folder half cleared never says it is
complete. A file that cannot be removed stops the restart with a `WriteError` naming it (exit
6); the list stays, and the next start finishes it. Run reports stay: they are the folder's
history.
"""

from __future__ import annotations

import logging
from typing import Any

from batchscore import faults
from batchscore.errors import BookkeepingError
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.manifest import written_for
from batchscore.output.neighbours import check_keys
from batchscore.output.retire import retirements
from batchscore.storage.layout import (
    DONE,
    GONE,
    JOB,
    KEYS,
    REJECTED,
    RESTART,
    SETTLED,
    is_own_file,
    own_names,
    part_key,
    part_name,
)

log = logging.getLogger("batchscore")


def start_over(ckpt: Checkpoint) -> None:
    """List what batchscore wrote here, then remove it (see the module's note). In a Delta
    table, the rows of chunks another writer took over leave it by their keys: where some
    have none, the restart is refused before anything changes."""
    check_keys(ckpt.format, ckpt.committed(), "a --restart")
    ckpt.drop_success()
    ckpt.sweep()
    plan = listing(ckpt)
    ckpt.write_json(RESTART, plan)
    carry_out(ckpt, plan)


def finish_restart(ckpt: Checkpoint, *, restarting: bool) -> None:
    """Finish a restart a killed run left half done. A list too damaged to read proves
    nothing: a new ``--restart`` lists the folder again, any other run stops (exit 10)."""
    try:
        plan = ckpt.read_json(RESTART, ("records", "files"))
        if plan is not None:
            check_listing(ckpt, plan)
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


def check_listing(ckpt: Checkpoint, plan: dict[str, Any]) -> None:
    """`Damaged` unless the list names only files batchscore writes (`is_own_file`): an edited
    or planted list removes nothing."""
    records, files = plan["records"], plan["files"]
    if not isinstance(records, list) or not isinstance(files, list):
        raise Damaged(ckpt.store.where(RESTART), "its records or files are not lists")
    for rel, folder in [(r, f"{DONE}/") for r in records] + [(f, "") for f in files]:
        if not (isinstance(rel, str) and rel.startswith(folder) and is_own_file(rel)):
            raise Damaged(ckpt.store.where(RESTART), f"it lists {rel!r}: no file batchscore writes")


def listing(ckpt: Checkpoint) -> dict[str, Any]:
    """Every file batchscore wrote here that a restart removes, the records apart."""
    store = ckpt.store
    files = sorted(part_name(key) for key in ckpt.committed())
    for name in sorted(set(store.names("")) - set(files)):  # unrecorded: the footer tells
        key = part_key(name)
        if key is not None and written_for(store, name).get("batchscore.chunk") == key:
            files.append(name)  # a crashed attempt's, or named by a record too damaged to read
    files += [f"{REJECTED}/{name}" for name in own_names(REJECTED, store.names(REJECTED))]
    files += [f"{KEYS}/{name}" for name in own_names(KEYS, store.names(KEYS))]
    for rel, plan in retirements(ckpt):
        files += [target for _, target in plan["moves"]] + [rel]
    files += [f"{GONE}/{name}" for name in own_names(GONE, store.names(GONE))]
    records = sorted(f"{DONE}/{name}" for name in own_names(DONE, store.names(DONE)))
    files = [rel for rel in dict.fromkeys(files) if is_own_file(rel)]  # a record's odd name
    return {"records": records, "files": [*files, SETTLED, JOB]}


def carry_out(ckpt: Checkpoint, plan: dict[str, Any]) -> None:
    """Remove what ``plan`` lists that is still there: `_SUCCESS` first, then the records,
    then the files, then the list itself. A file that cannot be removed is a `WriteError`
    naming it, and the list stays for the next start."""
    ckpt.drop_success()
    for rel in plan["records"]:
        ckpt.remove(rel)
    ckpt.barrier(DONE)
    faults.hit("restart-unrecorded")
    # every chunk leaves a table's log (by keys, one another writer took over)
    ckpt.format.retire_files(plan["files"])
    for rel in plan["files"]:
        ckpt.remove(rel, fault="restart-remove")
    ckpt.damaged.clear()
    ckpt.barrier("")
    ckpt.remove(RESTART)
