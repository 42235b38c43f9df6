""" "auto" is the default, measured once per machine and kept in the user's cache folder; the
quality gate still runs on every output folder's first run, with that job's rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.job.load import load_job
from batchscore.job.sections import BatchingConfig, ModelConfig
from batchscore.models.locate import locate
from batchscore.pipeline.driver import run_job
from batchscore.pipeline.stages import sample_rows
from batchscore.precision.cache import FILE, DecisionCache, user_cache_folder
from batchscore.precision.int8_linear import int8_available
from batchscore.precision.settle import expected_s, from_cache, soonest
from tests.reliability import make_job

AUTO = ["model.precision=auto", "batching.max_tokens=auto", "quality.sample_rows=24"]


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 30))


def entries(folder: Path) -> dict:
    return json.loads((folder / FILE).read_text())


def test_auto_is_the_default_and_ray_jobs_default_to_a_fixed_setting(tmp_path: Path):
    assert ModelConfig(task="embed").precision == "auto"
    assert BatchingConfig().max_tokens == "auto"
    path = tmp_path / "job.toml"
    path.write_text('engine = "ray"\n[input]\npath = "in"\n[model]\ntask = "embed"\n'
                    '[output]\npath = "out"\n')  # fmt: skip
    ray = load_job(path)
    assert ray.model.precision == "fp32" and ray.batching.max_tokens == 16384


def test_a_second_output_folder_reuses_this_machines_measurement(job: Path, tmp_path: Path):
    cache = DecisionCache(tmp_path / "cache")
    first = run_job(load_job(job, AUTO), cache=cache)
    measured = first["settled"]["precision"]
    assert measured["why"].startswith("the fastest that passes the quality gate")
    ((key, entry),) = entries(tmp_path / "cache").items()
    assert "embed" in key and "torch" in key and entry["precision"] == measured["precision"]
    assert entry["budgets"][measured["precision"]]["max_tokens"] > 0
    second = run_job(load_job(job, [*AUTO, 'output.path="out2"']), cache=cache)
    cached = second["settled"]["precision"]
    assert cached["trials"] == entry["trials"]
    assert cached["why"].startswith("cached on this machine")
    assert second["settled"]["batching"]["max_tokens"] == first["settled"]["batching"]["max_tokens"]
    if measured["precision"] == "fp32":
        assert cached["precision"] == "fp32"
    else:  # weighed for this job's 30 rows: the faster precision's gate against what it saves
        fp32_s, other_s, _ = expected_s(entry, measured["precision"], 30, 24, adopts=True)
        assert cached["precision"] == ("fp32" if fp32_s <= other_s else measured["precision"])
        assert "is expected to finish first" in cached["why"]
        if cached["precision"] != "fp32":  # the gate ran again, on this job's rows
            assert "on this job's rows" in cached["why"] and cached["agreement"]
    assert second["rows"] == 30


# Speeds as a machine might have measured them: int8 1.5x fp32's rows/s, and gating it costs
# 1.24 s (the fp32 reference: load and a pass) + 3.16 s (int8's load, calibration and a pass).
SPEEDS = {
    "fp32": {"rows_per_s": 100.0, "load_s": 1.0, "cold_s": 0.24},
    "int8": {"rows_per_s": 150.0, "load_s": 3.0, "cold_s": 0.16},
}


def test_expected_time_weighs_the_gate_against_the_rows():
    entry = {"precision": "int8", "speeds": SPEEDS, "sample_rows": 24}
    assert expected_s(entry, "int8", 100, 24) == pytest.approx((2.0, 4.4 + 100 / 150, 4.4))
    fp32_s, int8_s, _ = expected_s(entry, "int8", 10_000, 48)  # twice the sample: twice the pass
    assert (fp32_s, int8_s) == pytest.approx((101.0, 1.0 + 0.48 + 3.0 + 0.32 + 10_000 / 150))
    converted = expected_s(entry, "int8", 100, 24, converts=True)  # int8: calibration only
    assert converted == pytest.approx((2.0, 1.0 + 0.24 + 2.0 + 0.16 + 100 / 150, 3.4))
    adopted = expected_s(entry, "int8", 100, 24, adopts=True)  # the sample is not scored again
    assert adopted == pytest.approx((2.0, 4.4 + 76 / 150, 4.4))
    assert expected_s({"speeds": {"fp32": SPEEDS["fp32"]}}, "int8", 100, 24)[0] is None


def test_auto_weighs_every_precision_that_passed_for_the_jobs_rows(job: Path):
    """bf16's gate is cheap and int8's calibration is not: a mid-sized job finishes first in
    bf16 though int8 runs faster per row; only a large one pays int8's gate back."""
    speeds = {**SPEEDS, "bf16": {"rows_per_s": 140.0, "load_s": 1.2, "cold_s": 0.17},
              "int8": {"rows_per_s": 170.0, "load_s": 4.0, "cold_s": 0.14}}  # fmt: skip
    entry = {"precision": "int8", "speeds": speeds, "sample_rows": 24}
    settings = load_job(job, AUTO)
    picks = {rows: soonest(settings, entry, "int8", rows, 24) for rows in (100, 1000, 100_000)}
    assert [name for name, _ in picks.values()] == ["fp32", "bf16", "int8"]
    why = picks[1000][1]
    assert why.startswith("for 1,000 rows, bf16 is expected to finish first: fp32 in 11.0 s, ")
    assert "bf16 in 9.6 s (2.6 s of it its quality gate)" in why
    assert soonest(settings, {"precision": "int8"}, "int8", 100, 24) == ("int8", "")  # no speeds


