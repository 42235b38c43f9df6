"""batchscore: offline batch scoring of Parquet shards with PyTorch models.

The Python API (see the README's "From Python")::

    import batchscore
    report = batchscore.run("jobs/embed.toml", overrides={"model.max_length": 128})
    scored = batchscore.score(frame, task="embed", text="text")

``import batchscore`` loads nothing heavy: torch, transformers and the pipeline are imported by
the first call that needs them (`__getattr__` below), so a scheduler or a notebook can import
the package for free and a CLI's ``--help`` stays instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchscore.version import __version__

if TYPE_CHECKING:  # for type checkers and IDEs; at run time `__getattr__` imports on first use
    from batchscore.api import RunReport, run, score

__all__ = ["RunReport", "__version__", "run", "score"]
API = {"run", "score", "RunReport"}


def __getattr__(name: str) -> Any:
    """Import the API on first use (PEP 562), so importing the package stays cheap."""
    if name in API:
        from batchscore import api

        return getattr(api, name)
    raise AttributeError(f"module 'batchscore' has no attribute {name!r}")
