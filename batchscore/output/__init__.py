"""The output folder contract (every name in it: `batchscore.storage.layout`): the plan of work
(`pending`: chunks, the unit of commit), commit records and the job's claim (`checkpoint`,
`fingerprint`), the committer, the lock, and `status`."""
