"""The runtimes a model runs on, in one table keyed by `[model].runtime` (`RUNTIMES`): each
entry holds what sets it apart (the precisions it takes, its device, what rules it out), decided
before anything heavy is imported.

`[model].runtime` is "torch" (eager PyTorch for every model), "openvino" (the native BERT
encoder compiled for OpenVINO's CPU runtime, `batchscore.runtime.bert_openvino`) or "auto", which
is OpenVINO wherever it can run the model and PyTorch elsewhere. OpenVINO takes fp32, bf16 and
int8 loads on the CPU only (int8's once its calibration has chosen the int8 layers on torch):
fp16 stays a torch cast (OpenVINO's CPU fp16 needs AMX-FP16), and `[model].compile` hands the
graph to inductor instead. This module imports neither torch nor OpenVINO, so `batchscore
validate` checks the key without paying for either.
"""

from __future__ import annotations

import importlib.util
import platform
from collections.abc import Callable
from dataclasses import dataclass

from batchscore.errors import JobError
from batchscore.job.sections import ModelConfig


def openvino_missing() -> str | None:
    """Why OpenVINO cannot run here, or None; found without importing it (0.2 s)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"batchscore runs OpenVINO on x86-64 CPUs only, and this is a {platform.machine()}"
    if importlib.util.find_spec("openvino") is None:
        return "OpenVINO is not installed here (pip install openvino)"
    return None


@dataclass(frozen=True)
class Runtime:
    """One runtime, and what sets it apart: what it runs, where, and what rules it out."""

    label: str  # its name in messages
    precisions: tuple[str, ...] | None = None  # the precisions whose loads it takes; None: all
    cpu_only: bool = False
    compiles: bool = False  # it compiles the graph, as `[model].compile` would
    missing: Callable[[], str | None] = lambda: None  # why it cannot run here at all, or None

    def takes(self, precision: str) -> bool:
        """Whether it runs a load at ``precision`` (a concrete one)."""
        return self.precisions is None or precision in self.precisions


# `[model].runtime`'s vocabulary is these names plus "auto" (OpenVINO where it can, else torch)
RUNTIMES: dict[str, Runtime] = {
    "torch": Runtime("PyTorch"),
    "openvino": Runtime(
        "OpenVINO",
        ("fp32", "bf16", "int8"),
        cpu_only=True,
        compiles=True,
        missing=lambda: openvino_missing(),  # looked up when asked: tests stand in for it
    ),
}
OPENVINO = RUNTIMES["openvino"]


def listed(names: tuple[str, ...], last: str = "and") -> str:
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else names[0]


def runtime_problem(model: ModelConfig) -> str | None:
    """What makes the runtime `[model].runtime` names impossible for this [model], or None
    ("auto" chooses among them for itself)."""
    if model.runtime not in RUNTIMES:
        return None
    name, entry = model.runtime, RUNTIMES[model.runtime]
    if model.precision != "auto" and not entry.takes(model.precision):
        quoted = tuple(f'"{p}"' for p in entry.precisions)
        return (
            f'"{name}" runs {listed(entry.precisions)} models; precision "{model.precision}" '
            f'runs on torch. Use precision = {", ".join(quoted)} or "auto", or runtime = "auto"'
        )
    if entry.cpu_only and model.device.startswith("cuda"):
        return f'"{name}" runs on the CPU; [model].device is "{model.device}"'
    if entry.compiles and model.compile:
        return f'"{name}" and [model].compile = true both compile the model; choose one'
    return entry.missing()


def check_runtime_device(model: ModelConfig, device_type: str) -> None:
    """Refuse a CPU-only runtime named by the job where the device resolved to a GPU: "auto" on
    a machine with CUDA would otherwise run torch on the GPU while the job asked for OpenVINO."""
    entry = RUNTIMES.get(model.runtime)
    if entry is not None and entry.cpu_only and device_type != "cpu":
        raise JobError(
            f'[model].runtime = "{model.runtime}" runs on the CPU, and [model].device = '
            f'"{model.device}" is {device_type} on this machine; set device = "cpu" to run '
            f'{entry.label}, or runtime = "auto" to run on the GPU'
        )


def openvino_wanted(model: ModelConfig, *, cpu: bool, precision: str) -> bool:
    """Whether a load of ``model`` at ``precision`` (a concrete one), on the CPU or not, goes to
    OpenVINO: asked for, or "auto" and OpenVINO is here."""
    if model.runtime == "torch" or not cpu or not OPENVINO.takes(precision) or model.compile:
        return False
    return model.runtime == "openvino" or OPENVINO.missing() is None
