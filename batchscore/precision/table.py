"""The precisions, in one table keyed by `[model].precision`: everything that differs between them.

Adding a precision is one entry: the dtype the model's float parts run in, which devices run it
natively (faster than fp32), whether text generation may use it, and whether the loaded model is
transformed on the job's own rows (int8's calibration, see `batchscore.measure.load`).
Precision is decided once, at load; the batch loop never branches on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

import torch

from batchscore.errors import JobError, ModelError
from batchscore.job.sections import Precision as PrecisionName
from batchscore.precision.cpu import BF16_UNITS, FP16_UNITS, VNNI_UNITS, cpu_has
from batchscore.precision.int8_linear import int8_available, int8_problem, weight_levels


def bf16_native(device: torch.device) -> bool:
    """CUDA with bf16 units (not a T4's emulation, which `is_bf16_supported` counts unless
    told not to); a CPU with AVX-512 BF16 or AMX-BF16 units whose kernels this torch's oneDNN
    has. oneDNN's own check alone is true on every AVX-512 CPU, bf16 units or not."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return cpu_has(*BF16_UNITS) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def fp16_native(device: torch.device) -> bool:
    """Every CUDA GPU; a CPU with AMX-FP16 tiles (and oneDNN's kernels for them). Elsewhere
    fp16 gains nothing on fp32 (AVX-512 FP16 without AMX-FP16: 1.17x torch's fp32, see
    `batchscore.precision.cpu`) or is converted in software (slow)."""
    if device.type == "cuda":
        return True
    return cpu_has(*FP16_UNITS) and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def int8_native(device: torch.device) -> bool:
    """The CPU's oneDNN int8 kernels (see `batchscore.precision.int8_linear`), when they work."""
    return device.type == "cpu" and int8_available()


def bf16_speedup(device: torch.device) -> float:
    """A first guess of bf16's speed over fp32 before anything is measured: tensor cores on a
    GPU; AMX tiles; AVX-512 BF16's dot products (1.6x OpenVINO's fp32 on MiniLM, BENCHMARKS.md)."""
    if device.type == "cuda":
        return 2.0
    return 2.5 if cpu_has("amx_bf16") else 1.6


def fp16_speedup(device: torch.device) -> float:
    """As `bf16_speedup`: tensor cores, or AMX-FP16 tiles (not measured here: no such CPU)."""
    return 2.0


def int8_speedup(device: torch.device) -> float:
    """As `bf16_speedup`: AMX int8 tiles; VNNI dot products (2.1x OpenVINO's fp32 on MiniLM);
    without either, 7-bit weights through vpmaddubsw: 1.5x in a study of MiniLM's layers, but
    whole jobs on an AVX2 EPYC ran 1.26x (MiniLM, 256 tokens) and 1.10x (a MiniLM classifier,
    64 tokens, where attention and the rest weigh more), so the guess is the lower 1.2x: a
    guess too high makes a small job pay for a calibration its rows cannot repay."""
    if cpu_has("amx_int8"):
        return 2.5
    return 2.0 if cpu_has(*VNNI_UNITS) else 1.2


def int8_missing(device: torch.device) -> str | None:
    """Why this torch cannot run int8 on the CPU at all (a private op gone or broken)."""
    return int8_problem() if device.type == "cpu" else None


@dataclass(frozen=True)
class Precision:
    """One precision and everything that sets it apart."""

    dtype: torch.dtype  # what the model's float parts run in
    native: Callable[[torch.device], bool]  # whether this device runs it faster than fp32
    gated: bool = True  # compared with fp32 on the job's rows before it scores them
    generates: bool = True  # text generation may use it
    calibrated: bool = False  # the loaded model is transformed on the job's own rows
    # a first guess of its speed over fp32 on this device, before anything is measured: what
    # "auto" weighs when deciding whether trying it can pay for itself (`batchscore.measure.auto`)
    speedup: Callable[[torch.device], float] = lambda device: 1.0
    # why this torch build cannot run it on the device at all (a missing kernel), or None
    missing: Callable[[torch.device], str | None] = lambda device: None
    # whether OpenVINO's CPU runtime takes a native encoder at it on this device (where it does
    # not, a model stays on torch, and misses the 1.2x OpenVINO gives fp32: `measure.auto`)
    openvino: Callable[[torch.device], bool] = lambda device: device.type == "cpu"


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(torch.float32, lambda device: True, gated=False),
    "fp16": Precision(
        torch.float16, fp16_native, speedup=fp16_speedup, openvino=lambda device: False
    ),
    "bf16": Precision(torch.bfloat16, bf16_native, speedup=bf16_speedup),
    # int8's Linear layers go int8 once calibrated; everything else stays float32 (`int8.py`).
    # Its calibration compares output vectors, which generated text does not have.
    "int8": Precision(
        torch.float32,
        int8_native,
        generates=False,
        calibrated=True,
        missing=int8_missing,
        speedup=int8_speedup,
        # OpenVINO multiplies int8 on VNNI or AMX units only (`runtime.bert_openvino`)
        openvino=lambda device: device.type == "cpu" and weight_levels() == 127,
    ),
}
# The job file's vocabulary is these names plus "auto" (a choice among them, see `choose`).
assert set(get_args(PrecisionName)) == {*PRECISIONS, "auto"}, "precision table out of step"


def precision(name: str) -> Precision:
    """The table entry for ``name``; an unknown name lists the known ones."""
    if name not in PRECISIONS:
        raise JobError(f'[model].precision: "{name}" is not one of {", ".join(PRECISIONS)}')
    return PRECISIONS[name]


def available(device: torch.device) -> list[str]:
    """The precisions this device runs natively, fp32 first; the others are refused."""
    return [name for name, entry in PRECISIONS.items() if entry.native(device)]


def check_precision(name: str, device: torch.device) -> None:
    """Refuse a precision the device cannot run well, listing the ones it can.

    A precision whose kernels this torch build lacks (int8's private oneDNN ops, gone or broken
    after an upgrade) is a model error (exit 4) naming the torch version; "auto" never picks it.
    """
    missing = PRECISIONS[name].missing(device) if name in PRECISIONS else None
    if missing:
        raise ModelError(
            f'[model].precision: "{name}" cannot run with torch {torch.__version__} here: '
            f"{missing}. Use one of {', '.join(available(device))}"
        )
    fast = available(device)
    if name not in [*fast, "auto"]:
        raise JobError(
            f'[model].precision: "{name}" has no native support on {device} here '
            f"and would run slower than fp32; use one of {', '.join(fast)}"
        )
