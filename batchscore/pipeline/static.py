"""A window's static batches through the model, surviving out-of-memory (`run_window`).

Out of memory is not fatal, in any batch (the quality gate's sample too, `run_sample`): the
batch is re-planned under half the padded tokens it had (`Batching.halved`), the smaller budget
holds for the rest of the shard, and a single row that cannot fit even alone becomes that row's
error. Rows are
never dropped: every row leaves with an output or an error.

What the model has given so far is kept in a `Ran`, which can say at any point which units are
done and put their results in unit order: the scorer uses that to hand the writer the parts of
a window that are complete while the model runs the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchscore import faults
from batchscore.errors import ModelError
from batchscore.models.base import Task
from batchscore.observe.progress import Progress
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.sampler import padded_tokens, restore
from batchscore.runtime.device import is_out_of_memory
from batchscore.runtime.executor import Executor
from batchscore.runtime.transfer import Pending, Ready
from batchscore.work.units import Encoded, Window

log = logging.getLogger("batchscore")
NON_FINITE = "non-finite output (NaN or inf) from the model"


@dataclass
class Budget:
    """The batching policy in force: after an out-of-memory a smaller one (`Batching.halved`)
    holds for the rest of the shard; each shard starts from the job's (``configured``)."""

    configured: Batching
    in_force: Batching | None = None
    shard: int = -1

    def for_shard(self, shard: int) -> Batching:
        if shard != self.shard or self.in_force is None:  # a new shard starts from the job's
            self.shard, self.in_force = shard, self.configured
        return self.in_force

    def halve(self, padded: int) -> Batching:
        """After ``padded`` tokens ran out of memory: the policy for the rest of the shard."""
        self.in_force = (self.in_force or self.configured).halved(padded)
        return self.in_force


@dataclass
class Outcome:
    """A window's model results in unit order, and the window rows that failed in the model."""

    results: Any
    errors: dict[int, str] = field(default_factory=dict)
    batches: list[np.ndarray] = field(default_factory=list)


@dataclass
class Ran:
    """What the model has given for a window so far.

    ``done`` and ``outputs`` pair each batch's units with its results (the known units first,
    when ``known_first``); ``failed`` says why a unit has no usable result, and ``lost`` lists
    the units the model produced nothing for.
    """

    window: Window
    done: list[np.ndarray] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)
    known_first: bool = False

    def finished(self) -> np.ndarray:
        """Per unit of the window (repeats included): whether its result or failure is final."""
        window = self.window
        mask = np.zeros(len(window.encoded.lengths), dtype=bool)
        for units in self.done:
            mask[units] = True
        mask[self.lost] = True
        return mask if window.same_as is None else mask[window.same_as]

    def share_run(self) -> float:
        """The share of the window's tokens the model has run so far (known units cost
        nothing, and units run shortest first: a share of units would overstate it)."""
        lengths = self.window.encoded.lengths
        mask = np.zeros(len(lengths), dtype=bool)
        for units in self.done[1:] if self.known_first else self.done:
            mask[units] = True
        total = int(lengths.sum())
        return int(lengths[mask].sum()) / total if total else 0.0

    def outcome(self) -> Outcome:
        """Results in unit order, each repeat given its twin's, and the rows that failed.

        A unit with no result yet (lost, or not yet run) holds a stand-in, a copy of the first
        result, so every unit keeps its place; a lost unit's row is nulled by its error, and a
        unit not yet run belongs to a part that is not handed on before it is.
        """
        window = self.window
        encoded, same_as, failed = window.encoded, window.same_as, self.failed
        if same_as is not None and failed:  # a duplicate of a row that failed fails too
            failed = {u: failed[int(t)] for u, t in enumerate(same_as) if int(t) in failed}
        errors: dict[int, str] = {}
        for unit, why in failed.items():
            errors.setdefault(int(encoded.rows[encoded.owners[unit]]), why)
        ran = self.done[1:] if self.known_first else list(self.done)
        done, outputs = list(self.done), list(self.outputs)
        scored = np.zeros(len(encoded.lengths), dtype=bool)
        for units in done:
            scored[units] = True
        missing = (
            np.flatnonzero(~scored)
            if same_as is None
            else np.setdiff1d(window.units, np.flatnonzero(scored), assume_unique=True)
        )
        if len(missing):
            if not outputs:  # every unit failed: there is nothing to assemble
                return Outcome(None, errors, ran)
            outputs.append(np.repeat(outputs[0][:1], len(missing), axis=0))
            done.append(missing)
        empty = np.empty((0,), dtype=np.float32)
        results = restore(done, outputs, empty, size=len(encoded.lengths))
        if same_as is not None and len(results):
            results = results[same_as]
        return Outcome(results, errors, ran)


