"""``python -m batchscore`` is the ``batchscore`` command."""

from batchscore.cli import console

console()
