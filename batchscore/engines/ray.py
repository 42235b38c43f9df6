"""The Ray engine: model actors on a Ray cluster score whole chunks; this process commits them.

One actor per GPU (or per ``[ray].num_cpus`` CPU slots) loads the model once, then scores the
chunks it is sent with the local engine's own stages (`batchscore.pipeline.scoring.score_chunk`:
reader, `where`, tokenizer, sampler, scorer), returning each chunk's scored windows and
counters. The driver sends chunks as actors free up, two in flight per actor so none waits on
the driver, and commits each result exactly as the local engine's are committed: the output
and the checkpoints are the same, and either engine resumes the other's run.

An actor that dies (its process killed, its node lost) loses only its uncommitted chunks: they
are sent again, to a replacement actor that loads the model afresh. A chunk that was in flight
when `MAX_LOSSES` actors died fails the run instead of killing more.

Actors read input shards themselves, so every node must reach them (an object store, or a
shared folder), and every node needs batchscore installed with the same version.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batchscore.errors import BatchscoreError, EngineError, JobError
from batchscore.job.sections import Job, RayConfig
from batchscore.measure.gate import Trial
from batchscore.measure.load import load_at
from batchscore.models.tasks import input_kinds
from batchscore.observe.progress import Progress
from batchscore.observe.run_stats import RunStats
from batchscore.observe.shape import Shape
from batchscore.pipeline.scoring import Scorer, score_chunk
from batchscore.pipeline.stages import windows
from batchscore.runtime.executor import Executor
from batchscore.threads import Sink
from batchscore.work.units import Chunk, Scored, Shard

log = logging.getLogger("batchscore")
IN_FLIGHT = 2  # chunks queued per actor: one scoring, one waiting, so no actor idles
MAX_LOSSES = 3
COUNTERS = (
    "rows",
    "units",
    "duplicates",
    "tokens",
    "computed_tokens",
    "padded_tokens",
    "batches",
    "truncated",
    "retries",
    "chunked",
    "windows",
    "prompt_tokens",
    "generated_tokens",
)


def import_ray() -> Any:
    """Ray, or a message naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise JobError(
            'engine = "ray" needs Ray, an optional extra: pip install "batchscore[ray]"'
        ) from None
    return ray


@dataclass(frozen=True)
class Placement:
    """How many model actors to start, and the resources each one claims."""

    actors: int
    num_cpus: float
    num_gpus: float


