"""What "auto" measured on this machine, kept in the user's cache folder across output folders.

Timing every precision (and every token budget) costs seconds of model time; the answer depends
on the model, the task, the window, the device and the torch build, not on which folder the
output goes to. So it is measured once per machine and kept here, keyed by all of those. The
quality gate still runs on every output folder's first run, with that job's own rows: a cached
precision that fails it is measured again.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from batchscore.errors import WriteError
from batchscore.pipeline.threads import available_cores
from batchscore.storage.local import write_json

log = logging.getLogger("batchscore")
FILE = "decisions.json"


def user_cache_folder(environ: Mapping[str, str]) -> Path:
    """Where this user's decisions live: ``$XDG_CACHE_HOME/batchscore`` (``~/.cache`` by
    default). The command line and the Python API pass their environment in."""
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


class DecisionCache:
    """`decisions.json` in ``folder`` (None: no cache, every run measures)."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / FILE if folder is not None else None

    def all(self) -> dict[str, Any]:
        """Every cached decision, by key; an unreadable cache is an empty one (it only saves
        time, it never decides what a run writes)."""
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); measuring again", self.path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.all().get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` for ``key``; a cache that cannot be written is a warning, not an error."""
        if self.path is None:
            return
        entries = self.all()
        entries[key] = {**entry, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, entries)
        except (OSError, WriteError) as exc:
            log.warning("%s: cannot keep the measured decision: %s", self.path, exc)
