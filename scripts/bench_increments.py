"""Increments by row (`[input].increments = "rows"`): what a day's change costs against a full run,
and the diff's peak memory over many rows.

1. A folder of ``--rows`` rows (10 shards) on the tensor task (an MLP over 4 features, its
   hidden widths ``--hidden``: by default one layer of 8, so scoring is not the bulk) is scored
   whole in a fresh process; then ``--appended`` rows are appended to one shard and
   ``--edited`` rows edited in another, and the increment is run in a fresh process. Each of
   ``--rounds`` interleaved rounds does both from scratch (a new folder), then times the floor
   under any increment: a fresh interpreter importing torch, pyarrow and polars. Prints each
   wall time (the process's, start-up included) as the median of the rounds with their range,
   each ratio to the full run as the median of the rounds' own ratios with their range
   (scripts/rounds.py), and the last increment's report (rows scored, rows retired, phases).
2. The diff alone (`batchscore.output.diff.row_diff`) over ``--diff-rows`` input rows against
   as many committed rows (synthetic committed files holding only `id` and `_row_hash`, as
   the diff reads them), in a fresh process: its wall time and peak resident memory (the
   process's peak less its peak after imports).

    python scripts/bench_increments.py                          # 1,000,000 rows; a 10M diff
    python scripts/bench_increments.py --rows 100000 --diff-rows 1000000   # a quick look
    python scripts/bench_increments.py --hidden 1024,1024 --diff-rows 0    # a wider model
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import rounds  # noqa: E402

SHARDS = 10


def features(rows: int, seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
    return {f"x{j}": x[:, j] for j in range(4)}


def write_input(data: Path, rows: int) -> None:
    """``rows`` rows with int64 ids, in ``SHARDS`` files."""
    data.mkdir(parents=True, exist_ok=True)
    per = -(-rows // SHARDS)
    for s in range(SHARDS):
        ids = np.arange(s * per, min(rows, (s + 1) * per), dtype=np.int64)
        pq.write_table(pa.table({"id": ids, **features(len(ids), s)}), data / f"s{s}.parquet")


def write_job(folder: Path, data: Path, hidden: list[int]) -> Path:
    import torch
    from safetensors.torch import save_file

    from batchscore.models.numeric.factories import mlp

    torch.manual_seed(0)
    args = {"in_features": 4, "out_features": 3, "hidden": hidden}
    save_file(mlp(**args).eval().state_dict(), str(folder / "mlp.safetensors"))
    job = folder / "job.toml"
    job.write_text(
        f"""[input]
path = "{data}"
id = "id"
features = ["x0", "x1", "x2", "x3"]
increments = "rows"
[model]
task = "tensor"
path = "mlp.safetensors"
precision = "fp32"
[batching]
max_tokens = 65536
max_rows = 4096
[output]
path = "{folder / "out"}"
[tensor]
output = "class"
factory = "mlp"
factory_args = {{ in_features = 4, out_features = 3, hidden = {hidden} }}
"""
    )
    return job


def timed_run(job: Path) -> tuple[float, dict]:
    """``batchscore run JOB`` in a fresh process: its wall time and its run report."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "batchscore", "run", str(job), "--progress", "off"],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    runs = sorted((job.parent / "out/_batchscore/runs").glob("*.json"))
    return wall, json.loads(runs[-1].read_text())


def imports_s() -> float:
    """The wall time of a fresh interpreter that imports what any run imports, and ends as the
    command does (at once, without the interpreter's teardown)."""
    began = time.perf_counter()
    code = "import os, torch, pyarrow, polars; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - began


