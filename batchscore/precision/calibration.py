"""Calibration: run the job's own sample rows through a module, and compare outputs row by row.

Quantization is judged on the rows the job will score, not on a benchmark: the worst row decides,
because a pipeline promises every row, and a mean hides the short texts that int8 hurts most.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

B = TypeVar("B")
# Runs one calibration batch through a module; returns one float row per input row [rows, ...].
Forward = Callable[[nn.Module, Any], torch.Tensor]


def run(module: nn.Module, batches: Sequence[B], forward: Forward) -> list[torch.Tensor]:
    """Outputs of every batch as float32 rows, under inference_mode (no autograd bookkeeping)."""
    with torch.inference_mode():
        return [forward(module, batch).float().flatten(1) for batch in batches]


def row_cosines(outputs: Iterable[torch.Tensor], reference: Iterable[torch.Tensor]) -> torch.Tensor:
    """Cosine of each output row with its reference row, all batches concatenated."""
    pairs = zip(outputs, reference, strict=True)
    return torch.cat([F.cosine_similarity(out, ref, dim=1) for out, ref in pairs])


def input_absmax(
    module: nn.Module, batches: Sequence[B], forward: Forward
) -> tuple[list[torch.Tensor], dict[nn.Linear, torch.Tensor]]:
    """Run the batches once: the outputs, and each Linear's per-input-channel max of |x|.

    A Linear the batches never reach has no entry (it is left alone: nothing says how it behaves).
    """
    absmax: dict[nn.Linear, torch.Tensor] = {}

    def observe(linear: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1])
        seen = x.abs().amax(dim=0).float()
        absmax[linear] = torch.maximum(absmax[linear], seen) if linear in absmax else seen

    hooks = [
        m.register_forward_pre_hook(observe) for m in module.modules() if isinstance(m, nn.Linear)
    ]
    try:
        outputs = run(module, batches, forward)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs, absmax
