"""An embed run of the built-in model starts without importing transformers, and imports
huggingface_hub (an id's look-up) and prometheus_client (`--metrics-file`) only when it needs them.

transformers' import alone costs seconds, longer than scoring the first batch; the native BERT
encoder and tokenizer load exist so that the default embed job never pays it. Checked in a fresh
process, as a user's run starts, on the modules it has loaded when the run is over.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import ROOT, write_job

DRIVER = """
import sys
from batchscore.cli import main  # the command, not `console`, which ends the process at once
try:
    main(["run", sys.argv[1], "--progress", "off"])
except SystemExit as exc:
    assert not exc.code, f"the run failed: {exc.code}"
lazy = ("transformers", "torch.", "huggingface_hub", "prometheus_client")
print(sorted({m.split(".")[0] for m in sys.modules if m.startswith(lazy)}))
"""


def test_an_embed_run_never_imports_transformers(tmp_path: Path, small_corpus: pa.Table):
    (tmp_path / "in").mkdir()
    pq.write_table(small_corpus.slice(0, 40), tmp_path / "in" / "part-0.parquet")
    job = write_job(
        tmp_path / "embed.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "embed", "name": "all-MiniLM-L6-v2", "max_length": 128, "threads": 1},
        output={"path": "out"},
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", DRIVER, str(job)], capture_output=True,
                         text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    # torch ran it; transformers, the hub's client and the metrics' writer were never imported
    assert out.stdout.strip().splitlines()[-1] == "['torch']"
    assert pq.read_table(tmp_path / "out").num_rows == 40
