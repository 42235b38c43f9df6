"""Which runtime a model runs on, decided before anything heavy is imported.

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

from batchscore.errors import JobError
from batchscore.job.sections import ModelConfig

ON_OPENVINO = ("fp32", "bf16", "int8")  # the precisions whose loads OpenVINO takes


def openvino_missing() -> str | None:
    """Why OpenVINO cannot run here, or None; found without importing it (0.2 s)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"batchscore runs OpenVINO on x86-64 CPUs only, and this is a {platform.machine()}"
    if importlib.util.find_spec("openvino") is None:
        return "OpenVINO is not installed here (pip install openvino)"
    return None


def runtime_problem(model: ModelConfig) -> str | None:
    """What makes `[model].runtime = "openvino"` impossible for this [model], or None."""
    if model.runtime != "openvino":
        return None
    if model.precision not in (*ON_OPENVINO, "auto"):
        return (
            f'"openvino" runs fp32, bf16 and int8 models; precision "{model.precision}" runs '
            'on torch. Use precision = "fp32", "bf16", "int8" or "auto", or runtime = "auto"'
        )
    if model.device.startswith("cuda"):
        return f'"openvino" runs on the CPU; [model].device is "{model.device}"'
    if model.compile:
        return '"openvino" and [model].compile = true both compile the model; choose one'
    return openvino_missing()


def check_runtime_device(model: ModelConfig, device_type: str) -> None:
    """Refuse `[model].runtime = "openvino"` where the device resolved to a GPU: "auto" on a
    machine with CUDA would otherwise run torch on the GPU while the job asked for OpenVINO."""
    if model.runtime == "openvino" and device_type != "cpu":
        raise JobError(
            f'[model].runtime = "openvino" runs on the CPU, and [model].device = '
            f'"{model.device}" is {device_type} on this machine; set device = "cpu" to run '
            'OpenVINO, or runtime = "auto" to run on the GPU'
        )


def openvino_wanted(model: ModelConfig, *, cpu: bool, precision: str) -> bool:
    """Whether a load of ``model`` at ``precision`` (a concrete one), on the CPU or not, goes to
    OpenVINO: asked for, or "auto" and OpenVINO is here."""
    if model.runtime == "torch" or not cpu or precision not in ON_OPENVINO or model.compile:
        return False
    return model.runtime == "openvino" or openvino_missing() is None
