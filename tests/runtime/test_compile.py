"""`[model].compile`: torch.compile at load, outputs equal to eager's, one claim for both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from batchscore.job.parse import load_job
from batchscore.job.sections import ModelConfig
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.runtime.executor import Executor
from tests.conftest import read_output


def test_compile_wraps_the_module_and_keeps_the_eager_one():
    executor = Executor(ModelConfig(task="embed", precision="fp32", device="cpu", compile=True))
    linear = torch.nn.Linear(4, 2)
    module = executor.prepare(linear)
    assert module is not linear and module._orig_mod is linear  # compiled lazily, on first call
    assert executor.prepared == [linear]  # what int8 calibration would quantize: the eager one


def test_int8_stays_eager():
    """int8's calibration swaps Linear layers after load, which a compiled graph would not see."""
    executor = Executor(ModelConfig(task="embed", device="cpu", precision="int8", compile=True))
    linear = torch.nn.Linear(4, 2)
    assert not executor.compile and executor.prepare(linear) is linear


def test_compile_is_not_part_of_the_fingerprint(embed_job: Path, minilm_path: Path):
    """Compiled and eager outputs agree to float noise: turning it on keeps the folder's claim."""
    eager = fingerprint_parts(load_job(embed_job), minilm_path)
    compiled = fingerprint_parts(load_job(embed_job, ["model.compile=true"]), minilm_path)
    assert compiled == eager


@pytest.mark.slow
def test_compiled_embeddings_equal_eager(embed_job: Path, tmp_path: Path):
    """The same small job, eager and compiled (inductor's first compile: a minute or more on a
    small CPU, seconds once its on-disk cache holds the graph)."""
    from batchscore.recipes.run import run_job

    eager = read_output(tmp_path / run_job(load_job(embed_job))["output"])
    job = load_job(embed_job, ["model.compile=true", 'output.path="compiled"'])
    compiled = read_output(tmp_path / run_job(job)["output"])
    a = np.array(eager["embedding"].to_pylist())
    b = np.array(compiled["embedding"].to_pylist())
    assert a.shape == b.shape and a.shape[0] == eager.num_rows
    cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cosine.min() >= 0.9999
