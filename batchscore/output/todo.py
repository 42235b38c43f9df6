"""The work a run has to do: by shard, or (`[input].increments = "rows"`) by row."""

from __future__ import annotations

from batchscore.job.sections import InputConfig
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.increments import pending_rows
from batchscore.output.neighbours import check_columns
from batchscore.output.pending import Pending, pending_work
from batchscore.output.rewrite import finish_rewrites
from batchscore.work.units import Shard


def to_do(
    inp: InputConfig,
    *,
    kinds: dict[str, str],
    chunk_rows: int,
    shards: list[Shard],
    ckpt: Checkpoint,
    fingerprint: str,
    forget: bool = True,
    label: str = "",
) -> Pending:
    """The pending chunks (`pending_work` by shard, `pending_rows` by row, the same plan);
    ``forget=False`` (a dry run) changes nothing on disk; ``label`` names a run's increment.
    A Delta table that no longer takes batchscore's files is refused before anything changes
    (`batchscore.output.neighbours.check_columns`); a rewrite by rows that a killed run left
    is finished first, whichever way this run goes."""
    if forget:
        check_columns(ckpt)
        finish_rewrites(ckpt)
    if inp.by_rows:
        return pending_rows(
            inp,
            kinds=kinds,
            chunk_rows=chunk_rows,
            shards=shards,
            ckpt=ckpt,
            fingerprint=fingerprint,
            forget=forget,
            label=label,
        )
    return pending_work(
        inp,
        kinds=kinds,
        chunk_rows=chunk_rows,
        shards=shards,
        ckpt=ckpt,
        fingerprint=fingerprint,
        forget=forget,
    )
