"""`precision = "auto"` on a GPU: which precisions it may try, and which first.

No GPU here: the machine classes of `tests.machines` fake what `torch.cuda` answers (a T4
without bf16 units, an A100 with them). The precision table, the guesses and the spending rule
are the real code's; fp32's figures are those a GPU's gate pass would give (made up, stated).
"""

from __future__ import annotations

import pytest
import torch

from batchscore.measure.auto import prospects
from batchscore.measure.gate import Trial
from batchscore.measure.spend import Ledger, next_to_try
from batchscore.precision.table import available, precision

CUDA = torch.device("cuda")
# what a GPU's fp32 pass over a 256-row sample of MiniLM might give: 200k padded tokens/s
FP32 = Trial("fp32", {}, 0.1, 256, None, None, load_s=1.5, cold_s=0.3, tokens_per_s=2e5)
SAMPLE_TOKENS = 256 * 100.0


def candidates() -> list[str]:
    return [p for p in available(CUDA) if precision(p).gated]


def first_tried(rows: int) -> tuple[str | None, list[str]]:
    """What auto tries first for a job of ``rows`` 100-token rows, and what it weighed."""
    found = prospects(candidates(), CUDA, reference=FP32, sample_tokens=SAMPLE_TOKENS, known={},
                      layers=None)  # fmt: skip
    ledger = Ledger(fp32_speed=FP32.tokens_per_s, sample_tokens=SAMPLE_TOKENS,
                    left_tokens=rows * 100.0, own_s=FP32.load_s + FP32.cold_s)  # fmt: skip
    chosen, _ = next_to_try(found, ledger)
    return (chosen.prospect.name if chosen else None), [p.name for p in found]


@pytest.mark.parametrize(
    ("machine", "half"), [("cuda-turing", ["fp16"]), ("cuda-ampere", ["fp16", "bf16"])]
)
def test_a_gpu_tries_a_half_precision_first_and_never_int8(fake_machine, machine, half):
    """fp16 on every GPU, bf16 only where it has bf16 units (a T4 emulates it: slower than
    fp32); int8's kernels are the CPU's, so a GPU never tries it. fp16 and bf16 promise the
    same on tensor cores, and fp16 goes first: more mantissa, so it keeps closer to fp32 on
    the gate (MiniLM: cosine >= 0.9999), and generation's fp16 guard keeps it safe."""
    fake_machine(machine)
    assert candidates() == half and "int8" not in available(CUDA)
    first, weighed = first_tried(200_000)
    assert first == "fp16" and weighed == half


def test_once_fp16_won_bf16_cannot_pay_on_the_same_gpu(fake_machine):
    fake_machine("cuda-ampere")
    found = prospects(["bf16"], CUDA, reference=FP32, sample_tokens=SAMPLE_TOKENS, known={},
                      layers=None)  # fmt: skip
    ledger = Ledger(fp32_speed=FP32.tokens_per_s, sample_tokens=SAMPLE_TOKENS,
                    left_tokens=2e7, own_s=FP32.load_s + FP32.cold_s)  # fmt: skip
    ledger = ledger.after(won=True, speedup=2.4, cost_s=1.6)  # fp16 measured 2.4x fp32
    chosen, others = next_to_try(found, ledger)
    assert chosen is None and "not tried" in others[0].describe()


def test_a_job_no_larger_than_the_gate_sample_tries_nothing_on_a_gpu(fake_machine):
    fake_machine("cuda-ampere")
    assert first_tried(0)[0] is None
