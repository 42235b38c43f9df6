"""Packed float32 Linear weights (`batchscore.runtime.packing`) against plain ``F.linear``.

Side by side in one process, interleaved rounds, medians: the native MiniLM encoder on its real
weights over a few batch shapes, and greedy generation with randomly initialised models shaped
like T5-small and BART-large (the same tokens either way is checked, not assumed).

    python docs/studies/packing_study.py
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    T5Config,
    T5ForConditionalGeneration,
)

from batchscore.job.sections import ModelConfig
from batchscore.models.source.locate import locate
from batchscore.runtime import bert
from batchscore.runtime.packing import pack_linears

SHAPES = [(20, 50), (40, 100), (64, 128), (8, 256)]  # rows x tokens: short to long buckets


def timed(
    models: dict[str, torch.nn.Module], call: Callable[[torch.nn.Module], torch.Tensor], rounds: int
) -> dict[str, float]:
    """Median seconds of ``call`` on each model over interleaved rounds (the first, warming up,
    dropped)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for _ in range(rounds + 1):
            for name, model in models.items():
                start = time.perf_counter()
                call(model)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t[1:]) for name, t in times.items()}


def encoder(rounds: int) -> None:
    folder = locate(ModelConfig(task="embed", name="all-MiniLM-L6-v2", precision="fp32"))
    eager = bert.load_bert(folder, bert.read_shape(folder)).eval()
    packed = copy.deepcopy(eager)
    layers = pack_linears(packed)
    print(f"all-MiniLM-L6-v2, native encoder, {layers} Linear layers packed")
    generator = torch.Generator().manual_seed(0)
    for rows, length in SHAPES:
        ids = torch.randint(1000, 20000, (rows, length), generator=generator)
        mask = torch.ones_like(ids)
        mask[: rows // 3, length // 2 :] = 0  # a third of the rows half padding

        def run(model: torch.nn.Module, ids=ids, mask=mask) -> torch.Tensor:
            return model(ids, mask).last_hidden_state

        seconds = timed({"eager": eager, "packed": packed}, run, rounds)
        with torch.inference_mode():
            a, b = run(eager), run(packed)
        cosine = F.cosine_similarity(a.flatten(1), b.flatten(1)).min()
        print(f"  {rows:3d} x {length:3d} tokens: eager {seconds['eager'] * 1000:7.1f} ms, packed "
              f"{seconds['packed'] * 1000:7.1f} ms, {seconds['eager'] / seconds['packed']:.2f}x; "
              f"min cosine {cosine:.6f}")  # fmt: skip


def generation(rounds: int) -> None:
    torch.manual_seed(0)
    models = {
        "T5-small shape": T5ForConditionalGeneration(T5Config(decoder_start_token_id=0)),
        "BART-large shape": BartForConditionalGeneration(BartConfig()),
    }
    settings = {"max_new_tokens": 32, "min_new_tokens": 32, "do_sample": False, "num_beams": 1}
    ids = torch.randint(5, 30000, (8, 128))
    for name, eager in models.items():
        eager.eval()
        packed = copy.deepcopy(eager)
        layers = pack_linears(packed)

        def run(model: torch.nn.Module) -> torch.Tensor:
            return model.generate(ids, attention_mask=torch.ones_like(ids), **settings)

        seconds = timed({"eager": eager, "packed": packed}, run, rounds)
        with torch.inference_mode():
            same = torch.equal(run(eager), run(packed))
        print(f"{name}, greedy, 8 rows x 128 tokens in, 32 out, {layers} Linear layers packed: "
              f"eager {seconds['eager']:.2f} s, packed {seconds['packed']:.2f} s, "
              f"{seconds['eager'] / seconds['packed']:.2f}x; same tokens: {same}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; medians of {args.rounds} rounds")
    encoder(args.rounds)
    generation(max(2, args.rounds // 2))


if __name__ == "__main__":
    main()
