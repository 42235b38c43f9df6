"""Models: task adapters (`tasks`: one table keyed by `[model].task`), how each reads its rows and
writes its columns, and the fingerprint; below them, the rooms the adapters are built from:
`generation`, `stack` (sentence-transformers), `numeric` (the tensor task's parts), `text`, and
`source` (how model files are found, and loaded without running code)."""
