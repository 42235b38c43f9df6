"""The shape of a run's work, for the report page: how long its inputs were in tokens, and the
batches the sampler cut them into.

Counted per window in the model's thread (`add`), merged across Ray actors (`merge`), and
written into the run report as plain lists (`to_json`): one count per token length, and per
batch width (the padded length of a batch: where the sampler cut) its batches, rows and real
tokens, from which the page draws padding efficiency per bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Shape:
    """Units per token length, and batches per width (padded length)."""

    lengths: dict[int, int] = field(default_factory=dict)  # token length -> units
    widths: dict[int, list[int]] = field(default_factory=dict)  # width -> [batches, rows, tokens]

    def add(self, lengths: np.ndarray, batches: list[np.ndarray]) -> None:
        """Count a window: every unit's length, and each batch the model ran over them."""
        values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            self.lengths[value] = self.lengths.get(value, 0) + count
        self.add_batches(lengths, batches)

    def add_batches(self, lengths: np.ndarray, batches: list[np.ndarray]) -> None:
        """Count batches alone, over units whose lengths a window counted (the quality gate's
        pass, whose units the run's windows took without batching them again)."""
        lengths = np.asarray(lengths)
        for batch in batches:
            if not len(batch):
                continue
            sizes = lengths[batch]
            entry = self.widths.setdefault(int(sizes.max()), [0, 0, 0])
            entry[0] += 1
            entry[1] += len(batch)
            entry[2] += int(sizes.sum())

    def merge(self, other: Shape) -> None:
        """Add another replica's counts (a Ray actor's chunk)."""
        for value, count in other.lengths.items():
            self.lengths[value] = self.lengths.get(value, 0) + count
        for width, (batches, rows, tokens) in other.widths.items():
            entry = self.widths.setdefault(width, [0, 0, 0])
            entry[0] += batches
            entry[1] += rows
            entry[2] += tokens

    def to_json(self) -> dict[str, Any]:
        """``{"lengths": [[length, units], ...], "batches": [[width, batches, rows, tokens],
        ...]}``, each sorted by length: compact, whatever the number of rows."""
        return {
            "lengths": [[k, self.lengths[k]] for k in sorted(self.lengths)],
            "batches": [[k, *self.widths[k]] for k in sorted(self.widths)],
        }
