"""`[model].runtime`: which fp32, bf16 and int8 loads go to OpenVINO, what is refused, and a job
end to end on both runtimes with the same numbers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from batchscore.errors import JobError, ModelError
from batchscore.job import runtimes
from batchscore.job.parse import load_job
from batchscore.job.runtimes import RUNTIMES, openvino_missing
from batchscore.job.sections import ModelConfig
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.models.stack.embedder import Embedder
from batchscore.models.stack.stack_text import StackText
from batchscore.precision.int8_linear import int8_available, weight_levels
from batchscore.precision.table import available
from batchscore.runtime.bert import BertEncoder
from batchscore.runtime.bert_openvino import OpenVinoBert
from batchscore.runtime.executor import Executor
from tests.conftest import read_output

needs_openvino = pytest.mark.skipif(openvino_missing() is not None, reason=str(openvino_missing()))


def embedder(path: Path, **model: object) -> tuple[Embedder, Executor]:
    config = ModelConfig(task="embed", max_length=64, threads=1, **model)
    executor = Executor(config)
    return Embedder(StackText(path, config), config, executor, normalize=True), executor


def score_each(
    embed_job: Path, tmp_path: Path, runs: tuple[tuple[str, str], ...]
) -> tuple[dict[tuple[str, str], torch.Tensor], dict[tuple[str, str], dict]]:
    """The embed job run at each (runtime, precision), each into its own folder: its
    embeddings and its run report, by (runtime, precision)."""
    from batchscore.recipes.run import run_job

    outputs, reports = {}, {}
    for runtime, precision in runs:
        sets = [f'model.runtime="{runtime}"', f'model.precision="{precision}"']
        job = load_job(embed_job, [*sets, f'output.path="{runtime}-{precision}"'])
        reports[runtime, precision] = report = run_job(job)
        vectors = read_output(tmp_path / report["output"])["embedding"].to_pylist()
        outputs[runtime, precision] = torch.tensor(vectors)
    return outputs, reports


@needs_openvino
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_auto_puts_the_native_encoder_of_an_fp32_or_bf16_cpu_load_on_openvino(
    minilm_path, precision
):
    if precision not in available(torch.device("cpu")):
        pytest.skip(f"this CPU does not run {precision}")  # and so refuses the job before load
    embed, executor = embedder(minilm_path, precision=precision)
    assert executor.runtime == "openvino" and executor.compiled
    assert isinstance(embed.model.transformer, OpenVinoBert)
    assert not any(isinstance(m, BertEncoder) for m in embed.model.modules())


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"precision": "fp32", "runtime": "torch"}, "asked for torch"),
        ({"precision": "int8"}, "int8 goes once calibrated, not at load"),
        ({"precision": "fp32", "compile": True}, "inductor compiles it instead"),
    ],
)
def test_other_loads_stay_on_torch(minilm_path, settings, why):
    embed, executor = embedder(minilm_path, **settings)
    assert executor.runtime == "torch", why
    assert isinstance(embed.model.transformer, BertEncoder) or executor.compile


@needs_openvino
def test_openvino_by_name_refuses_a_model_it_cannot_run(tmp_path, minilm_path):
    """A model that loads through transformers (here a DistilBERT) has no native encoder."""
    from transformers import DistilBertConfig, DistilBertModel

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (tmp_path / name).write_bytes((minilm_path / name).read_bytes())
    config = DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    DistilBertModel(config).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r'runtime = "openvino" runs BERT encoders batchscore'):
        embedder(tmp_path, precision="fp32", runtime="openvino")
    _, executor = embedder(tmp_path, precision="fp32")  # auto: torch, no complaint
    assert executor.runtime == "torch"


@pytest.mark.parametrize("runtime", ["auto", "openvino"])
def test_fp32_bf16_and_int8_cpu_loads_go_to_openvino(runtime, monkeypatch):
    """fp16 stays a torch cast (OpenVINO's CPU fp16 needs AMX-FP16)."""
    monkeypatch.setattr(runtimes, "openvino_missing", lambda: None)  # as on an x86-64 with it
    model = ModelConfig(task="embed", runtime=runtime)
    wanted = {p: runtimes.openvino_wanted(model, cpu=True, precision=p)
              for p in ("fp32", "bf16", "fp16", "int8")}  # fmt: skip
    assert wanted == {"fp32": True, "bf16": True, "fp16": False, "int8": True}
    assert set(RUNTIMES["openvino"].precisions) == {"fp32", "bf16", "int8"}
    assert not runtimes.openvino_wanted(model, cpu=False, precision="fp32")
    compiled = dataclasses.replace(model, compile=True)
    assert not runtimes.openvino_wanted(compiled, cpu=True, precision="fp32")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ('model.precision="fp16"', 'precision "fp16" runs on torch'),
        ('model.device="cuda"', "runs on the CPU"),
        ("model.compile=true", "both compile the model"),
    ],
)
def test_openvino_by_name_is_checked_with_the_job(embed_job, setting, message):
    with pytest.raises(JobError, match=r"\[model\]\.runtime: .*" + message):
        load_job(embed_job, ['model.runtime="openvino"', setting])


