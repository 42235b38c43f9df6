"""Executor: where the model runs. Device and precision are decided once, at load, never per batch.

A precision is an entry of `batchscore.precision.table` applied as a load-time transform; the batch
loop only moves inputs to the device and times the model, so "model busy" is measured in one place.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from batchscore.errors import ModelError
from batchscore.job.runtimes import check_runtime_device, openvino_wanted
from batchscore.job.sections import ModelConfig
from batchscore.precision.table import check_precision, precision
from batchscore.runtime.bert import BertEncoder
from batchscore.runtime.bert_openvino import openvino_bert
from batchscore.runtime.device import resolve_device
from batchscore.runtime.packing import pack_linears
from batchscore.runtime.transfer import Pending, transfer_for
from batchscore.threads import available_cores

T = TypeVar("T")
log = logging.getLogger("batchscore")


def inductor(module: torch.nn.Module) -> torch.nn.Module:
    """The module's forward through inductor. ``dynamic=True`` makes batch and sequence sizes
    symbolic from the first call, so each length bucket reuses one graph instead of compiling
    its own. Compiling happens at the first call: minutes cold on a small CPU, seconds when
    inductor's on-disk cache (FX graph and AOTAutograd caches, on by default) has the graph."""
    return torch.compile(module, backend="inductor", dynamic=True)


