"""The quality gate in rounds: fp32 and the candidate score the job's first distinct rows a
round at a time, and the gate stops at the first look where its promise is kept
(`batchscore.measure.promise`), so its price follows its doubt.

- Cold (no evidence kept for this job): looks at 72, 144, ... rows up to `[quality].sample_rows`
  (the defaults). A candidate far from its threshold stops at the first look; one whose rows
  come within half the threshold's reach of it widens; a row past the threshold is refused at
  once.
- Warm (this machine kept the gate's evidence for this precision and job, `evidence_key`): a
  spot sample of 32 rows is scored first and, when it agrees with the evidence
  (`promise.agrees`), the gate stops there; when it does not, the cold looks follow, the spot's
  rows counted as the first of them.

The rows a pass scored in fp32 and in the candidate are the run's own (`pipeline/known.py`), so
fewer of them is less measuring, not more scoring.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import pyarrow as pa

from batchscore.job.sections import Job, QualityConfig
from batchscore.measure.cache import Entry, Evidence
from batchscore.measure.gate import Trial, judge
from batchscore.measure.promise import SPOT_ROWS, Look, Promise, agrees, judge_look
from batchscore.models.agreement import Agreement
from batchscore.precision.table import PRECISIONS

log = logging.getLogger("batchscore")
DETAIL = {"detail": True}


@dataclass(frozen=True)
class Gated:
    """How the gate concluded on a candidate: its agreement on the rows it scored, and why it
    stopped there."""

    agreement: Agreement
    look: Look
    spot: bool  # concluded by a warm run's spot sample, on the evidence kept
    promise: Promise

    def record(self) -> dict[str, object]:
        """As the decision records it (`settled.json`, the run report)."""
        return {
            "rows": self.look.rows,
            "verdict": self.look.verdict,
            "stopped": "spot sample agrees with the evidence kept" if self.spot else self.look.why,
            "promise": self.promise.describe(),
            "shown_below": round(self.look.bound, 5),
        }

    def evidence(self, before: Evidence | None) -> Evidence | None:
        """What a passed gate adds to the evidence kept for the job (None where it failed, or
        its measure judges no row on its own)."""
        margins = self.agreement.margins
        if self.look.verdict != "pass" or margins is None or not len(margins):
            return None
        worst = max(0.0, min(1.0, float(margins.min())))
        if before is None or not self.spot:
            return Evidence(self.look.rows, worst)
        return Evidence(before.rows + self.look.rows, min(before.worst, worst))


def promise_of(quality: QualityConfig) -> Promise:
    return Promise(quality.max_share_below, quality.confidence)


def first_rows(quality: QualityConfig, rows: int, *, warm: bool, whole: bool) -> int:
    """The rows a trial scores before the gate's first look: the spot sample where evidence is
    kept, the promise's first look otherwise, every sample row where the job needs them all."""
    if whole:
        return rows
    first = SPOT_ROWS if warm else promise_of(quality).looks(rows)[0]
    return min(first, rows)


def rounds(job: Job, table: pa.Table, seen: dict[str, Evidence], whole: bool) -> str:
    """The rows the gate scores first, as its progress line says them."""
    first = first_rows(job.quality, table.num_rows, warm=bool(seen), whole=whole)
    more = f" (up to {table.num_rows} where in doubt)" if first < table.num_rows else ""
    return f"{first} rows{more}"


def gate_in_rounds(
    reference: Trial,
    candidate: Trial,
    table: pa.Table,
    quality: QualityConfig,
    *,
    evidence: Evidence | None,
    whole: bool = False,
) -> Gated:
    """Score both trials on more of ``table`` (the sample) until the gate concludes.

    ``evidence``: what this machine kept for this precision and job (None: cold). ``whole``:
    the job needs every sample row scored (its int8 ranges are measured on them)."""
    promise = promise_of(quality)
    cap = table.num_rows
    looks = [cap] if whole else promise.looks(cap)
    if evidence is not None and not whole:
        spot = min(SPOT_ROWS, cap)
        agreement = judged(reference, candidate, table, spot, quality)
        margins = agreement.margins
        rows_judged = not agreement.shares and margins is not None
        if agreement.passed and rows_judged and agrees(margins.tolist(), evidence.worst):
            bound = promise.bound(evidence.rows + spot, 0, promise.risk)
            look = Look("pass", spot, 0, bound, "spot sample agrees with the evidence kept")
            return Gated(agreement, look, True, promise)
        log.info(
            "quality gate: %s's spot sample of %d rows does not agree with what this machine "
            "saw before (%d rows, worst margin %.3f): the whole gate again",
            candidate.precision,
            spot,
            evidence.rows,
            evidence.worst,
        )
    look = Look("more", 0, 0, 1.0, "")
    for at, rows in enumerate(looks):
        if rows < candidate.rows:
            continue  # the spot sample went past this look
        agreement = judged(reference, candidate, table, rows, quality)
        look = judge_look(
            promise,
            margins=[] if agreement.margins is None else agreement.margins.tolist(),
            failed=not agreement.passed,
            look=at,
            looks=looks,
            whole=whole or agreement.shares or agreement.margins is None,
        )
        log.info("quality gate: %s, %s", candidate.precision, look.why, extra=DETAIL)
        if look.verdict != "more":
            break
    return Gated(agreement, look, False, promise)


def judged(
    reference: Trial, candidate: Trial, table: pa.Table, rows: int, quality: QualityConfig
) -> Agreement:
    """Both trials brought to ``table``'s first ``rows`` rows, and the candidate judged."""
    for scored in (reference, candidate):
        if scored.rows < rows:
            scored.score(table.slice(scored.rows, rows - scored.rows))
    candidate.agreement = judge(reference, candidate, quality)
    return candidate.agreement


def evidence_key(job: Job, precision: str) -> str:
    """What the gate's evidence is kept under, beside the machine's key (`machine_key`): the
    precision, and the job as far as its rows and its thresholds go (its name, its input's
    columns and filter, its task's options, `[quality]`'s thresholds), not where its input or
    output lie, so that tomorrow's folder of the same job finds it."""
    q = job.quality
    parts = (
        job.name,
        job.input.text,
        job.input.text_pair,
        job.input.messages,
        job.input.image,
        job.input.features,
        job.input.where,
        repr(job.options),
        (q.min_cosine, q.min_agreement, q.min_exact_match, q.max_relative_error),
    )
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return f"{precision} | job {digest}"


def kept_evidence(entry: Entry, job: Job) -> dict[str, Evidence]:
    """What this machine kept of the gate's evidence for ``job``, by precision."""
    mine = {evidence_key(job, name): name for name, entry in PRECISIONS.items() if entry.gated}
    return {mine[key]: seen for key, seen in entry.evidence.items() if key in mine}


def new_evidence(
    job: Job, gates: dict[str, Gated], before: dict[str, Evidence]
) -> dict[str, Evidence | None]:
    """The evidence to keep after this run's gates (by `evidence_key`): a pass adds to it (a
    re-opened gate's pass replaces it); a failed gate forgets it (None), so that the next run
    of the job scores the whole gate again rather than a spot sample."""
    return {evidence_key(job, n): g.evidence(before.get(n)) for n, g in gates.items()}
