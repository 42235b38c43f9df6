"""int8 precision as a load-time transform: swap Linear layers for int8 ones where quality allows.

Which layers go int8 is measured, not assumed: the fp32 module scores the job's own calibration
rows once (that pass also records each Linear's input range, for SmoothQuant), every Linear the
rows reach is swapped for an `Int8Linear`, and the rows are scored again; that pass also measures
each layer's own int8 error on the inputs it meets. If the worst row's cosine with fp32 falls
short, the layers with the largest error stay in float, as few as the target allows, found by a
binary search over that ranking. Calibration therefore costs a bounded number of passes over
the rows (`max_passes`: 3 + ceil(log2(Linear layers)), 10 for BERT-base's 72), never one pass
per Linear. Layers are found by type and judged by measurement, so any encoder works.

Usage, once at load, before the batch loop (the module is changed in place and returned)::

    module, report = quantize_int8(module, batches, forward, min_cosine=0.99)
    print(report.summary())
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from batchscore.precision.calibration import Forward, input_absmax, row_cosines, run
from batchscore.precision.int8_linear import Int8Linear, int8_available

# score(layers kept in float) -> per-row cosines with fp32, over every calibration row
Score = Callable[[set[str]], torch.Tensor]


def search_passes(layers: int) -> int:
    """The binary search's passes at most over ``layers`` ranked Linear layers: ceil(log2),
    enough to settle on one prefix length however many there are (7 for BERT-base's 72, 8 for
    BERT-large's 144); a cap below it could stop short and keep every layer in float."""
    return max(layers - 1, 0).bit_length()


def max_passes(layers: int) -> int:
    """Every pass a calibration over ``layers`` Linear layers can run: the fp32 pass (outputs and
    input ranges), the all-int8 pass (with each layer's own error), the search, and, where no
    shorter prefix met the target, the all-float one measured for the report."""
    return 2 + search_passes(layers) + 1


@dataclass
class QuantReport:
    """What `quantize_int8` did and what it measured on the calibration rows."""

    target: float  # the worst calibration row had to reach this cosine with fp32
    rows: int
    min_cosine: float  # of the returned module, worst calibration row
    mean_cosine: float
    quantized: list[str]  # module paths now Int8Linear
    kept: dict[str, str]  # module path -> why it stays in float
    # path -> its own int8 error (output error / output norm) on the rows, largest first
    sensitivity: dict[str, float] = field(default_factory=dict)
    int8_share: float = 0.0  # fraction of the Linear multiply-adds that run in int8
    passes: int = 0  # calibration passes run (each costs one forward over the rows)
    seconds: float = 0.0  # time to apply, all passes included

    def summary(self) -> str:
        kept = ", ".join(self.kept) or "none"
        return (
            f"{len(self.quantized)} Linear layers in int8 ({self.int8_share:.0%} of Linear "
            f"MACs), kept in float: {kept}; calibration {self.rows} rows: min cosine "
            f"{self.min_cosine:.4f} (target {self.target:.4f}), mean {self.mean_cosine:.5f}; "
            f"{self.passes} passes, {self.seconds:.1f} s"
        )


@dataclass
class Slot:
    """Where one Linear lives (so it can be swapped) and both of its versions."""

    path: str
    parent: nn.Module
    attr: str
    linear: nn.Linear
    int8: Int8Linear

    def use(self, quantized: bool) -> None:
        setattr(self.parent, self.attr, self.int8 if quantized else self.linear)


def smoothing(linear: nn.Linear, absmax: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel factor s = max|x|^a / max|W|^(1-a).

    Dividing x by s (and multiplying W's columns by s) flattens the few activation channels that
    are 10-15x larger than the rest in BERT-style FFNs; per-row activation scales would otherwise
    spend most of their 255 steps on those channels and round the rest coarsely.
    """
    w = linear.weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)
    return (absmax.clamp(min=1e-5) ** alpha / w ** (1 - alpha)).clamp(min=1e-5)


def quantize_int8(
    module: nn.Module,
    batches: Sequence[object],
    forward: Forward,
    min_cosine: float | None = 0.99,
    alpha: float | None = 0.5,
    headroom: float = 0.5,
    dtype: torch.dtype = torch.float32,
) -> tuple[nn.Module, QuantReport]:
    """Swap `module`'s Linear layers for int8 ones, keeping the sensitive ones in float.

    Args:
        module: the float32 module in eval mode, on the CPU (changed in place and returned).
        batches: a few hundred of the job's own rows, as whatever `forward` takes.
        forward: ``forward(module, batch) -> [rows, ...]`` float outputs (e.g. the pooled,
            normalized embeddings), compared row by row with the fp32 ones by cosine.
        min_cosine: the promise for every row of the job; None makes none: every Linear the
            rows reach goes int8 (what a user who accepts int8's quality as it is asks for).
        alpha: SmoothQuant migration strength; None turns smoothing off.
        headroom: the calibration sample must beat ``min_cosine`` by this fraction of the gap to
            1 (0.5: 0.995 for 0.99), because the job has rows the sample has not seen.
        dtype: for everything that is not int8 (attention, norms, layers kept in float):
            float32 anywhere; bfloat16 only where the CPU has native bf16 (AVX-512 BF16, AMX).
    """
    if not int8_available():
        raise RuntimeError("int8 needs PyTorch's oneDNN (mkldnn) CPU kernels, absent in this build")
    if (min_cosine is not None and not 0 < min_cosine <= 1) or not 0 <= headroom < 1:
        raise ValueError(
            f"min_cosine must be in (0, 1] and headroom in [0, 1), got {min_cosine}, {headroom}"
        )
    if not batches:
        raise ValueError("int8 calibration needs at least one batch of the job's rows")
    if any(p.device.type != "cpu" for p in module.parameters()):
        raise ValueError("int8 runs on the CPU: quantize the module before moving it elsewhere")
    start = time.perf_counter()
    target = -1.0 if min_cosine is None else min_cosine + headroom * (1 - min_cosine)
    reference, absmax = input_absmax(module, batches, forward)
    rows = sum(len(r) for r in reference)
    slots, unseen = find_slots(module, absmax, alpha)
    # Int8 twins are built from the float32 weights above; only now is the rest cast (in place,
    # so the Linear layers that may be restored are cast too; Int8Linear tensors are untouched).
    module.to(dtype)
    passes = 1

    def score(keep: set[str]) -> torch.Tensor:
        nonlocal passes
        passes += 1
        for slot in slots:
            slot.use(slot.path not in keep)
        return row_cosines(run(module, batches, forward), reference)

    with layer_errors(slots) as sensitivity:
        cosines = score(set())
    keep: list[str] = []
    if float(cosines.min()) < target:
        keep, cosines = fewest_to_keep(list(sensitivity), score, target)
    else:
        sensitivity = {}
    for slot in slots:
        slot.use(slot.path not in keep)
    kept = {path: "not reached by the calibration rows" for path in unseen}
    for rank, path in enumerate(keep, 1):
        kept[path] = f"int8 error rank {rank}: {sensitivity[path]:.2%} of its output"
    macs = {s.path: s.linear.in_features * s.linear.out_features for s in slots}
    report = QuantReport(
        target=target,
        rows=rows,
        min_cosine=float(cosines.min()),
        mean_cosine=float(cosines.mean()),
        quantized=[s.path for s in slots if s.path not in keep],
        kept=kept,
        sensitivity=sensitivity,
        int8_share=sum(v for p, v in macs.items() if p not in keep) / max(sum(macs.values()), 1),
        passes=passes,
        seconds=time.perf_counter() - start,
    )
    return module, report


def find_slots(
    module: nn.Module, absmax: dict[nn.Linear, torch.Tensor], alpha: float | None
) -> tuple[list[Slot], list[str]]:
    """Every Linear (by type, in module order) with its int8 twin; and those never run."""
    slots, unseen = [], []
    with torch.no_grad():
        for parent_path, parent in module.named_modules():
            for attr, child in parent.named_children():
                if not isinstance(child, nn.Linear):
                    continue
                path = f"{parent_path}.{attr}" if parent_path else attr
                if child not in absmax:
                    unseen.append(path)
                    continue
                smooth = smoothing(child, absmax[child], alpha) if alpha is not None else None
                slots.append(Slot(path, parent, attr, child, Int8Linear(child, smooth)))
    return slots, unseen


@contextmanager
def layer_errors(slots: list[Slot]) -> Iterator[dict[str, float]]:
    """While int8 layers run: each one's error against its float twin on the very inputs it
    meets (output error norm over output norm), filled in, largest first, on exit.

    A layer's own error is what the model's worst rows suffer from it before the layers after
    it add theirs, so it ranks which layers to keep in float without a pass per layer.
    """
    errors = dict.fromkeys((s.path for s in slots), 0.0)
    norms = dict.fromkeys((s.path for s in slots), 0.0)

    def hook(slot: Slot) -> Callable[..., None]:
        def measure(_: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            exact = slot.linear(args[0]).float()
            errors[slot.path] += float((out.float() - exact).square().sum())
            norms[slot.path] += float(exact.square().sum())

        return measure

    ranked: dict[str, float] = {}
    hooks = [slot.int8.register_forward_hook(hook(slot)) for slot in slots]
    try:
        yield ranked
    finally:
        for handle in hooks:
            handle.remove()
    relative = {p: (errors[p] / norms[p]) ** 0.5 if norms[p] else 0.0 for p in errors}
    ranked.update(sorted(relative.items(), key=lambda item: -item[1]))


def fewest_to_keep(
    ranked: list[str], score: Score, target: float
) -> tuple[list[str], torch.Tensor]:
    """The shortest largest-error-first prefix that, kept in float, meets the target.

    Binary search over the prefix length (keeping more layers in float only helps, nearly
    always), so the search costs at most `search_passes` calibration passes, not one per layer;
    a prefix is only ever returned with its own measured cosines.
    """
    lo, hi, best = 1, len(ranked), None
    while lo < hi:  # halves [lo, hi] each pass: search_passes(len(ranked)) at most
        mid = (lo + hi) // 2
        cosines = score(set(ranked[:mid]))
        if float(cosines.min()) >= target:
            hi, best = mid, cosines
        else:
            lo = mid + 1
    if best is None:  # nothing short of every layer met it: all float, measured for the report
        hi, best = len(ranked), score(set(ranked))
    return ranked[:hi], best
