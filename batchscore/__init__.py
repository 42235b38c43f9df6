"""batchscore: offline batch scoring of Parquet shards with PyTorch models."""

__version__ = "0.1.0"
