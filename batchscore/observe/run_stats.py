"""What a run did, measured: counters while it runs, then a summary and a JSON report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from batchscore.observe.phases import describe, split
from batchscore.observe.shape import Shape


@dataclass
class RunStats:
    """Counters one run accumulates; `report` derives the rates from them."""

    rows: int = 0
    units: int = 0
    duplicates: int = 0
    from_gate: int = 0  # units the quality gate's pass had scored, by the model the run adopted
    tokens: int = 0
    computed_tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    truncated: int = 0
    # usage: the tokens the model read for the rows scored (the `prompt_tokens` column's sum)
    # and those a generative model wrote (`generated_tokens`'s), as an API would bill them
    prompt_tokens: int = 0
    generated_tokens: int = 0
    chunked: int = 0  # long texts read whole, in windows ([model].long_text = "chunk")
    windows: int = 0  # the windows those texts were scored as
    bad_rows: int = 0
    filtered: int = 0  # input rows `[input].where` dropped, in the chunks committed
    chunks_pending: int = 0  # chunks this run set out to score
    chunks_redone: int = 0  # of them, committed before but no longer intact
    chunks_committed: int = 0
    chunks_already_done: int = 0
    rows_retired: int = 0  # by rows: committed rows this run retired (edited, or gone)
    rows_already_done: int = 0
    load_s: float = 0.0  # the model's load, the quality gate's where the run adopted it
    tuning_s: float = 0.0  # settling what the job left to measurement, beyond the run's own work
    phases: dict[str, float] = field(default_factory=dict)  # seconds by phase (`observe.phases`)
    model_busy_s: float = 0.0  # summed over model replicas, the adopted gate pass's included
    # of the counts above, the quality gate's pass the run adopted (`adopt`)
    gate_padded_tokens: int = 0
    gate_busy_s: float = 0.0
    replicas: int = 1  # models that ran side by side (Ray actors)
    actors_replaced: int = 0
    retries: int = 0  # transient I/O errors retried (and overcome, unless the run failed)
    started: float = field(default_factory=time.time)
    # wall clock when the first batch was scored: with the process's own start time, how long a
    # user waits for the first result (`make bench` measures start-up so)
    first_batch_at: float | None = None
    wall_s: float = 0.0
    # for the report page: token lengths and batch widths, the run over time, rows per shard
    shape: Shape = field(default_factory=Shape)
    timeline: dict[str, list[float]] = field(default_factory=dict)
    shards: dict[str, dict[str, int]] = field(default_factory=dict)

    def committed(self, shard: str, rows: int, bad_rows: int, filtered: int) -> None:
        """Count a committed chunk against its shard."""
        entry = self.shards.setdefault(shard, {"rows": 0, "bad_rows": 0, "filtered": 0})
        entry["rows"] += rows
        entry["bad_rows"] += bad_rows
        entry["filtered"] += filtered

    def adopt(self, lengths: np.ndarray, batches: list[np.ndarray], *, busy_s: float) -> None:
        """Count the quality gate's pass as batches of the run: the run adopted the gate's
        model and takes its results (`batchscore.pipeline.known`), so its units are never
        batched again, and without this a job whose rows the gate scored would say 0 padded
        tokens in 0 batches and a model idle. ``lengths``: the pass's units' token lengths
        (its windows count the units themselves); ``batches``: unit indices per batch;
        ``busy_s``: the model's time on them."""
        lengths = np.asarray(lengths, dtype=np.int64)
        ran = [b for b in batches if len(b)]
        padded = sum(len(b) * int(lengths[b].max()) for b in ran)
        self.computed_tokens += sum(int(lengths[b].sum()) for b in ran)
        self.padded_tokens += padded
        self.batches += len(ran)
        self.gate_padded_tokens += padded
        self.gate_busy_s += busy_s
        self.shape.add_batches(lengths, ran)

    def used(self, rows: Any, names: tuple[str, ...]) -> None:
        """Count the task's usage columns ``names`` (`prompt_tokens`, `generated_tokens`) of
        output rows (a pyarrow Table) on their way to the writer; a row that failed holds null
        there, and counts nothing."""
        for name in names:
            total = rows.column(name).fill_null(0).to_numpy().sum()
            setattr(self, name, getattr(self, name) + int(total))

    def report(self, **context: Any) -> dict[str, Any]:
        """The run report: counters, derived rates, and whatever context the driver adds."""
        wall = max(self.wall_s, 1e-9)
        # one level of copying, not `asdict`'s deep one (seconds over thousands of shards)
        counters = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "shape"}
        counters["timeline"] = {k: list(v) for k, v in self.timeline.items()}
        counters["shards"] = {path: dict(entry) for path, entry in self.shards.items()}
        counters["phases"] = split(self.phases, self.wall_s)
        return {
            **counters,
            "shape": self.shape.to_json(),
            "padding_efficiency": round(self.computed_tokens / self.padded_tokens, 4)
            if self.padded_tokens
            else 1.0,
            "rows_per_s": round(self.rows / wall, 2),
            # the real tokens the model read (a generating task's prompts), and those it wrote:
            # generation is compared by the second
            "tokens_per_s": round(self.tokens / wall, 1),
            "generated_tokens_per_s": round(self.generated_tokens / wall, 1),
            # per replica, so it stays a share of 0-1 however many models ran
            "model_busy_share": round(self.model_busy_s / (wall * max(self.replicas, 1)), 4),
            "total_tokens": self.prompt_tokens + self.generated_tokens,
            **context,
        }


