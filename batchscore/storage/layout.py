"""Every name batchscore gives a file or folder in an output folder, in one place.

Data files sit at the top (``part-<shard key>-<chunk>.parquet``) with ``_SUCCESS`` beside them
once the output is complete; everything else lives under ``_batchscore/``, which dataset readers
skip by its leading underscore, and none of it ends in ``.parquet``, so a ``**/*.parquet`` glob
(DuckDB, polars) sees data files only: the output of a shard that left the input is kept under
``_batchscore/gone/``, its data files' names ending ``.parquet.gone``. A name is never made
from raw input strings: a shard's key is a digest of its path, so adding, removing or renaming
one shard leaves every other shard's names alone.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

STATE = "_batchscore"  # bookkeeping folder inside an output
JOB = f"{STATE}/job.json"  # the job that claimed the folder: inputs and fingerprint
DONE = f"{STATE}/done"  # one commit record per chunk: the manifest of data files
WRITING = f"{STATE}/writing"  # one intent per data file being published
RUNS = f"{STATE}/runs"  # one report per run
REJECTED = f"{STATE}/rejected"  # rows recorded with an error, per chunk (JSON lines)
SETTLED = f"{STATE}/settled.json"  # what an earlier run measured and chose
GONE = f"{STATE}/gone"  # the output of shards that left the input: one folder per retirement
KEYS = f"{STATE}/keys"  # a Delta table's: each committed chunk's ids (and row hashes), per chunk
# an Iceberg table's SQL catalog (SQLite) when the job names none; an object-store output keeps
# it beside its lock, on this machine (`catalog_file`)
CATALOG = f"{STATE}/iceberg.db"
RESTART = f"{STATE}/restart.json"  # the files a --restart removes, until it has removed them
STAGING = f"{STATE}/tmp"  # temporary files, renamed into place when complete
LOCK = f"{STATE}/lock"  # the file whose flock guards the folder
SUCCESS = "_SUCCESS"  # the Hadoop convention: present when every input row is committed
MAX_REPORTS = 100  # run reports kept; older ones are pruned
PIECE_ROWS = 10**15  # shard rows a piece's name can start at (`piece_key`)
GONE_SUFFIX = ".gone"  # a kept data file's name ends so, out of every `**/*.parquet` glob
CHUNK_NAME = re.compile(r"part-[0-9a-f]{16}-[0-9]{5,}\.parquet")  # see `part_name`
# A chunk key (`chunk_key`), or an older version's (its shard's place: "00003-00000"), and a
# moment (`stamp`): what the names batchscore gives its bookkeeping files are made of. A file
# in `_batchscore/` whose name is not of its folder's form is someone else's: never deleted.
KEY = r"(?:[0-9a-f]{16}|[0-9]{5,})-[0-9]{5,}"
STAMP = r"[0-9]{8}T[0-9]{6}(?:\.[0-9]{6})?Z-[0-9]+"
DATA_NAME = re.compile(rf"part-{KEY}\.parquet")  # a chunk's data file, this version's or older
OWN_NAMES = {
    DONE: re.compile(rf"{KEY}\.json"),  # commit records (`record_name`)
    WRITING: re.compile(rf"{KEY}\.json"),  # intents (`intent_name`)
    REJECTED: re.compile(rf"{KEY}\.jsonl|part-{KEY}\.parquet"),  # an older version's, too
    GONE: re.compile(rf"{STAMP}\.json"),  # retirement plans (`retirement_name`)
    RUNS: re.compile(rf"{STAMP}\.json"),  # run reports (`report_name`)
    KEYS: re.compile(rf"{KEY}\.arrow"),  # a chunk's keys (`keys_name`)
}
KEPT_NAME = re.compile(rf"{STAMP}/(?:part-{KEY}\.parquet\.gone|{KEY}\.jsonl?)")  # `kept_name`
# every fixed name: none of them may be a symbolic link (see `batchscore.storage.disk`)
FIXED = (
    STATE,
    JOB,
    DONE,
    WRITING,
    RUNS,
    REJECTED,
    SETTLED,
    GONE,
    KEYS,
    CATALOG,
    RESTART,
    STAGING,
    LOCK,
    SUCCESS,
)


def shard_key(path: str) -> str:
    """A shard's part of its chunks' names: a digest of its path (absolute, or its URL)."""
    return hashlib.sha256(path.encode()).hexdigest()[:16]


def chunk_key(shard: str, chunk: int) -> str:
    """A chunk's key: its shard's key and its number within the shard."""
    return f"{shard}-{chunk:05d}"


def shard_of(key: str) -> str:
    """The shard key a chunk key starts with."""
    return key.rsplit("-", 1)[0]


def successor_key(key: str, retirement: str) -> str:
    """The key of the file that replaces chunk ``key``'s once a retirement (``retirement``:
    its plan or folder) took some of its rows, where a file is never rewritten in place (a
    Delta table's log names each file once, with its size and rows): a digest of both, and the
    chunk's own number, so every name check that knows chunk keys knows it."""
    return chunk_key(shard_key(f"{key}@{retirement}"), int(key.rsplit("-", 1)[1]))


def piece_key(key: str, start: int) -> str:
    """The key of a piece of chunk ``key``: its rows from shard row ``start`` on, committed
    before the rest of the chunk was scored (`[output].commit_s`). The chunk's own key and
    the start as 15 digits, so every name check that knows chunk keys knows it, its shard's
    key is the chunk's, and two pieces of a shard never share a name (a chunk's number has
    at least 5 digits: the start is the last 15)."""
    if not 0 <= start < PIECE_ROWS:
        raise ValueError(f"a piece cannot start at row {start}")
    return f"{key}{start:015d}"


def part_name(key: str) -> str:
    """The data file of a chunk."""
    return f"part-{key}.parquet"


def is_part_name(name: str) -> bool:
    """Whether a file name has the form batchscore gives data files (not that it wrote it)."""
    return name.startswith("part-") and name.endswith(".parquet")


def is_chunk_name(name: str) -> bool:
    """Whether a file name is exactly one batchscore gives a chunk's data file."""
    return CHUNK_NAME.fullmatch(name) is not None


def part_key(name: str) -> str | None:
    """The chunk key a data file's name holds, or None when the name is not a data file's."""
    return name[len("part-") : -len(".parquet")] if is_part_name(name) else None


def record_name(key: str) -> str:
    """The commit record of a chunk."""
    return f"{DONE}/{key}.json"


def intent_name(key: str) -> str:
    """The intent written just before a chunk's data file is published."""
    return f"{WRITING}/{key}.json"


def keys_name(key: str) -> str:
    """A chunk's keys in a Delta table's folder: its rows' ids (and hashes, by rows), which
    outlive its data file once another writer rewrote it (`batchscore.output.keys`)."""
    return f"{KEYS}/{key}.arrow"


def keys_key(rel: str) -> str | None:
    """The chunk whose keys ``rel`` is (None: not a keys file batchscore names)."""
    folder, _, name = rel.rpartition("/")
    return name.removesuffix(".arrow") if folder == KEYS and is_own_name(KEYS, name) else None


def catalog_file(lock_path: Path) -> Path:
    """Where an Iceberg table's own SQL catalog lives: beside the output's lock (in
    ``_batchscore/`` for a local folder, `CATALOG`; in this machine's private folder for an
    object store, where SQLite cannot write)."""
    return lock_path.with_name(CATALOG.rsplit("/", 1)[1])


def rejected_name(key: str) -> str:
    """The listing of a chunk's rows recorded with an error."""
    return f"{REJECTED}/{key}.jsonl"


def staged_name(rel: str, pid: int) -> str:
    """The staging file (one folder, flat) that becomes ``rel`` when published."""
    return f"{rel.replace('/', '_')}.{pid}.tmp"


def stamp(started: float, pid: int) -> str:
    """A moment and a process as a name: UTC to the microsecond, so names sort oldest first."""
    second, fraction = divmod(started, 1)
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(second))}.{int(fraction * 1e6):06d}Z-{pid}"


