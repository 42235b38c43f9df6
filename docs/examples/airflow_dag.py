"""An Airflow DAG that keeps a batchscore output folder current, daily: plan, run, status.

Three BashOperator tasks, each a batchscore command read by its exit status alone
(docs/reliability.md, "Exit status"):

- ``plan``: ``batchscore plan JOB --max-wall-s 3600`` exits 12 when the run would not fit the
  hour; the task is then skipped (``skip_on_exit_code``), and Airflow skips the tasks after it.
  It exits as the run would when the run would fail at once (2, 4, 5, 10), and fails the DAG
  run before anything is loaded.
- ``run``: ``batchscore run JOB`` exits 0 once every row is committed. Airflow retries a task
  that failed whatever its status, which is what 75 (another run of the job still holds its
  lock), 7 (reading failed transiently) and 143 (stopped by SIGTERM: the worker shut down) ask
  for: the retry resumes, and nothing committed is scored again. A real failure (2 the job
  file, 4 the model, 5 the output folder) fails again at once, before scoring anything.
- ``check``: ``batchscore status JOB --check`` exits 13 unless the output is complete: the DAG
  run fails, and nothing after it reads a partial folder.

``batchscore`` is the command on the workers' PATH (or the full path of a virtual
environment's: ``/srv/batchscore/.venv/bin/batchscore``). Written for Airflow 3; on Airflow
2.x import ``DAG`` from ``airflow`` and ``BashOperator`` from ``airflow.operators.bash``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

OVER_LIMIT = 12  # plan: the run would not fit --max-wall-s; skipped, not failed
RETRIES = 3  # run: 75 (lock held), 7 (transient) and 143 (SIGTERM) pass on a later try

with DAG(
    dag_id="batchscore_embed",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "job": "/srv/batchscore/jobs/embed.toml",
        "metrics": "/var/lib/node_exporter/textfile/batchscore_embed.prom",
    },
) as dag:
    plan = BashOperator(
        task_id="plan",
        bash_command="batchscore plan {{ params.job }} --max-wall-s 3600",
        skip_on_exit_code=OVER_LIMIT,
    )
    run = BashOperator(
        task_id="run",
        bash_command=(
            "batchscore run {{ params.job }} --progress log --metrics-file {{ params.metrics }}"
        ),
        retries=RETRIES,
        retry_delay=timedelta(minutes=10),
    )
    check = BashOperator(
        task_id="check",
        bash_command="batchscore status {{ params.job }} --check",
    )
    plan >> run >> check
