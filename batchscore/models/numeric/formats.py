"""Model files for the tensor task: told apart by content, loaded without running pickles.

- safetensors: a JSON header and raw tensors; loading is parsing, nothing runs. The module comes
  from a factory the job names (`factories.py`), into which the weights are loaded strictly.
- TorchScript: an archive of TorchScript code and tensors, read by torch.jit's own loader, which
  builds only TorchScript objects (no Python globals, no imports). The model's TorchScript
  program does run when scored, and it may call any operator registered in this process.
- torch.export (``.pt2`` archives): a graph of operators plus tensors. `torch.export.load` falls
  back to a full pickle for some payloads, so the archive is checked first and refused when it
  holds pickled weights or constants, Python objects, compiled AOTInductor libraries, or sample
  inputs that a weights-only unpickler cannot read.
- A plain `torch.save` file is a pickle, which can run code as it loads: it is refused.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from batchscore.errors import ModelError
from batchscore.models.numeric.factories import find_factory
from batchscore.runtime.executor import Executor


def detect(path: Path) -> str:
    """ "safetensors", "torchscript", "export" or "pickle", from the file's bytes."""
    with path.open("rb") as fh:
        head = fh.read(9)
    if len(head) == 9 and head[8:9] == b"{":
        (size,) = struct.unpack("<Q", head[:8])
        if 0 < size < path.stat().st_size:
            return "safetensors"
    if zipfile.is_zipfile(path):
        names = zipfile.ZipFile(path).namelist()
        if any(n.endswith("archive_format") for n in names):
            return "export"
        if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
            return "torchscript"
        if any(n.endswith("data.pkl") for n in names):
            return "pickle"
    raise ModelError(f"{path}: not a safetensors, TorchScript or torch.export file")


def model_format(path: Path, options: Any) -> str:
    """The job's `[tensor].format`, or the one the file's content shows; pickles are refused."""
    if not path.is_file():
        raise ModelError(f"{path}: the tensor task reads one model file, not a folder")
    fmt = detect(path) if options.format == "auto" else options.format
    if fmt == "pickle":
        raise ModelError(
            f"{path}: a torch.save pickle, which can run code when loaded; save the weights "
            "with safetensors (and name a factory), or the model with TorchScript or torch.export"
        )
    if fmt == "safetensors" and not options.factory:
        raise ModelError(f"{path}: safetensors weights need [tensor].factory to build the model")
    return fmt


def check_export_archive(path: Path) -> None:
    """Refuse a torch.export archive whose loading would need a full (code-running) unpickler."""
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        if any("data/aotinductor/" in n for n in names):
            raise ModelError(f"{path}: holds compiled AOTInductor code, which is not loaded")
        for name in names:
            if name.endswith(("_weights_config.json", "_constants_config.json")):
                for fqn, entry in json.loads(archive.read(name))["config"].items():
                    if entry.get("use_pickle") or not entry["path_name"].startswith(
                        ("weight_", "tensor_")
                    ):
                        raise ModelError(f"{path}: {fqn} is stored as a pickle; not loaded")
            elif "data/weights/" in name and name.endswith(".pt"):
                raise ModelError(f"{path}: legacy pickled weights ({name}); re-export the model")
            elif "data/sample_inputs/" in name:
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as exc:
                    raise ModelError(f"{path}: {name} needs a full unpickler; not loaded") from exc


def load_model(path: Path, options: Any, executor: Executor) -> torch.nn.Module:
    """The tensor task's module, on the executor's device and dtype, in inference mode."""
    fmt = model_format(path, options)
    try:
        if fmt == "torchscript":
            module = torch.jit.load(str(path), map_location="cpu").eval()
        elif fmt == "export":
            check_export_archive(path)
            with path.open("rb") as fh:
                # An exported graph is frozen in the mode it was exported in (eval() is refused).
                module = torch.export.load(fh).module()
        else:
            return load_factory_model(path, options, executor)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ModelError(f"{path}: cannot load it as {fmt}: {exc}") from exc
    # Cast and place once, as `Executor.prepare` does (which neither kind of module allows whole).
    module = module.to(device=executor.device, dtype=executor.dtype)
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module


def load_factory_model(path: Path, options: Any, executor: Executor) -> torch.nn.Module:
    """Build the named factory's module and load the safetensors weights into it, strictly."""
    from safetensors.torch import load_file

    factory = find_factory(options.factory)
    try:
        module = factory(**options.factory_args)
    except TypeError as exc:
        raise ModelError(f"[tensor].factory_args: {options.factory}: {exc}") from exc
    missing, unexpected = module.load_state_dict(load_file(str(path)), strict=False)
    if missing or unexpected:
        raise ModelError(
            f"{path}: the weights do not fit factory {options.factory!r} (missing: "
            f"{', '.join(missing) or 'none'}; unexpected: {', '.join(unexpected) or 'none'})"
        )
    return executor.prepare(module)