def change(data: Path, appended: int, edited: int) -> None:
    """``appended`` new rows at the end of the first shard, ``edited`` rows of the second
    with a changed feature."""
    first = pq.read_table(data / "s0.parquet")
    start = 10**12  # ids no shard holds
    new = pa.table(
        {"id": np.arange(start, start + appended, dtype=np.int64), **features(appended, 99)}
    )
    pq.write_table(pa.concat_tables([first, new]), data / "s0.parquet")
    second = pq.read_table(data / "s1.parquet").to_pydict()
    step = max(1, len(second["id"]) // max(edited, 1))
    for i in range(0, step * edited, step):
        second["x0"][i] += 1.0
    pq.write_table(pa.table(second).cast(first.schema), data / "s1.parquet")


DIFF_CHILD = """
import json, resource, sys, time
from pathlib import Path
from batchscore.job.sections import InputConfig
from batchscore.output.diff import row_diff
from batchscore.storage.disk import LocalStore
from batchscore.work.shards import find_shards
folder = Path(sys.argv[1])
inp = InputConfig(path=(str(folder / "in"),), id="id", features=("x0", "x1", "x2", "x3"),
                  increments="rows")
shards = find_shards(inp)
records = json.loads((folder / "records.json").read_text())
kinds = {f"x{j}": "numeric" for j in range(4)}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.perf_counter()
diff = row_diff(inp, kinds=kinds, shards=shards, store=LocalStore(folder / "out"),
                committed=records)
wall = time.perf_counter() - began
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": wall, "peak_mib": peak / 1024, "after_imports_mib": base / 1024,
                  "counts": diff.counts()}))
"""


def diff_memory(folder: Path, rows: int) -> dict:
    """The diff over ``rows`` input rows against as many committed rows, in a fresh process."""
    from batchscore.work.row_hash import hash_column

    data, out = folder / "in", folder / "out"
    out.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    records, per, files = {}, 1_000_000, -(-rows // 1_000_000)
    for s in range(files):
        ids = np.arange(s * per, min(rows, (s + 1) * per), dtype=np.int64)
        table = pa.table({"id": ids, **features(len(ids), s)})
        pq.write_table(table, data / f"s{s:03d}.parquet")
        hashes = hash_column(table, [f"x{j}" for j in range(4)])
        for c in range(0, len(ids), 100_000):  # committed files of 100,000 rows
            key = f"{s:03d}-{c // 100_000:05d}"
            part = pa.table({"id": ids[c : c + 100_000], "_row_hash": hashes[c : c + 100_000]})
            pq.write_table(part, out / f"part-{key}.parquet")
            records[key] = {"file": f"part-{key}.parquet", "rows": part.num_rows}
    (folder / "records.json").write_text(json.dumps(records))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", DIFF_CHILD, str(folder)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"diff failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--appended", type=int, default=1_000)
    parser.add_argument("--edited", type=int, default=100)
    parser.add_argument(
        "--hidden",
        default="8",
        help="the MLP's hidden widths, comma-separated (8: scoring is almost free; 1024,1024: "
        "a row costs what a mid-sized tabular model's does)",
    )
    parser.add_argument("--diff-rows", type=int, default=10_000_000, help="0: skip")
    parser.add_argument(
        "--rounds", type=rounds.count(), default=3, help="interleaved: full run, then increment"
    )
    parser.add_argument("--folder", type=Path, default=None, help="default: a temporary one")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bench-increments-"))
    hidden = [int(w) for w in args.hidden.split(",")]
    for stale in folder.glob("round-*"):  # an earlier bench's: each round starts from nothing
        shutil.rmtree(stale)
    walls: dict[str, list[float]] = {"full": [], "increment": [], "imports": []}
    reports: dict[str, list[dict]] = {"full": [], "increment": []}
    for round_ in range(args.rounds):  # interleaved: a drift in machine load hits both alike
        run_folder = folder / f"round-{round_ + 1}"
        run_folder.mkdir(parents=True)
        data = run_folder / "data"
        write_input(data, args.rows)
        job = write_job(run_folder, data, hidden)
        for which in ("full", "increment"):
            if which == "increment":
                change(data, args.appended, args.edited)
            took, report = timed_run(job)
            walls[which].append(took)
            reports[which].append(report)
        walls["imports"].append(imports_s())
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    full, inc = reports["full"][-1], reports["increment"][-1]
    own = {k: statistics.median(r["wall_s"] for r in rs) for k, rs in reports.items()}
    print(f"medians of {args.rounds} interleaved rounds (each a full run, then the increment)")
    print(
        f"full run: {full['rows']:,} rows in {statistics.median(walls['full']):.2f} s "
        f"(range {rounds.spread(walls['full'], 2)}; process wall, start-up included)"
    )
    print(
        f"increment: {inc['rows']:,} rows scored, {inc['rows_retired']:,} retired, in "
        f"{statistics.median(walls['increment']):.2f} s (range "
        f"{rounds.spread(walls['increment'], 2)}; the report's own wall: "
        f"{own['increment']:.2f} s of {own['full']:.2f} s)"
    )
    print(f"increment vs full run: {rounds.ratio(walls['increment'], walls['full'])}")
    print(f"  diff: {json.dumps(inc.get('increments'))}")
    phases = ", ".join(f"{name} {s:.2f} s" for name, s in inc["phases"].items())
    print(
        f"  the last increment's time by phase (preparing: listing, the diff, retiring): {phases}"
    )
    floor = walls["imports"]
    print(
        f"  a fresh interpreter importing torch, pyarrow and polars alone: "
        f"{statistics.median(floor):.2f} s (range {rounds.spread(floor, 2)}); vs the full run: "
        f"{rounds.ratio(floor, walls['full'])} (no increment can take less)"
    )
    if args.diff_rows:
        found = diff_memory(folder / "diff", args.diff_rows)
        print(
            f"diff of {args.diff_rows:,} input rows against {args.diff_rows:,} committed: "
            f"{found['wall_s']:.1f} s, peak RSS {found['peak_mib']:.0f} MiB "
            f"({found['peak_mib'] - found['after_imports_mib']:.0f} MiB over the "
            f"{found['after_imports_mib']:.0f} MiB after imports)"
        )


if __name__ == "__main__":
    main()
