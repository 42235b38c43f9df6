"""Log lines for people (``batchscore: ...``) or for log collectors (one JSON object a line)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# LogRecord attributes that are not extra fields a caller attached
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra}``: what Loki, Fluent Bit or
    CloudWatch parse without a custom pattern."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(verbose: bool, fmt: str) -> None:
    """Log to stderr at INFO (DEBUG when verbose), as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    text = logging.Formatter("batchscore: %(message)s")
    handler.setFormatter(JsonFormatter() if fmt == "json" else text)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
