"""What "auto" measured on this machine, kept across output folders and runs.

A precision's speed relative to fp32 depends on the model, the task, the window, the device and
the torch build, not on which folder the output goes to or which rows it scores. So each
precision "auto" tries is kept here as a ratio to fp32 measured side by side (with its load and
calibration costs), keyed by all of those. A later job then weighs that precision by what this
machine measured instead of by the device's guess; fp32 itself is timed afresh by every run's
gate pass, so a cache written on a busy machine never sets an absolute speed, and every run that
tries a precision measures it again and replaces what is kept.

The folder is the user's cache (``$XDG_CACHE_HOME/batchscore``), or one named for a process
(``$BATCHSCORE_CACHE_DIR``) or a job (`[quality].cache_dir`), so that a volume mounted into
fresh containers, or a file baked into an image (`batchscore check --export`), carries decisions
from run to run. The cache only saves time: one that is missing, unreadable, read-only or holds
entries that do not validate is a warning and a cold run, never an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import platform
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from batchscore.errors import WriteError
from batchscore.files import Refused, read_shared, writable_by_others
from batchscore.storage.disk import write_json
from batchscore.threads import available_cores

log = logging.getLogger("batchscore")
FILE = "decisions.json"
# read at most this much: an entry is a few hundred bytes, so this is tens of thousands of
# models, and a file past it (or a device that reads without end) is not a cache
MAX_BYTES = 16 << 20
FORMAT = 2  # entries of an older layout do not validate, and are measured again


@dataclass(frozen=True)
class Measured:
    """One precision of a model, as this machine measured it."""

    speedup: float  # its padded tokens per second over fp32's, measured side by side
    load_s: float  # loading the model at it, calibration left out
    calibrate_s: float = 0.0  # int8's calibration, seconds per 1,000 padded tokens of sample


@dataclass(frozen=True)
class Evidence:
    """What the quality gate saw of one precision on one job's rows (`evidence_key`), in every
    new output folder so far: a warm run checks a spot sample against it rather than scoring
    the whole gate again (`batchscore.measure.rounds`)."""

    rows: int  # rows scored beside fp32, every one on the right side of its threshold
    worst: float  # the smallest margin among them (1: as fp32, 0: at the threshold)


@dataclass(frozen=True)
class Entry:
    """Everything kept for one cache key."""

    measured: dict[str, Measured] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)  # precision -> why it cannot run
    measured_at: str = ""
    # "precision | job digest" -> the gate's evidence; entries written before it have none
    evidence: dict[str, Evidence] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def parse(cls, data: Any) -> Entry:
        """An entry as `to_json` wrote it; `ValueError` saying what is wrong otherwise."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not an entry of format {FORMAT}")
        measured, unusable = data.get("measured", {}), data.get("unusable", {})
        if not isinstance(measured, dict) or not isinstance(unusable, dict):
            raise ValueError('"measured" and "unusable" must be objects')
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in unusable.items()):
            raise ValueError('"unusable" must map precisions to reasons')
        evidence = data.get("evidence", {})
        if not isinstance(evidence, dict):
            raise ValueError('"evidence" must be an object')
        return cls(
            {name: measurement(name, value) for name, value in measured.items()},
            dict(unusable),
            str(data.get("measured_at", "")),
            {str(key): seen(key, value) for key, value in evidence.items()},
        )


def seen(key: str, value: Any) -> Evidence:
    """One validated `Evidence`: a positive count of rows and a margin from 0 to 1."""
    if not isinstance(value, dict) or set(value) != {"rows", "worst"}:
        raise ValueError(f"evidence {key}: expected rows and worst")
    rows, worst = value["rows"], value["worst"]
    if type(rows) is not int or rows < 1 or type(worst) not in (int, float):
        raise ValueError(f"evidence {key}: rows must be a positive whole number, worst a number")
    if not 0 <= worst <= 1:
        raise ValueError(f"evidence {key}: worst must lie from 0 to 1")
    return Evidence(rows, float(worst))


def measurement(name: str, value: Any) -> Measured:
    """One validated `Measured`: finite, non-negative numbers, a positive speedup."""
    if not isinstance(value, dict) or set(value) - {"speedup", "load_s", "calibrate_s"}:
        raise ValueError(f"{name}: expected speedup, load_s and calibrate_s")
    numbers = {k: v for k, v in value.items() if type(v) in (int, float) and math.isfinite(v)}
    if numbers.keys() != value.keys() or any(v < 0 for v in numbers.values()):
        raise ValueError(f"{name}: every value must be a finite number >= 0")
    if numbers.get("speedup", 0) <= 0 or "load_s" not in numbers:
        raise ValueError(f"{name}: needs a positive speedup and a load_s")
    return Measured(**numbers)


