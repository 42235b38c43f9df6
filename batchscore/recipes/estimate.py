"""`batchscore plan`'s time estimate, and the plan as a whole (`plan_job`, what the CLI calls).

The estimate is the run's phases (`batchscore.observe.phases`) as this machine would spend them:
start-up (this very process's), the model's load, what the run will spend measuring, and
scoring. The scoring rate comes from this machine: the last run of the job that scored rows at
the same precision (padded tokens per second of its scoring wall time, so reading, writing and
their overlap are in it), or, when there is none, a short timed sample: the model loaded at the
precision the run starts with scores ~`TIMED_ROWS` rows drawn at random from those to score,
after a warm-up batch (padded tokens per second of model time). Measuring follows what the run
will do (`batchscore.measure.auto`): nothing for a folder that settled, the gate's passes and
int8's calibration for a fixed precision, and for "auto" each faster precision that can pay for
itself on this job, at the speed this machine measured for it before or the device's guess.
The estimate says which of its parts are guesses, and what a machine with an empty cache
folder would spend (`cold_wall_s`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import OverLimitError
from batchscore.job.sections import Job
from batchscore.measure.auto import calibration_s, prospects
from batchscore.measure.budget import model_shape, planned_budget
from batchscore.measure.cache import Entry, open_cache
from batchscore.measure.decide import concrete, machine_key
from batchscore.measure.gate import Trial
from batchscore.measure.load import load_at
from batchscore.measure.rounds import first_rows, kept_evidence
from batchscore.measure.spend import Ledger, next_to_try
from batchscore.models.embed import calibrates
from batchscore.models.fingerprint import model_identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import generates
from batchscore.observe.phases import describe
from batchscore.output.checkpoint import Checkpoint
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.sampler import padded_tokens
from batchscore.precision.table import available, check_precision, precision
from batchscore.recipes.plan import SAMPLE_ROWS, plan_counts
from batchscore.runtime.device import resolve_device
from batchscore.runtime.executor import Executor

# The timed sample: rows drawn at random from those to score, and at most this much model time
# on them. Measured on a busy 2-core CPU, 128 rows (2-3 batches) gave rates 2x apart from one
# try to the next; 512 rows came within 10% of the run that followed.
TIMED_ROWS = 512
TIMED_S = 15.0


def plan_job(
    job: Job,
    *,
    sample_rows: int = SAMPLE_ROWS,
    timing: bool = True,
    environ: Mapping[str, str] | None = None,
    startup_s: float | None = None,
) -> dict[str, Any]:
    """The dry run: `plan_counts`' counts, and an estimated wall time (None, with the reason,
    when there is no earlier run and ``timing`` is off). ``environ``: the environment the front
    door passes in, where this machine's measurements are kept, as the run would read them
    (`batchscore.measure.cache`; None: none); ``startup_s``: this process's own start-up, the
    run's likely one."""
    cache = open_cache(environ, job.quality.cache_dir)
    model_path = locate(job.model)
    ckpt = Checkpoint(job.output.path)
    claimed = job  # as the run claims the output: before its "auto" settings are settled
    settled = ckpt.settled()
    if settled:  # what the next run will use: the recorded decision
        job = concrete(job, settled)
    timed = job  # the precision and budget the run starts scoring with
    if job.batching.max_tokens == "auto":
        timed = with_budget(timed, planned_budget(job, model_path))
    if job.model.precision == "auto":  # the run starts in fp32: its gate pass is its own work
        timed = dataclasses.replace(timed, model=dataclasses.replace(job.model, precision="fp32"))
    check_precision(timed.model.precision, resolve_device(timed.model.device))
    planned, rows = plan_counts(
        timed,
        model_path,
        sample_rows=sample_rows,
        claimed=claimed,
        timing_rows=TIMED_ROWS if timing else 0,
        environ=environ,
    )
    entry = None
    if cache is not None and not settled:
        entry = cache.get(machine_key(job, model_identity(model_path)))
    planned["estimate"] = estimate(
        timed,
        model_path,
        planned,
        ckpt.reports(),
        timing_rows=rows,
        auto=job.model.precision == "auto" and not settled,
        settled=bool(settled),
        entry=entry or Entry(),
        startup_s=startup_s,
    )
    planned.setdefault("notes", [])  # the plan's own (by rows: what the diff found) first
    if job.batching.max_tokens == "auto" and not settled:
        planned["notes"].append(
            f'max_tokens = "auto": {timed.batching.max_tokens}, from the model\'s shape'
        )
    return planned


