"""The recipes: one per command, each wiring the rooms below it explicitly. `driver` runs a job
(`run`: the run's record, report and metrics, however it ends), `plan` + `estimate` are the
dry run and its time, `preflight` what `validate` checks,
`status` what is done, and `history` the numbers `batchscore report` draws."""
