"""The native MiniLM encoder on OpenVINO (`batchscore.models.bert_openvino`) against eager torch.

One process, the same weights, the same batches: the bench corpus's texts cut by batchscore's own
sampler under a token budget, as a job cuts them. Torch runs as a job runs it (packed Linear
weights, `batchscore.pipeline.packing`); OpenVINO as `[model].runtime = "auto"` builds it.
Interleaved rounds, each model's first round (new shapes) reported apart from the median of the
rest; padded tokens per second, and the largest difference of their hidden states.

    python scripts/runtime_study.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from batchscore.job.sections import ModelConfig
from batchscore.models.bert import load_bert, read_shape
from batchscore.models.bert_openvino import openvino_bert
from batchscore.models.locate import locate
from batchscore.models.text import TextEncoder
from batchscore.pipeline.packing import pack_linears
from batchscore.pipeline.sampler import form_batches

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
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

    eager = load_bert(path, read_shape(path)).eval().requires_grad_(False)
    start = time.perf_counter()
    models = {"openvino": openvino_bert(eager, bench.THREADS)}
    built = time.perf_counter() - start
    pack_linears(eager)
    models["torch"] = eager
    print(f"torch {torch.__version__}, {bench.THREADS} threads; {args.rows} texts in "
          f"{len(cut)} batches, {padded:,} padded tokens; OpenVINO build, compile and probe "
          f"{built:.2f} s")  # fmt: skip

    times: dict[str, list[float]] = {name: [] for name in models}
    outputs: dict[str, list[torch.Tensor]] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, model in models.items():
                begin = time.perf_counter()
                outputs[name] = [model(x, mask).last_hidden_state for x, mask in batches]
                times[name].append(time.perf_counter() - begin)
    gap = max(
        float((a - b)[mask.bool()].abs().max())
        for a, b, (_, mask) in zip(outputs["openvino"], outputs["torch"], batches, strict=True)
    )
    steady = {name: padded / statistics.median(t[1:]) for name, t in times.items()}
    for name, t in times.items():
        print(f"  {name:<9} first round {padded / t[0]:8,.0f} padded tokens/s; "
              f"then {steady[name]:8,.0f} (median of {len(t) - 1})")  # fmt: skip
    print(f"OpenVINO vs torch, per padded token: {steady['openvino'] / steady['torch']:.2f}x; "
          f"largest hidden-state difference {gap:.2g}")  # fmt: skip


if __name__ == "__main__":
    main()
