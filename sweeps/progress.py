"""Progress of a sweep: configurations done, rate and ETA.

On a terminal one line is redrawn in place (a bar); otherwise (logs, pipes, CI) a plain
line is printed at most every ``interval`` seconds and at the end.  Progress goes to stderr
so that stdout carries only the result (``--json``).
"""

from __future__ import annotations

import sys
import time


def format_eta(seconds: float) -> str:
    """``75`` -> ``1m15s``; unknown -> ``?``."""
    if seconds != seconds or seconds == float("inf") or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


class Progress:
    """Counts configurations (product rows covered) and chunks as they complete."""

    def __init__(self, total_configs: int, total_chunks: int, stream=None,
                 tty: bool | None = None, interval: float = 2.0, enabled: bool = True,
                 done_configs: int = 0, done_chunks: int = 0):
        self.total = total_configs
        self.chunks = total_chunks
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval
        self.enabled = enabled
        self.done = done_configs
        self.done_chunks = done_chunks
        self._base = done_configs
        self._t0 = time.perf_counter()
        self._last = 0.0

    def rate(self) -> float:
        dt = time.perf_counter() - self._t0
        return (self.done - self._base) / dt if dt > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rate_s = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2f}"
        return (f"{self.done}/{self.total} configs ({pct:.1f}%), chunk {self.done_chunks}/"
                f"{self.chunks}, {rate_s} configs/s, ETA {format_eta(eta)}")

    def update(self, configs: int, chunks: int = 1) -> None:
        self.done += configs
        self.done_chunks += chunks
        if not self.enabled:
            return
        now = time.perf_counter()
        last = self.done_chunks >= self.chunks
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total) if self.total else width
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r[{bar}] {self.line()}\x1b[K")
            if last:
                self.stream.write("\n")
            self.stream.flush()
        elif last or now - self._last >= self.interval:
            self.stream.write(f"progress: {self.line()}\n")
            self.stream.flush()
            self._last = now
