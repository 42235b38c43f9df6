"""Which folders hold a model of two towers, image and text, embedding into one space.

transformers' ``CLIPModel`` and ``SiglipModel`` folders (``config.json`` of ``model_type``
"clip" or "siglip", and the processor's ``preprocessor_config.json``), and sentence-transformers'
CLIP layout: ``modules.json`` whose first module (``CLIPModel``, or the ``Transformer`` that
replaced it) names such a folder, optionally followed by ``Normalize``. Told apart by their
configs, never by a name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batchscore.errors import ModelError

KINDS = ("clip", "siglip")
# modules of sentence-transformers' CLIP layout: the towers, and what may follow them
TOWER_MODULES = ("CLIPModel", "Transformer")
AFTER_TOWERS = ("Normalize",)


@dataclass(frozen=True)
class Towers:
    """A two-tower model's folder (``config.json``, weights, processor) and its shapes."""

    source: Path  # the folder the job named
    folder: Path  # where the transformers model is (a sentence-transformers module's folder)
    kind: str  # "clip" or "siglip"
    image_size: int
    patch_size: int
    text_positions: int  # the text tower's positions: SigLIP's texts are padded to them
    normalize: bool  # the sentence-transformers stack ends in Normalize

    @property
    def patches(self) -> int:
        """Positions the image tower reads per image: its patches, and CLIP's class token."""
        side = self.image_size // self.patch_size
        return side * side + (1 if self.kind == "clip" else 0)


def read_json(file: Path) -> dict | list | None:
    """A JSON file's content, or None when it is absent or not JSON."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_type(folder: Path) -> str | None:
    config = read_json(folder / "config.json")
    return config.get("model_type") if isinstance(config, dict) else None


def stack_folder(path: Path) -> tuple[Path, bool] | None:
    """A sentence-transformers CLIP stack's model folder and whether it normalizes; None when
    ``path`` holds no such stack."""
    modules = read_json(path / "modules.json")
    if not isinstance(modules, list) or not modules or not isinstance(modules[0], dict):
        return None
    first = modules[0]
    if not str(first.get("type", "")).endswith(TOWER_MODULES):
        return None
    folder = path / str(first.get("path", ""))
    if model_type(folder) not in KINDS:
        return None
    rest = [str(m.get("type", "")) for m in modules[1:] if isinstance(m, dict)]
    others = [t for t in rest if not t.endswith(AFTER_TOWERS)]
    if others:
        raise ModelError(
            f"{path}: a CLIP stack followed by {others[0]}, which batchscore does not run; "
            "it runs the towers and Normalize"
        )
    return folder, bool(rest)


def find_towers(path: Path) -> Towers | None:
    """The two-tower model ``path`` holds, or None when it holds another kind of model."""
    if not path.is_dir():
        return None
    found = stack_folder(path)
    folder, normalize = found if found else (path, False)
    kind = model_type(folder)
    if kind not in KINDS:
        return None
    config = read_json(folder / "config.json")
    assert isinstance(config, dict)  # model_type read it
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    try:
        return Towers(
            source=path,
            folder=folder,
            kind=kind,
            image_size=int(vision.get("image_size", 224)),
            patch_size=int(vision.get("patch_size", 32 if kind == "clip" else 16)),
            text_positions=int(text.get("max_position_embeddings", 77 if kind == "clip" else 64)),
            normalize=normalize,
        )
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{folder}/config.json: unreadable tower shapes: {exc}") from exc
