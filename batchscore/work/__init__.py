"""The units of work every layer shares (`units`: shards, chunks, windows, scored parts), a row's
error (`row_errors`: the output's error column and the rejected-rows listing), the input shards
a job names (`shards`: found, footers opened, columns checked) and the one Arrow layout their
rows are read in (`columns`). Nothing here imports a model."""
