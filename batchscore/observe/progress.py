"""Live progress: a tqdm bar on a terminal, a periodic log line elsewhere."""

from __future__ import annotations

import logging
import time

from tqdm import tqdm

log = logging.getLogger("batchscore")


class Progress:
    """A tqdm bar on a terminal; elsewhere (cron, CI logs) a log line every `every_s` seconds."""

    def __init__(self, total_rows: int, mode: str, every_s: float = 10.0) -> None:
        self.mode, self.every_s, self.total = mode, every_s, total_rows
        self.rows, self.tokens = 0.0, 0
        self.start = self.last = time.perf_counter()
        self.bar = tqdm(total=total_rows, unit="row", dynamic_ncols=True) if mode == "bar" else None

    def advance(self, rows: float, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        now = time.perf_counter()
        rate = self.tokens / max(now - self.start, 1e-9)
        if self.bar is not None:
            self.bar.update(rows)
            self.bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
        elif self.mode == "log" and now - self.last >= self.every_s:
            self.last = now
            log.info(
                "%.0f/%d rows (%.1f%%), %.1f rows/s, %.0f tokens/s",
                self.rows,
                self.total,
                100 * self.rows / max(self.total, 1),
                self.rows / (now - self.start),
                rate,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
