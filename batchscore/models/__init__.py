"""Models: task adapters (`tasks`: one table keyed by `[model].task`), how each reads its rows and
writes its columns, and how model files are found (`locate`) and loaded without running code."""
