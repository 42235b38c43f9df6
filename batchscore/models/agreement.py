"""Agreement measures: how far a precision moves a task's outputs from fp32, on the job's rows.

Each task declares its own measure (`Task.agreement`) from the kinds here: vectors by cosine,
labels and classes by agreement (and the largest probability change), text by exact match (and
token overlap), values by relative error, scores by their error relative to their scale.
`[quality]` sets the thresholds. A task cannot pass the quality gate by having outputs nobody
compares: the gate asks the task, never the column names.

A measure that judges each row (a cosine, an error) also gives each row's margin to its
threshold, on which the gate's promise is counted (`batchscore.measure.promise`); one that
judges a share of rows (agreement, exact match) marks itself, since its threshold is already a
share and holds only over the whole sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchscore.job.sections import QualityConfig

Columns = dict[str, pa.Array]


@dataclass
class Agreement:
    """Measured agreement with fp32, and the thresholds it missed."""

    metrics: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # each judged row's margin to its threshold: 1 where it equals fp32's, 0 at the threshold,
    # below 0 past it (`margins`); None where no measure judges rows one by one
    margins: np.ndarray | None = None
    shares: bool = False  # a threshold on a share of rows: judged on the whole sample only

    @property
    def passed(self) -> bool:
        return not self.failures

    def judge_rows(self, errors: np.ndarray, allowed: float) -> None:
        """Keep each row's margin, its error against the ``allowed`` one; with several per-row
        measures (a reward model's named scores), a row's least."""
        found = margins(errors, allowed)
        self.margins = found if self.margins is None else np.minimum(self.margins, found)

    def check(self, name: str, value: float, limit: float, at_least: bool = True) -> None:
        """Record a metric and whether it is on the right side of its threshold."""
        self.metrics[name] = value
        if (value < limit) if at_least else (value > limit):
            self.failures.append(f"{name} {value:.4f} {'<' if at_least else '>'} {limit}")

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
        return shown + ("" if self.passed else f"; fails the gate: {', '.join(self.failures)}")


def margins(errors: np.ndarray, allowed: float) -> np.ndarray:
    """Each row's margin to its threshold: 1 - error / allowed (1: no error, 0: at the
    threshold, below 0: past it); an error that is NaN is past any threshold. A threshold
    that allows no error at all leaves a row 1 or -1."""
    errors = np.nan_to_num(np.asarray(errors, dtype=np.float64), nan=np.inf)
    if allowed <= 0:
        return np.where(errors <= 0, 1.0, -1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.nan_to_num(1.0 - errors / allowed, nan=-np.inf)


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


def vectors(reference: Columns, candidate: Columns, column: str, gate: QualityConfig) -> Agreement:
    """Vectors by cosine: the worst row must reach `min_cosine`."""
    result = Agreement()
    a, b = numbers(reference[column]), numbers(candidate[column])
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    result.check("cosine_min", float(cos.min()), gate.min_cosine)
    result.metrics["cosine_mean"] = float(cos.mean())
    result.judge_rows(1.0 - cos, 1.0 - gate.min_cosine)
    return result


def labels(
    reference: Columns, candidate: Columns, probabilities: str, gate: QualityConfig
) -> Agreement:
    """Labels by agreement (`min_agreement`), with the largest change of ``probabilities``."""
    result = Agreement(shares=True)
    agreement = share_equal(reference["label"], candidate["label"])
    result.check("label_agreement", agreement, gate.min_agreement)
    change = np.abs(numbers(reference[probabilities]) - numbers(candidate[probabilities])).max()
    result.metrics["max_probability_change"] = float(change)
    return result


def texts(reference: Columns, candidate: Columns, column: str, gate: QualityConfig) -> Agreement:
    """Texts by exact match (`min_exact_match`), with the mean token overlap."""
    result = Agreement(shares=True)
    exact = share_equal(reference[column], candidate[column])
    result.check("exact_match", exact, gate.min_exact_match)
    result.metrics["token_overlap"] = token_overlap(reference[column], candidate[column])
    return result


def classes(reference: Columns, candidate: Columns, column: str, gate: QualityConfig) -> Agreement:
    """Class numbers by agreement (`min_agreement`)."""
    result = Agreement(shares=True)
    agreement = share_equal(reference[column], candidate[column])
    result.check("prediction_agreement", agreement, gate.min_agreement)
    return result


def scores(reference: Columns, candidate: Columns, column: str, gate: QualityConfig) -> Agreement:
    """Scores (a reranker's) by their largest change relative to the scores' scale, the largest
    |score| of the sample (`max_relative_error`), with the share of neighbouring rows (in fp32's
    order) the candidate keeps in order.

    Relative to the scale, not to each score: a raw logit near zero (or a probability near
    zero) moves by a large share of itself while moving no row past another, and the order of
    rows is what a reranker is for. The order is recorded, not gated: rows whose fp32 scores
    are nearly equal may swap under any precision, harmlessly.
    """
    result = Agreement()
    a, b = numbers(reference[column]), numbers(candidate[column])
    scored = ~(np.isnan(a) & np.isnan(b))  # a row neither scored (a row error) is not compared
    a, b = a[scored], b[scored]
    if not len(a):
        return result
    scale = max(float(np.nanmax(np.abs(a), initial=0.0)), 1e-6)
    differences = np.abs(a - b)
    # a score one side lost (NaN, an overflow) is as far off as a score can be
    error = float("inf") if np.isnan(differences).any() else float(differences.max() / scale)
    result.check("max_score_error", error, gate.max_relative_error, at_least=False)
    result.judge_rows(differences / scale, gate.max_relative_error)
    if len(a) > 1:  # neighbours, not every pair: a sample of 65,536 rows has 2e9 pairs
        order = np.argsort(a, kind="stable")
        steps, moved = np.diff(a[order]), np.diff(b[order])
        kept = (steps == 0) | (np.sign(steps) == np.sign(moved))  # fp32's ties may go either way
        result.metrics["order_kept"] = float(kept.mean())
    return result


def values(reference: Columns, candidate: Columns, column: str, gate: QualityConfig) -> Agreement:
    """Numbers by their largest relative error (`max_relative_error`)."""
    result = Agreement()
    a, b = numbers(reference[column]), numbers(candidate[column])
    errors = np.abs(a - b) / np.maximum(np.abs(a), 1e-6)
    result.check("max_relative_error", float(errors.max()), gate.max_relative_error, at_least=False)
    result.judge_rows(errors.reshape(len(errors), -1).max(1), gate.max_relative_error)
    return result


def logprobs(reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
    """Log-likelihoods (loglik's) by the largest relative change of a row's perplexity, its
    per-token log-probability moved: exp(|candidate - fp32| / tokens) - 1 against
    `max_relative_error` (0.01: no row's perplexity, nor its continuation's, moves by more
    than 1 %); with `is_greedy`, the share of rows where it agrees against `min_agreement`.
    The share of neighbouring rows (by fp32's log-probability per token) kept in order is
    recorded, as for scores: what a filter by perplexity keeps depends on it.

    Per token, because a sum over a long text grows with its length where one over a short
    continuation stays near zero: a relative error of the sum would fail a continuation
    whose log-probability is near zero for a change nobody could see, and an absolute one
    would pass or fail a text by its length.
    """
    result = Agreement()
    a, b = numbers(reference["logprob"]), numbers(candidate["logprob"])
    tokens = np.maximum(numbers(reference["tokens"]), 1)
    scored = ~(np.isnan(a) & np.isnan(b))  # a row neither scored (a row error) is not compared
    a, b, tokens = a[scored], b[scored], tokens[scored]
    if not len(a):
        return result
    moved = np.abs(a - b) / tokens
    error = float("inf") if np.isnan(moved).any() else float(np.expm1(moved.max()))
    result.check("max_perplexity_error", error, gate.max_relative_error, at_least=False)
    result.judge_rows(np.expm1(moved), gate.max_relative_error)
    if "is_greedy" in reference and "is_greedy" in candidate:
        result.shares = True
        result.check(
            "greedy_agreement",
            share_equal(reference["is_greedy"], candidate["is_greedy"]),
            gate.min_agreement,
        )
    if len(a) > 1:
        order = np.argsort(a / tokens, kind="stable")
        steps, shifted = np.diff((a / tokens)[order]), np.diff((b / tokens)[order])
        kept = (steps == 0) | (np.sign(steps) == np.sign(shifted))
        result.metrics["order_kept"] = float(kept.mean())
    return result


def named_scores(
    reference: Columns, candidate: Columns, column: str, gate: QualityConfig
) -> Agreement:
    """A struct of scores (a reward model's named logits) as `scores` judges each of its
    fields, each metric named after its field; one field off fails the whole."""
    result = Agreement()
    for name in reference[column].type.names:
        one = scores(
            {name: pc.struct_field(reference[column], name)},
            {name: pc.struct_field(candidate[column], name)},
            name,
            gate,
        )
        result.metrics |= {f"{name}: {k}": v for k, v in one.metrics.items()}
        result.failures += [f"{name}: {failure}" for failure in one.failures]
        if one.margins is not None:
            result.margins = (
                one.margins if result.margins is None else np.minimum(result.margins, one.margins)
            )
    return result
