"""The batching policy: how a job's rows become batches, decided in one place.

Built once from `[batching]` and the task's encoding (`Batching.of`), it answers for every
stage that cuts batches alike: the reader's windows, the model thread, out-of-memory halving,
the quality gate, int8 calibration, the `max_tokens = "auto"` probe, the timed estimate and
`batchscore plan`. So whether rows are sorted into length buckets, under what token budget and
how many rows a batch holds cannot differ between what a job measures, plans and runs.

It is a frozen value: where the budget changes (the measured "auto" budget, a smaller one after
an out-of-memory) a new policy is derived (`under`, `halved`); the cut itself is the sampler's
pure `form_batches` (`batchscore.pipeline.sampler`), which this is the one wrapper over.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from batchscore.job.sections import BatchingConfig
from batchscore.models.base import Encoding
from batchscore.pipeline.sampler import form_batches
from batchscore.work.units import Encoded


@dataclass(frozen=True)
class Batching:
    """Batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens, their rows sorted
    into length buckets where ``sort`` (else in input order, each batch filled in turn)."""

    max_tokens: int
    max_rows: int
    sort: bool

    @classmethod
    def of(
        cls, batching: BatchingConfig, encoding: Encoding, *, max_tokens: int | None = None
    ) -> Batching:
        """The job's policy: rows are sorted where `[batching].sort` asks and the task's inputs
        have a length to sort by (`Encoding.bucketing`: an image or a feature vector has not).
        ``max_tokens`` is the budget where `[batching].max_tokens` is not (yet) a number:
        "auto" before it is measured, or the budget a measurement tries."""
        budget = batching.max_tokens if max_tokens is None else max_tokens
        if not isinstance(budget, int):  # the caller's mistake: "auto" is measured first
            raise ValueError('max_tokens = "auto" has no budget to cut by until it is measured')
        return cls(budget, batching.max_rows, batching.sort and encoding.bucketing)

    def under(self, max_tokens: int) -> Batching:
        """The same policy under another budget (one measured, or one a probe tries)."""
        return dataclasses.replace(self, max_tokens=max_tokens)

    def halved(self, padded: int) -> Batching:
        """After a batch of ``padded`` tokens ran out of memory: half of them, so the loop
        always ends however far the budget falls (at one token, every batch is one row)."""
        return self.under(max(1, padded // 2))

    def cut(self, sizes: np.ndarray) -> list[np.ndarray]:
        """Batches of indices into ``sizes`` (each unit's tokens, its reserve included); a
        unit longer than the budget runs alone, at the budget."""
        return form_batches(
            np.minimum(sizes, self.max_tokens), self.max_tokens, self.max_rows, self.sort
        )

    def batches(self, encoded: Encoded, units: np.ndarray) -> list[np.ndarray]:
        """``units`` of ``encoded`` cut into batches: arrays of those units."""
        sizes = (encoded.lengths + encoded.reserve)[units]
        return [units[b] for b in self.cut(sizes)]
