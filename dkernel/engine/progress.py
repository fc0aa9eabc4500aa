"""Progress line for long work, on stderr: steps, rate, ETA and running metrics."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Prints at most every ``interval`` seconds; a no-op when disabled."""

    def __init__(self, total: int, label: str, enabled: bool, stream: TextIO | None = None,
                 interval: float = 1.0, start: int = 0, unit: str = "steps") -> None:
        self.total, self.label, self.enabled, self.unit = total, label, enabled, unit
        self.stream = stream or sys.stderr
        self.interval = interval
        self.done = self._base = start
        self._t0 = self._last = time.perf_counter()
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, n: int = 1, **metrics: float) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < self.interval and self.done < self.total:
            return
        self._last = now
        rate = (self.done - self._base) / max(now - self._t0, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        parts = [f"{self.label}: {self.done}/{self.total} {self.unit}",
                 f"{rate:.1f} {self.unit}/s", f"eta {eta:.0f}s"]
        parts += [f"{k} {v:.4g}" for k, v in metrics.items()]
        line = " | ".join(parts)
        self.stream.write(("\r" + line) if self._tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()
