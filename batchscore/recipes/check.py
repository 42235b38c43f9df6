"""`batchscore check`: the quality gate on a job's rows, measured and shown, never recorded.

The job's precision scores the job's sample next to fp32 (for "auto", every precision the
device runs natively, each timed) and the agreement is judged as a run's gate judges it
(`batchscore.measure.decide.check`). What this machine measured before for the model is shown
beside it, and the measurement replaces it in the cache folder; ``export`` writes it to a file a
build step can bake into a container image's cache folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batchscore.errors import QualityGateError
from batchscore.job.sections import Job
from batchscore.measure.cache import Entry, open_cache
from batchscore.measure.decide import check as check_quality
from batchscore.measure.decide import machine_key
from batchscore.models.fingerprint import model_identity
from batchscore.models.source.locate import locate
from batchscore.output.settled import Chosen


@dataclass(frozen=True)
class Checked:
    """What `check` measured: the gate's verdict, whether the job's precision passed, what was
    kept for the model before (None: nothing, or forgotten), and what was exported."""

    chosen: Chosen
    passed: bool
    before: Entry | None
    exported: Entry | None = None
    export: str | None = None  # the file exported to, as the caller named it


def check(
    job: Job,
    *,
    environ: Mapping[str, str],
    refresh: bool = False,
    export: str | None = None,
) -> Checked:
    """Gate the job's precision on its rows (for "auto", time every precision the device
    runs). ``environ``: the environment the front door passes in, where the cache folder is
    found; ``refresh`` forgets what was kept for the model first; ``export`` writes what is
    kept for the model and device to that file (a decisions.json)."""
    path = locate(job.model)
    cache = open_cache(environ, job.quality.cache_dir)
    files = model_identity(path)
    chosen, passed, before = check_quality(
        job, path, cache=cache, model_files=files, refresh=refresh
    )
    exported = None
    if export is not None and cache is not None:
        exported = cache.export(machine_key(job, files), Path(export))
    return Checked(chosen, passed, before, exported, export)


def verdict(checked: Checked, name: str) -> str:
    """The verdict's line, naming the job as the caller named it."""
    return f"{name}: precision {checked.chosen.precision}: {checked.chosen.why}"


def format_check(checked: Checked, name: str) -> str:
    """What `check` prints: what was kept before, each precision measured now, the verdict,
    and what was exported."""
    lines: list[str] = []
    before = checked.before
    if before is not None:
        lines.append(f"measured on this machine before ({before.measured_at}):")
        lines += [
            f"  {precision}: {seen.speedup:.2f}x fp32 per padded token, load {seen.load_s:.1f} s"
            for precision, seen in before.measured.items()
        ]
        lines += [
            f"  {precision}: cannot run this model ({why})"
            for precision, why in before.unusable.items()
        ]
        lines.append("measured now:")
    lines += [f"  {line}" for line in checked.chosen.trials]
    lines.append(verdict(checked, name))
    if checked.exported is not None:
        kept = ", ".join(checked.exported.measured) or "fp32 only"
        lines.append(f"{checked.export}: {kept} for this model here")
    return "\n".join(lines)


def check_passed(checked: Checked, job: Job, name: str) -> None:
    """`QualityGateError` (exit 8) when the job's precision failed the gate."""
    if not checked.passed:
        raise QualityGateError(f"{name}: {job.model.precision} fails the quality gate")