class Executor:
    """Holds the device, dtype and thread count, prepares modules, and times model calls."""

    def __init__(self, model: ModelConfig) -> None:
        self.device = resolve_device(model.device)
        check_runtime_device(model, self.device.type)
        check_precision(model.precision, self.device)
        self.precision = model.precision
        self.dtype = precision(model.precision).dtype
        self.transfer = transfer_for(self.device)  # how batches reach it and come back
        self.busy_s = 0.0
        self.prepared: list[torch.nn.Module] = []  # what int8 calibration will quantize
        self.quantization = ""  # what int8 did, for the run report
        self.calibrate_s = 0.0  # what int8's calibration took, part of the load
        entry = precision(model.precision)
        # int8's calibration swaps Linear layers after load, which a compiled graph would not see
        self.compile = model.compile and not entry.calibrated
        self.asked_runtime = model.runtime
        self.runtime = "torch"  # "openvino" once `prepare` has compiled an encoder for it
        cpu = self.device.type == "cpu"
        self.openvino = openvino_wanted(model, cpu=cpu, precision=model.precision)
        # One intra-op thread per core: more threads only fight over the same cores. Around an
        # OpenVINO encoder torch keeps one (see `run`).
        self.threads = (model.threads or available_cores()) if cpu else torch.get_num_threads()
        torch.set_num_threads(self.threads)

    @property
    def compiled(self) -> bool:
        """Whether the model runs as a compiled graph (inductor or OpenVINO), which a change to
        its torch layers after load (int8's swap) would not reach."""
        return self.compile or self.runtime == "openvino"

    @property
    def torch_threads(self) -> int:
        """torch's intra-op threads for this model's calls: one beside an OpenVINO encoder
        (see `run`), else the job's."""
        return 1 if self.runtime == "openvino" else self.threads

    def prepare(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast once, move once, switch to inference behaviour (no dropout, no grad); put a
        native BERT encoder on OpenVINO where the runtime says (`batchscore.job.runtimes`);
        compile when the job asks (`[model].compile`), else pack float32 CPU Linear weights for
        oneDNN (`batchscore.runtime.packing`). `prepared` keeps the module before inductor."""
        module = self.place(module).eval()
        module.requires_grad_(False)
        if self.openvino and not precision(self.precision).calibrated:
            module = self.to_openvino(module)  # int8's goes once calibrated (`calibrated`)
        if self.device.type == "cpu" and self.dtype == torch.float32 and not self.compile:
            pack_linears(module)  # the layers left in torch (a stack's Dense head, say)
        self.prepared.append(module)
        return inductor(module) if self.compile else module

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module cast and moved to the device; a GPU without room for its weights is the
        model's problem (exit 4) with the figures to act on, not a traceback."""
        try:
            return module.to(device=self.device, dtype=self.dtype)
        except torch.OutOfMemoryError as exc:
            self.release_memory()
            size = sum(p.numel() * p.element_size() for p in module.parameters()) / 2**30
            raise ModelError(
                f"the model's weights ({size:.1f} GiB at {self.precision}) do not fit in the "
                f"free memory of {self.device} ({exc}): free the device, choose a smaller "
                'precision, or set [model].device = "cpu"'
            ) from exc

    def calibrated(self, module: torch.nn.Module) -> None:
        """``module``, a prepared model whose Linear layers int8 calibration has just chosen,
        goes to OpenVINO where the runtime says: each native BERT encoder in it is replaced in
        place by its OpenVINO build, the int8 layers' weights kept in int8."""
        if self.openvino:
            self.to_openvino(module)  # a bare encoder as the model is no task's: none to replace

    def to_openvino(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` with each native BERT encoder in it compiled for OpenVINO. A model with
        none stays in torch, unless the job asked for OpenVINO by name: then it is refused."""

        def on_openvino(encoder: BertEncoder) -> torch.nn.Module:
            try:
                built = openvino_bert(encoder, self.threads)
            except ModelError as exc:
                if self.asked_runtime == "openvino":
                    raise ModelError(f'[model].runtime = "openvino": {exc}') from exc
                # int8 without VNNI is this CPU's lot, not a fault; an fp32 build failing is
                level = logging.INFO if precision(self.precision).calibrated else logging.WARNING
                log.log(level, "runtime auto: the encoder stays on torch: %s", exc)
                return encoder
            self.runtime = "openvino"
            return built

        if isinstance(module, BertEncoder):
            return on_openvino(module)
        for name, child in list(module.named_modules()):
            if isinstance(child, BertEncoder):
                parent, _, attr = name.rpartition(".")
                setattr(module.get_submodule(parent), attr, on_openvino(child))
        if self.runtime != "openvino" and self.asked_runtime == "openvino":
            raise ModelError(
                '[model].runtime = "openvino" runs BERT encoders batchscore runs natively '
                "(safetensors weights, absolute positions); this model loads through "
                'transformers and runs on torch: set runtime = "auto" or "torch"'
            )
        return module

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device, as the device's transfer moves it (on a GPU: staged in
        a reused pinned buffer, copied on its own stream, `batchscore.runtime.transfer`)."""
        return self.transfer.to_device(array)

    def host(self, tensor: torch.Tensor) -> Pending:
        """A model output on its way to the host; `wait` for it (on a GPU, after the next batch
        was launched, so the copy back overlaps it)."""
        return self.transfer.to_host(tensor)

    def launch(self, fn: Callable[[], Pending]) -> Pending:
        """Start a batch: as `run`, but ``fn`` returns its results still on their way (see
        `host`); the time it takes to start is model time."""
        return self.run(fn)

    def wait(self, pending: Pending) -> np.ndarray:
        """A launched batch's results on the host; the time waited is model time."""
        start = time.perf_counter()
        out = pending.result()
        self.busy_s += time.perf_counter() - start
        return out

    def release_memory(self) -> None:
        """Return cached blocks to the device: after an out-of-memory, before trying smaller;
        after a model is let go (`measure.gate.Trial.unload`), before the next one runs."""
        if self.device.type == "cuda":
            gc.collect()  # a model let go may still be held through a reference cycle
            torch.cuda.empty_cache()

    def run(self, fn: Callable[[], T]) -> T:
        """Call the model under inference_mode and add the time to `busy_s`.

        ``fn`` must return host data (e.g. ``.cpu()``): that copy is the sync point that makes the
        timing true on CUDA, where kernels otherwise return before they finish.

        Where the encoder runs on OpenVINO, torch's part (pooling, a small head) runs on one
        thread: a second OpenMP thread spins for a while after each op, on a core that
        OpenVINO's threads need for the next batch (6-14 % of the encoder's speed, BENCHMARKS.md
        "bf16 on OpenVINO"). Set at every call: trials of other precisions share the process.
        """
        if torch.get_num_threads() != self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        start = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        self.busy_s += time.perf_counter() - start
        return out
