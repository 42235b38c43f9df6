"""Start-up benchmark: process start to the first scored batch, beside `import torch`.

The figure issue 14 asks to bring close to its floor: a fresh `python -c "import torch"`. Both
run as fresh processes, interleaved round by round (this machine is shared and noisy), and the
medians are compared. The job is the default embed model at fp32 with a small input, so the
quality gate "auto" precision runs first stays out of the figure; one warm-up run first fills
the user cache folder with its timed batch budget, as every later run on a machine finds it.

    python scripts/bench_startup.py --rounds 7
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import sample_corpus  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "startup")
    args = parser.parse_args()

    data = args.work / "data"
    shutil.rmtree(args.work, ignore_errors=True)
    data.mkdir(parents=True)
    sample_corpus.write_shards(bench.sample(args.rows), data, shards=1)
    job = bench.job_file(args.work, data, name="all-MiniLM-L6-v2", precision="fp32",
                         max_length=256)  # fmt: skip
    shutil.rmtree(bench.XDG, ignore_errors=True)
    bench.batchscore_run(job)  # times fp32's batch budget once, as a machine's first run does
    first, torch_s = [], []
    for _ in range(args.rounds):  # interleaved: a drift in machine load hits both alike
        first.append(bench.batchscore_run(job)["first_batch_s"])
        torch_s.append(bench.import_torch())
    run, floor = statistics.median(first), statistics.median(torch_s)
    print(f"first batch (process start to first scored batch): {run:.2f} s median of {args.rounds}")
    print(f'python -c "import torch":                          {floor:.2f} s')
    print(f"ratio: {run / floor:.2f}x   (runs: {', '.join(f'{s:.2f}' for s in first)})")


if __name__ == "__main__":
    main()
