"""The Python API: `run` a job as the command line does, or `score` a data frame in memory.

Both raise the package's exceptions (`batchscore.errors`, each with the CLI's ``exit_code``),
never ``SystemExit``. `score` keeps loaded models in this process (`recipes.score.LOADED`), so
a notebook that scores twice with the same settings loads, gates and calibrates the model once.

A call that takes longer than `SAY_AFTER_S` says what it is doing on stderr (loading the model,
the quality gate, then a progress bar), unless the program logs for itself: a notebook's first
call on a fresh machine is not silent for a minute.

Each call runs one recipe (`batchscore.recipes`: `driver.run_job`, `score.score_rows`) and only
translates: its arguments into a job, frames into Arrow and back, the command line's words in
messages into Python's. Calls from several threads take turns (`batchscore.recipes.score.TURN`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from batchscore.errors import BatchscoreError, JobError, ShardsFailedError
from batchscore.frames import Frame
from batchscore.job.parse import apply_overrides, apply_values, job_from_dict, read_job_file
from batchscore.job.schema import did_you_mean, show
from batchscore.job.sections import SECTIONS, TASK_SECTIONS, Job
from batchscore.observe.logs import slow_steps
from batchscore.observe.run_stats import RunReport
from batchscore.recipes.run import run_job
from batchscore.recipes.score import MEMORY, TURN, columns_read, score_rows

__all__ = ["RunReport", "run", "score"]
SAY_AFTER_S = 1.0  # a step (or scoring) that runs longer is said, on stderr
Overrides = Mapping[str, Any] | Sequence[str]
# Job keys `score` takes as options, by section; the others make no sense without files.
OPTION_SECTIONS = ("model", "batching", "quality", "output", "input")
NOT_OPTIONS = {
    "input": {"path", "text", "id", "keep", "where"},
    "model": {"task", "name", "path"},
    "output": {"path", "chunk_rows"},
}
# The names sentence-transformers and `run`'s own arguments give what a job key does
ALIASES = {"batch_size": "max_rows", "accept_quality": "accept"}
GENERATING = ("generate", "summarize")  # tasks with max_new_tokens, where max_tokens misleads
# The command line's words in library messages, and what a Python caller writes instead
PYTHON_WORDS = (
    ("with --restart", "with restart=True"),
    ("--restart", "restart"),  # "an interrupted --restart"
    ("--accept-quality", "accept_quality=True"),
)


def run(
    job: str | PathLike[str] | Mapping[str, Any],
    *,
    overrides: Overrides | None = None,
    restart: bool = False,
    accept_quality: bool = False,
    progress: Literal["bar", "log", "off"] | None = None,
) -> RunReport:
    """Score every row of ``job`` not yet committed, as ``batchscore run`` does.

    Args:
        job: a job file's path, or a dict of its TOML tables (relative paths are then
            relative to the working directory).
        overrides: ``{"model.max_length": 128}`` (values as they are), or ``--set`` strings.
        restart: discard committed output and start over.
        accept_quality: score even if the precision fails its [quality] gate.
        progress: "bar", "log" (a log line every 10 s) or "off" (the default).

    Raises:
        JobError: a bad job (naming the file and key); every other `BatchscoreError` as the CLI
            would exit with it. `ShardsFailedError` when shards failed: the others were
            committed, and its ``report`` (a `RunReport`) names the failures. Messages name
            this function's arguments (``restart=True``), not the command line's flags.
    """
    with TURN, in_python_words():
        loaded = job_of(job, overrides)
        if progress not in (None, "bar", "log", "off"):
            raise JobError(f'run(): progress: expected "bar", "log" or "off", got {progress!r}')
        try:
            report = run_job(
                loaded,
                restart=restart,
                accept_quality=accept_quality,
                progress=progress or "off",
                environ=os.environ,
            )
        except ShardsFailedError as exc:
            exc.report = RunReport.of(exc.report)
            raise
    return RunReport.of(report)


@contextlib.contextmanager
def in_python_words() -> Iterator[None]:
    """Errors raised within name what a Python caller passes (``restart=True``), not the
    command line's flags that library messages name (``--restart``)."""
    try:
        yield
    except BatchscoreError as exc:
        exc.args = tuple(python_words(a) if isinstance(a, str) else a for a in exc.args)
        if isinstance(exc, JobError):
            exc.problems = [python_words(p) for p in exc.problems]
        raise


