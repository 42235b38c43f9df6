"""``max_tokens = "auto"``: the token budget from the model's shape, probed once on a GPU.

On a CPU the budget hardly matters once a batch holds a few thousand tokens: the cores are busy
either way (MiniLM ran within 5 % at every budget from 2,048 to 32,768, BENCHMARKS.md), and a
larger batch only costs memory. So the budget is the largest power of two whose per-token
activations (the widest layer's output, the hidden states around it and the attention scores
of a full-length row) fit a working set of `CPU_WORKING_SET` bytes, between the longest row and
16,384. On a GPU the budget is what fits: half the memory left free once the model is loaded,
over the same per-token bytes, then probed with one batch of the sample's rows at that size and
halved on out-of-memory. One probe, never a sweep of timed budgets.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore.job.sections import BatchingConfig, Job
from batchscore.measure.gate import Trial
from batchscore.models.tasks import generates
from batchscore.output.settled import Budget
from batchscore.pipeline.batching import Batching
from batchscore.precision.table import precision
from batchscore.runtime.device import is_out_of_memory, resolve_device

log = logging.getLogger("batchscore")
CPU_WORKING_SET = 128 * 2**20  # bytes of activations per batch on a CPU (MiniLM at 256: 4,096)
CPU_MAX, GPU_MIN, GPU_MAX = 16384, 4096, 262144
DEFAULT = 8192  # a model whose shape no config tells (a TorchScript file, a tensor model)
# the config keys transformers' architectures name their sizes by, most common first
HIDDEN = ("hidden_size", "d_model", "n_embd", "dim")
WIDEST = ("intermediate_size", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "ffn_dim")
HEADS = ("num_attention_heads", "num_heads", "n_head", "encoder_attention_heads")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers")


@dataclass(frozen=True)
class Shape:
    """What sets a model's activation memory per token, and the longest input it reads."""

    hidden: int
    widest: int
    heads: int
    positions: int | None = None  # the position table's length, where the model has one
    layers: int | None = None  # transformer blocks, where the config says
    kv_heads: int | None = None  # key/value heads where fewer than the query heads (GQA, MQA)

    @property
    def linear_layers(self) -> int | None:
        """Its Linear layers, as a transformer block has six (query, key, value, output, and
        the feed-forward's two), and two more for a pooler or head; None where unknown."""
        return 6 * self.layers + 2 if self.layers else None

    def bytes_per_token(self, length: int, element: int) -> int:
        """Activation bytes one token costs in a batch of rows ``length`` tokens long."""
        return element * (self.widest + 4 * self.hidden + self.heads * length)

    def cache_bytes_per_token(self, element: int) -> int:
        """Bytes one token holds in a decoder's key/value cache for as long as its row
        generates: a key and a value per layer, each the width of the key/value heads."""
        kv_width = self.hidden * (self.kv_heads or self.heads) // self.heads
        return element * 2 * (self.layers or 1) * kv_width


def model_shape(model_path: Path) -> Shape | None:
    """The shape a Hugging Face (or sentence-transformers) folder's config.json gives; None
    for a model without one."""
    for config in (model_path / "config.json", model_path / "0_Transformer" / "config.json"):
        try:
            data: Any = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return shape_of(data)
    return None


def shape_of(config: dict[str, Any]) -> Shape | None:
    """A config's sizes, by the keys transformers' architectures use; None without a width."""

    def first(keys: tuple[str, ...]) -> int | None:
        found = [config[k] for k in keys if type(config.get(k)) is int and config[k] > 0]
        return found[0] if found else None

    hidden = first(HIDDEN)
    if hidden is None:
        return None
    positions = first(("max_position_embeddings", "n_positions", "n_ctx"))
    heads = first(HEADS) or 1
    kv_heads = first(("num_key_value_heads", "multi_query_group_num"))
    if config.get("multi_query") is True:  # GPT-BigCode's single key/value head
        kv_heads = 1
    kv = kv_heads if kv_heads is not None and kv_heads < heads else None
    return Shape(hidden, first(WIDEST) or 4 * hidden, heads, positions, first(LAYERS), kv)


def power_of_two_below(value: float) -> int:
    return 2 ** max(int(np.floor(np.log2(max(value, 1.0)))), 0)


def power_of_two_above(value: float) -> int:
    return 2 ** max(int(np.ceil(np.log2(max(value, 1.0)))), 0)


