"""Settling "auto" and gating precision on the job's own rows, once per output folder."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from batchscore.errors import QualityGateError
from batchscore.job.parse import load_job
from batchscore.job.runtimes import openvino_missing
from batchscore.measure.auto import choose_auto
from batchscore.measure.decide import machine_key
from batchscore.measure.gate import judge, trial
from batchscore.measure.load import job_sample
from batchscore.models.source.locate import locate
from batchscore.precision.int8_linear import int8_available, weight_levels
from batchscore.precision.table import available
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import read_output, record_of
from tests.reliability import make_job

FAST = [p for p in available(torch.device("cpu")) if p != "fp32"]
needs_fast = pytest.mark.skipif(not FAST, reason="this CPU runs no precision faster than fp32")


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 90))


def settled(job: Path) -> dict:
    return json.loads((job.parent / "out/_batchscore/settled.json").read_text())


@needs_fast
def test_precision_is_gated_once_and_recorded(job: Path):
    sets = [f"model.precision={FAST[0]}", "quality.sample_rows=40"]
    report = run_job(load_job(job, sets))
    decision = report["settled"]["precision"]
    assert decision["precision"] == FAST[0] and "passes the quality gate" in decision["why"]
    assert decision["agreement"]["cosine_min"] >= 0.99
    assert settled(job) == report["settled"]
    record_of(job.parent / "out", shard=1).unlink()
    again = run_job(load_job(job, sets))
    assert again["settled"] == report["settled"] and again["tuning_s"] < 0.5  # not measured again


@needs_fast
def test_a_failing_precision_is_refused_unless_accepted(job: Path):
    sets = [f"model.precision={FAST[0]}", "quality.sample_rows=40", "quality.min_cosine=1.0"]
    with pytest.raises(QualityGateError, match=r"fails the quality gate on the first 40 rows"):
        run_job(load_job(job, sets))
    assert not list((job.parent / "out").glob("*.parquet"))  # nothing scored
    report = run_job(load_job(job, sets), accept_quality=True)
    assert "FAILS the quality gate, accepted" in report["settled"]["precision"]["why"]
    assert report["rows"] == 90


@needs_fast
def test_auto_precision_picks_the_fastest_that_passes(job: Path):
    """A job large enough that trying a faster precision pays: the most promising is tried,
    gated and timed; one whose promise cannot beat what was measured is passed over, saying so;
    and the fastest of those that pass (fp32 among them) is chosen."""
    settings = load_job(job, ["model.precision=auto", "quality.sample_rows=40"])
    table = job_sample(settings)
    auto = choose_auto(settings, locate(settings.model), table, rows=10**7, known={}, unusable={})
    record = auto.record
    assert len(record.speeds) >= 2, record.trials  # fp32 and at least one candidate timed
    untried = [line for line in record.trials if ": not tried (" in line]
    assert len(record.speeds) + len(untried) == 1 + len(FAST), record.trials
    timed = {line.split(":")[0].split(" on ")[0]: line for line in record.trials}
    passed = {name for name in record.speeds if "fails the" not in timed[name]}
    fastest = max(passed, key=lambda name: record.speeds[name])
    assert record.precision == auto.chosen.precision == fastest, record.trials
    assert record.why.startswith("for 10,000,000 rows, the fastest that passes the quality gate")


@pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")
def test_int8_is_calibrated_on_the_jobs_rows_and_keeps_quality(tmp_path: Path, small_corpus):
    rows = small_corpus.slice(0, 90)
    reference = run_job(load_job(make_job(tmp_path / "fp32", rows)))
    sets = ["model.precision=int8", "quality.sample_rows=40"]
    report = run_job(load_job(make_job(tmp_path / "int8", rows), sets))
    assert report["precision"] == "int8" and report["rows"] == reference["rows"] == 90
    assert "Linear layers in int8" in report["int8"] and "calibration 20 rows" in report["int8"]
    assert report["settled"]["precision"]["agreement"]["cosine_min"] >= 0.99
    fp32 = np.array(read_output(tmp_path / "fp32/out")["embedding"].to_pylist())
    int8 = np.array(read_output(tmp_path / "int8/out")["embedding"].to_pylist())
    assert (fp32 * int8).sum(axis=1).min() >= 0.99  # every row, 70 of them never calibrated on


@pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")
def test_int8_that_cannot_keep_the_promise_fails_the_gate_not_the_model(job: Path):
    """Calibration that must keep every layer in float is the gate's verdict (exit 8), and
    "auto" moves on to the next precision instead of failing the run."""
    strict = ["quality.sample_rows=40", "quality.min_cosine=1.0"]
    with pytest.raises(QualityGateError, match="with any Linear layer in int8") as caught:
        run_job(load_job(job, ["model.precision=int8", *strict]))
    assert caught.value.exit_code == 8
    settings = load_job(job, ["model.precision=auto", "model.runtime=torch", *strict])
    table = job_sample(settings)
    # a job large enough that int8 is tried (against torch's fp32: see test_cache)
    auto = choose_auto(settings, locate(settings.model), table, rows=10**7, known={}, unusable={})
    assert auto.chosen.precision == "fp32"
    assert any(t.startswith("int8: fails the quality gate") for t in auto.record.trials)
    report = run_job(load_job(job, ["model.precision=auto", *strict, 'output.path="auto"']))
    assert report["precision"] == "fp32" and report["rows"] == 90


def test_auto_budget_comes_from_the_models_shape(job: Path):
    report = run_job(load_job(job, ["batching.max_tokens=auto", "quality.sample_rows=40"]))
    choice = report["settled"]["batching"]
    # MiniLM (hidden 384, FFN 1536, 12 heads) at max_length 64: 12 KiB a token, 128 MiB a batch
    assert choice["max_tokens"] == 8192 and "from the model's shape" in choice["why"]
    assert report["rows"] == 90 and report["from_gate"] == 40  # the fp32 pass was the run's


def test_repeated_inputs_are_scored_once(tmp_path: Path, small_corpus):
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    shard = sorted((tmp_path / "in").glob("*.parquet"))[0]
    table = pq.read_table(shard)
    texts = table["text"].to_pylist()
    texts[1:6] = [texts[0]] * 5
    pq.write_table(table.set_column(2, "text", pa.array(texts)), shard)
    report = run_job(load_job(job))
    assert report["duplicates"] == 5
    out = read_output(tmp_path / "out")["embedding"].to_pylist()
    assert all(out[i] == out[0] for i in range(1, 6))


@needs_fast
def test_check_command(job: Path):
    sets = [f"model.precision={FAST[0]}", "quality.sample_rows=30"]

    def check(*more: str):
        args = [a for key in [*sets, *more] for a in ("--set", key)]
        return invoke("check", str(job), *args)

    ok = check()
    assert ok.exit_code == 0, ok.stderr
    assert re.search(r"fp32( on OpenVINO)?:", ok.output) and "passes the quality gate" in ok.output
    strict = check("quality.min_cosine=1.0")
    assert strict.exit_code == 8 and "fails the quality gate" in strict.stderr


@pytest.mark.skipif(not int8_available(), reason="this torch build has no int8 CPU kernels")
def test_gating_int8_converts_the_reference_model_instead_of_loading_it_again(job: Path):
    sets = ["model.precision=int8", "quality.sample_rows=24", 'model.runtime="torch"']
    settings = load_job(job, sets)
    model_path, table = locate(settings.model), job_sample(settings)
    reference = trial(settings, model_path, "fp32", table=table, max_tokens=4096, timed=False)
    task = reference.task
    converted = trial(
        settings, model_path, "int8", table=table, max_tokens=4096, timed=False, reuse=reference
    )
    assert converted.task is task and reference.task is None  # the same model, now int8
    assert converted.executor.precision == "int8" and "in int8" in converted.executor.quantization
    assert judge(reference, converted, settings.quality).passed
    fresh = trial(settings, model_path, "int8", table=table, max_tokens=4096, timed=False)
    mine, theirs = (np.stack(t.columns["embedding"].to_numpy(zero_copy_only=False))
                    for t in (converted, fresh))  # fmt: skip
    np.testing.assert_array_equal(mine, theirs)  # calibration is deterministic either way


@pytest.mark.skipif(not int8_available(), reason="this torch build has no int8 CPU kernels")
@pytest.mark.skipif(openvino_missing() is not None, reason=str(openvino_missing()))
def test_gating_int8_loads_again_when_the_reference_ran_on_openvino(job: Path):
    """OpenVINO's graph holds no torch Linear layer to swap: int8 gets a model of its own,
    calibrated on torch, then on OpenVINO too where the CPU has VNNI."""
    settings = load_job(job, ["model.precision=int8", "quality.sample_rows=24"])
    model_path, table = locate(settings.model), job_sample(settings)
    reference = trial(settings, model_path, "fp32", table=table, max_tokens=4096, timed=False)
    assert reference.executor.runtime == "openvino" and reference.executor.compiled
    task = reference.task
    converted = trial(
        settings, model_path, "int8", table=table, max_tokens=4096, timed=False, reuse=reference
    )
    assert converted.task is not task
    assert converted.executor.runtime == ("openvino" if weight_levels() == 127 else "torch")
    assert "in int8" in converted.executor.quantization
    assert judge(reference, converted, settings.quality).passed


@pytest.mark.skipif(openvino_missing() is not None, reason=str(openvino_missing()))
def test_the_cache_key_names_the_runtime_each_precision_was_timed_on(job: Path):
    """A speed timed on torch must not stand for OpenVINO's: each runtime setting has its key,
    and the key names OpenVINO's version and the precisions it runs."""
    keys = {
        runtime: machine_key(load_job(job, [f'model.runtime="{runtime}"']), "0" * 64)
        for runtime in ("auto", "openvino", "torch")
    }
    assert keys["auto"] == keys["openvino"]
    assert keys["auto"].endswith(f"| openvino {version('openvino')} (fp32, bf16, int8)")
    assert "openvino" not in keys["torch"] and keys["torch"] != keys["auto"]
