"""What a job leaves to measurement, settled once per output folder (`settle`): the quality gate
(`gate`: a precision next to fp32, by the task's own measure), a fixed precision gated and
`check`'s full table (`choose`), "auto" (`auto`: fp32 first, then what can pay for itself), the
token budget (`budget`), a task loaded at a precision, int8 calibrated (`load`), and what this
machine measured, kept across jobs (`cache`)."""