@pytest.mark.skipif(not int8_available(), reason="this torch build has no int8 CPU kernels")
def test_auto_scores_a_small_job_in_fp32_and_gates_int8_for_a_large_one(job: Path):
    settings = load_job(job, AUTO)
    model_path, table = locate(settings.model), sample_rows(settings, 24)
    budgets = {"int8": {"max_tokens": 4096, "why": "timed"}}
    entry = {"precision": "int8", "trials": ["fp32: 100 rows/s", "int8: 150 rows/s"],
             "speeds": SPEEDS, "sample_rows": 24, "budgets": budgets}  # fmt: skip
    small, decision, chosen = from_cache(settings, model_path, table, entry, rows=100)
    assert small.model.precision == "fp32" and chosen is None  # no gate: fp32 is the reference
    assert "for 100 rows, fp32 is expected to finish first" in decision["precision"]["why"]
    assert small.batching.max_tokens == 4096  # the budget timed for int8, the nearest measured
    large, decision, chosen = from_cache(settings, model_path, table, entry, rows=10_000)
    assert large.model.precision == "int8" and chosen is not None
    why = decision["precision"]["why"]
    assert "for 10,000 rows, int8 is expected to finish first" in why
    assert "on this job's rows: int8 passes the quality gate" in why


def test_a_cached_precision_that_fails_this_jobs_gate_is_measured_again(job: Path, tmp_path):
    cache = DecisionCache(tmp_path / "cache")
    run_job(load_job(job, AUTO), cache=cache)
    ((key, entry),) = entries(tmp_path / "cache").items()
    budgets = {"int8": {"max_tokens": 4096, "why": "test"}}
    entry.pop("speeds", None)  # as a cache kept before speeds were: int8 is gated, not weighed
    cache.put(key, {**entry, "precision": "int8", "budgets": budgets})
    strict = [*AUTO, "quality.min_cosine=1.0", "quality.min_agreement=1.0", 'output.path="o3"']
    report = run_job(load_job(job, strict), cache=cache)
    decision = report["settled"]["precision"]
    assert not decision.get("cached") and decision["precision"] == "fp32"  # measured afresh
    assert report["rows"] == 30


def test_check_shows_the_cached_table_and_refresh_measures_again(job: Path, tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = user_cache_folder(env)
    args = ["check", str(job), *[a for s in AUTO for a in ("--set", s)]]
    measured = CliRunner(env=env).invoke(main, args)
    assert measured.exit_code == 0, measured.output
    stamp = entries(folder)
    shown = CliRunner(env=env).invoke(main, args)
    assert shown.exit_code == 0 and "cached on this machine" in shown.output
    assert entries(folder) == stamp  # shown, not measured
    refreshed = CliRunner(env=env).invoke(main, [*args, "--refresh"])
    assert refreshed.exit_code == 0 and "cached on this machine" not in refreshed.output


def test_the_command_line_keeps_decisions_in_xdg_cache_home(job: Path, tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    sets = [a for s in AUTO for a in ("--set", s)]
    result = CliRunner(env=env).invoke(main, ["run", str(job), "--progress", "off", *sets])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "xdg/batchscore" / FILE).is_file()