def with_budget(job: Job, budget: int) -> Job:
    return dataclasses.replace(job, batching=dataclasses.replace(job.batching, max_tokens=budget))


def usable(reports: Iterable[dict[str, Any]], precision: str) -> dict[str, Any] | None:
    """The newest run (newest first) that scored rows at ``precision`` on this engine locally."""
    for report in reports:
        scoring = report.get("wall_s", 0) - report.get("load_s", 0) - report.get("tuning_s", 0)
        if (
            report.get("padded_tokens", 0) > 0
            and scoring > 0
            and report.get("precision") == precision
            and report.get("engine", "local") == "local"
        ):
            return report
    return None


def estimate(
    job: Job,
    model_path: Path,
    planned: dict[str, Any],
    reports: Any,
    *,
    timing_rows: pa.Table | None,
    auto: bool = False,
    settled: bool = False,
    entry: Entry | None = None,
    startup_s: float | None = None,
) -> dict[str, Any]:
    """Seconds the run should take, by phase. ``job`` is at the precision the run starts
    scoring with (fp32 for an unsettled "auto"); ``entry``: what this machine measured."""
    padding = planned["padding"]
    if not planned["chunks_to_score"]:
        return {"wall_s": 0.0, "basis": "nothing to score: every chunk is committed"}
    last = usable(reports, job.model.precision)
    if last is not None:
        scoring = last["wall_s"] - last["load_s"] - last["tuning_s"]
        rate, load_s = last["padded_tokens"] / scoring, last["load_s"]
        runtime = last.get("runtime", "torch")
        basis = (
            f"the last run ({last.get('run_id', '?')}) on {last.get('device', '?')} in "
            f"{last['precision']}: {rate:,.0f} padded tokens per second of wall time"
        )
        if last.get("from_gate"):  # its load was the gate's: the gate pass's share of its time
            load_s = max(last.get("phases", {}).get("loading", load_s), load_s)
    elif timing_rows is not None and timing_rows.num_rows:
        rate, load_s, rows, runtime = timed_sample(job, model_path, timing_rows)
        basis = (
            f"a timed sample on this machine ({rows} rows, {job.model.precision}): "
            f"{rate:,.0f} padded tokens per second of model time"
        )
    else:
        return {"wall_s": None, "basis": "no earlier run to go by, and timing is off"}
    padded = padding["padded_tokens"]
    # the gate's first round, where it stops for a candidate not in doubt (`measure.rounds`)
    warm, cap = bool(kept_evidence(entry or Entry(), job)), planned["rows_to_score"]
    cap = min(job.quality.sample_rows, cap)
    sample = first_rows(job.quality, cap, warm=warm, whole=calibrates(job.options))
    per_row = padded / max(planned["rows_to_score"], 1)
    whole = per_row * min(job.quality.sample_rows, planned["rows_to_score"])  # int8 calibrates
    spend = Spend(job, model_path, rate, load_s, padded, per_row * sample, runtime, settled, whole)
    here = spend.auto(entry or Entry()) if auto else spend.fixed(entry or Entry())
    cold = spend.auto(Entry()) if auto else spend.fixed(Entry())
    startup = startup_s or 0.0
    found: dict[str, Any] = {
        "wall_s": round(startup + sum(here["parts"].values()), 1),
        "cold_wall_s": round(startup + sum(cold["parts"].values()), 1),
        "parts": {
            "start-up": round(startup, 2),
            **{k: round(v, 2) for k, v in here["parts"].items()},
        },
        "precision": here["precision"],
        "guesses": here["guesses"],
        "load_s": round(load_s, 2),
        "rate": round(rate, 1),
        "basis": basis,
    }
    tokens, efficiency = planned["tokens"], padding["efficiency"] or 1.0
    if tokens.get("low") is not None:  # the sampled token count's interval, scoring alone
        for key, count in (("low_s", tokens["low"]), ("high_s", tokens["high"])):
            extra = (count / efficiency - padded) / here["speed"]
            found[key] = round(found["wall_s"] + extra, 1)
    return found


