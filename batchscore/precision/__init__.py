"""Precision: one table of precisions (`table`: dtype, devices, gate, calibration) and int8's
load-time transform (`int8_linear`: the layer, `calibration`: outputs compared row by row,
`int8`: which layers go int8). Choosing one on a job's rows is `batchscore.measure`'s."""
