"""The units of work every layer shares (`units`: shards, chunks, windows, scored parts), the
input shards a job names (`shards`: found, footers opened, columns checked) and the one Arrow
layout their rows are read in (`columns`). Nothing here imports a model."""
