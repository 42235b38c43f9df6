"""Task adapters, chosen from a table keyed by `[model].task`; see `batchscore.models.base`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchscore.config import InputConfig, ModelConfig
from batchscore.executor import Executor
from batchscore.models.base import Encoded, Task
from batchscore.models.embed import EmbedTask
from batchscore.models.summarize import SummarizeTask

TASKS: dict[str, type] = {"embed": EmbedTask, "summarize": SummarizeTask}


def input_kinds(task: str, inp: InputConfig, options: Any) -> dict[str, str]:
    """Input columns a task reads, each with the kind it must be ("text" or "numeric")."""
    return TASKS[task].input_kinds(inp, options)


def load_task(
    path: Path, model: ModelConfig, options: Any, inp: InputConfig, executor: Executor
) -> Task:
    """Build the adapter for the job's task around the model at ``path``."""
    return TASKS[model.task](path, model, options, inp, executor)


__all__ = ["TASKS", "Encoded", "Task", "input_kinds", "load_task"]