@dataclass(frozen=True)
class RunReport:
    """A run's report as the Python API returns it: the key figures as typed attributes, and
    the whole JSON report (as written under ``<output>/_batchscore/runs/``) in `data`."""

    job: str
    outcome: str  # ok | shards failed | interrupted | failed
    rows: int  # rows scored by this run
    tokens: int  # real (unpadded) tokens
    padding_efficiency: float  # real / padded tokens, 0-1
    rows_per_s: float
    tokens_per_s: float  # real tokens read per second (a generating task's prompt tokens)
    wall_s: float
    precision: str
    device: str
    runtime: str  # "torch", or "openvino" where its encoder ran on OpenVINO; "" before a load
    output: str
    failures: tuple[dict[str, str], ...]  # shards that failed: {"shard", "error"}
    bad_rows: int  # rows recorded with their error (on_error = "skip")
    # usage: tokens the model read and wrote for this run's rows ([output].usage, generation)
    prompt_tokens: int
    generated_tokens: int
    generated_tokens_per_s: float  # tokens written per second (generation: the figure compared)
    data: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, report: dict[str, Any]) -> RunReport:
        """From a run report dict (`RunStats.report` plus the driver's context)."""
        return cls(
            job=str(report.get("job", "")),
            outcome=str(report.get("outcome", "")),
            rows=int(report.get("rows", 0)),
            tokens=int(report.get("tokens", 0)),
            padding_efficiency=float(report.get("padding_efficiency", 1.0)),
            rows_per_s=float(report.get("rows_per_s", 0.0)),
            tokens_per_s=float(report.get("tokens_per_s", 0.0)),
            wall_s=float(report.get("wall_s", 0.0)),
            precision=str(report.get("precision", "")),
            device=str(report.get("device", "")),
            runtime=str(report.get("runtime", "")),
            output=str(report.get("output", "")),
            failures=tuple(report.get("failed_shards", ())),
            bad_rows=int(report.get("bad_rows", 0)),
            prompt_tokens=int(report.get("prompt_tokens", 0)),
            generated_tokens=int(report.get("generated_tokens", 0)),
            generated_tokens_per_s=float(report.get("generated_tokens_per_s", 0.0)),
            data=report,
        )

    def __str__(self) -> str:
        return summary(self.data)


# the run report's keys a summary event carries (the whole report is in "run finished")
KEY_FIGURES = (
    "job",
    "run_id",
    "outcome",
    "rows",
    "tokens",
    "padding_efficiency",
    "rows_per_s",
    "tokens_per_s",
    "generated_tokens_per_s",
    "wall_s",
    "precision",
    "device",
    "runtime",
    "chunks_committed",
    "chunks_already_done",
    "rows_already_done",
    "bad_rows",
    "prompt_tokens",
    "generated_tokens",
    "total_tokens",
    "output",
)


