"""Device paths only a GPU machine would take, tested here with the device faked.

This machine has no GPU, so CUDA's answers are monkeypatched: which GPU it is, whether it has
bf16 units, how much memory is free, and an out-of-memory error (a real CUDA OOM cannot happen
on a CPU). Everything else is the real code: the precision table, the budget's probe, the
executor's placement, and real runs on the CPU for the folder that moves between machines.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from batchscore.errors import JobError, ModelError, OutputConflictError
from batchscore.job.parse import load_job
from batchscore.job.sections import ModelConfig
from batchscore.measure.budget import Shape, probe, shape_budget
from batchscore.pipeline.batching import Batching
from batchscore.precision.table import available, bf16_native
from batchscore.recipes.run import run_job
from batchscore.recipes.validate import preflight
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded
from tests.conftest import restamp
from tests.machines import gpu
from tests.reliability import make_job


@pytest.fixture(name="gpu")
def gpu_fixture(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    return gpu(monkeypatch)


def test_bf16_is_native_only_where_the_gpu_has_bf16_units(gpu):
    cuda = torch.device("cuda")
    assert torch.cuda.is_bf16_supported()  # what torch says of a T4, counting emulation
    assert not bf16_native(cuda) and available(cuda) == ["fp32", "fp16"]
    gpu.major = 8  # an A100 or newer
    assert bf16_native(cuda) and available(cuda) == ["fp32", "fp16", "bf16"]


def test_a_gpu_budget_is_half_the_free_memory_over_the_activations_per_token(gpu):
    shape = Shape(hidden=384, widest=1536, heads=12)
    budget, why = shape_budget(shape, device=torch.device("cuda"), dtype=torch.float16, longest=256)
    # 2 bytes x (1536 + 4 x 384 + 12 x 256) = 12 KiB a token; 8 GiB / 12 KiB = 699,050 -> cap
    assert budget == 262144 and "half of the 16.0 GiB free" in why
    gpu.free = 2**30
    assert shape_budget(shape, device=torch.device("cuda"), dtype=torch.float16, longest=256)[
        0
    ] == (32768)


def test_a_generating_models_gpu_budget_leaves_room_for_its_key_value_cache(gpu):
    """The continuous loop seats rows up to the budget's tokens, each holding its keys and
    values in every layer while it decodes: a GPU budget for a generating model counts that
    cache beside the activations, so budget x (activations + cache) stays within the half of
    the free memory it was sized from (CUDA faked: this machine has no GPU). A model with
    fewer key/value heads (grouped-query attention) holds less and gets more."""
    from batchscore.measure.budget import shape_of

    gpu.free = 2**33
    config = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
              "num_hidden_layers": 32, "max_position_embeddings": 2048}  # fmt: skip
    shape = shape_of(config)
    cuda, half = torch.device("cuda"), torch.float16
    scoring, _ = shape_budget(shape, device=cuda, dtype=half, longest=2048)
    budget, why = shape_budget(shape, device=cuda, dtype=half, longest=2048, generates=True)
    per_token = shape.bytes_per_token(2048, 2) + shape.cache_bytes_per_token(2)
    assert shape.cache_bytes_per_token(2) == 2 * 2 * 32 * 4096  # a key and a value a layer
    assert budget * per_token <= gpu.free / 2 < 2 * budget * per_token
    assert budget < scoring and "key/value cache" in why
    grouped = shape_of({**config, "num_key_value_heads": 8})
    assert grouped.cache_bytes_per_token(2) == shape.cache_bytes_per_token(2) // 4
    assert shape_budget(grouped, device=cuda, dtype=half, longest=2048, generates=True)[0] > budget
    cpu = torch.device("cpu")  # a CPU's budget is its working set's: the cache is host memory
    assert shape_budget(shape, device=cpu, dtype=half, longest=2048, generates=True) == (
        shape_budget(shape, device=cpu, dtype=half, longest=2048)
    )


class OutOfMemoryTask:
    """A task whose model runs out of memory above ``fits`` tokens a batch (a mock: a real CUDA
    out-of-memory cannot happen on this CPU-only machine)."""

    bucketing = True

    def __init__(self, fits: int) -> None:
        self.fits = fits

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        tokens = int((encoded.lengths[batch] + encoded.reserve).max()) * len(batch)
        if tokens > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return np.zeros((len(batch), 1), dtype=np.float32)


class Runs:
    device = torch.device("cuda")

    def run(self, fn):
        return fn()

    def release_memory(self) -> None:
        pass


def encoded(rows: int = 64, length: int = 100) -> Encoded:
    lengths = np.full(rows, length, dtype=np.int64)
    return Encoded(lengths=lengths, owners=np.arange(rows), rows=np.arange(rows))


def test_the_probe_halves_a_budget_that_runs_out_of_memory(gpu):
    chosen = SimpleNamespace(task=OutOfMemoryTask(fits=5000), executor=Runs())
    assert probe(chosen, encoded(), Batching(65536, 512, sort=True), floor=128) == 4096


def test_a_budget_that_never_fits_is_the_floor_not_a_crash(gpu):
    """Every budget out of memory: the floor, for the scorer to split what does not fit (it
    turns a row that cannot fit alone into that row's error), never `ValueError`."""
    chosen = SimpleNamespace(task=OutOfMemoryTask(fits=0), executor=Runs())
    assert probe(chosen, encoded(), Batching(65536, 512, sort=True), floor=128) == 128


def test_openvino_on_a_gpu_machine_with_device_auto_is_refused_not_ignored(gpu, tmp_path):
    model = ModelConfig(task="embed", runtime="openvino", precision="fp32")
    with pytest.raises(JobError, match=r'runtime = "openvino" runs on the CPU.*"auto" is cuda'):
        Executor(model)
    job = make_job(tmp_path, pa_rows(), chunk_rows=15)
    with pytest.raises(JobError, match=r'runtime = "openvino" runs on the CPU'):
        preflight(load_job(job, ['model.runtime="openvino"']))


def pa_rows():
    import pyarrow as pa

    return pa.table({"doc_id": ["a", "b"], "kind": ["x", "y"], "text": ["one", "two"]})


def test_weights_that_do_not_fit_the_gpu_are_the_models_error(gpu, monkeypatch):
    executor = Executor(ModelConfig(task="embed", precision="fp32", device="cpu"))
    module = torch.nn.Linear(4, 4)

    def no_room(*args, **kwargs):  # what moving to a full GPU raises (mocked: no GPU here)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(module, "to", no_room)
    with pytest.raises(ModelError, match="do not fit in the free memory") as caught:
        executor.prepare(module)
    assert caught.value.exit_code == 4


def settle_folder_as(tmp_path: Path, corpus, precision: str) -> Path:
    """A job's folder with one chunk to score again, settled at ``precision`` as a machine that
    runs it would have recorded it (this one may not: the record is written as it would be)."""
    job = make_job(tmp_path, corpus.slice(0, 30))
    run_job(load_job(job, AUTO))
    settled = tmp_path / "out/_batchscore/settled.json"
    record = json.loads(settled.read_text())
    record["precision"] = {"precision": precision, "why": "measured where it ran"}
    settled.write_text(json.dumps(record))
    for file in (tmp_path / "out").glob("*.parquet"):  # what its files' footers say too
        restamp(file, {"batchscore.precision": precision})
    next((tmp_path / "out/_batchscore/done").iterdir()).unlink()
    return job


AUTO = ["model.precision=auto", "quality.sample_rows=8"]


def test_a_folder_settled_at_int8_resumed_on_a_gpu_machine_is_a_folder_conflict(
    tmp_path: Path, small_corpus, monkeypatch
):
    job = settle_folder_as(tmp_path, small_corpus, "int8")
    gpu(monkeypatch)
    with pytest.raises(OutputConflictError) as caught:
        run_job(load_job(job, AUTO))  # the job never set a precision: "auto" settled it
    message = str(caught.value)
    assert caught.value.exit_code == 5 and "settled on precision int8" in message
    assert "does not run int8" in message and "--restart" in message
    assert "[model].precision" not in message


def test_a_folder_settled_at_fp16_resumed_on_a_cpu_is_a_folder_conflict(
    tmp_path: Path, small_corpus
):
    job = settle_folder_as(tmp_path, small_corpus, "fp16")
    with pytest.raises(OutputConflictError, match=r"settled on precision fp16.*does not run fp16"):
        run_job(load_job(job, AUTO))
