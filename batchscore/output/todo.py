"""The work a run has to do, by shard or (`[input].increments = "rows"`) by row: a plan, read
only.

`to_do` reads the input's footers, the commit records, the data files' footers and a
table's log, and writes nothing: `batchscore plan`, `status` and `validate` call it alone, and
a folder a killed run left half changed reads as it stands (a run finishes that first:
`batchscore.output.apply.recover`). A run carries the plan out (`batchscore.output.apply`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from batchscore.output.checkpoint import Checkpoint
from batchscore.output.increments import plan_rows
from batchscore.output.pending import plan_room, plan_shards
from batchscore.output.survey import Plan, Survey, TableWork
from batchscore.storage.layout import part_name


def to_do(ckpt: Checkpoint, survey: Survey) -> Plan:
    """The plan of work (`plan_shards` by shard, `plan_rows` by row, the same plan), with the
    room its new files need and a table's reconciliation (`Plan`)."""
    plan = plan_rows(ckpt, survey) if survey.inp.by_rows else plan_shards(ckpt, survey)
    leaving = {k: r for k, r in plan.records.items() if k in plan.leaving}
    out = set(plan.uncommit)
    # the files a run moves or removes before it makes room: not in the way
    removed = {part_name(k) for k in leaving} | {
        part_name(k) for k in out if plan.records[k]["file"] == part_name(k)
    }
    holding = {k: r for k, r in plan.records.items() if k not in out and k not in leaving}
    return dataclasses.replace(
        plan,
        room=plan_room(ckpt.store, plan.chunks, survey.fingerprint, removed=removed),
        table=table_work(ckpt, plan.records, holding),
    )


def table_work(
    ckpt: Checkpoint, records: Mapping[str, dict[str, Any]], holding: Mapping[str, dict[str, Any]]
) -> TableWork:
    """What making the output format's log one with the ``holding`` records does (nothing for
    a folder of files); see `batchscore.output.neighbours.backfill` and `reconcile`."""
    table = ckpt.format
    kept = table.kept() if table.id_column is not None else set(records)
    backfill = frozenset(
        key
        for key, record in records.items()
        if key not in kept and ckpt.store.size(record["file"]) is not None
    )
    stray, missing = table.out_of_step(set(holding))
    return TableWork(backfill, stray=frozenset(stray), missing=frozenset(missing))
