"""Out of memory in any batch halves it and goes on; it never fails the shard or the gate.

A real CUDA out-of-memory cannot happen on this CPU-only machine, so the task raises what
CUDA raises (mocked): torch's `OutOfMemoryError` from the caching allocator, and the plain
`RuntimeError`s a full GPU also gives (a kernel's own cudaMalloc, cuBLAS's workspace). The
splitting, the budget and the results are the real code's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.api import data_job
from batchscore.errors import ModelError
from batchscore.job.sections import BatchingConfig, ModelConfig
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.sampler import padded_tokens
from batchscore.pipeline.stages import encode
from batchscore.pipeline.static import Budget, run_sample, run_window
from batchscore.runtime.device import is_out_of_memory
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded
from tests.pipeline.test_known import QUIET, Sums
from tests.pipeline.test_scoring import window_of

# what a full GPU raises, each a batch too large (mocked: no GPU here)
FULL = {
    "allocator": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    "kernel": lambda: RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA"),
    "cublas": lambda: RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
}
OPTIONS = {"max_tokens": 256, "max_rows": 64, "precision": "fp32", "threads": 1}
ONE_ROW = "out of memory even as a batch of one row"


class Full(Sums):
    """`Sums` on a GPU that holds ``fits`` padded tokens a batch; above that, ``raises``."""

    def __init__(self, fits: int, raises: str) -> None:
        self.fits, self.raises = fits, raises
        self.ran: list[int] = []  # padded tokens of each batch that ran

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        tokens = padded_tokens(encoded.lengths + encoded.reserve, [batch])
        if tokens > self.fits:
            raise FULL[self.raises]()
        self.ran.append(tokens)
        return super().forward(encoded, batch)


def test_every_way_a_full_gpu_shows_is_out_of_memory_and_nothing_else_is():
    assert all(is_out_of_memory(make()) for make in FULL.values())
    assert not is_out_of_memory(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_out_of_memory(ValueError("CUDA out of memory"))  # not what torch raises


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(
        st.sampled_from(["a", "bb", "ccc", "e" * 9, "f" * 14, "g" * 30]), min_size=1, max_size=60
    ),
    fits=st.integers(1, 120),
    raises=st.sampled_from(sorted(FULL)),
)
def test_out_of_memory_in_any_batch_halves_it_and_every_row_leaves(texts, fits, raises):
    """Every row its own result, or (only where it cannot fit alone) its error; after the first
    out-of-memory, no batch the loop plans is over the smaller budget it set."""
    task = Full(fits, raises)
    job = data_job(task="embed", model=None, text="text", options=OPTIONS)
    policy = Batching.of(job.batching, task)
    window = encode(window_of(texts, [len(texts)]), task, policy, "skip")
    budget = Budget(policy)
    budget.for_shard(0)
    outcome = run_window(
        window,
        window.batches,
        task=task,
        executor=Executor(job.model),
        budget=budget,
        progress=QUIET,
    )
    for row, text in enumerate(texts):
        if len(text) > fits:
            assert outcome.errors[row] == ONE_ROW
        else:
            assert row not in outcome.errors and outcome.results[row] == sum(text.encode())
    split = [len(b) > 1 and padded_tokens(window.encoded.lengths, [b]) > fits
             for b in window.batches]  # fmt: skip
    if any(split):  # a batch ran out of memory and was split: the budget fell, and stays down
        assert budget.in_force.max_tokens < 256 and budget.for_shard(0) == budget.in_force
        assert policy.max_tokens == 256  # the job's policy stands: the next shard starts from it


@pytest.mark.parametrize("raises", sorted(FULL))
def test_the_gates_sample_halves_too_and_gives_every_rows_result(raises):
    texts = ["a" * (1 + i % 13) for i in range(50)]
    task = Full(40, raises)
    executor = Executor(ModelConfig(task="embed", precision="fp32", device="cpu", threads=1))
    encoded = task.encode(window_of(texts, [len(texts)]).table)
    policy = Batching(4096, 64, sort=True)
    cut = policy.batches(encoded, np.arange(len(texts)))
    sample = run_sample(encoded, cut, task=task, executor=executor, policy=policy)
    got = {int(u): r for b, o in zip(sample.batches, sample.outputs, strict=True)
           for u, r in zip(b, o, strict=True)}  # fmt: skip
    assert got == {i: sum(t.encode()) for i, t in enumerate(texts)}
    assert max(task.ran) <= 40 and len(sample.seconds) == len(sample.batches)


def test_a_sample_row_that_cannot_fit_alone_is_the_models_error_naming_its_tokens():
    task = Full(5, "allocator")
    executor = Executor(ModelConfig(task="embed", precision="fp32", device="cpu", threads=1))
    encoded = task.encode(window_of(["abc", "x" * 9], [2]).table)
    with pytest.raises(ModelError, match="one sample row of 9 tokens"):
        policy = Batching(4096, 8, sort=True)
        run_sample(encoded, [np.arange(2)], task=task, executor=executor, policy=policy)


def test_out_of_memory_in_an_unsorted_job_cuts_the_rest_in_input_order():
    """`[batching].sort = false` holds after an out-of-memory too: what was queued is cut again
    in input order under the smaller budget, never sorted by length."""
    texts = ["e" * 9, "a", "g" * 30, "bb", "f" * 14, "ccc", "a", "g" * 30]
    task, ran = Full(40, "allocator"), []
    forward = task.forward

    def recorded(encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        out = forward(encoded, batch)  # out of memory: not run, not recorded
        ran.extend(batch.tolist())
        return out

    task.forward = recorded
    policy = Batching.of(BatchingConfig(max_tokens=256, max_rows=64, sort=False), task)
    window = encode(window_of(texts, [len(texts)]), task, policy, "skip")
    budget = Budget(policy)
    budget.for_shard(0)
    executor = Executor(ModelConfig(task="embed", precision="fp32", device="cpu", threads=1))
    run_window(window, window.batches, task=task, executor=executor, budget=budget, progress=QUIET)
    assert budget.in_force.max_tokens < 256 and not budget.in_force.sort
    assert ran == sorted(ran) == window.units.tolist()  # the repeats are scored once
