"""Model factories for safetensors weights: a name in the job -> code that builds the module.

A job names a factory (`[tensor].factory`), never an import path, so a job file cannot make
batchscore import arbitrary code. Factories are batchscore's built-ins, then those that installed
packages register under the entry-point group ``batchscore.factories``, e.g. in pyproject.toml:

    [project.entry-points."batchscore.factories"]
    churn-net = "mypackage.models:build_churn_net"

A factory takes the job's `[tensor].factory_args` as keyword arguments and returns an
``nn.Module`` whose state dict the weights file fills exactly. Built-ins win a name clash.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

import torch
from torch import nn

from batchscore.errors import ModelError
from batchscore.job.schema import did_you_mean

GROUP = "batchscore.factories"


class MLP(nn.Module):
    """Standardise (with statistics stored alongside the weights), then Linear/ReLU layers."""

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(in_features))
        self.register_buffer("scale", torch.ones(in_features))
        sizes = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers((x - self.mean) / self.scale)


def mlp(in_features: int, out_features: int, hidden: Sequence[int] = (64,)) -> nn.Module:
    """The built-in ``mlp`` factory: a multilayer perceptron over standardised features."""
    return MLP(in_features, out_features, hidden)


BUILTIN: dict[str, Callable[..., nn.Module]] = {"mlp": mlp}


def registered() -> dict[str, object]:
    """Factories that installed packages register (entry points, not yet imported)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def find_factory(name: str) -> Callable[..., nn.Module]:
    """The factory called ``name``; ModelError listing the known ones when there is none."""
    if name in BUILTIN:
        return BUILTIN[name]
    found = registered()
    if name not in found:
        known = sorted({*BUILTIN, *found})
        raise ModelError(
            f'[tensor].factory: no factory "{name}"{did_you_mean(name, known)}; known: '
            f"{', '.join(known)}. Packages register theirs under the entry-point group {GROUP}"
        )
    try:
        return found[name].load()
    except Exception as exc:  # an installed package's import failed: say which
        raise ModelError(f'[tensor].factory: "{name}" failed to import: {exc}') from exc
