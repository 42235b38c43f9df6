"""What the CPU's own units are, read from CPUID through torch (`torch.cpu.get_capabilities`).

oneDNN's own answers are not enough to call a precision native: its bf16 check is true on any
AVX-512 CPU (Skylake-SP, Cascade Lake and Ice Lake have no bf16 dot products and convert in
software), so a precision is native only where the CPU has the units that compute it.
"""

from __future__ import annotations

import torch

BF16_UNITS = ("avx512_bf16", "amx_bf16")  # bf16 dot products: Cooper Lake, Zen 4, Sapphire Rapids
# fp16 matrix products: AMX-FP16 (Granite Rapids). AVX-512 FP16 alone (Sapphire Rapids) is not
# enough: MiniLM ran fp16 at 1.17x torch's fp32 there, slower than fp32 on OpenVINO (a whole
# job 22.7 s against 18.4 s), where bf16 on AMX ran 3.9x (docs/studies/cpu_dtypes_study.py)
FP16_UNITS = ("amx_fp16",)
VNNI_UNITS = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot products into int32


def cpu_has(*flags: str) -> bool:
    """Whether the CPU has any of these units (torch's reading of CPUID; none on a torch too old
    to say)."""
    caps = getattr(torch.cpu, "get_capabilities", dict)()
    return any(caps.get(flag, False) for flag in flags)
