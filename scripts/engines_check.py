"""One job three ways: the local engine, the Ray engine, and the local engine over s3:// URLs.

Runs `batchscore run JOB` (default jobs/embed.toml) as a user would, in fresh processes, on the
first `--shards` shards of its input: locally; with `--engine ray` (a local Ray instance); and
with input and output in a bucket of moto's S3 server, started here on a loopback port and found
through the standard AWS variables. Then checks the three outputs hold the same rows in the same
order with bitwise-equal values, and prints each run's time.

    python scripts/engines_check.py                 # needs the dev extra (ray, moto[server])
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent


def start_s3() -> tuple[subprocess.Popen, dict[str, str]]:
    """moto's S3 server on a free loopback port; the environment that points clients at it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, env
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit("moto's S3 server did not start") from None
            time.sleep(0.2)


def run(job: Path, env: dict[str, str], *sets: str, engine: str = "local") -> float:
    """`batchscore run` in a fresh process; its wall seconds."""
    command = [sys.executable, "-m", "batchscore", "run", str(job), "--engine", engine]
    command += ["--progress", "off", *(a for s in sets for a in ("--set", s))]
    start = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return time.perf_counter() - start


def read(fs: pafs.FileSystem, folder: str) -> pa.Table:
    """Every committed part file of an output folder, in name order."""
    files = fs.get_file_info(pafs.FileSelector(folder))
    parts = sorted(f.path for f in files if f.base_name.endswith(".parquet"))
    return pa.concat_tables(pq.read_table(p, filesystem=fs) for p in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", type=Path, default=ROOT / "jobs/embed.toml")
    parser.add_argument("--data", type=Path, default=ROOT / "data/docs")
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args()

    shards = sorted(args.data.glob("*.parquet"))[: args.shards]
    server, env = start_s3()
    try:
        s3 = pafs.S3FileSystem(
            endpoint_override=env["AWS_ENDPOINT_URL"],
            access_key="local",
            secret_key="local",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        s3.create_dir("batchscore-check")
        for shard in shards:
            pafs.copy_files(
                str(shard), f"batchscore-check/in/{shard.name}", destination_filesystem=s3
            )
        with tempfile.TemporaryDirectory() as tmp:
            local_in = [f'"{s}"' for s in shards]
            inputs = f"input.path=[{', '.join(local_in)}]"
            times = {
                "local": run(args.job, env, inputs, f'output.path="{tmp}/local"'),
                "ray": run(args.job, env, inputs, f'output.path="{tmp}/ray"', engine="ray"),
                "s3": run(
                    args.job,
                    env,
                    'input.path="s3://batchscore-check/in/*.parquet"',
                    'output.path="s3://batchscore-check/out"',
                ),
            }
            local = pafs.LocalFileSystem()
            outputs = {
                "local": read(local, f"{tmp}/local"),
                "ray": read(local, f"{tmp}/ray"),
                "s3": read(s3, "batchscore-check/out"),
            }
    finally:
        server.terminate()
        server.wait(timeout=30)
    reference = outputs["local"]
    print(f"{args.job.name} on {len(shards)} shards ({reference.num_rows:,} rows):")
    for name, table in outputs.items():
        same = table.equals(reference)
        print(f"  {name:<6} {times[name]:6.1f} s  {table.num_rows:,} rows  equal to local: {same}")
    if not all(t.equals(reference) for t in outputs.values()):
        raise SystemExit("the outputs differ")


if __name__ == "__main__":
    main()
