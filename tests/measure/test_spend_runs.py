"""The spending rule where costs are measured, not assumed: the measuring a real run makes
(`choose_auto`, the run's own, on the real MiniLM and the job's rows, every load, calibration
and pass timed on this machine) keeps what docs/precision.md promises, on every CPU class the
tests can fake: measuring stays within the budget plus the largest overrun of one trial over
the worst case it was admitted on, and the run records all three.

The classes are faked (`tests.machines`): a class promises speeds this machine may not have
(an AMX guess of 2.5x for bf16, fp16 at 2x where this CPU emulates it), which is exactly the
case the property tests in `test_spend.py` cannot reach: a trial that costs more than it was
expected to.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from batchscore.job.parse import load_job
from batchscore.measure.auto import choose_auto
from batchscore.measure.load import job_sample
from batchscore.models.source.locate import locate
from tests.reliability import make_job

pytestmark = pytest.mark.slow
CPU_CLASSES = ["avx2", "avx512", "avx512-vnni", "avx512-bf16", "amx", "amx-fp16"]
ROUNDED = 0.003  # the record keeps milliseconds: three roundings


@pytest.mark.parametrize("rows", [2_000, 20_000])
@pytest.mark.parametrize("machine", CPU_CLASSES)
def test_a_runs_measuring_stays_within_its_budget_and_one_trials_overrun(
    fake_machine, machine, rows, tmp_path: Path, small_corpus
):
    """Jobs of 2,000 rows (a budget of seconds, which the trials' worst cases press against)
    and of 20,000 (most candidates the class runs natively pay and fit): what the run spent is
    within its budget plus the overrun it measured."""
    fake_machine(machine)
    job = load_job(make_job(tmp_path, small_corpus.slice(0, 64)))
    job = dataclasses.replace(job, quality=dataclasses.replace(job.quality, sample_rows=64))
    auto = choose_auto(job, locate(job.model), job_sample(job), rows=rows, known={}, unusable={})
    spending = auto.record.measured["spending"]
    print(machine, rows, spending, auto.record.precision)
    assert spending["spent_s"] <= spending["budget_s"] + spending["overrun_s"] + ROUNDED, (
        machine,
        spending,
        auto.record.trials,
    )
    assert len(auto.record.trials) > 1, f"{machine}: nothing weighed beside fp32"