@dataclasses.dataclass
class Spend:
    """What a run of ``padded`` tokens spends beyond start-up, as the run would decide it:
    ``rate`` and ``load_s`` are the starting precision's; ``sample``: the gate's tokens, as
    far as its first round (`measure.rounds`); ``whole``: the whole sample's, int8's
    calibration's."""

    job: Job
    model_path: Path
    rate: float
    load_s: float
    padded: float
    sample: float
    runtime: str = "torch"  # where the starting precision's model ran (torch or openvino)
    settled: bool = False  # the folder's first run decided: nothing is measured again
    whole: float = 0.0

    def fixed(self, entry: Entry) -> dict[str, Any]:
        """A settled folder, fp32, or a fixed precision that the gate checks against fp32."""
        name = self.job.model.precision
        parts = {"measuring": 0.0, "loading": self.load_s, "scoring": self.padded / self.rate}
        guesses: list[str] = []
        if not self.settled and name != "fp32":  # fp32's load and pass, int8's calibration
            known = entry.measured.get(name)
            device = resolve_device(self.job.model.device)
            speedup = known.speedup if known else precision(name).speedup(device)
            if known is None:
                guesses.append(
                    f"fp32's speed, from {name}'s as the device's guess ({speedup:.2f}x)"
                )
            fp32 = self.rate / max(speedup, 1e-9)
            calibrating = calibration_s(
                name,
                self.whole,
                fp32=fp32,
                speedup=speedup,
                runtime=self.runtime,
                layers=self.layers,
                known=known,
            )
            parts["measuring"] = self.load_s + self.sample / fp32 + calibrating
        return {"parts": parts, "precision": name, "guesses": guesses, "speed": self.rate}

    @property
    def layers(self) -> int | None:
        shape = model_shape(self.model_path)
        return shape.linear_layers if shape else None

    def auto(self, entry: Entry) -> dict[str, Any]:
        """An unsettled "auto": fp32 first, then each faster precision as the run weighs it
        (`batchscore.measure.spend`), each tried one expected to pass at its expected speed."""
        device = resolve_device(self.job.model.device)
        reference = Trial(
            "fp32",
            {},
            0.0,
            1,
            None,
            None,
            load_s=self.load_s,
            tokens_per_s=self.rate,
            tokens_per_row=self.sample,
            runtime=self.runtime,
        )
        generating = generates(self.job.model, self.model_path)
        candidates = [
            p
            for p in available(device)
            if precision(p).gated
            and p not in entry.unusable
            and (precision(p).generates or not generating)
        ]
        waiting = prospects(
            candidates,
            device,
            reference=reference,
            sample_tokens=self.whole,
            known=entry.measured,
            layers=self.layers,
        )
        ledger = Ledger(
            fp32_speed=self.rate,
            sample_tokens=self.sample,
            left_tokens=max(self.padded - self.sample, 0.0),
            own_s=self.load_s + self.sample / self.rate,
        )
        chosen, loading, guesses = "fp32", self.load_s, []
        while waiting:
            weighed, others = next_to_try(waiting, ledger)
            if weighed is None:
                break
            waiting = [w.prospect for w in others]
            tried = weighed.prospect
            ledger = ledger.after(  # as expected: it passes, at its speed, at its cost
                won=True,
                speedup=tried.speedup,
                cost_s=weighed.cost_s,
                calibrate_s=tried.calibrate_s,
            )
            chosen, loading = tried.name, tried.load_s
            if tried.guessed:
                guess = f"the device's guess ({tried.speedup:.2f}x fp32)"
                guesses.append(f"{tried.name}'s speed: {guess}")
        speed = ledger.speed(ledger.best_speedup)
        # the chosen one's pass over the sample, then the rest of the job
        scoring = ledger.own_s - loading + ledger.left_tokens / speed
        parts = {"measuring": ledger.sunk_s, "loading": loading, "scoring": scoring}
        return {"parts": parts, "precision": chosen, "guesses": guesses, "speed": speed}


