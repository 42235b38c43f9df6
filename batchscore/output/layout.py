"""Every name batchscore gives a file or folder in an output folder, in one place.

Data files sit at the top (``part-<chunk key>.parquet``); everything else lives under
``_batchscore/``, which dataset readers skip by its leading underscore. A name is never made from
raw input strings: a chunk key is built from numbers the job derives itself.
"""

from __future__ import annotations

import time

STATE = "_batchscore"  # bookkeeping folder inside an output
JOB = f"{STATE}/job.json"  # the job that owns the folder: name and fingerprint
DONE = f"{STATE}/done"  # one commit record per chunk
RUNS = f"{STATE}/runs"  # one report per run
REJECTED = f"{STATE}/rejected"  # rows recorded with an error, per chunk
SETTLED = f"{STATE}/settled.json"  # what an earlier run measured and chose
STAGING = f"{STATE}/tmp"  # temporary files, renamed into place when complete
LOCK = f"{STATE}/lock"  # the file whose flock guards the folder


def shard_key(index: int) -> str:
    """A shard's part of its chunks' keys: its place in sorted path order."""
    return f"{index:05d}"


def chunk_key(shard: str, chunk: int) -> str:
    """A chunk's key: its shard's key and its number within the shard."""
    return f"{shard}-{chunk:05d}"


def shard_of(key: str) -> str:
    """The shard key a chunk key starts with."""
    return key.rsplit("-", 1)[0]


def part_name(key: str) -> str:
    """The data file of a chunk; sorted names give shards in path order, chunks in row order."""
    return f"part-{key}.parquet"


def record_name(key: str) -> str:
    """The commit record of a chunk."""
    return f"{DONE}/{key}.json"


def rejected_name(key: str) -> str:
    """The listing of a chunk's rows recorded with an error."""
    return f"{REJECTED}/{part_name(key)}"


def staged_name(rel: str, pid: int) -> str:
    """The staging file (one folder, flat) that becomes ``rel`` when published."""
    return f"{rel.replace('/', '_')}.{pid}.tmp"


def report_name(started: float, pid: int) -> str:
    """A run report, named by its UTC start to the microsecond (two runs in one second keep
    two reports) and the process, so names sort oldest first."""
    second, fraction = divmod(started, 1)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(second))
    return f"{RUNS}/{stamp}.{int(fraction * 1e6):06d}Z-{pid}.json"
