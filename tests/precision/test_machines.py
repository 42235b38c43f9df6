"""Which precisions each class of machine runs natively, with the machine faked (`tests.machines`):
a precision is native only where the device has the units that compute it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from batchscore.precision.table import (
    available,
    bf16_native,
    bf16_speedup,
    fp16_native,
    int8_speedup,
)
from tests.commands import invoke
from tests.reliability import make_job

NATIVE = {
    "avx2": ["fp32", "int8"],
    "avx512": ["fp32", "int8"],  # oneDNN says bf16, but it would convert in software
    "avx512-vnni": ["fp32", "int8"],
    "avx512-bf16": ["fp32", "bf16", "int8"],
    "amx": ["fp32", "bf16", "int8"],  # AVX-512 FP16 alone: fp16 no faster than fp32
    "amx-fp16": ["fp32", "fp16", "bf16", "int8"],
    "cuda-ampere": ["fp32", "fp16", "bf16"],
    "cuda-turing": ["fp32", "fp16"],
}


@pytest.mark.parametrize("name", NATIVE)
def test_each_machine_runs_natively_what_its_units_compute(fake_machine, name):
    machine = fake_machine(name)
    assert available(machine.device) == NATIVE[name]


def test_an_avx512_cpu_without_bf16_units_is_not_bf16_native(fake_machine):
    """oneDNN's own bf16 check is true for any AVX-512 CPU: it is not enough."""
    fake_machine("avx512")
    assert torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert not bf16_native(torch.device("cpu"))


def test_an_amx_cpu_without_amx_fp16_is_not_fp16_native(fake_machine):
    """AVX-512 FP16 without AMX-FP16 (Sapphire Rapids): oneDNN has fp16 kernels, but MiniLM ran
    1.17x torch's fp32 in them, slower than fp32 on OpenVINO (measured on such a CPU), so fp16
    is not offered; Granite Rapids' AMX-FP16 tiles are."""
    fake_machine("amx")
    assert torch.ops.mkldnn._is_mkldnn_fp16_supported()
    assert not fp16_native(torch.device("cpu"))
    fake_machine("amx-fp16")
    assert fp16_native(torch.device("cpu"))


def test_first_guesses_follow_the_units(fake_machine):
    cpu = torch.device("cpu")
    fake_machine("avx2")
    assert int8_speedup(cpu) == pytest.approx(1.2)
    fake_machine("avx512-vnni")
    assert int8_speedup(cpu) == pytest.approx(2.0)
    fake_machine("avx512-bf16")
    assert bf16_speedup(cpu) == pytest.approx(1.6)
    fake_machine("amx")
    assert bf16_speedup(cpu) == pytest.approx(2.5) and int8_speedup(cpu) == pytest.approx(2.5)


def test_fixed_bf16_is_refused_at_validate_on_an_avx512_cpu_without_bf16_units(
    fake_machine, tmp_path: Path, small_corpus
):
    job = make_job(tmp_path, small_corpus.slice(0, 10))
    fake_machine("avx512")
    result = invoke("validate", str(job), "--set", 'model.precision="bf16"')
    assert result.exit_code == 2, result.output
    assert "[model].precision" in result.output and "no native support" in result.output
    fake_machine("avx512-bf16")
    assert invoke("validate", str(job), "--set", 'model.precision="bf16"').exit_code == 0
