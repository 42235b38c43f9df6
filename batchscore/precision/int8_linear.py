"""Int8Linear: a drop-in for ``nn.Linear`` that multiplies in int8 on the CPU's oneDNN kernels.

Weights are quantized once, per output channel (symmetric, +-127); activations per row
(token), at run time, because one row's outliers would otherwise set the step size for every row
of the batch. An optional per-input-channel smoothing vector (SmoothQuant) moves activation
outliers into the weights, where per-channel scales absorb them.

The matmul is ``torch.ops.onednn.qlinear_pointwise``, the kernel PyTorch's own x86 int8 path
(PT2E + inductor) lowers to. It takes plain uint8/int8 tensors, so nothing here touches the
deprecated quantized-tensor types (``torch.qint8``, ``torch.ao.quantization``).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from batchscore.precision.cpu import VNNI_UNITS, cpu_has

# uint8 activations with zero point 128: oneDNN's u8 x s8 path is its fast one (VNNI vpdpbusd
# multiplies unsigned by signed bytes); signed int8 activations fall back to a reference kernel.
ZERO_POINT = 128
# Rows are quantized, multiplied and rescaled in chunks this tall, so each chunk's float, uint8 and
# output temporaries (1.5-6 MB) stay in cache across the ~8 elementwise passes over them. Whole
# 8k-token batches stream every pass through DRAM: measured, that made the quantize/rescale
# passes cost 2-3x the int8 matmul; chunked, the layer runs ~2x faster.
CHUNK_ROWS = 1024
OPS = "torch.ops.onednn.qlinear_prepack, qlinear_pointwise"


def int8_available() -> bool:
    """Whether this build and CPU have working oneDNN int8 linear kernels (probed once)."""
    return int8_problem() is None


@cache
def int8_problem() -> str | None:
    """Why int8 cannot run here, or None when it can; probed once per process, at first use.

    ``qlinear_pointwise`` and ``qlinear_prepack`` are private oneDNN ops: a torch upgrade may
    drop, rename or change them without notice, and their presence alone says nothing about
    their signature. So the probe runs one tiny `Int8Linear` (the very code path a job runs)
    and checks its result against float, rather than looking the ops up by name.
    """
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn) support"
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(32, 8)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(8, 32, generator=generator))
        linear.bias.copy_(torch.randn(8, generator=generator))
    x = torch.randn(4, 32, generator=generator)
    try:
        with torch.inference_mode():
            got, want = Int8Linear(linear)(x), linear(x)
    except (AttributeError, RuntimeError, TypeError, NotImplementedError) as exc:
        return f"its private oneDNN ops ({OPS}) failed on a probe: {type(exc).__name__}: {exc}"
    if got.shape != want.shape or not torch.allclose(got, want, rtol=0.1, atol=0.2):
        return f"its private oneDNN ops ({OPS}) gave wrong results on a probe"
    return None


@cache
def weight_levels() -> int:
    """Largest int8 weight magnitude: 127 with VNNI (or AMX), 63 without.

    Without VNNI, oneDNN multiplies u8 x s8 with vpmaddubsw, which adds pairs of products in int16
    and saturates silently (255 * 127 * 2 > 32767); 7-bit weights keep every pair in range.
    """
    return 127 if cpu_has(*VNNI_UNITS) else 63


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of a 2-D float tensor, stored as uint8 with zero point 128."""
    absmax = torch.maximum(x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True).neg_())
    scale = absmax.clamp_(min=1e-12).div_(127)
    # float -> int8 is vectorised, float -> uint8 is not (4x slower); +128 mod 256 is a flip of
    # the sign bit, so XOR 0x80 on the int8 bytes gives the uint8 value with zero point 128.
    q = x.div(scale).round_().to(torch.int8).view(torch.uint8).bitwise_xor_(0x80)
    return q, scale


class Int8Linear(nn.Module):
    """``y = x @ W.T + b`` with W in int8 (per output channel) and x quantized per row on the fly.

    Its tensors are plain attributes, not parameters or buffers, so a later ``module.to(dtype)``
    (casting the rest of the model to bf16, say) leaves the int8 weights and float32 scales as
    the kernel needs them. Input and output share a dtype (float32 or bfloat16).
    """

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        self.inv_smooth = None
        if smooth is not None:
            # x @ W.T == (x / s) @ (W * s).T: the division by s is folded into the activation pass.
            weight = weight * smooth
            self.inv_smooth = smooth.reciprocal().float().contiguous()
        levels = weight_levels()
        self.w_scale = (weight.abs().amax(dim=1).clamp(min=1e-12) / levels).contiguous()
        w_int8 = torch.round(weight / self.w_scale[:, None]).clamp(-levels, levels).to(torch.int8)
        self.w_zero = torch.zeros(self.out_features, dtype=torch.int32)
        self.bias = linear.bias.detach().float() if linear.bias is not None else None
        # Prepacked once into oneDNN's blocked layout (an opaque tensor only its kernels read);
        # the plain bytes are kept for an OpenVINO build of the layer
        # (`batchscore.runtime.bert_openvino`).
        self.packed = torch.ops.onednn.qlinear_prepack(w_int8, None)
        self.w_int8 = w_int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        for start in range(0, x.shape[0], CHUNK_ROWS):
            self._chunk(x[start : start + CHUNK_ROWS], out[start : start + CHUNK_ROWS])
        return out.reshape(*shape[:-1], self.out_features)

    def _chunk(self, x: torch.Tensor, out: torch.Tensor) -> None:
        x = x * self.inv_smooth if self.inv_smooth is not None else x.float()
        q, scale = quantize_rows(x)
        y = torch.ops.onednn.qlinear_pointwise(
            q,
            1.0,
            ZERO_POINT,
            self.packed,
            self.w_scale,
            self.w_zero,
            None,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )
        # The per-row scale can only be applied after the kernel (oneDNN takes one activation
        # scale per tensor), and the bias after it; written straight into the output slice.
        if self.bias is not None:
            torch.addcmul(self.bias, y, scale, out=out)
        else:
            torch.mul(y, scale, out=out)

    def extra_repr(self) -> str:
        smooth = self.inv_smooth is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, smooth={smooth}"
