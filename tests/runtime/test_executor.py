"""The executor: devices, the precision table, and refusing precisions a device runs badly."""

from __future__ import annotations

import pytest
import torch

from batchscore.errors import JobError
from batchscore.job.sections import ModelConfig
from batchscore.precision.table import available, check_precision
from batchscore.runtime.device import resolve_device
from batchscore.runtime.executor import Executor


def test_auto_is_cpu_without_cuda():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_a_job_error():
    with pytest.raises(JobError, match='"cuda:1" asked for, but this machine has no CUDA GPU'):
        resolve_device("cuda:1")


def test_fp16_on_cpu_is_refused_with_alternatives():
    cpu = torch.device("cpu")
    if "fp16" in available(cpu):
        pytest.skip("this CPU has native fp16")
    with pytest.raises(JobError, match=r'"fp16" has no native support on cpu .* use one of fp32'):
        check_precision("fp16", cpu)


def test_prepare_casts_once_and_freezes():
    precision = "bf16" if "bf16" in available(torch.device("cpu")) else "fp32"
    executor = Executor(ModelConfig(task="embed", device="cpu", precision=precision))
    module = executor.prepare(torch.nn.Linear(4, 2))
    assert not module.training
    assert all(p.dtype == executor.dtype and not p.requires_grad for p in module.parameters())
    out = executor.run(lambda: module(torch.ones(1, 4, dtype=executor.dtype)).float().numpy())
    assert out.shape == (1, 2) and executor.busy_s > 0


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_cuda_precisions_run(precision):
    executor = Executor(ModelConfig(task="embed", device="cuda", precision=precision))
    module = executor.prepare(torch.nn.Linear(4, 2))
    import numpy as np

    x = executor.tensor(np.ones((3, 4), dtype=np.float32)).to(executor.dtype)
    assert executor.run(lambda: module(x).float().cpu().numpy()).shape == (3, 2)


@pytest.mark.gpu
def test_cuda_embeddings_match_cpu(embed_job, tmp_path):
    """The same job on the GPU in fp16 agrees with the CPU's fp32 output."""
    import numpy as np

    from batchscore.job.parse import load_job
    from batchscore.recipes.run import run_job
    from tests.conftest import read_output

    cpu = read_output(tmp_path / run_job(load_job(embed_job))["output"])
    gpu_job = load_job(
        embed_job, ["model.device=cuda", "model.precision=fp16", 'output.path="gpu"']
    )
    gpu = read_output(tmp_path / run_job(gpu_job)["output"])
    a = np.array(cpu["embedding"].to_pylist())
    b = np.array(gpu["embedding"].to_pylist())
    assert (a * b).sum(axis=1).min() >= 0.999
