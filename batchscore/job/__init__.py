"""The job file: its sections (frozen dataclasses), how it is loaded and checked, the row filter
(`[input].where`) and prompt templates. Nothing here imports torch: `validate` and `--help` stay
fast, and every other room receives only the sections it needs."""
