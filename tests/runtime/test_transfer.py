"""How batches reach the device and come back: one transfer per device kind, chosen once, and
the batch loop launching the next batch before it waits for the last one's results.

There is no GPU here: the choice of `CudaTransfer` is tested with CUDA faked (`tests.machines`),
and the overlap with a task whose results arrive late (a stand-in for a copy back that has not
finished: no CUDA stream can run on this CPU). The real copies, streams and pinned buffers run
in the `gpu` tests at the end, skipped without CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchscore.api import data_job
from batchscore.job.sections import ModelConfig
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.stages import encode
from batchscore.pipeline.static import Budget, run_window
from batchscore.runtime.executor import Executor
from batchscore.runtime.transfer import CudaTransfer, HostTransfer, Ready, transfer_for
from batchscore.work.units import Encoded
from tests.machines import gpu
from tests.pipeline.test_known import QUIET, Sums
from tests.pipeline.test_scoring import window_of


def test_the_cpu_moves_nothing_and_a_gpu_gets_its_stream_transfer_chosen_at_load(monkeypatch):
    cpu = Executor(ModelConfig(task="embed", precision="fp32", device="cpu", threads=1))
    assert isinstance(cpu.transfer, HostTransfer)
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert cpu.tensor(array).data_ptr() == torch.from_numpy(array).data_ptr()  # no copy
    assert isinstance(cpu.host(torch.ones(2)), Ready)
    gpu(monkeypatch)  # faked: which transfer is chosen, not a copy, is what runs here
    on_gpu = Executor(ModelConfig(task="embed", precision="fp16", device="cuda"))
    assert isinstance(on_gpu.transfer, CudaTransfer) and on_gpu.transfer.stream is None
    assert isinstance(transfer_for(torch.device("cuda:0")), CudaTransfer)
    assert isinstance(transfer_for(torch.device("meta")), HostTransfer)  # any other: the CPU's


class Late:
    """Results still on their way (as a GPU's copy back is), until waited for."""

    def __init__(self, value: np.ndarray, log: list[str], name: str) -> None:
        self.value, self.log, self.name = value, log, name

    def done(self) -> bool:
        return False

    def result(self) -> np.ndarray:
        self.log.append(f"wait {self.name}")
        return self.value


class Launches(Sums):
    """`Sums` whose batches are launched, their results arriving late."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def launch(self, encoded: Encoded, batch: np.ndarray) -> Late:
        name = str(len([e for e in self.log if e.startswith("launch")]))
        self.log.append(f"launch {name}")
        return Late(self.forward(encoded, batch), self.log, name)


def run(task: Sums, texts: list[str]) -> np.ndarray:
    options = {"max_tokens": 8, "max_rows": 2, "precision": "fp32", "threads": 1}
    job = data_job(task="embed", model=None, text="text", options=options)
    policy = Batching.of(job.batching, task)
    window = encode(window_of(texts, [len(texts)]), task, policy, "fail")
    budget = Budget(policy)
    budget.for_shard(0)
    executor = Executor(job.model)
    outcome = run_window(
        window, window.batches, task=task, executor=executor, budget=budget, progress=QUIET
    )
    return outcome.results


TEXTS = ["ab", "c", "def", "gh", "i", "jk", "lmn"]
SUMS = [float(sum(t.encode())) for t in TEXTS]


def test_the_next_batch_is_launched_before_the_last_ones_results_are_waited_for():
    task = Launches()
    assert list(run(task, TEXTS)) == SUMS
    launches = [e for e in task.log if e.startswith("launch")]
    assert len(launches) >= 3
    expected = ["launch 0"]
    for i in range(1, len(launches)):
        expected += [f"launch {i}", f"wait {i - 1}"]
    assert task.log == [*expected, f"wait {len(launches) - 1}"]


def test_a_task_with_results_at_once_is_taken_batch_by_batch_as_before():
    """The CPU's path: a result there at once is taken before the next batch starts, so the
    writer's handoffs and the progress bar see each batch as soon as it ran."""
    seen: list[int] = []
    task = Sums()
    forward = task.forward
    task.forward = lambda encoded, batch: seen.append(len(batch)) or forward(encoded, batch)
    assert list(run(task, TEXTS)) == SUMS and len(seen) >= 3


@pytest.mark.gpu
def test_a_gpu_round_trip_through_pinned_buffers_and_the_copy_stream_is_exact():
    transfer = CudaTransfer(torch.device("cuda"))
    pendings = []
    for i in range(20):  # more batches than pinned buffers: buffers are reused, never clobbered
        array = np.arange(1000 * (1 + i % 3), dtype=np.int64) + i
        on_gpu = transfer.to_device(array)
        pendings.append((array, transfer.to_host(on_gpu * 2)))
    for array, pending in pendings:
        np.testing.assert_array_equal(pending.result(), array * 2)
    assert transfer.stream is not None and len(transfer.inputs.buffers) <= 8


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "auto"])
def test_a_gpu_embed_job_agrees_with_the_cpus_fp32(tmp_path, small_corpus, precision):
    """The whole path on a real GPU: pinned buffers, the copy stream, the loop's overlap, and
    auto choosing there; cosine >= 0.999 to the CPU's fp32 on every row."""
    from batchscore.job.parse import load_job
    from batchscore.recipes.run import run_job
    from tests.conftest import read_output
    from tests.reliability import make_job

    rows = small_corpus.slice(0, 200)
    outs = []
    runs = {
        "cpu": ["model.device=cpu", "model.precision=fp32"],
        "gpu": ["model.device=cuda", f"model.precision={precision}"],
    }
    for where, sets in runs.items():
        job = make_job(tmp_path / where, rows)
        run_job(load_job(job, sets))
        outs.append(np.array(read_output(job.parent / "out")["embedding"].to_pylist()))
    cpu, on_gpu = outs
    cosine = (cpu * on_gpu).sum(1) / np.linalg.norm(cpu, axis=1) / np.linalg.norm(on_gpu, axis=1)
    assert cosine.min() >= 0.999