def test_openvino_by_name_without_openvino_is_a_job_error(embed_job, monkeypatch):
    """Uninstalling a package cannot be done inside a test run: the finder says it is absent."""
    found = importlib.util.find_spec
    monkeypatch.setattr(
        runtimes.importlib.util, "find_spec", lambda n: None if n == "openvino" else found(n)
    )
    with pytest.raises(JobError, match=r"\[model\]\.runtime: .*not installed"):
        load_job(embed_job, ['model.runtime="openvino"'])
    assert not runtimes.openvino_wanted(ModelConfig(task="embed"), cpu=True, precision="fp32")


def test_an_unknown_runtime_names_the_choices(embed_job):
    with pytest.raises(JobError, match=r"\[model\]\.runtime.*auto.*torch.*openvino"):
        load_job(embed_job, ['model.runtime="onnx"'])


def test_the_runtime_is_not_part_of_the_fingerprint(embed_job, minilm_path):
    """Both runtimes give the same numbers to float noise: switching keeps the folder's claim."""
    torch_parts = fingerprint_parts(load_job(embed_job, ['model.runtime="torch"']), minilm_path)
    assert fingerprint_parts(load_job(embed_job), minilm_path) == torch_parts


@needs_openvino
def test_a_job_scores_the_same_on_both_runtimes(embed_job, tmp_path):
    """The small embed job at fp32 and at "auto" precision on OpenVINO, against torch."""
    from batchscore.recipes.run import run_job

    outputs, reports = {}, {}
    for runtime, precision in (("torch", "fp32"), ("openvino", "fp32"), ("auto", "auto")):
        sets = [f'model.runtime="{runtime}"', f'model.precision="{precision}"']
        job = load_job(embed_job, [*sets, f'output.path="{runtime}"'])
        report = run_job(job)
        outputs[runtime] = read_output(tmp_path / report["output"])
        reports[runtime] = report
    assert reports["torch"]["runtime"] == "torch" and reports["openvino"]["runtime"] == "openvino"
    want = np.array(outputs["torch"]["embedding"].to_pylist())
    for runtime in ("openvino", "auto"):
        got = np.array(outputs[runtime]["embedding"].to_pylist())
        assert got.shape == want.shape and outputs[runtime]["doc_id"] == outputs["torch"]["doc_id"]
        if reports[runtime]["precision"] == "fp32":  # "auto" may pick int8 on another CPU
            assert np.abs(got - want).max() < 1e-5
    runs = sorted((tmp_path / "openvino/_batchscore/runs").glob("*.json"))
    assert json.loads(runs[-1].read_text())["runtime"] == "openvino"


@needs_openvino
@pytest.mark.skipif("bf16" not in available(torch.device("cpu")), reason="no bf16 units here")
def test_a_bf16_job_scores_on_openvino_as_on_torch(embed_job, tmp_path):
    """bf16 on OpenVINO and on torch round differently; both stay at fp32's embeddings."""
    runs = (("torch", "fp32"), ("torch", "bf16"), ("openvino", "bf16"))
    outputs, reports = score_each(embed_job, tmp_path, runs)
    assert reports["openvino", "bf16"]["runtime"] == "openvino"
    assert reports["torch", "bf16"]["runtime"] == "torch"
    want = outputs["torch", "fp32"]
    for key in (("torch", "bf16"), ("openvino", "bf16")):
        assert reports[key]["precision"] == "bf16"
        assert torch.nn.functional.cosine_similarity(outputs[key], want).min() >= 0.999, key


@needs_openvino
def test_torch_runs_on_one_thread_around_an_openvino_encoder(minilm_path):
    """torch's second OpenMP thread would spin on a core OpenVINO needs; each executor's calls
    get its own setting, whichever ran last (trials of several precisions share a process)."""
    config = ModelConfig(task="embed", max_length=64, threads=2, precision="fp32")
    on_openvino = Executor(config)
    Embedder(StackText(minilm_path, config), config, on_openvino, normalize=True)
    on_torch = Executor(dataclasses.replace(config, runtime="torch"))
    assert on_openvino.runtime == "openvino" and on_torch.runtime == "torch"
    for _ in range(2):
        assert on_openvino.run(torch.get_num_threads) == 1
        assert on_torch.run(torch.get_num_threads) == 2


@needs_openvino
@pytest.mark.skipif(not int8_available(), reason="this torch build has no int8 CPU kernels")
def test_an_int8_job_goes_to_openvino_once_calibrated(embed_job, tmp_path):
    """int8's calibration picks the layers on torch; then, where the CPU multiplies bytes in
    VNNI, the encoder goes to OpenVINO with those layers in int8. Either way the embeddings
    keep the gate's promise against fp32, and the report says where the model ran."""
    runs = (("torch", "fp32"), ("torch", "int8"), ("auto", "int8"))
    outputs, reports = score_each(embed_job, tmp_path, runs)
    vnni = weight_levels() == 127
    assert reports["auto", "int8"]["runtime"] == ("openvino" if vnni else "torch")
    assert reports["torch", "int8"]["runtime"] == "torch"
    assert ("on OpenVINO" in reports["auto", "int8"]["int8"]) == vnni
    want = outputs["torch", "fp32"]
    for key in (("torch", "int8"), ("auto", "int8")):
        assert reports[key]["precision"] == "int8"
        assert torch.nn.functional.cosine_similarity(outputs[key], want).min() >= 0.99, key
