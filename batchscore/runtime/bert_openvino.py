"""The native BERT encoder on OpenVINO's CPU runtime: the same layers, as one OpenVINO graph.

On a CPU, eager PyTorch runs a BERT layer as a dozen separate operators, and the ones around the
matmuls (attention over short rows, GELU, the layer norms, the residual adds) take a fifth of the
time for a twentieth of the work. OpenVINO compiles the whole graph with those fused into the
matmuls and runs it about 1.2x faster per token in float32 (BENCHMARKS.md, "OpenVINO runtime").

The graph is built here, operator by operator, from the loaded `BertEncoder`'s own weights, not
converted by OpenVINO's model converter: building it is a few milliseconds, needs no tracing and
no files, and the converter reports usage over the network unless told not to. Precision is
the encoder's own: a float32 encoder runs pinned to f32 (OpenVINO would pick bf16 on a CPU with
bf16 units), a bfloat16 one runs OpenVINO's bf16 kernels, which on a CPU with AVX-512 BF16 run
about 1.15x torch's bf16 per token (BENCHMARKS.md, "bf16 on OpenVINO"). An int8-calibrated
encoder (`batchscore.precision.int8`: some Linear layers swapped for `Int8Linear`) keeps those
layers' int8 weights and per-channel scales as OpenVINO's compressed weights, and OpenVINO
quantizes their inputs at run time per group of input channels (`DYNAMIC_QUANTIZATION_GROUP_SIZE`)
to multiply in int8 on the CPU's VNNI units: finer than torch's one scale per row, and about
1.3x OpenVINO's own bf16 per token on an EPYC with AVX-512 VNNI (BENCHMARKS.md, "int8 on
OpenVINO"). Every build is checked against the torch encoder on a probe batch before it scores
a row (`openvino_bert`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from batchscore.errors import ModelError
from batchscore.precision.int8_linear import Int8Linear, weight_levels
from batchscore.runtime.bert import BertEncoder, BertShape, EncoderOutput

log = logging.getLogger("batchscore")
# config.json's hidden_act -> OpenVINO's Gelu mode, or the opset function for the others
GELU_MODES = {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
# The probe's largest hidden-state difference from torch's, relative to the largest state: fused
# operators round differently (about 1e-6 in float32, 7e-3 in bfloat16, where torch rounds
# too); a wrong graph differs by the size of the states themselves.
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.05}
INT8_TOLERANCE = 0.05  # int8 against torch's int8: each rounds its activations its own way
HINTS = {torch.float32: "f32", torch.bfloat16: "bf16"}  # OpenVINO's name for each
# Input channels per dynamically quantized group of an int8 layer, the first that divides every
# such layer's inputs. Measured on MiniLM (1,000 bench texts, OpenVINO 2026.4, AVX-512 VNNI):
# groups of 128-384 ran 1.2-1.3x bf16 at min cosine 0.995-0.998 against fp32; groups of 32
# barely beat bf16; a group that does not divide a layer's inputs leaves it decompressed to f32.
GROUPS = (128, 64, 32)


def build_graph(encoder: BertEncoder) -> Any:
    """``encoder``'s forward as an OpenVINO model: token ids, attention mask and token types
    ([rows, length], int64, both sizes dynamic) to the last hidden states, in float32."""
    import openvino as ov
    import openvino.opset13 as ops

    shape: BertShape = encoder.config

    def weights(t: torch.Tensor) -> Any:
        return ops.constant(t.detach().to(torch.float32).contiguous().numpy(), dtype=ov.Type.f32)

    def ints(*values: int) -> Any:
        return ops.constant(np.array(values, dtype=np.int64))

    def scalar(value: int) -> Any:
        return ops.constant(np.int64(value))

    def norm(x: Any, layer: nn.LayerNorm) -> Any:
        scaled = ops.mvn(x, ints(-1), True, layer.eps, "inside_sqrt")  # as torch: var + eps
        return ops.add(ops.multiply(scaled, weights(layer.weight)), weights(layer.bias))

    def linear(x: Any, layer: nn.Linear | Int8Linear) -> Any:
        if not isinstance(layer, Int8Linear):
            return ops.add(ops.matmul(x, weights(layer.weight), False, True), weights(layer.bias))
        # int8 weights, then a multiply by their per-channel scales: the pattern OpenVINO's CPU
        # plugin keeps compressed and multiplies in int8 against its quantized inputs.
        if layer.inv_smooth is not None:  # SmoothQuant's x / s (W * s is in the weights)
            x = ops.multiply(x, weights(layer.inv_smooth))
        int8 = ops.convert(ops.constant(layer.w_int8.numpy(), dtype=ov.Type.i8), ov.Type.f32)
        scaled = ops.multiply(int8, weights(layer.w_scale[:, None]))
        out = ops.matmul(x, scaled, False, True)
        return out if layer.bias is None else ops.add(out, weights(layer.bias))

    def activation(x: Any) -> Any:
        act = shape.hidden_act
        if act in GELU_MODES:
            return ops.gelu(x, GELU_MODES[act])
        return ops.relu(x) if act == "relu" else ops.swish(x)  # silu / swish

    width, heads = shape.hidden_size, shape.num_attention_heads

    def split(x: Any) -> Any:  # [rows, length, width] -> [rows, heads, length, head width]
        return ops.transpose(
            ops.reshape(x, ints(0, 0, heads, width // heads), True), ints(0, 2, 1, 3)
        )

    ids, mask, types = (
        ops.parameter([-1, -1], ov.Type.i64, name=name)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    )
    length = ops.gather(ops.shape_of(ids), scalar(1), scalar(0))
    positions = ops.range(scalar(0), length, scalar(1), ov.Type.i64)
    # Summed in the torch encoder's order: words + types, then positions.
    x = ops.add(
        ops.gather(weights(encoder.words.weight), ids, ints(0)),
        ops.gather(weights(encoder.types.weight), types, ints(0)),
    )
    x = norm(
        ops.add(x, ops.gather(weights(encoder.positions.weight), positions, ints(0))),
        encoder.embedding_norm,
    )
    keep = ops.unsqueeze(ops.not_equal(mask, ints(0)), ints(1, 2))  # [rows, 1, 1, length]
    for layer in encoder.layers:
        q, k, v = (split(linear(x, lin)) for lin in (layer.query, layer.key, layer.value))
        attended = ops.scaled_dot_product_attention(q, k, v, keep, causal=False)
        attended = ops.reshape(ops.transpose(attended, ints(0, 2, 1, 3)), ints(0, 0, width), True)
        x = norm(ops.add(linear(attended, layer.attention_out), x), layer.attention_norm)
        inner = activation(linear(x, layer.intermediate))
        x = norm(ops.add(linear(inner, layer.output), x), layer.output_norm)
    return ov.Model([x], [ids, mask, types], "bert")


class OpenVinoBert(nn.Module):
    """A compiled OpenVINO graph in the place of a `BertEncoder`: the same call, the same output.

    It has no parameters: the weights live in the compiled graph, and precision's load-time
    transforms (casts, int8's Linear swap) have nothing to act on, which is why it is built
    after the cast and int8 never gets one (`batchscore.runtime.executor`). Its hidden states
    come back in ``dtype``, the encoder's, for the layers after it (pooling, a stack's head).
    """

    def __init__(self, compiled: Any, shape: BertShape, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = shape  # `SentenceEncoder` reads hidden_size, as from any encoder
        self.dtype = dtype
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.lock = threading.Lock()  # one infer request: one call at a time

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> EncoderOutput:
        ids = input_ids.to(torch.int64).numpy()
        types = (
            np.zeros_like(ids) if token_type_ids is None else token_type_ids.to(torch.int64).numpy()
        )
        # OpenVINO's Gather reads an index past the table as zeros; torch's embedding raises.
        # A tokenizer larger than the model's vocabulary must fail here as it does in torch.
        for name, values, rows in (
            ("token id", ids, self.config.vocab_size),
            ("token type", types, self.config.type_vocab_size),
        ):
            outside = values[(values < 0) | (values >= rows)]
            if outside.size:
                raise IndexError(f"{name} {outside[0]} is out of the model's range 0..{rows - 1}")
        with self.lock:
            out = self.request.infer([ids, attention_mask.to(torch.int64).numpy(), types])
            hidden = torch.from_numpy(np.array(out[0], dtype=np.float32, copy=True))
        return EncoderOutput(hidden.to(self.dtype))


def int8_group(encoder: BertEncoder) -> int | None:
    """Input channels per dynamically quantized group for ``encoder``'s int8 layers (`GROUPS`);
    None when it has none. A `ModelError` where int8 would not pay here: without VNNI (or AMX),
    or when no group size divides every int8 layer's inputs."""
    inputs = {m.in_features for m in encoder.modules() if isinstance(m, Int8Linear)}
    if not inputs:
        return None
    if weight_levels() < 127:  # `weight_levels` tells whether the CPU multiplies bytes in VNNI
        raise ModelError("OpenVINO's int8 needs VNNI or AMX int8 units, and this CPU has neither")
    for group in GROUPS:
        if all(n % group == 0 for n in inputs):
            return group
    raise ModelError(f"no int8 group of {GROUPS} divides the int8 layers' inputs {sorted(inputs)}")


