"""The recipes: one per command, each wiring the rooms below it explicitly. `driver` runs a job
(`run`: the run's record, report and metrics, however it ends; `stopped`: the metrics of a run
stopped before its record), `plan` + `estimate` are the dry run and its time, `preflight` what
`validate` checks, `check` the quality gate shown, `status` what is done, `history` the numbers
`batchscore report` draws, and `score` the Python API's in-memory scoring. The front doors (the
command line, the Python API) call one recipe per verb and pass their environment in; a recipe
opens its own cache from it."""
