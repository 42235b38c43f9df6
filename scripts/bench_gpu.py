"""GPU benchmark in one shot (a few minutes on one CUDA GPU): every precision the GPU runs, for
embeddings (MiniLM on the sample corpus) and generation (the toy GPT-2 `make setup` builds),
side by side in one process, with bucketing on and off, and fidelity against fp32.

    python scripts/bench_gpu.py              # make bench-gpu runs this after `pytest -m gpu`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import sample_corpus  # noqa: E402


def run(job_text: str, folder: Path, sets: list[str]) -> tuple[dict, pa.Table]:
    """One in-process `batchscore run` from scratch; its report and output."""
    from batchscore.job.parse import load_job
    from batchscore.recipes.driver import run_job

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.toml"
    path.write_text(job_text)
    start = time.perf_counter()
    report = run_job(load_job(path, sets), restart=True, accept_quality=True)
    report["process_s"] = time.perf_counter() - start
    files = sorted((folder / "out").glob("*.parquet"))
    return report, pa.concat_tables(pq.read_table(f) for f in files)


def cosine_min(a: pa.Array, b: pa.Array) -> float:
    x, y = np.array(a.to_pylist()), np.array(b.to_pylist())
    return float(((x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))).min())


def main() -> None:
    import torch

    from batchscore.precision.table import available

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench-gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench-gpu needs a CUDA GPU, and this machine has none")
    device = torch.device("cuda")
    precisions = [p for p in ("fp32", "fp16", "bf16", "int8") if p in available(device)]
    print(
        f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
        f"precisions: {', '.join(precisions)}"
    )

    corpus = sample_corpus.corpus()
    table = pa.concat_tables([corpus] * (args.rows // corpus.num_rows + 1)).slice(0, args.rows)
    data = args.work / "data"
    sample_corpus.write_shards(table, data, shards=8)
    embed = (
        f'[input]\npath = "{data}"\ntext = "text"\n[model]\ntask = "embed"\n'
        f'device = "cuda"\n[batching]\nmax_tokens = 65536\nmax_rows = 1024\n'
        f'[output]\npath = "out"\n'
    )
    print(f"\nembed: all-MiniLM-L6-v2, {args.rows:,} texts")
    print(
        f"{'variant':<24} {'rows/s':>9} {'tokens/s':>10} {'pad eff':>7} {'busy':>5} {'cos min':>8}"
    )
    reference = None
    for precision in precisions:
        for sort in (True, False):
            name = f"{precision}{'' if sort else ' naive (32 rows)'}"
            sets = [f"model.precision={precision}", f"batching.sort={str(sort).lower()}"]
            if not sort:
                sets.append("batching.max_rows=32")
            report, out = run(embed, args.work / name.replace(" ", "-"), sets)
            reference = out if reference is None else reference
            print(
                f"{name:<24} {report['rows_per_s']:>9,.0f} {report['tokens_per_s']:>10,.0f} "
                f"{report['padding_efficiency']:>7.3f} {report['model_busy_share']:>5.0%} "
                f"{cosine_min(out['embedding'], reference['embedding']):>8.5f}"
            )

    toy = ROOT / "models/toy-gpt2"
    if not toy.is_dir():
        print("\ngenerate: skipped, no models/toy-gpt2 (run make setup)")
        return
    prompts = pa.table({"text": [t[:300] for t in corpus["text"].to_pylist()[:4096]]})
    gen_data = args.work / "prompts"
    gen_data.mkdir(parents=True, exist_ok=True)
    pq.write_table(prompts, gen_data / "p.parquet")
    generate = (
        f'[input]\npath = "{gen_data}"\ntext = "text"\n[model]\ntask = "generate"\n'
        f'path = "{toy}"\ndevice = "cuda"\nmax_length = 128\n[generate]\n'
        f"max_new_tokens = 32\n[batching]\nmax_tokens = 65536\nmax_rows = 512\n"
        f'[output]\npath = "out"\n'
    )
    print("\ngenerate: toy GPT-2, 4,096 prompts, 32 new tokens, greedy")
    print(f"{'variant':<24} {'rows/s':>9} {'new tok/s':>10} {'exact vs fp32':>13}")
    reference = None
    for precision in precisions:
        for sort in (True, False):
            name = f"{precision}{'' if sort else ' unsorted'}"
            sets = [f"model.precision={precision}", f"batching.sort={str(sort).lower()}"]
            report, out = run(generate, args.work / f"gen-{name.replace(' ', '-')}", sets)
            reference = out if reference is None else reference
            same = np.mean(
                [
                    a == b
                    for a, b in zip(
                        out["generated"].to_pylist(),
                        reference["generated"].to_pylist(),
                        strict=True,
                    )
                ]
            )
            new = sum(out["generated_tokens"].to_pylist()) / report["wall_s"]
            print(f"{name:<24} {report['rows_per_s']:>9,.0f} {new:>10,.0f} {same:>13.3f}")
    print(json.dumps({"done": True}))


if __name__ == "__main__":
    main()
