"""The pipeline, in data order: shards and reader (rows), stages (windows and batches), sampler
(length buckets), executor and scoring (the model), writer (Parquet), threads (the overlap), and
the driver that wires them for one job. `preflight` checks a job before any of it runs."""
