"""Start-up benchmark: process start to the first scored batch, beside `import torch`.

The figure issue 14 asks to bring close to its floor: a fresh `python -c "import torch"`. Each
runs as a fresh process, interleaved round by round (this machine is shared and noisy); each
ratio is the median of its rounds' own ratios, with their range (scripts/rounds.py). The job
is the default embed model at fp32 on a small input, so the quality gate that "auto" precision
runs first stays out of the figure; one warm-up run per tree fills the user cache folder with
its timed batch budget, as every later run on a machine finds it. ``--baseline`` names another
source tree (a checkout of an older commit, say) to time in the same rounds, so a change's
before and after meet the same machine load.

    python scripts/bench_startup.py --rounds 7 --baseline /tmp/batchscore-before
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import rounds  # noqa: E402
import sample_corpus  # noqa: E402


@contextmanager
def source(tree: Path) -> Iterator[None]:
    """Child processes import batchscore from ``tree`` (run from it too: `python -m` puts the
    working directory first on the path)."""
    saved, where = os.environ.get("PYTHONPATH"), Path.cwd()
    os.environ["PYTHONPATH"] = str(tree)
    os.chdir(tree)
    try:
        yield
    finally:
        os.chdir(where)
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=rounds.count(), default=7)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--baseline", type=Path, help="another source tree, timed alongside")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "startup")
    args = parser.parse_args()
    args.work = args.work.resolve()

    shutil.rmtree(args.work, ignore_errors=True)
    data = args.work / "data"
    sample_corpus.write_shards(bench.sample(args.rows), data, shards=1)
    # name -> (source tree, [model].precision; None: the key left out, as in the default job)
    trees = {"this tree": (ROOT, "fp32"), "this tree, default job": (ROOT, None)}
    if args.baseline:
        trees["baseline"] = (args.baseline, "fp32")
    jobs = {}
    shutil.rmtree(bench.XDG, ignore_errors=True)
    for name, (tree, precision) in trees.items():
        folder = args.work / name.replace(" ", "-").replace(",", "")
        folder.mkdir()
        keys = {"precision": precision} if precision else {}
        jobs[name] = bench.job_file(folder, data, name="all-MiniLM-L6-v2", max_length=256, **keys)
        with source(tree):
            bench.batchscore_run(jobs[name])  # what a first run on the machine measures
    first: dict[str, list[float]] = {name: [] for name in trees}
    torch_s = []
    for _ in range(args.rounds):  # interleaved: a drift in machine load hits all alike
        for name, (tree, _) in trees.items():
            with source(tree):
                first[name].append(bench.batchscore_run(jobs[name])["first_batch_s"])
        torch_s.append(bench.import_torch())
    floor = statistics.median(torch_s)
    print(f"medians of {args.rounds} interleaved rounds, {args.rows} rows, process start to "
          "first batch; fp32 unless named the default job (no precision key)")  # fmt: skip
    label = 'python -c "import torch"'
    print(f"{label:<28} {floor:6.2f} s (range {rounds.spread(torch_s, 2)})")
    for name, runs in first.items():
        run = statistics.median(runs)
        where = trees[name][0]
        print(f"{name:<28} {run:6.2f} s (range {rounds.spread(runs, 2)})  "
              f"{rounds.ratio(runs, torch_s)} torch  ({where})")  # fmt: skip
    if args.baseline:
        ratio = rounds.ratio(first["baseline"], first["this tree"])
        print(f"this tree vs baseline (baseline's time / this tree's): {ratio}")


if __name__ == "__main__":
    main()