def place(cfg: RayConfig, device: str, cluster: dict[str, float], chunks: int) -> Placement:
    """One actor per GPU where the cluster has GPUs and the job may use them, else one per CPU
    slot; never more actors than chunks. Refuses resources the cluster does not have."""
    gpus_total, cpus_total = cluster.get("GPU", 0.0), cluster.get("CPU", 0.0)
    gpus = cfg.num_gpus if cfg.num_gpus is not None else float(bool(gpus_total) and device != "cpu")
    if gpus > gpus_total or cfg.num_cpus > cpus_total:
        raise EngineError(
            f"[ray]: an actor needs {cfg.num_cpus:g} CPU and {gpus:g} GPU, but the cluster has "
            f"{cpus_total:g} CPU and {gpus_total:g} GPU in all"
        )
    if cfg.actors:
        wanted = cfg.actors
    elif gpus:
        wanted = int(gpus_total // gpus)
    else:
        wanted = int(cpus_total // cfg.num_cpus) if cfg.num_cpus else 1
    return Placement(max(1, min(wanted, chunks)), cfg.num_cpus, gpus)


@dataclass
class ChunkResult:
    """What an actor sends back for one chunk."""

    parts: list[Scored]
    counters: dict[str, int]
    busy_s: float
    shape: Shape  # token lengths and batch widths, for the report page


class ChunkActor:
    """One model replica, in a Ray worker process; loads the model on first use.

    Ray runs its methods one at a time on the worker's main thread, and it starts no thread of
    its own, so what loading and scoring import (transformers, lazily) is never imported from
    two threads at once.
    """

    def __init__(self, job: Job, model_path: Path, placement: Placement) -> None:
        model = job.model
        if placement.num_gpus and model.device.startswith("cuda:"):
            model = replace(model, device="cuda")  # Ray gives each actor its own GPU(s)
        if model.threads is None and not placement.num_gpus:
            model = replace(model, threads=max(1, int(placement.num_cpus)))  # its slots only
        self.job, self.model, self.model_path = job, model, model_path
        self.kinds = input_kinds(model.task, job.input, job.options)  # the columns it reads
        self.scorer: Scorer | None = None

    def load(self) -> dict[str, Any]:
        """Load the model; return the task's columns and where it runs."""
        if self.scorer is None:
            executor = Executor(self.model)
            job = replace(self.job, model=self.model)
            task = load_at(job, self.model_path, executor)
            self.scorer = Scorer(
                task,
                executor,
                inp=job.input,
                batching=job.batching,
                on_error=job.output.on_error,
                stats=RunStats(),
                progress=Progress(0, "off"),
            )
        executor = self.scorer.executor
        return {
            "columns": self.scorer.task.columns,
            "device": str(executor.device),
            "precision": executor.precision,
            "quantization": executor.quantization,
            "runtime": executor.runtime,
            "pid": os.getpid(),
        }

    def score(self, chunk: Chunk) -> ChunkResult:
        """Score one chunk with the same stages the local engine runs."""
        self.load()
        scorer = self.scorer
        scorer.stats, busy = RunStats(), scorer.executor.busy_s
        job = self.job
        read = windows(
            [chunk],
            scorer.task,
            inp=job.input,
            kinds=self.kinds,
            batching=job.batching,
            on_error=job.output.on_error,
        )
        parts = score_chunk(read, scorer)
        counters = {name: getattr(scorer.stats, name) for name in COUNTERS}
        shape = scorer.stats.shape
        return ChunkResult(parts, counters, scorer.executor.busy_s - busy, shape)


@dataclass
class Columns:
    """The task's output fields, as the driver needs them for the output schema."""

    columns: list[Any]


class RayEngine:
    """Model actors on a Ray cluster; chunks go out as actors free up, results come back here."""

    def __init__(self, job: Job) -> None:
        self.job, self.cfg = job, job.ray
        self.ray = import_ray()
        self.device, self.precision = "ray", job.model.precision
        self.quantization = ""
        self.runtime = "torch"
        self.busy_s = 0.0
        self.actors: list[Any] = []
        self.generation: list[int] = []
        self.losses: Counter[str] = Counter()
        self.replaced = 0
        self.started_ray = False
        self.actor_class: Any = None
        self.model_path: Path | None = None

    def connect(self) -> None:
        """Join the configured cluster, or start a local one (unless this process has one)."""
        ray = self.ray
        if ray.is_initialized():
            return
        try:
            ray.init(
                address=self.cfg.address,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.cfg.address or "a local Ray instance"
            raise EngineError(f"[ray].address: cannot start or reach {where}: {exc}") from exc
        self.started_ray = True

    def load(
        self,
        model_path: Path,
        stats: RunStats,
        chunks: list[Chunk],
        loaded: Trial | None = None,
        *,
        shards: list[Shard] | None = None,
    ) -> Columns:
        """Start the model actors, no more than ``chunks`` keep busy; each loads its own model
        (``loaded`` stays in the driver) and reads its own calibration rows, where it runs
        (``shards`` are this process's listing)."""
        self.connect()
        ray = self.ray
        placement = place(self.cfg, self.job.model.device, ray.cluster_resources(), len(chunks))
        self.model_path = model_path
        self.actor_class = ray.remote(
            num_cpus=placement.num_cpus,
            num_gpus=placement.num_gpus,
            max_restarts=0,  # a dead actor is replaced here, where its chunks are tracked
        )(ChunkActor)
        self.placement = placement
        self.actors = [self.start_actor() for _ in range(placement.actors)]
        self.generation = [0] * placement.actors
        infos = self.wait([actor.load.remote() for actor in self.actors])
        first = infos[0]
        self.device = f"{first['device']} x {len(self.actors)} ray actors"
        self.precision, self.quantization = first["precision"], first["quantization"]
        self.runtime = first["runtime"]
        stats.replicas = len(self.actors)
        log.info("ray: %d model actors ready (pids %s)", len(infos), [i["pid"] for i in infos])
        return Columns(first["columns"])

    def start_actor(self) -> Any:
        return self.actor_class.remote(self.job, self.model_path, self.placement)

    def wait(self, refs: list[Any]) -> list[Any]:
        """`ray.get`, with a batchscore error raised in an actor re-raised as itself."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return self.ray.get(refs)
        except RayTaskError as exc:
            raise unwrap(exc) from None
        except RayActorError as exc:
            raise EngineError(f"ray: a model actor died while loading the model: {exc}") from exc

    def score(
        self, chunks: list[Chunk], sink: Sink[list[Scored]], bar: Progress, stats: RunStats
    ) -> None:
        from ray.exceptions import RayActorError, RayTaskError

        ray = self.ray
        pending = deque(chunks)
        inflight: dict[Any, tuple[Chunk, int, int]] = {}  # ref -> chunk, actor slot, generation
        while pending or inflight:
            for slot, actor in enumerate(self.actors):
                mine = (slot, self.generation[slot])
                busy = sum(1 for _, s, g in inflight.values() if (s, g) == mine)
                for _ in range(min(IN_FLIGHT - busy, len(pending))):
                    chunk = pending.popleft()
                    inflight[actor.score.remote(chunk)] = (chunk, slot, self.generation[slot])
            done, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in done:
                chunk, slot, generation = inflight.pop(ref)
                try:
                    result = ray.get(ref)
                except RayTaskError as exc:
                    raise unwrap(exc) from None
                except RayActorError as exc:
                    self.lost(chunk, slot, generation, exc)
                    pending.appendleft(chunk)
                    continue
                sink.put(result.parts)
                for name, value in result.counters.items():
                    setattr(stats, name, getattr(stats, name) + value)
                stats.shape.merge(result.shape)
                self.busy_s += result.busy_s
                bar.advance(chunk.rows, result.counters["tokens"])
        stats.actors_replaced += self.replaced

    def lost(self, chunk: Chunk, slot: int, generation: int, exc: Exception) -> None:
        """A chunk's actor died: count it against the chunk, and replace the actor once."""
        self.losses[chunk.key] += 1
        if self.losses[chunk.key] >= MAX_LOSSES:
            raise EngineError(
                f"{chunk.shard.path}: rows {chunk.start}-{chunk.stop}: {MAX_LOSSES} model actors "
                f"died while scoring them (last: {first_line(exc)}); committed chunks are kept"
            )
        if generation != self.generation[slot]:
            return  # that actor was already replaced
        log.warning("ray: model actor %d died (%s); starting a replacement", slot, first_line(exc))
        self.kill(self.actors[slot])
        self.actors[slot] = self.start_actor()
        self.generation[slot] += 1
        self.replaced += 1

    def kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already dead is fine
            self.ray.kill(actor, no_restart=True)

    def close(self) -> None:
        for actor in self.actors:
            self.kill(actor)
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False


def unwrap(exc: Exception) -> Exception:
    """The batchscore error an actor raised (its exit code intact), or Ray's own error."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BatchscoreError) else exc


def first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
