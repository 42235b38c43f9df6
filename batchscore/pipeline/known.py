"""Results the run's model already gave, so that no unit is scored twice by the same model.

A new output folder's quality gate scores the job's first rows (`batchscore.measure.gate`),
and the local engine then adopts the gate's model rather than loading it again. Those rows are
the first the run reads, so without this the run would score them a second time, with the very
model that just did: a pass over `[quality].sample_rows` rows wasted in every new folder
(0.5-0.7 s for MiniLM in bf16 on 2 cores, of a 2.5-3 s gate; BENCHMARKS.md). Units are matched
by their model input (`unit_keys`), as `batchscore.pipeline.stages.distinct` matches repeats:
every task's result depends on its input alone. Each known result is taken once, by the first
window that meets its input. The pass's batches come with its results: the run counts them as
its own (batches, padded tokens, the report page's widths; `RunStats.adopt`), since the units
they scored are never batched again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from batchscore.work.units import Encoded


def unit_keys(encoded: Encoded) -> list[bytes] | None:
    """Each unit's input to the model: its token ids, and a text pair's segments (a pair split
    elsewhere is another input), or the keys its encoding made of inputs that are not tokens
    (``extra["keys"]``: an image's pixels' digest). None for units without either (rows of a
    tensor)."""
    if "keys" in encoded.extra:
        return encoded.extra["keys"]
    if encoded.ids is None:
        return None
    keys = [ids.tobytes() for ids in encoded.ids]
    if encoded.type_ids is not None:
        keys = [key + types.tobytes() for key, types in zip(keys, encoded.type_ids, strict=True)]
    return keys


@dataclass
class Known:
    """Results by unit key: ``results[index[key]]`` is what the model gave for that input;
    ``lengths`` and ``batches``: the pass's units' token lengths and the batches it ran them
    in (unit indices)."""

    index: dict[bytes, int]
    results: np.ndarray
    lengths: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    batches: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def of(
        cls, encoded: Encoded, results: np.ndarray, batches: list[np.ndarray] | None = None
    ) -> Known | None:
        """What a pass over ``encoded`` gave (``results`` in unit order, from ``batches``), or
        None when its units cannot be matched or the pass gave nothing."""
        keys = unit_keys(encoded)
        if not keys or len(results) != len(keys):
            return None
        index = {key: unit for unit, key in enumerate(keys)}
        return cls(index, results, np.asarray(encoded.lengths), list(batches or []))

    @staticmethod
    def joined(first: Known | None, then: Known | None) -> Known | None:
        """Two passes' results over different units as one pass's (the quality gate scores its
        sample in rounds), ``then``'s units numbered after ``first``'s; None where either
        cannot be matched, or their results do not stack."""
        if first is None or then is None:
            return None
        offset = len(first.results)
        try:
            results = np.concatenate([first.results, then.results])
        except ValueError:  # outputs of different shapes (generated tokens): not kept
            return None
        index = {**first.index, **{key: unit + offset for key, unit in then.index.items()}}
        return Known(
            index,
            results,
            np.concatenate([first.lengths, then.lengths]),
            [*first.batches, *(batch + offset for batch in then.batches)],
        )

    def take(self, keys: list[bytes], units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Those of ``units`` (``keys``: every unit's, `unit_keys`) whose result is known, and
        their results; each is given once."""
        found = [(u, self.index.pop(keys[u], -1)) for u in units.tolist()]
        hits = [(u, at) for u, at in found if at >= 0]
        taken = np.array([u for u, _ in hits], dtype=np.int64)
        return taken, self.results[np.array([at for _, at in hits], dtype=np.int64)]

    def __bool__(self) -> bool:
        return bool(self.index)