def python_words(message: str) -> str:
    for flag, argument in PYTHON_WORDS:
        message = message.replace(flag, argument)
    return message


def job_of(job: str | PathLike[str] | Mapping[str, Any], overrides: Overrides | None) -> Job:
    """A validated job from a file or a dict of tables, with overrides applied."""
    if isinstance(job, str | PathLike):
        source = Path(job)
        raw = read_job_file(source)
    elif isinstance(job, Mapping):
        source = Path("<job dict>")
        raw = copy.deepcopy(dict(job))
        output = raw.get("output")
        named = isinstance(output, dict) and isinstance(output.get("path"), str)
        raw.setdefault("name", Path(output["path"]).name if named else "job")
    else:
        raise JobError(
            f"run(): job must be a job file's path or a dict of its tables, got {show(job)}"
        )
    if isinstance(overrides, Mapping):
        apply_values(raw, overrides, "overrides")
    elif overrides is not None:
        if isinstance(overrides, str):
            raise JobError("run(): overrides: give a dict, or a list of 'section.key=value'")
        apply_overrides(raw, list(overrides), origin="overrides:")
    return job_from_dict(raw, source)


def score(
    data: Any,
    *,
    task: str,
    model: str | PathLike[str] | None = None,
    text: str | None = None,
    **options: Any,
) -> Any:
    """Score texts or an in-memory table, in input order, writing nothing.

    Args:
        data: texts (a list of strings, a pandas or polars Series, a 1-D numpy array, or one
            string), as sentence-transformers' ``encode`` takes them; or a pyarrow Table, a
            polars DataFrame or a pandas DataFrame.
        task: embed, classify, generate, summarize, tensor, loglik or reward.
        model: a built-in model's name or a local model's path; the built-in default if None.
        text: the column a text task reads in a frame (default "text").
        **options: any job key a frame can use, by its name (``precision="int8"``,
            ``max_rows=32`` or ``batch_size=32``, ``max_tokens=4096`` (the batch token
            budget: rows x padded length), ``max_new_tokens=64``, ``normalize=False``,
            ``features=["x0", "x1"]``, ``on_error="skip"``), or a whole section as a dict
            (``batching={...}``).

    Returns:
        For texts, as ``encode`` returns them: embed's vectors as a float32 numpy array of
        one row per text (one vector for one string); another task's outputs as a list (of
        strings, or of dicts such as ``{"label": ..., "score": ...}``). For a frame, the
        same type: its columns unchanged (pandas keeps its index), then the task's columns.

    Raises:
        JobError: an unknown option or a bad value (named); a column clash.
        InputDataError: a missing column, or a row that cannot be scored (named by its row),
            unless ``on_error="skip"`` (then the row gets nulls and its ``error``).
        ModelError, QualityGateError: as for a job.
    """
    frame = Frame.of(data)
    with TURN, in_python_words(), slow_steps(SAY_AFTER_S) as saying:
        if frame.texts and text is not None:
            raise JobError(
                f"score(): text={text!r} names a frame's column; texts alone are read as they are"
            )
        job = data_job(task=task, model=model, text=text, options=options)
        if frame.texts and job.output.on_error == "skip":
            raise JobError(
                'score(): on_error="skip" writes each bad row\'s error in a column of its own; '
                "pass a DataFrame (or a pyarrow Table) to keep them, or leave it out for texts"
            )
        return score_frame(frame, job, progress="bar" if saying else "off")


