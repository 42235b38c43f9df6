"""MiniLM's encoder in eager torch at each float dtype the CPU could run: is fp16 worth offering?

oneDNN has fp16 kernels on any CPU with AVX-512 FP16 (Sapphire Rapids), so "fp16 native" on a
CPU used to follow that flag. This study times the same batch (``--batch`` rows of ``--tokens``
tokens, random ids) through all-MiniLM-L6-v2 in float32, bfloat16 and float16, in interleaved
rounds of ``--seconds`` each, and prints padded tokens per second and each dtype's ratio to
float32 (medians). Its answer decides `batchscore.precision.cpu.FP16_UNITS`.

    python docs/studies/cpu_dtypes_study.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from batchscore.job.sections import ModelConfig
from batchscore.models.source.locate import locate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench
from bench_cold import flags

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    from transformers import AutoModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(bench.THREADS)
    path = locate(ModelConfig(task="embed", name="all-MiniLM-L6-v2", precision="fp32"))
    ids = torch.randint(
        1000, 20000, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    models = {name: AutoModel.from_pretrained(path, dtype=dt).eval() for name, dt in DTYPES.items()}
    speeds: dict[str, list[float]] = {name: [] for name in DTYPES}
    with torch.inference_mode():
        for model in models.values():  # first calls: new shapes, kernels chosen
            model(input_ids=ids, attention_mask=mask)
        for _ in range(args.rounds):
            for name, model in models.items():
                began, calls = time.perf_counter(), 0
                while time.perf_counter() - began < args.seconds:
                    model(input_ids=ids, attention_mask=mask)
                    calls += 1
                speeds[name].append(calls * ids.numel() / (time.perf_counter() - began))
    print(f"machine: {flags()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{args.batch} x {args.tokens} tokens, medians of {args.rounds} interleaved rounds")
    fp32 = statistics.median(speeds["fp32"])
    for name, found in speeds.items():
        median = statistics.median(found)
        print(f"  {name}  {median:10,.0f} padded tokens/s  {median / fp32:5.2f}x fp32")


if __name__ == "__main__":
    main()
