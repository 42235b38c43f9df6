"""The native MiniLM encoder on OpenVINO (`batchscore.runtime.bert_openvino`) against eager torch.

One process, the same weights, the same batches: the bench corpus's texts cut by batchscore's own
sampler under a token budget, as a job cuts them. Each precision OpenVINO takes (fp32, bf16
where the CPU has bf16 units, int8 where it has int8 kernels) on both runtimes: torch as a job
runs it (fp32 with packed Linear weights, `batchscore.runtime.packing`; bf16 cast; int8
calibrated on other corpus texts), OpenVINO as `[model].runtime = "auto"` builds it.
Interleaved rounds, each model's first round (new shapes) reported apart from the median of
the rest (and their range); padded tokens per second, the largest difference of the hidden
states from torch's at the same precision, and the worst cosine of the mean-pooled embeddings
against fp32. Each ratio is the median of the counted rounds' own ratios, with their range
(scripts/rounds.py), so ``--rounds`` is at least 4: three counted after the first.

    python docs/studies/runtime_study.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from batchscore.errors import ModelError
from batchscore.job.runtimes import OPENVINO
from batchscore.job.sections import ModelConfig
from batchscore.models.source.locate import locate
from batchscore.models.stack.pooling import pool
from batchscore.models.text.text import TextEncoder
from batchscore.pipeline.sampler import form_batches
from batchscore.precision.int8 import quantize_int8
from batchscore.precision.table import available, precision
from batchscore.runtime.bert import load_bert, read_shape
from batchscore.runtime.bert_openvino import openvino_bert
from batchscore.runtime.packing import pack_linears

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench
import rounds
import sample_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    why = " after the first (new shapes), which is reported apart"
    parser.add_argument("--rounds", type=rounds.count(rounds.LEAST + 1, why), default=4)
    parser.add_argument("--max-tokens", type=int, default=16384)
    args = parser.parse_args()
    torch.set_num_threads(bench.THREADS)
    path = locate(ModelConfig(task="embed", name="all-MiniLM-L6-v2", precision="fp32"))
    text = TextEncoder(path, 256, False)
    ids, _ = text.encode(bench.sample(args.rows).column("text").to_pylist())
    lengths = np.array([len(row) for row in ids])
    cut = form_batches(lengths, args.max_tokens, 512, sort=True)
    batches = [tuple(map(torch.from_numpy, text.collate([ids[i] for i in b]))) for b in cut]
    padded = sum(int(x.numel()) for x, _ in batches)

    precisions = [p for p in OPENVINO.precisions if p in available(torch.device("cpu"))]
    models: dict[tuple[str, str], torch.nn.Module] = {}
    for name in precisions:
        eager = load_bert(path, read_shape(path)).eval().requires_grad_(False)
        eager = eager.to(precision(name).dtype)
        if precision(name).calibrated:
            calibrate(eager, text, args.rows)
        start = time.perf_counter()
        try:
            models[name, "openvino"] = openvino_bert(eager, bench.THREADS)
        except ModelError as exc:  # int8 without VNNI: a job keeps it on torch
            print(f"OpenVINO {name}: refused ({exc})")
            continue
        print(f"OpenVINO {name}: build, compile and probe {time.perf_counter() - start:.2f} s")
        if name == "fp32":
            pack_linears(eager)
        models[name, "torch"] = eager
    print(f"torch {torch.__version__}, {bench.THREADS} threads; {args.rows} texts in "
          f"{len(cut)} batches, {padded:,} padded tokens")  # fmt: skip

    times: dict[tuple[str, str], list[float]] = {key: [] for key in models}
    outputs: dict[tuple[str, str], list[torch.Tensor]] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for key, model in models.items():
                begin = time.perf_counter()
                outputs[key] = [model(x, mask).last_hidden_state for x, mask in batches]
                times[key].append(time.perf_counter() - begin)
    counted = {key: t[1:] for key, t in times.items()}  # the first round reported apart
    steady = {key: padded / statistics.median(t) for key, t in counted.items()}
    for (name, runtime), t in times.items():
        cosine = worst_cosine(outputs[name, runtime], outputs["fp32", "torch"], batches)
        spread = f"{padded / max(t[1:]):,.0f}-{padded / min(t[1:]):,.0f}"
        print(f"  {name} {runtime:<9} first round {padded / t[0]:8,.0f} padded tokens/s; then "
              f"{steady[name, runtime]:8,.0f} (median of {len(t) - 1}, range {spread}); min "
              f"cosine vs fp32 {cosine:.5f}")  # fmt: skip
    for name in [p for p in precisions if (p, "openvino") in models]:
        gap = max(
            float((a.float() - b.float())[mask.bool()].abs().max())
            for a, b, (_, mask) in zip(
                outputs[name, "openvino"], outputs[name, "torch"], batches, strict=True
            )
        )
        ratio = rounds.ratio(counted[name, "torch"], counted[name, "openvino"])
        print(f"{name}: OpenVINO vs torch, per padded token: {ratio}; largest "
              f"hidden-state difference {gap:.2g}")  # fmt: skip
    if len(precisions) > 1:
        best = max(steady, key=steady.__getitem__)
        ratio = rounds.ratio(counted["fp32", "torch"], counted[best])
        print(f"fastest: {' on '.join(best)}, {ratio} torch fp32")


def calibrate(eager: torch.nn.Module, text: TextEncoder, rows: int) -> None:
    """int8 as a job calibrates it (`batchscore.precision.int8`, target min cosine 0.99), on
    128 corpus texts the timed ones are not: those halfway between them."""
    corpus = sample_corpus.corpus().column("text").to_pylist()
    step = max(1, len(corpus) // rows)
    ids, _ = text.encode(corpus[step // 2 :: step][:128])
    batches = [tuple(map(torch.from_numpy, text.collate(ids[i : i + 16])))
               for i in range(0, len(ids), 16)]  # fmt: skip

    def forward(module: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return pool(module(*batch).last_hidden_state.float(), batch[1], ("mean",), 0)

    start = time.perf_counter()
    with torch.inference_mode():
        _, report = quantize_int8(eager, batches, forward, min_cosine=0.99)
    print(f"int8 calibration ({time.perf_counter() - start:.1f} s): {report.summary()}")


def worst_cosine(
    got: list[torch.Tensor], want: list[torch.Tensor], batches: list[tuple[torch.Tensor, ...]]
) -> float:
    """The lowest cosine between two runs' mean-pooled embeddings, over every row."""
    worst = 1.0
    for a, b, (_, mask) in zip(got, want, batches, strict=True):
        a, b = (pool(x.float(), mask, ("mean",), 0) for x in (a, b))
        worst = min(worst, float(torch.nn.functional.cosine_similarity(a, b).min()))
    return worst


if __name__ == "__main__":
    main()