def score_frame(frame: Frame, job: Job, progress: str = "off") -> Any:
    """`score`'s work on a frame, once the job is built (the caller holds `TURN`): the columns
    the task reads, as Arrow, through the recipe, and its columns back onto the frame;
    ``progress`` "bar" shows a bar on stderr once scoring has taken `SAY_AFTER_S`."""
    read = frame.arrow(columns_read(job))
    scored = score_rows(
        job,
        read.table,
        bad=read.bad,
        names=frame.names,
        environ=os.environ,
        progress=progress,
        delay_s=SAY_AFTER_S,
    )
    return frame.with_columns(scored)


def data_job(
    *, task: str, model: str | PathLike[str] | None, text: str | None, options: dict[str, Any]
) -> Job:
    """The job `score` runs: the task, model and options as a job file would give them."""
    if task not in TASK_SECTIONS:
        raise JobError(
            f"score(): task: expected one of {', '.join(TASK_SECTIONS)}, got {task!r}"
            f"{did_you_mean(str(task), TASK_SECTIONS)}"
        )
    raw: dict[str, Any] = {
        "name": "score",
        "input": {"path": MEMORY},
        "model": {"task": task},
        # never written nor read: score() keeps everything in memory (two names, so the job
        # is not refused as an output folder that is its own input)
        "output": {"path": f"{MEMORY} (scores)"},
    }
    if text is not None:
        raw["input"]["text"] = text
    if model is not None:
        local = isinstance(model, PathLike) or Path(model).exists()
        raw["model"]["path" if local else "name"] = str(model)
    for key, value in named(task, options).items():
        section = option_section(task, key, value)
        if section == key:
            raw.setdefault(section, {}).update(value)
        else:
            raw.setdefault(section, {})[key] = value
    return job_from_dict(raw, Path("score()"))


def named(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` by their job keys: the familiar names (``batch_size``, the rows per batch
    that sentence-transformers' ``encode`` takes) become the keys that do the same; a
    generating task's ``max_tokens`` is refused, as it means the tokens to generate in
    vLLM and transformers, and the batch token budget here."""
    keys: dict[str, Any] = {}
    given: dict[str, str] = {}  # job key -> the name the caller gave it
    for key, value in options.items():
        job_key = ALIASES.get(key, key)
        if job_key in given:
            raise JobError(f"score(): {given[job_key]} and {key} are the same option; give one")
        given[job_key] = key
        if key == "max_tokens" and task in GENERATING:
            raise JobError(
                f"score(): max_tokens is the batch token budget ([batching].max_tokens: rows "
                f"x padded length of one batch), not the tokens to generate per row: for those "
                f"pass max_new_tokens={value!r}; for the budget, batching={{'max_tokens': ...}}"
            )
        keys[job_key] = value
    return keys


def option_section(task: str, key: str, value: Any) -> str:
    """The job section a `score` option belongs to (itself, for a whole section as a dict)."""
    sections = (task, *OPTION_SECTIONS)
    if key in sections and isinstance(value, Mapping):
        for inner in value:
            if inner in NOT_OPTIONS.get(key, ()):
                raise JobError(f"score(): [{key}].{inner} does not apply to in-memory data")
        return key
    for name in sections:
        fields = {f.name for f in dataclasses.fields(SECTIONS[name])}
        if key in fields - NOT_OPTIONS.get(name, set()):
            return name
        if key in fields:
            raise JobError(
                f"score(): [{name}].{key} does not apply to in-memory data"
                + ("; pass it as model=" if key in ("name", "path") else "")
            )
    known = sorted(
        {f.name for n in sections for f in dataclasses.fields(SECTIONS[n])}
        - {k for n in sections for k in NOT_OPTIONS.get(n, ())}
    )
    raise JobError(
        f"score(): unknown option {key!r}{did_you_mean(key, known)}; the options are job "
        f"keys: {', '.join(known)}"
    )