def run_window(
    window: Window,
    cut: list[np.ndarray],
    *,
    task: Task,
    executor: Executor,
    budget: Budget,
    progress: Progress,
    after_batch: Callable[[Ran], None] = lambda ran: None,
) -> Outcome:
    """Run every batch; on out-of-memory, re-plan what is left under a smaller budget.

    When the window has repeats (``same_as``: unit -> the identical unit that is scored for
    it), batches cover only the distinct units and each duplicate gets its twin's result (and
    its twin's failure). Units whose result is known (`Window.known`) take it as it is, checked
    like any batch's. ``after_batch`` sees what has been given after each batch.
    """
    encoded = window.encoded
    rows_per_unit = window.table.num_rows / max(len(window.units), 1)
    sizes = encoded.lengths + encoded.reserve
    queue, ran = list(cut), Ran(window)
    known = window.known
    if known is not None and len(known):  # taken as they are, checked as any batch's are
        ran.known_first = True
        ran.done.append(known)
        ran.outputs.append(window.known_results)
        ran.failed.update(dict.fromkeys(non_finite(window.known_results, known), NON_FINITE))
        progress.advance(rows_per_unit * len(known), int(encoded.lengths[known].sum()))
    launch = launcher(task)  # chosen once: the loop never asks what device it runs on
    in_flight: list[tuple[np.ndarray, Pending]] = []  # launched, results not yet taken

    def land() -> None:
        """Take the oldest launched batch's results (waiting for them only if not there)."""
        batch, pending = in_flight.pop(0)
        out = executor.wait(pending)
        ran.failed.update(dict.fromkeys(non_finite(out, batch), NON_FINITE))
        ran.outputs.append(out)
        ran.done.append(batch)
        progress.advance(rows_per_unit * len(batch), int(encoded.lengths[batch].sum()))
        after_batch(ran)

    while queue:
        batch = queue.pop(0)
        padded = padded_tokens(sizes, [batch])
        try:
            faults.hit("model-batch", tokens=padded)
            pending = executor.launch(lambda batch=batch: launch(encoded, batch))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            executor.release_memory()
            if len(batch) == 1:
                ran.failed[int(batch[0])] = "out of memory even as a batch of one row"
                ran.lost.append(int(batch[0]))
                progress.advance(rows_per_unit, 0)
                continue
            smaller = budget.halve(padded)  # also for the rest of the shard
            queue = halved(encoded, batch, queue, smaller)
            continue
        # The batch before this one is taken only now that this one is launched: on a GPU its
        # copy back and this one's copy in and kernels overlap; on the CPU both are done.
        in_flight.append((batch, pending))
        while in_flight and (len(in_flight) > 1 or in_flight[0][1].done()):
            land()
    while in_flight:
        land()
    return ran.outcome()


def launcher(task: Task) -> Callable[[Encoded, np.ndarray], Pending]:
    """How the loop starts a batch: the task's own `launch` where its results can come back
    while the next batch runs (embed's vectors), else its `forward`, whose are there at once."""
    launch = getattr(task, "launch", None)
    if launch is not None:
        return launch
    return lambda encoded, batch: Ready(task.forward(encoded, batch))


def halved(
    encoded: Encoded, batch: np.ndarray, queue: list[np.ndarray], policy: Batching
) -> list[np.ndarray]:
    """What is left to run after ``batch`` ran out of memory: its two halves first (so the loop
    always ends, however the budget falls), then what was queued, re-cut by ``policy`` (the
    job's, under the smaller budget): sorted or in input order as the job's batches were."""
    padded = padded_tokens(encoded.lengths + encoded.reserve, [batch])
    log.warning(
        "out of memory on %d rows x %d tokens; budget now %d tokens",
        len(batch),
        padded // len(batch),
        policy.max_tokens,
    )
    if queue:
        queue = policy.batches(encoded, np.concatenate(queue))
    half = len(batch) // 2
    return [batch[:half], batch[half:], *queue]


@dataclass
class Sample:
    """The quality gate's sample as the model ran it: the batches in the order they ran (after
    any out-of-memory split), each one's results and model seconds."""

    batches: list[np.ndarray] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def run_sample(
    encoded: Encoded, cut: list[np.ndarray], *, task: Task, executor: Executor, policy: Batching
) -> Sample:
    """The gate's sample (``cut``, by ``policy``) through the model, out of memory handled as a
    run's batches are (`run_window`): the batch halved, the rest re-cut under half its tokens
    (`Batching.halved`). A sample row that cannot fit even alone is the model's problem (exit
    4): the gate cannot judge without it, and the run's budget is the gate's."""
    queue, sample = list(cut), Sample()
    sizes = encoded.lengths + encoded.reserve
    while queue:
        batch = queue.pop(0)
        padded = padded_tokens(sizes, [batch])
        before = executor.busy_s
        try:
            faults.hit("gate-batch", tokens=padded)
            out = executor.run(lambda batch=batch: task.forward(encoded, batch))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            executor.release_memory()
            if len(batch) == 1:
                raise ModelError(
                    f"out of memory scoring one sample row of {padded} tokens for the quality "
                    f"gate on {executor.device}: lower [model].max_length, or free the device"
                ) from exc
            queue = halved(encoded, batch, queue, policy.halved(padded))
            continue
        sample.batches.append(batch)
        sample.outputs.append(out)
        sample.seconds.append(executor.busy_s - before)
    return sample


def non_finite(out: Any, batch: np.ndarray) -> list[int]:
    """The units of ``batch`` whose numeric output holds NaN or inf (never written as a score)."""
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "fc" or not len(out):
        return []  # generated tokens, say: nothing to be non-finite
    finite = np.isfinite(out.reshape(len(out), -1)).all(axis=1)
    return [int(u) for u in batch[~finite]]