def shape_budget(
    shape: Shape | None,
    *,
    device: torch.device,
    dtype: torch.dtype,
    longest: int,
    generates: bool = False,
) -> tuple[int, str]:
    """The budget the shape allows on ``device``, never below ``longest`` (the longest unit, in
    tokens, which must fit a batch alone); and why. A generating model's tokens also hold its
    key/value cache while their rows decode (the continuous loop seats rows up to the budget's
    tokens, prompts and new tokens counted), so on a GPU that cache counts beside them."""
    floor = power_of_two_above(longest)
    if shape is None:
        return max(DEFAULT, floor), "the default (no config.json tells the model's shape)"
    element = torch.empty((), dtype=dtype).element_size()
    per_token = shape.bytes_per_token(longest, element)
    what = (
        f"from the model's shape (hidden {shape.hidden}, widest layer {shape.widest}, "
        f"{shape.heads} heads; rows up to {longest} tokens: {per_token / 1024:.1f} KiB of "
        "activations per token"
    )
    if device.type == "cuda":
        if generates:
            cache = shape.cache_bytes_per_token(element)
            per_token += cache
            what += f" and {cache / 1024:.1f} KiB of key/value cache"
        free, _ = torch.cuda.mem_get_info(device)
        budget = min(max(power_of_two_below(free / 2 / per_token), GPU_MIN), GPU_MAX)
        return max(budget, floor), f"{what}, half of the {free / 2**30:.1f} GiB free)"
    budget = min(power_of_two_below(CPU_WORKING_SET / per_token), CPU_MAX)
    return max(budget, floor), f"{what}, {CPU_WORKING_SET // 2**20} MiB a batch on the CPU)"


def longest_unit(shape: Shape | None, max_length: int | None, sample_longest: int) -> int:
    """The longest unit the run can meet: the job's window, else the model's position table
    (else 512), and never shorter than a unit the sample holds (a prompt's reserve included)."""
    window = max_length or (shape.positions if shape and shape.positions else 512)
    return max(window, sample_longest)


def choose_budget(
    chosen: Trial,
    model_path: Path,
    table: pa.Table,
    *,
    max_length: int | None,
    batching: BatchingConfig,
    generates: bool = False,
) -> Budget:
    """The budget for the run's model (the chosen trial's): from its shape, and on a GPU
    probed with one batch of the sample's rows (cut as `[batching]` cuts the run's), halved
    until it fits."""
    task, executor = chosen.task, chosen.executor
    encoded = task.encode(table)
    sizes = encoded.lengths + encoded.reserve
    shape = model_shape(model_path)
    longest = longest_unit(shape, max_length, int(sizes.max()) if len(sizes) else 1)
    longest += encoded.reserve if max_length else 0
    budget, why = shape_budget(
        shape, device=executor.device, dtype=executor.dtype, longest=longest, generates=generates
    )
    if executor.device.type == "cuda" and len(sizes):
        policy = Batching.of(batching, task, max_tokens=budget)
        fits = probe(chosen, encoded, policy, floor=power_of_two_above(longest))
        if fits != budget:
            why += f"; {budget} ran out of memory in a probe, {fits} fits"
        budget = fits
    return Budget(budget, why)


def probe(chosen: Trial, encoded: Any, policy: Batching, *, floor: int) -> int:
    """The largest of ``policy``'s budget, its half, its quarter, ... (not below ``floor``) at
    which one batch of the sample's rows, repeated to fill it and cut by ``policy``, runs
    without running out of memory."""
    task, executor = chosen.task, chosen.executor
    sizes = encoded.lengths + encoded.reserve
    while True:
        budget = policy.max_tokens
        copies = int(np.ceil(budget / max(int(sizes.sum()), 1)))
        units = np.tile(np.arange(len(sizes)), copies)
        cut = policy.batches(encoded, units)
        fullest = max(cut, key=lambda b: len(b) * int(sizes[b].max()))
        try:
            executor.run(lambda b=fullest: task.forward(encoded, b))
            return budget
        except Exception as exc:
            if not is_out_of_memory(exc) or budget // 2 < floor:
                if is_out_of_memory(exc):
                    executor.release_memory()
                    return floor  # the scorer splits what does not fit, row by row if need be
                raise
            executor.release_memory()
            log.info("max_tokens = auto: %d ran out of memory; trying %d", budget, budget // 2)
            policy = policy.under(budget // 2)


def planned_budget(job: Job, model_path: Path) -> int:
    """The budget "auto" derives from the model's shape on this device, without loading it."""
    device = resolve_device(job.model.device)
    name = "fp32" if job.model.precision == "auto" else job.model.precision
    shape = model_shape(model_path)
    longest = longest_unit(shape, job.model.max_length, 1)
    kind, dtype = generates(job.model, model_path), precision(name).dtype
    return shape_budget(shape, device=device, dtype=dtype, longest=longest, generates=kind)[0]
