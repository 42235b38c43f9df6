"""Where a run's time went: its wall time split into phases that follow one another.

    start-up    the process, from its start to the run's (imports, reading the job file)
    preparing   the lock, the claim, finding what is still to score
    measuring   what the job left to measurement costs beyond its own work: the quality gate's
                passes and loads that the run does not keep, trials, int8's calibration, the
                budget's probe (the gate pass whose model and results the run adopts is the
                run's own loading and scoring, and is counted there)
    loading     the model the run scores with
    scoring     reading, scoring and committing, side by side
    finishing   the writer's last commits, the verdict, the report

A first run on a fresh machine is judged by these: "measuring" is what a cold cache costs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PHASES = ("start-up", "preparing", "measuring", "loading", "scoring", "finishing")


def process_start() -> float | None:
    """When this process started (seconds since the epoch), from the kernel's own record (it
    counts the interpreter's start and every import): its age is the time since boot less the
    boot-relative tick it started at. None where /proc does not say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age if age >= 0 else None


@dataclass
class Block:
    """One timed block of a phase: its seconds, once it has ended."""

    seconds: float = 0.0


class Clock:
    """A run's phases as it goes: ``with clock.phase("loading"):`` adds the block's seconds to
    the phase (when it ends without an error: a run that stops mid-phase leaves it out), and
    `move` puts seconds one phase spent on another's work where they belong."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases  # the run's own record (`RunStats.phases`), filled in place

    @contextmanager
    def phase(self, name: str) -> Iterator[Block]:
        block = Block()
        started = time.perf_counter()
        yield block
        block.seconds = time.perf_counter() - started
        self.phases[name] = self.phases.get(name, 0.0) + block.seconds

    def add(self, name: str, seconds: float) -> None:
        """Seconds spent in ``name`` outside any block (the process's start-up)."""
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def move(self, seconds: float, source: str, to: str) -> None:
        """Count ``seconds`` timed under ``source`` under ``to`` instead (``source`` never
        goes below zero)."""
        self.phases[source] = max(self.phases.get(source, 0.0) - seconds, 0.0)
        self.add(to, seconds)


def split(phases: dict[str, float], wall_s: float) -> dict[str, float]:
    """The run's phases in order, "finishing" being what the others leave of the wall time."""
    timed = {name: round(phases[name], 3) for name in PHASES if name in phases}
    within = sum(v for k, v in timed.items() if k != "start-up")
    timed["finishing"] = round(max(wall_s - within, 0.0), 3)
    return timed


def describe(phases: dict[str, float]) -> str:
    """One line: each phase's seconds, in order."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