def openvino_bert(encoder: BertEncoder, threads: int) -> OpenVinoBert:
    """``encoder`` (float32 or bfloat16, CPU; float32 with int8 layers after int8 calibration)
    compiled for OpenVINO's CPU runtime at its own precision with ``threads`` threads, checked
    against ``encoder`` itself on a probe batch (one row padded); a graph that disagrees is a
    `ModelError`, never a silently different number."""
    import openvino as ov

    dtype = encoder.words.weight.dtype
    if dtype not in HINTS:
        raise ModelError(f"OpenVINO runs float32 and bfloat16 encoders here, not {dtype}")
    group = int8_group(encoder)
    core = ov.Core()
    units = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if dtype == torch.bfloat16 and "BF16" not in units:  # else emulated (slow) or quietly f32
        raise ModelError("OpenVINO finds no bf16 units on this CPU")
    config = {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": HINTS[dtype],  # never bf16 behind an fp32 job's back
        "PERFORMANCE_HINT": "LATENCY",  # one stream: the batch loop calls one batch at a time
        "ENABLE_CPU_PINNING": False,  # the reader and writer threads share these cores
    }
    if group is not None:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(group)  # its binding takes a string
    ids = torch.arange(16, dtype=torch.int64).reshape(2, 8) % encoder.config.vocab_size
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    try:
        compiled = core.compile_model(build_graph(encoder), "CPU", config)
        module = OpenVinoBert(compiled, encoder.config, dtype)
        with torch.inference_mode():
            got = module(ids, mask).last_hidden_state
    except Exception as exc:  # OpenVINO's own errors carry no type worth telling apart
        raise ModelError(f"OpenVINO could not compile this encoder: {exc}") from exc
    with torch.inference_mode():
        want = encoder(ids, mask).last_hidden_state
    real = mask.bool()
    want, got = want[real].float(), got[real].float()
    gap = float((want - got).abs().max() / want.abs().max())
    tolerance = PROBE_TOLERANCE[dtype] if group is None else INT8_TOLERANCE
    if not gap <= tolerance:  # also catches NaN
        raise ModelError(
            f"the OpenVINO build of this encoder disagrees with torch's on a probe batch by "
            f"{gap:.3g} of its largest hidden state (tolerance {tolerance}); "
            'set [model].runtime = "torch"'
        )
    kind = f"{dtype}, int8 in groups of {group}" if group else str(dtype)
    log.debug("openvino: encoder compiled, %s, %d threads; probe gap %.2g", kind, threads, gap)
    return module
