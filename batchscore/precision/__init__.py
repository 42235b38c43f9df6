"""Precision: one table of precisions (`table`), the int8 transform (`int8_linear`, `calibration`,
`int8`), loading a task at a precision (`load`), the quality gate (`gate`) and the choices left to
measurement (`choose`: "auto" precision and token budget)."""