def report_name(started: float, pid: int) -> str:
    """A run report, named by the run's start (two runs in one second keep two reports)."""
    return f"{RUNS}/{stamp(started, pid)}.json"


def retirement_name(started: float, pid: int) -> str:
    """The plan and record of one retirement (the output of shards that left the input, moved
    out of the data files); what it moved lies in the folder of the same name."""
    return f"{GONE}/{stamp(started, pid)}.json"


def kept_name(retirement: str, rel: str) -> str:
    """Where a retirement keeps ``rel`` (a data file, a commit record, a rejected-rows list):
    in its own folder, flat, a data file's name ending in `GONE_SUFFIX`."""
    name = rel.rsplit("/", 1)[-1]
    return f"{retirement.removesuffix('.json')}/{name}{GONE_SUFFIX if is_part_name(name) else ''}"


def is_own_name(folder: str, name: str) -> bool:
    """Whether ``name``, in the bookkeeping folder ``folder`` (`DONE`, `WRITING`, `REJECTED`,
    `GONE`, `RUNS`, `KEYS`), has the form batchscore gives the files it writes there."""
    return OWN_NAMES[folder].fullmatch(name) is not None


def own_names(folder: str, names: list[str]) -> list[str]:
    """Those of ``names`` (files in ``folder``) that batchscore names so (`is_own_name`)."""
    return [name for name in names if is_own_name(folder, name)]


def is_kept_move(retirement: str, source: str, target: str) -> bool:
    """Whether a retirement plan's move is one batchscore plans (`retirement_name`'s folder):
    a chunk's data file, rejected rows or commit record, to `kept_name`. A plan that lists
    anything else was not written by batchscore, and nothing it names is moved or deleted."""
    folder, _, name = source.rpartition("/")
    if folder == "":
        own = DATA_NAME.fullmatch(name) is not None
    else:
        own = folder in (DONE, REJECTED) and is_own_name(folder, name)
    return own and target == kept_name(retirement, source)


def is_own_file(rel: str) -> bool:
    """Whether ``rel`` is a path batchscore gives a file it writes in an output folder (what a
    ``--restart`` may list for removal): a data file, a bookkeeping file in its folder, a
    retirement's kept file, the measured settings or the job record."""
    if rel in (SETTLED, JOB):
        return True
    folder, _, name = rel.rpartition("/")
    if folder == "":
        return DATA_NAME.fullmatch(name) is not None
    if folder in OWN_NAMES:
        return is_own_name(folder, name)
    return rel.startswith(f"{GONE}/") and KEPT_NAME.fullmatch(rel[len(GONE) + 1 :]) is not None