def key_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The summary as data: its key figures, and whether the run had nothing to do."""
    figures = {key: report[key] for key in KEY_FIGURES if key in report}
    return {**figures, "nothing_to_do": nothing_to_do(report)}


def nothing_to_do(report: dict[str, Any]) -> bool:
    """Whether the run found every chunk committed already (and so loaded no model)."""
    return not report.get("chunks_pending") and report.get("outcome") == "ok"


def headline(report: dict[str, Any]) -> str:
    """The summary's first line: what the run did, in one sentence."""
    if nothing_to_do(report):
        rows, chunks = report.get("rows_already_done", 0), report.get("chunks_already_done", 0)
        return (
            f"{report['job']}: nothing to do: every row is committed ({rows:,} "
            f"row{'' if rows == 1 else 's'} in {chunks:,} chunk{'' if chunks == 1 else 's'})"
        )
    return (
        f"{report['job']}: {report['rows']:,} rows scored in {report['wall_s']:.1f} s "
        f"({report['rows_per_s']:,.1f} rows/s, {speeds(report)})"
    )


def speeds(report: dict[str, Any]) -> str:
    """Tokens per second as people compare them: a generating run's generated tokens (its
    prompts' beside them, named), any other run's real tokens. A report from before generated
    tokens/s was kept has it derived."""
    if not report.get("generated_tokens"):
        return f"{report.get('tokens_per_s', 0):,.0f} tokens/s"
    wrote = report.get("generated_tokens_per_s")
    if wrote is None:
        wrote = report["generated_tokens"] / max(report.get("wall_s", 0), 1e-9)
    return f"{wrote:,.0f} generated tokens/s, {report.get('tokens_per_s', 0):,.0f} prompt tokens/s"


def summary(report: dict[str, Any]) -> str:
    """A few human lines from a run report (one, and the output, when there was nothing to
    do: no model was loaded, so there is no device, precision or speed to tell)."""
    if nothing_to_do(report):
        return "\n".join(
            [
                f"batchscore: {headline(report)}",
                *gone(report),
                f"  output: {report['output']}",
            ]
        )
    return "\n".join(
        [
            f"batchscore: {headline(report)}",
            f"  tokens: {report['tokens']:,} real; {report['computed_tokens']:,} run (repeats "
            f"skipped) as {report['padded_tokens']:,} padded (padding efficiency "
            f"{report['padding_efficiency']:.3f}) in {report['batches']:,} "
            f"batches; {report['truncated']:,} inputs truncated, "
            f"{report['duplicates']:,} repeats scored once",
            f"  model busy {report['model_busy_share']:.1%} of wall time; model load "
            f"{report['load_s']:.1f} s; {report['device']}, {report['precision']}"
            + (" on OpenVINO" if report.get("runtime") == "openvino" else ""),
            *([f"  time: {describe(report['phases'])}"] if report.get("phases") else []),
            f"  chunks: {report['chunks_committed']} committed now, "
            f"{report['chunks_already_done']} already done ({report['rows_already_done']:,} rows)",
            *[f"  scored again: {r['why']}" for r in report.get("redone", [])],
            *gone(report),
            *(
                [f"  filtered: {report['filtered']:,} input rows dropped by [input].where"]
                if report.get("filtered")
                else []
            ),
            *(
                [f"  long texts: {report['chunked']:,} read whole as {report['windows']:,} windows"]
                if report.get("chunked")
                else []
            ),
            *(
                [f"  quality gate: {report['from_gate']:,} inputs scored by its pass, not again"]
                if report.get("from_gate")
                else []
            ),
            *usage(report),
            *([f"  int8: {report['int8']}"] if report.get("int8") else []),
            *(
                [f"  ray: {report['actors_replaced']} model actor(s) died and were replaced"]
                if report.get("actors_replaced")
                else []
            ),
            f"  output: {report['output']}",
        ]
    )


def gone(report: dict[str, Any]) -> list[str]:
    """The line about shards that left the input, if any did."""
    if not report.get("gone_shards"):
        return []
    return [
        f"  gone: {len(report['gone_shards'])} shard(s) no longer input; their output left the "
        "data files, kept under _batchscore/gone/ (status lists them)"
    ]


def usage(report: dict[str, Any]) -> list[str]:
    """The line of the run's usage totals, when it counted any."""
    read, wrote = report.get("prompt_tokens", 0), report.get("generated_tokens", 0)
    if not read and not wrote:
        return []
    made = f" + {wrote:,} generated = {read + wrote:,}" if wrote else ""
    seen = "as the model read them: its tokenizer's count, an image's patches"
    return [f"  usage: {read:,} prompt tokens{made} ({seen})"]
