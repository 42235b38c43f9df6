"""The quality gate: how far a precision moves a model's outputs from fp32, on the job's rows.

Agreement is measured on output columns, so it holds for every model that writes them:
vectors by cosine, labels and classes by agreement (and the largest probability change), text
by exact match (and token overlap), values by relative error. `[quality]` sets the thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from batchscore.config import QualityConfig


@dataclass
class Agreement:
    """Measured agreement with fp32, and the thresholds it missed."""

    metrics: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def check(self, name: str, value: float, limit: float, at_least: bool = True) -> None:
        """Record a metric and whether it is on the right side of its threshold."""
        self.metrics[name] = value
        if (value < limit) if at_least else (value > limit):
            self.failures.append(f"{name} {value:.4f} {'<' if at_least else '>'} {limit}")

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
        return shown + ("" if self.passed else f"; fails the gate: {', '.join(self.failures)}")


def numbers(column: pa.Array) -> np.ndarray:
    """A numeric column, scalars or lists, as floats."""
    return np.asarray(column.to_pylist(), dtype=np.float64)


def share_equal(a: pa.Array, b: pa.Array) -> float:
    return float(np.mean([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)]))


def token_overlap(a: pa.Array, b: pa.Array) -> float:
    """Mean token F1 between paired texts (whitespace tokens, counted as multisets)."""
    scores = []
    for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True):
        left, right = (x or "").split(), (y or "").split()
        common = sum(min(left.count(t), right.count(t)) for t in set(left))
        scores.append(1.0 if not left and not right else 2 * common / (len(left) + len(right)))
    return float(np.mean(scores))


def measure(
    reference: dict[str, pa.Array], candidate: dict[str, pa.Array], gate: QualityConfig
) -> Agreement:
    """Compare two scorings of the same rows, column by column, against the gate."""
    result = Agreement()
    if not reference or len(next(iter(reference.values()))) == 0:
        return result
    if "embedding" in reference:
        a, b = numbers(reference["embedding"]), numbers(candidate["embedding"])
        cos = (a * b).sum(1) / np.maximum(
            np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12
        )
        result.check("cosine_min", float(cos.min()), gate.min_cosine)
        result.metrics["cosine_mean"] = float(cos.mean())
    if "label" in reference:
        result.check(
            "label_agreement",
            share_equal(reference["label"], candidate["label"]),
            gate.min_agreement,
        )
        probs = "scores" if "scores" in reference else "score"
        change = np.abs(numbers(reference[probs]) - numbers(candidate[probs])).max()
        result.metrics["max_probability_change"] = float(change)
    for text in ("generated", "summary"):
        if text in reference:
            result.check(
                "exact_match", share_equal(reference[text], candidate[text]), gate.min_exact_match
            )
            result.metrics["token_overlap"] = token_overlap(reference[text], candidate[text])
    if "prediction" in reference:
        if pa.types.is_integer(reference["prediction"].type):
            agreement = share_equal(reference["prediction"], candidate["prediction"])
            result.check("prediction_agreement", agreement, gate.min_agreement)
        else:
            a, b = numbers(reference["prediction"]), numbers(candidate["prediction"])
            error = float((np.abs(a - b) / np.maximum(np.abs(a), 1e-6)).max())
            result.check("max_relative_error", error, gate.max_relative_error, at_least=False)
    return result
