"""Kills that really happen: a state machine's kill step first runs the step traced on the
folder as it is (in this process, counting every fault point it passes, `faults.traced`), puts
the folder back, then kills a real subprocess at a hit the trace saw, and asserts that the
process died by SIGKILL. A kill armed at a point the step never reaches would end as a normal
run and count as a pass; here it fails the test.

`Kills` keeps which points a machine reached across its examples, prefers a point not reached
yet, and `until_reached` runs a machine until every point it must reach was killed at least
once (the test fails when the budget of examples runs out first), printing what it reached.
"""

from __future__ import annotations

import shutil
import signal
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path

from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from batchscore import faults
from batchscore.errors import BatchscoreError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.commands import run


def reachable(job: Path, out: Path, *, restart: bool = False) -> Counter[str]:
    """The fault points a run of ``job`` makes from the folder ``out`` as it is now, each with
    its number of hits; the folder is put back as it was (times kept) once the run ends."""
    before = out.with_name(out.name + ".before-trace")
    shutil.rmtree(before, ignore_errors=True)
    if out.exists():
        shutil.copytree(out, before, symlinks=True)
    try:
        # a refused run passes the points it passed
        with faults.traced() as counts, suppress(BatchscoreError):
            run_job(load_job(job), restart=restart)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if before.exists():
            before.rename(out)
    return counts


class Kills:
    """Which of ``points`` a machine killed a run at, over all of its examples."""

    def __init__(self, points: Iterable[str], must_reach: Iterable[str]) -> None:
        self.points, self.must_reach = list(points), set(must_reach)
        self.reached: Counter[str] = Counter()  # by the rounds before this one
        self.now: Counter[str] = Counter()  # by this round (its replays too, while it shrinks)
        self.plain = 0  # kill steps whose run passed none of the points

    def choose(
        self, counts: Counter[str], pick: int, among: Iterable[str] | None = None
    ) -> tuple[str, int] | None:
        """A point the run will pass and one of its hits: a point no earlier round killed at
        first, whichever step it is (so every kill step serves the coverage, and a round's
        choices replay alike when Hypothesis shrinks a failure), else one of the step's own
        ``among``, else any; ``pick`` (a number the machine drew) decides among them."""
        passed = [p for p in self.points if counts[p]]
        fresh = [p for p in passed if not self.reached[p]]
        own = [p for p in among or () if counts[p]]
        options = fresh or own or passed
        if not options:
            return None
        point = options[pick % len(options)]
        return point, 1 + (pick // len(options)) % counts[point]

    def kill(
        self, job: Path, out: Path, pick: int, *args: str, among: Iterable[str] | None = None
    ) -> str | None:
        """Kill ``batchscore run JOB ARGS`` at a hit it will really make (of a point in
        ``among``, where given) and return the point; where it passes none of the points, run
        it to its end and return None; either way in a subprocess."""
        counts = reachable(job, out, restart="--restart" in args)
        chosen = self.choose(counts, pick, among)
        if chosen is None:
            self.plain += 1
            event("a kill step whose run passes no kill point: run to its end")
            done = run(job, *args)
            assert done.returncode == 0, done.stderr[-2000:]
            return None
        point, nth = chosen
        done = run(job, *args, faults=f"{point}@{nth}:kill")
        assert done.returncode == -signal.SIGKILL, (
            f"the kill at {point}@{nth} did not happen (the trace counted {counts[point]} "
            f"hits; exit {done.returncode}): {done.stderr[-2000:]}"
        )
        self.now[point] += 1
        event(f"killed at {point}")
        return point

    def round_ended(self) -> None:
        self.reached += self.now
        self.now.clear()

    def unreached(self) -> set[str]:
        return {p for p in self.must_reach if not self.reached[p]}

    def summary(self) -> str:
        counts = ", ".join(f"{p} {self.reached[p]}" for p in self.points if self.reached[p])
        missing = ", ".join(sorted(self.unreached())) or "none"
        return f"killed at: {counts or 'nothing'}; never reached: {missing}"


def until_reached(
    machine: type[RuleBasedStateMachine],
    kills: Kills,
    *,
    examples: int,
    steps: int,
    rounds: int,
    settings_of: Callable[..., settings],
    at_least: int = 0,
) -> str:
    """Run ``machine`` ``examples`` at a time until every point ``kills`` must reach was
    killed at (and ``at_least`` examples ran), at most ``rounds`` times; what it reached,
    printed and returned."""
    ran = 0
    while ran < rounds * examples:
        # each round draws new sequences: Hypothesis's CI profile (CI=true) derandomizes,
        # which would replay the first round's every time and never reach a point it missed
        drawn = settings_of(max_examples=examples, stateful_step_count=steps)
        run_state_machine_as_test(machine, settings=settings(drawn, derandomize=False))
        ran += examples
        kills.round_ended()
        if not kills.unreached() and ran >= at_least:
            break
    summary = f"{machine.__name__}: {ran} examples of at most {steps} steps; {kills.summary()}"
    print(summary)
    assert not kills.unreached(), summary
    return summary
