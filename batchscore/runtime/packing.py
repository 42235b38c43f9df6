"""float32 Linear layers on the CPU through oneDNN with their weights packed once, at load.

``F.linear`` hands each call to the BLAS, which re-blocks the weight for its kernel on every
call; oneDNN's ``_linear_pointwise`` takes a weight packed once into the layout its kernel reads.
On this project's 2-core AMD EPYC (AVX2) that ran MiniLM's feed-forward matmuls 1.12-1.19x
faster, the whole encoder 1.02-1.12x, and greedy generation 1.5-1.85x, where a decoder's
steps multiply a few rows at a time (`docs/studies/packing_study.py`, BENCHMARKS.md). The packed
copy follows its weight: a weight changed in place (or replaced) is packed again before its next
call, and one cast to another dtype or moved off the CPU runs through ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear kernels."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU calls use a packed copy of its weight.

    It stays an ``nn.Linear`` with the same ``weight`` and ``bias`` parameters (tied weights stay
    tied, the state dict is unchanged, int8's calibration still finds and swaps it). The packed
    copy is a plain attribute, not a buffer: ``module.to()`` leaves it alone (oneDNN's opaque
    tensors cannot be cast or moved; the weight's new dtype or device sends calls to
    ``F.linear``), and a copy or pickle packs the copied weight again. It costs one more copy of
    the weight in memory.
    """

    packed: torch.Tensor
    packed_from: tuple[int, int]  # the weight's storage and version when it was packed

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("packed", None)  # an opaque oneDNN tensor has no storage to copy
        state.pop("packed_from", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.repack()

    def repack(self) -> None:
        """Pack the weight as it is now."""
        self.packed, self.packed_from = pack(self.weight), stamp(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, weight, self.bias)
        if stamp(weight) != self.packed_from:  # changed since it was packed
            self.repack()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(module: nn.Module) -> int:
    """Turn every float32 CPU ``nn.Linear`` (exactly that type: a subclass may do more in its
    forward) of ``module`` into a `PackedLinear`, in place; returns how many (none where torch
    lacks oneDNN). The layer object is kept (its class changes), so every reference to it, and
    every hook on it, still holds."""
    if not packing_available():
        return 0
    count = 0
    for layer in module.modules():
        weight = layer.weight if type(layer) is nn.Linear else None
        if weight is None or weight.dtype != torch.float32 or weight.device.type != "cpu":
            continue
        layer.__class__ = PackedLinear
        layer.repack()
        count += 1
    return count


def stamp(weight: torch.Tensor) -> tuple[int, int]:
    """What tells that a weight changed: its storage (replaced) and version (changed in place;
    a weight made under ``inference_mode`` keeps no version, and only its storage is told)."""
    return weight.data_ptr(), 0 if weight.is_inference() else weight._version


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in the layout oneDNN's linear kernel reads (a copy: an opaque oneDNN tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())
