"""The output folder contract (every name in it: `batchscore.storage.layout`): the plan of work
(`pending`: which chunks are still to score), commit records (`checkpoint`), the job's claim
(`claim`) and what it settled on (`settled`), the chunk writer and the committer, the lock, and
gone shards moved out (`retire`)."""
