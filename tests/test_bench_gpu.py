"""`scripts/bench_gpu.py --smoke` runs end to end here (the CPU, a few hundred rows), so the
GPU benchmark is known to work before a GPU runs it: its table's rows and columns, every row
measured or saying why not. Its figures are a CPU's and are not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_gpu_benchmark_runs_end_to_end_in_its_smoke_mode(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "scripts/bench_gpu.py"), "--smoke", "--rows", "300",
               "--work", str(tmp_path / "bench")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    for column in ("tokens/s", "rows/s", "GPU busy", "peak MiB", "cos min"):
        assert column in lines[header]
    rows = lines[header + 1 : header + 8]
    names = ["fp32, first shard", "(auto), cold", "(auto), warm", "fp16 fixed", "bf16 fixed",
             "sentence-transformers encode", "generate toy GPT-2"]  # fmt: skip
    for name, row in zip(names, rows, strict=True):
        assert name in row, rows
    for row in rows[:3]:  # batchscore's own embed rows are measured, within the gate of fp32
        assert float(row.split()[-1]) >= 0.99, row
    assert json.loads(lines[-1])["done"] is True
