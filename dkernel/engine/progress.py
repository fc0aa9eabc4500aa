"""Progress line for long work, on stderr: steps, rate, ETA and running metrics.

Follows dask's progress bars: on a terminal one line is rewritten in place
(carriage return) at most every ``interval`` seconds; elsewhere -- a
notebook, a log file, a pipe -- a carriage return does not rewind, so
complete lines are printed, few of them: one per tenth of the work (and at
least every ``quiet_interval`` seconds on long runs), then one at the end.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Prints at most every ``interval`` seconds (terminal) or every tenth of
    the work (elsewhere); a no-op when disabled."""

    def __init__(self, total: int, label: str, enabled: bool, stream: TextIO | None = None,
                 interval: float = 1.0, start: int = 0, quiet_interval: float = 60.0,
                 unit: str = "steps") -> None:
        self.total, self.label, self.enabled, self.unit = total, label, enabled, unit
        self.stream = stream or sys.stderr
        self.interval = interval
        self.quiet_interval = quiet_interval
        self.done = self._base = start
        self._t0 = self._last = time.perf_counter()
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._next_tenth = self._tenth(start) + 1
        self._width = 0

    def _tenth(self, done: int) -> int:
        return (10 * done) // max(self.total, 1)

    def update(self, n: int = 1, **metrics: float) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        finished = self.done >= self.total
        if self._tty:
            if now - self._last < self.interval and not finished:
                return
        else:
            tenth = self._tenth(self.done)
            if tenth < self._next_tenth and now - self._last < self.quiet_interval and not finished:
                return
            self._next_tenth = tenth + 1
        self._last = now
        rate = (self.done - self._base) / max(now - self._t0, 1e-9)
        parts = [f"{self.label}: {self.done}/{self.total} {self.unit}",
                 f"{rate:.1f} {self.unit}/s"]
        if finished:
            parts.append(f"{now - self._t0:.1f}s")
        else:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            parts.append(f"eta {eta:.0f}s")
        parts += [f"{k} {v:.4g}" for k, v in metrics.items()]
        line = " | ".join(parts)
        if self._tty:  # pad over the rest of a longer previous line
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()
