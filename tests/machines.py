"""The machine classes batchscore's users run on, faked on whatever machine runs the tests.

What a CPU has is read from CPUID through `torch.cpu.get_capabilities`, and oneDNN answers whether
it has bf16 and fp16 kernels; a GPU is what `torch.cuda` says. Each class below replaces those
answers (a mock: the tests run on one CPU, with no GPU), so a rule about devices is checked on
every class, not only on the machine at hand. Everything above those answers is the real code.

oneDNN's bf16 answer is what it gives on such a CPU: true on any AVX-512 CPU, bf16 units or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from batchscore.precision.int8_linear import weight_levels

AVX2 = {"avx": True, "avx2": True, "fma3": True}
AVX512 = {**AVX2, "avx512_f": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True}
AMX = {
    **AVX512,
    **dict.fromkeys(("avx512_vnni", "avx512_bf16", "avx512_fp16"), True),
    **dict.fromkeys(("amx_tile", "amx_bf16", "amx_int8"), True),
}


@dataclass(frozen=True)
class Machine:
    """One class of machine: its CPU's flags, and its GPU's compute capability (0: none)."""

    name: str
    cpu: dict[str, bool]
    gpu_major: int = 0
    gpu_name: str = ""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.gpu_major else "cpu")


MACHINES = {
    # an AVX2 EPYC or Xeon (Zen 2/3, Haswell to Skylake client): no bf16, fp16 or int8 dot units
    "avx2": Machine("avx2", AVX2),
    # Skylake-SP, Cascade Lake (with VNNI), Ice Lake: AVX-512, no bf16 units (oneDNN emulates)
    "avx512": Machine("avx512", AVX512),
    "avx512-vnni": Machine("avx512-vnni", {**AVX512, "avx512_vnni": True}),
    # Cooper Lake, AMD Zen 4/5 (EPYC Genoa, Turin): bf16 dot products and VNNI, no AMX
    "avx512-bf16": Machine("avx512-bf16", {**AVX512, "avx512_vnni": True, "avx512_bf16": True}),
    # Sapphire and Emerald Rapids: AMX tiles for bf16 and int8, AVX-512 FP16 (no AMX-FP16)
    "amx": Machine("amx", AMX),
    # Granite Rapids: AMX-FP16 tiles as well
    "amx-fp16": Machine("amx-fp16", {**AMX, "amx_fp16": True}),
    # GPUs: Ampere and later have bf16 tensor cores; Turing (a T4) only emulates bf16
    "cuda-ampere": Machine("cuda-ampere", AVX512, gpu_major=8, gpu_name="NVIDIA A100 (faked)"),
    "cuda-turing": Machine("cuda-turing", AVX2, gpu_major=7, gpu_name="Tesla T4 (faked)"),
}


def fake(monkeypatch: pytest.MonkeyPatch, machine: Machine, free: int = 16 * 2**30) -> None:
    """Make this process see ``machine``: its CPU flags, oneDNN's answers on it, and its GPU
    (``free`` bytes of memory free), or none."""
    flags = dict(machine.cpu)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(flags))
    avx512 = flags.get("avx512_f", False)
    fp16 = flags.get("avx512_fp16", False) or flags.get("amx_fp16", False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: avx512)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: fp16)
    weight_levels.cache_clear()  # read again from the faked flags (`fake_machine` clears it after)
    if machine.gpu_major:
        gpu(monkeypatch, major=machine.gpu_major, name=machine.gpu_name, free=free)
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def gpu(
    monkeypatch: pytest.MonkeyPatch,
    *,
    major: int = 7,
    name: str = "Tesla T4 (faked)",
    free: int = 16 * 2**30,
) -> SimpleNamespace:
    """A faked CUDA machine: one GPU of compute capability ``major`` (7: a T4, which emulates
    bf16 and so passes `is_bf16_supported()` unless emulation is excluded), ``free`` bytes free.
    Returns the spec, whose ``major`` and ``free`` a test may change."""
    spec = SimpleNamespace(major=major, free=free)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda *_: SimpleNamespace(major=spec.major)
    )
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda *_: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (spec.free, 16 * 2**30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return spec
