"""The quality gate in rounds on real models and rows: a clean candidate stops at the first
look, bad rows planted in a real candidate's outputs are caught at the promised rate, and the
gate's evidence carries across output folders (a warm run scores a spot sample, and re-opens
the whole gate where the spot sample disagrees).

Planting is the one stand-in here: the candidate's real outputs (MiniLM at a faster precision)
are corrupted on seeded rows, since no real precision fails at a rate a test can choose."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.errors import QualityGateError
from batchscore.job.parse import load_job
from batchscore.measure.gate import Trial, trial
from batchscore.measure.load import job_sample, trial_budget
from batchscore.measure.promise import Promise, judge_look
from batchscore.measure.rounds import evidence_key
from batchscore.models.source.locate import locate
from batchscore.precision.table import available
from batchscore.recipes.run import run_job
from tests.reliability import make_job

FAST = [p for p in available(torch.device("cpu")) if p != "fp32"]
needs_fast = pytest.mark.skipif(not FAST, reason="this CPU runs no precision faster than fp32")
TRIALS = 1000


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus)  # 360 rows: the whole default sample of 256


def turned(vectors: np.ndarray, rows: list[int], cosine: float, seed: int) -> np.ndarray:
    """``vectors`` with those ``rows`` turned away from themselves to ``cosine``."""
    rng = np.random.default_rng(seed)
    out = vectors.copy()
    for row in rows:
        v = out[row] / np.linalg.norm(out[row])
        u = rng.standard_normal(len(v))
        u -= (u @ v) * v
        u /= np.linalg.norm(u)
        out[row] = (cosine * v + np.sqrt(1 - cosine**2) * u) * np.linalg.norm(out[row])
    return out


def column(vectors: np.ndarray, like: pa.Array) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.astype(np.float32).ravel()), vectors.shape[1]
    ).cast(like.type)


def plant(monkeypatch, rows: set[int], cosine: float) -> None:
    """Every faster precision's trial gives, for the sample rows in ``rows``, its real vector
    turned to ``cosine`` with itself."""
    score = Trial.score

    def planted(self: Trial, table: pa.Table) -> None:
        start = self.rows
        score(self, table)
        hit = sorted(r for r in rows if start <= r < self.rows)
        if self.precision != "fp32" and hit:
            real = self.columns["embedding"]
            vectors = np.asarray(real.to_pylist(), dtype=np.float64)
            self.columns = {
                **self.columns,
                "embedding": column(turned(vectors, hit, cosine, 0), real),
            }

    monkeypatch.setattr(Trial, "score", planted)


def gate_line(report: dict) -> dict:
    return report["settled"]["precision"]


@needs_fast
def test_a_clean_candidate_stops_at_the_first_look_and_its_rows_are_the_runs(job: Path):
    report = run_job(load_job(job, [f"model.precision={FAST[0]}"]))
    line = gate_line(report)
    assert line["sample_rows"] == 72 and line["gate"]["verdict"] == "pass"
    assert "fewer than 5.0% of rows below" in line["gate"]["promise"]
    assert report["from_gate"] == 72  # the rows it scored are the run's, not scored again


@needs_fast
def test_bad_rows_planted_in_a_real_candidate_are_caught_at_the_promised_rate(job: Path):
    """One real pass each over the whole sample, then ``TRIALS`` seeded plantings at 5 % (the
    promised share) judged look by look with the task's own measure."""
    loaded = load_job(job, [f"model.precision={FAST[0]}"])
    path, table = locate(loaded.model), job_sample(loaded)
    budget = trial_budget(loaded)
    reference = trial(loaded, path, "fp32", table=table, max_tokens=budget, timed=False)
    candidate = trial(loaded, path, FAST[0], table=table, max_tokens=budget, timed=False)
    real = np.asarray(candidate.columns["embedding"].to_pylist(), dtype=np.float64)
    truth = reference.columns["embedding"]
    promise, caught, scored = Promise(), 0, []
    looks = promise.looks(table.num_rows)
    for seed in range(TRIALS):
        bad = np.flatnonzero(np.random.default_rng(seed).random(table.num_rows) < 0.05)
        planted = column(turned(real, bad.tolist(), 0.95, seed), truth)
        for at, rows in enumerate(looks):
            agreement = candidate.task.agreement(
                {"embedding": truth.slice(0, rows)},
                {"embedding": planted.slice(0, rows)},
                loaded.quality,
            )
            look = judge_look(
                promise,
                margins=agreement.margins.tolist(),
                failed=not agreement.passed,
                look=at,
                looks=looks,
                whole=False,
            )
            if look.verdict != "more":
                break
        caught += look.verdict == "fail"
        scored.append(look.rows)
    assert caught / TRIALS >= promise.confidence - 0.02  # 0.7 points of standard error
    assert min(scored) == 72


@needs_fast
def test_a_warm_run_into_a_new_folder_scores_only_the_spot_sample(job: Path, tmp_path: Path):
    cache = ["quality.cache_dir=" + str(tmp_path / "cache"), f"model.precision={FAST[0]}"]
    cold = run_job(load_job(job, [*cache, "output.path=" + str(tmp_path / "day1")]), environ={})
    assert gate_line(cold)["sample_rows"] == 72
    kept = json.loads((tmp_path / "cache/decisions.json").read_text())
    (entry,) = kept.values()
    assert entry["evidence"] == {
        evidence_key(load_job(job), FAST[0]): {"rows": 72, "worst": pytest.approx(0.99, abs=0.01)}
    }
    warm = run_job(load_job(job, [*cache, "output.path=" + str(tmp_path / "day2")]), environ={})
    line = gate_line(warm)
    assert line["sample_rows"] == 32 and line["gate"]["stopped"].startswith("spot sample agrees")
    assert warm["from_gate"] == 32
    (entry,) = json.loads((tmp_path / "cache/decisions.json").read_text()).values()
    assert [e["rows"] for e in entry["evidence"].values()] == [104]  # the spot's rows added


@needs_fast
def test_a_spot_sample_that_disagrees_reopens_the_whole_gate(
    job: Path, tmp_path: Path, monkeypatch, caplog
):
    cache = ["quality.cache_dir=" + str(tmp_path / "cache"), f"model.precision={FAST[0]}"]
    run_job(load_job(job, [*cache, "output.path=" + str(tmp_path / "day1")]), environ={})
    plant(monkeypatch, {5}, cosine=0.992)  # one spot row in doubt: the evidence saw none
    with caplog.at_level(logging.INFO, logger="batchscore"):
        warm = run_job(load_job(job, [*cache, "output.path=" + str(tmp_path / "day2")]), environ={})
    assert "does not agree with what this machine saw before" in caplog.text
    line = gate_line(warm)
    assert line["sample_rows"] == 144 and line["gate"]["verdict"] == "pass"  # widened
    plant(monkeypatch, {3, 40, 100}, cosine=0.5)  # bad rows: refused, the evidence forgotten
    day3 = ["output.path=" + str(tmp_path / "day3")]
    with pytest.raises(QualityGateError, match="fails the quality gate on the first 72 rows"):
        run_job(load_job(job, [*cache, *day3]), environ={})
    (entry,) = json.loads((tmp_path / "cache/decisions.json").read_text()).values()
    assert entry["evidence"] == {}
