"""A two-tower model's weights: transformers' ``CLIPModel`` or ``SiglipModel`` loaded from its
folder, each tower as a module of its own whose output is the model's ``get_image_features`` or
``get_text_features``, so the executor prepares (casts, places, compiles) each as any model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from batchscore.job.sections import ModelConfig
from batchscore.models.source.locate import load_pretrained
from batchscore.models.vision.family import Towers


def features(output: Any) -> torch.Tensor:
    """The projected vectors: transformers 5 returns them as an output's ``pooler_output``,
    earlier versions as a tensor."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


# each tower's modules in transformers' CLIPModel and SiglipModel (SigLIP has no projections)
TOWER_PARTS = {
    "image": ("vision_model", "visual_projection"),
    "text": ("text_model", "text_projection"),
}


def drop(model: nn.Module, tower: str) -> nn.Module:
    """``model`` without ``tower``'s modules, which the other tower's features never call: its
    weights leave memory, and int8 does not calibrate layers that never run."""
    for name in TOWER_PARTS[tower]:
        if isinstance(getattr(model, name, None), nn.Module):
            setattr(model, name, nn.Identity())
    return model


class ImageTower(nn.Module):
    """Pixels in, ``get_image_features`` out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = drop(model, "text")

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = next(self.model.parameters()).dtype  # the executor's cast, once at load
        return features(self.model.get_image_features(pixel_values=pixel_values.to(dtype)))


class TextTower(nn.Module):
    """Token ids and their mask in, ``get_text_features`` out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = drop(model, "image")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return features(out)


def load_towers(towers: Towers, model: ModelConfig, executor: Any) -> nn.Module:
    """The folder's model (``AutoModel``: CLIPModel or SiglipModel), every weight its own."""
    from transformers import AutoModel

    return load_pretrained(AutoModel, towers.folder, model, executor, complete=True)


def output_dim(module: nn.Module) -> int:
    """The length of the vectors both towers write."""
    config = module.config
    if getattr(config, "projection_dim", None) and config.model_type == "clip":
        return int(config.projection_dim)
    return int(config.vision_config.hidden_size)  # SigLIP: the pooled vision state