def cache_folder(environ: Mapping[str, str], job_folder: str | None = None) -> Path:
    """Where decisions live: the job's `[quality].cache_dir`, else ``$BATCHSCORE_CACHE_DIR``,
    else the user's ``$XDG_CACHE_HOME/batchscore`` (``~/.cache`` by default). The command line
    and the Python API pass their environment in."""
    if job_folder:
        return Path(job_folder).expanduser()
    if environ.get("BATCHSCORE_CACHE_DIR"):
        return Path(environ["BATCHSCORE_CACHE_DIR"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "batchscore"


def device_label(device: torch.device) -> str:
    """The hardware a measurement holds for: the GPU's name, or the CPU's model and the cores
    this process may use."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu {name} x{available_cores()}"


def cache_key(
    *, model_files: str, task: str, max_length: Any, device: torch.device, runtime: str = ""
) -> str:
    """One line that names everything a cached decision depends on."""
    parts = [model_files[:16], task, f"max_length={max_length}", device_label(device)]
    return " | ".join([*parts, f"torch {torch.__version__}", *([runtime] if runtime else [])])


ADVICE = (
    ": make the cache folder and its decisions.json yours and writable only by you, or name "
    "another folder ([quality].cache_dir, BATCHSCORE_CACHE_DIR)"
)


class DecisionCache:
    """`decisions.json` in ``folder`` (None: no cache, every run measures)."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / FILE if folder is not None else None
        # a run reads the cache more than once (to choose, then to learn): a problem is said once
        self.said: set[str] = set()

    def warn_once(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            log.warning(message)

    def raw(self) -> dict[str, Any]:
        """The file's entries as they are, by key; unreadable or untrusted is empty, with a
        warning."""
        if self.path is None or self.untrusted(self.path.parent):
            return {}
        try:
            text = read_shared(
                self.path, MAX_BYTES, lambda info: writable_by_others(info, folder=False)
            )
            if text is None:
                return {}
            data = json.loads(text)
        except Refused as exc:
            self.warn_once(f"{exc}; not read, measuring again{ADVICE if exc.vetted else ''}")
            return {}
        except (OSError, ValueError) as exc:
            self.warn_once(f"{self.path}: unreadable ({exc}); measuring again")
            return {}
        if not isinstance(data, dict):
            self.warn_once(f"{self.path}: not a JSON object; measuring again")
            return {}
        return data

    def untrusted(self, folder: Path) -> bool:
        """Whether another user could change the cache ``folder`` (said once); one that is not
        there yet is made by this user. A file in a trusted folder that is not to be read
        (someone else's, a link, a FIFO) is replaced by this user's own when the run keeps
        what it measured."""
        try:
            problem = writable_by_others(folder.stat(), folder=True)
        except OSError:
            return False
        if problem:
            self.warn_once(f"{folder}: {problem}; not read, measuring again{ADVICE}")
        return problem is not None

    def get(self, key: str) -> Entry | None:
        """The entry for ``key``; one that does not validate is ignored, with a warning."""
        entry, problem = self.lookup(key)
        if problem is not None:
            self.warn_once(
                f"{self.path}: the entry for this model does not validate ({problem}); "
                "measuring again"
            )
        return entry

    def lookup(self, key: str) -> tuple[Entry | None, str | None]:
        """The entry for ``key`` (None where there is none or it does not validate), and why
        it does not validate."""
        entries = self.raw()
        if key not in entries:
            return None, None
        try:
            return Entry.parse(entries[key]), None
        except ValueError as exc:
            return None, str(exc)

    def put(self, key: str, entry: Entry) -> None:
        """Keep ``entry`` for ``key``; a cache that cannot be written is a warning, not an error."""
        if self.path is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kept = Entry(entry.measured, entry.unusable, stamp, entry.evidence)
        entries = {**self.raw(), key: kept.to_json()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.untrusted(self.path.parent):
                return  # nothing kept where someone else could change it
            write_json(self.path, entries)
        except (OSError, WriteError) as exc:
            log.warning("%s: cannot keep what was measured: %s", self.path, exc)

    def learn(
        self, key: str, measured: dict[str, Measured], unusable: dict[str, str] | None = None
    ) -> None:
        """Replace what is kept for the precisions just measured; keep the others. An entry
        that does not validate (an older batchscore's) is replaced even when nothing was
        measured, so the next run neither warns nor measures again for it."""
        entry, problem = self.lookup(key)
        if not measured and not unusable and problem is None:
            return
        entry = entry or Entry()
        self.put(
            key,
            Entry(
                {**entry.measured, **measured},
                {**entry.unusable, **(unusable or {})},
                evidence=entry.evidence,
            ),
        )

    def note(self, key: str, evidence: Mapping[str, Evidence | None]) -> None:
        """Keep what the quality gate saw (`Evidence`, by `evidence_key`) beside the rest; a
        key given None is forgotten."""
        if not evidence:
            return
        entry = self.get(key) or Entry()
        kept = {k: v for k, v in {**entry.evidence, **evidence}.items() if v is not None}
        if kept != entry.evidence:
            self.put(key, dataclasses.replace(entry, evidence=kept))

    def export(self, key: str, path: Path) -> Entry:
        """Write the entry for ``key`` alone, as a `decisions.json` that a build step can place
        in an image's cache folder (an empty one where only fp32 runs here)."""
        entry = self.get(key) or Entry()
        write_json(path, {key: entry.to_json()})
        return entry


def open_cache(environ: Mapping[str, str] | None, job_folder: str | None) -> DecisionCache | None:
    """The cache a recipe keeps what it measures in: in `cache_folder` of the environment its
    front door passes in (the command line's, the Python caller's). None without one (a
    library call that names none): nothing is kept, and every new output folder measures."""
    if environ is None:
        return None
    return DecisionCache(cache_folder(environ, job_folder))