def timed_sample(job: Job, model_path: Path, table: pa.Table) -> tuple[float, float, int, str]:
    """(padded tokens per second of model time, model load seconds, rows, runtime): the model
    at the job's precision scores ``table`` (rows drawn from those to score) once warmed up."""
    executor = Executor(job.model)
    start = time.perf_counter()
    task = load_at(job, model_path, executor, table)
    load_s = time.perf_counter() - start
    encoded = task.encode(table)
    units = np.arange(len(encoded.lengths))
    cut = Batching.of(job.batching, task).batches(encoded, units)
    if not cut:
        return 1.0, load_s, 0, executor.runtime
    executor.run(lambda: task.forward(encoded, cut[0]))  # warm-up: first calls pay set-up costs
    before, padded = executor.busy_s, 0
    # in random order, so that stopping at TIMED_S leaves a fair share of short and long batches
    for i in np.random.default_rng(0).permutation(len(cut)):
        executor.run(lambda batch=cut[i]: task.forward(encoded, batch))
        padded += padded_tokens(encoded.lengths, [cut[i]])
        if executor.busy_s - before > TIMED_S:
            break
    seconds = max(executor.busy_s - before, 1e-9)
    return padded / seconds, load_s, table.num_rows, executor.runtime


def check_limits(
    result: dict[str, Any], job: str, *, max_wall_s: float | None, max_tokens: int | None
) -> None:
    """Raise `OverLimitError` (exit 12) when the plan is over a limit a scheduler gave."""
    over = []
    wall = result["estimate"].get("wall_s")
    if max_wall_s is not None and wall is not None and wall > max_wall_s:
        over.append(f"estimated {wall:,.0f} s > --max-wall-s {max_wall_s:,.0f}")
    if max_tokens is not None and result["tokens"]["value"] > max_tokens:
        over.append(f"{result['tokens']['value']:,} tokens > --max-tokens {max_tokens:,}")
    if over:
        raise OverLimitError(f"{job}: over the limit: {'; '.join(over)}")


def format_plan(p: dict[str, Any]) -> str:
    """The plan for people; ``--json`` gives scripts the same data."""
    tokens, padding, est = p["tokens"], p["padding"], p["estimate"]
    cut = p["truncated"]
    after = f"after truncation to the model's window: {cut:,} input(s) cut" if cut else ""
    if tokens["exact"]:
        token_line = f"{tokens['value']:,} (exact: every row tokenized{', ' if after else ''}"
        token_line += f"{after})"
    else:
        token_line = (
            f"~{tokens['value']:,} (95% interval {tokens['low']:,} to {tokens['high']:,}, "
            f"from a random sample of {tokens['sampled_rows']:,} rows)"
        )
    where = f" ({p['filtered']:,} dropped by [input].where)" if p["where"] else ""
    lines = [
        f"plan for {p['job']} (a dry run: only the tokenizer was loaded to count)",
        f"  input: {p['shards']} shard(s), {p['input_rows']:,} rows; {p['rows_committed']:,} rows "
        f"committed ({p['chunks_committed']} chunks), {p['chunks_to_score']} chunk(s) to score",
        f"  rows to score: {p['rows_to_score']:,}{where}",
        f"  tokens: {token_line}",
    ]
    padded = "padded tokens"
    if tokens.get("repeats"):
        lines.append(
            f"  repeats: {tokens['repeats']:,} input(s) repeat an earlier one and are scored "
            f"once: {tokens['to_run']:,} tokens to run"
        )
        padded = f"those {tokens['to_run']:,} padded to"
    lines.append(
        f"  batches: {padding['batches']:,} under max_tokens {p['max_tokens']}; {padded} "
        f"{padding['padded_tokens']:,}; padding efficiency {padding['efficiency']:.3f} "
        f"({'the run' if padding['exact'] else 'the sampled lengths'} through the sampler)"
    )
    if est.get("wall_s") is None:
        lines.append(f"  ESTIMATE: none ({est['basis']})")
    else:
        spread = f" ({est['low_s']:,.0f} to {est['high_s']:,.0f} s)" if "low_s" in est else ""
        lines.append(f"  ESTIMATE: ~{est['wall_s']:,.1f} s wall time{spread}")
        if "parts" in est:
            lines.append(f"    {describe(est['parts'])}; scoring at {est['precision']}")
            lines.append(f"    model load {est['load_s']:.1f} s; rate from {est['basis']}")
            lines += [f"    a guess: {g}" for g in est["guesses"]]
            if est["cold_wall_s"] != est["wall_s"]:
                lines.append(f"    with an empty cache folder: ~{est['cold_wall_s']:,.1f} s")
        else:
            lines.append(f"    {est['basis']}")
    lines += [f"  note: {n}" for n in p["notes"]]
    if p["conflict"]:
        lines.append(f"  warning: {p['conflict']}")
    lines += [f"  failing: {f['error']}" for f in p["failures"]]
    return "\n".join(lines)
