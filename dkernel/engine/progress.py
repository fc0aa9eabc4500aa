"""Progress line for long work, on stderr: steps, rate, ETA and running metrics.

Follows dask's progress bars: on a terminal one line is rewritten in place
(carriage return) at most every ``interval`` seconds; elsewhere -- a
notebook, a log file, a pipe -- a carriage return does not rewind, so
complete lines are printed, few of them: one per tenth of the work (and at
least every ``quiet_interval`` seconds on long runs), then one at the end.

Work that prints nothing of its own -- a cluster's start, a client-side
eigensolve or Cholesky, a unit of a bar that takes long -- runs inside a
:func:`phase`: after ``dkernel.progress-heartbeat`` seconds (10) with no
progress line, a line names the innermost phase and how long it has run.
Kernel EigenPro sat silent for 9-45 s in its eigensolve, FALKON for 120 s
before its first line, a CSV ingest for 20 s.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np

from dkernel.engine.settings import number
from dkernel.files import AdviceStream

_lock = threading.RLock()
#: the enabled phases, innermost last; when a progress line was last written;
#: the width of a terminal's current line (one line is rewritten in place)
_phases: list[tuple[str, float, TextIO]] = []
_out: dict[str, Any] = {"last": 0.0, "width": 0, "beating": False}


def _write(stream: TextIO, line: str, tty: bool) -> None:
    """Every progress line goes out here (a terminal's rewritten in place)."""
    stream = AdviceStream(stream) if not isinstance(stream, AdviceStream) else stream
    with _lock:
        if tty:  # pad over the rest of a longer previous line
            stream.write("\r" + line.ljust(_out["width"]))
            _out["width"] = len(line)
        else:
            stream.write(line + "\n")
        stream.flush()
        _out["last"] = time.perf_counter()


def _end_line(stream: TextIO) -> None:
    stream = AdviceStream(stream) if not isinstance(stream, AdviceStream) else stream
    with _lock:
        stream.write("\n")
        stream.flush()
        _out["width"] = 0


@contextmanager
def phase(label: str, enabled: bool, stream: TextIO | None = None) -> Iterator[None]:
    """Run the body as phase ``label`` (module docstring); a no-op when disabled."""
    if not enabled:
        yield
        return
    # (read here, not in the thread: a bad value is the caller's one-line error)
    every = number("dkernel.progress-heartbeat", 10.0)
    entry = (label, time.perf_counter(), stream or sys.stderr)
    with _lock:
        _phases.append(entry)
        _out["last"] = max(_out["last"], entry[1])  # (silence is counted from here)
        if not _out["beating"] and every > 0:  # (0: no heartbeat)
            _out["beating"] = True
            threading.Thread(target=_beat, args=(every,), name="dkernel-progress",
                             daemon=True).start()
    try:
        yield
    finally:
        with _lock:
            _phases.remove(entry)


def _beat(every: float) -> None:
    try:
        while True:
            # re-read: one thread serves every later phase of the process; a value made
            # bad since keeps the one checked when this thread started
            with contextlib.suppress(ValueError):
                every = number("dkernel.progress-heartbeat", 10.0)
            time.sleep(min(1.0, every / 4) if every > 0 else 0.25)
            with _lock:
                if not _phases:
                    return
                if every <= 0:  # (0: no heartbeat)
                    continue
                label, t0, stream = _phases[-1]
                now = time.perf_counter()
                if now - _out["last"] >= every:
                    # a whole line, on a terminal too (over a bar's line, which
                    # its next update redraws): what prints next starts afresh
                    line = f"{label}: running, {now - t0:.0f}s"
                    try:
                        if hasattr(stream, "isatty") and stream.isatty():
                            _write(stream, line, True)
                            _end_line(stream)
                        else:
                            _write(stream, line, False)
                    except (OSError, ValueError):  # (a closed stream or pipe: say nothing)
                        _out["last"] = now
    finally:  # (the next phase starts another; a failed write did not stop it for good)
        with _lock:
            _out["beating"] = False


class Progress:
    """Prints at most every ``interval`` seconds (terminal) or every tenth of
    the work (elsewhere); a no-op when disabled."""

    def __init__(self, total: int, label: str, enabled: bool, stream: TextIO | None = None,
                 interval: float = 1.0, start: int = 0, quiet_interval: float = 10.0,
                 unit: str = "steps") -> None:
        self.total, self.label, self.enabled, self.unit = total, label, enabled, unit
        self.stream = stream or sys.stderr
        self.interval = interval
        self.quiet_interval = quiet_interval
        self.done = self._base = start
        self._t0 = self._last = time.perf_counter()
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._next_tenth = self._tenth(start) + 1
        self._ended = False

    def _tenth(self, done: int) -> int:
        return (10 * done) // max(self.total, 1)

    def update(self, n: int = 1, **metrics: float) -> None:
        self.done += n
        if not self.enabled or (n == 0 and not metrics):
            return
        now = time.perf_counter()
        finished = self.done >= self.total
        if finished and self._ended:  # (an ingest's last chunks repeated the "done" line)
            return
        self._ended = finished
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
        _write(self.stream, " | ".join(parts), self._tty)

    def close(self) -> None:
        if self.enabled and self._tty:
            _end_line(self.stream)


def chunkwise(fn: Any, arrays: list, width: int, label: str, enabled: bool) -> np.ndarray:
    """``fn(*blocks)``, a 1-D float64 of ``width``, for each row chunk of the
    row-aligned dask ``arrays`` (1-D ones as one column), computed as one graph;
    stacked in chunk order (n_chunks x width).  Enabled, the chunks run on the
    current client and a progress line counts them as they finish (a metric over
    a large store said nothing until it was done); otherwise dask's current
    scheduler computes the same graph."""
    import dask.array as da
    from distributed import get_client

    from dkernel.engine.stall import compute, current_client, gather, wait_running

    rows = arrays[0].chunks[0]
    blocks = [(a if a.ndim == 2 else a[:, None]).rechunk({0: rows, 1: -1}) for a in arrays]
    parts = da.map_blocks(_partial, *blocks, fn=fn, dtype=np.float64,
                          chunks=((1,) * len(rows), (width,)), meta=np.empty((0, 0)))
    if not enabled:
        return np.asarray(compute(parts)[0])
    client = current_client() or get_client()
    futures = client.compute(list(parts.to_delayed().ravel()))
    bar = Progress(len(futures), label, True, unit="chunks")
    try:
        # (as_completed waited for ever once every worker was lost)
        wait_running(client, futures, "scoring", on_done=bar.update)
        return np.concatenate(gather(client, futures, "scoring"))
    finally:
        bar.close()


def _partial(*blocks: Any, fn: Any) -> np.ndarray:
    return np.asarray(fn(*blocks), dtype=np.float64).reshape(1, -1)


def time_budget(seen: dict, seconds: float, lanes: int) -> dict[str, float]:
    """Where an epoch's time went: ``compute_seconds`` (the partials' own time,
    summed over lanes), ``busy`` (that over ``lanes`` x the epoch: 1 means the
    lanes never waited), ``update_seconds`` (the client's updates),
    ``wait_seconds`` (the client waiting for step results) and
    ``straggler_seconds`` (per lane, the wait for each step's slowest lane:
    its compute time less the lanes' mean, summed over the steps)."""
    return {"compute_seconds": seen["compute"],
            "busy": seen["compute"] / max(lanes * seconds, 1e-9),
            "update_seconds": seen["update"], "wait_seconds": seen["wait"],
            "straggler_seconds": seen["straggle"]}


def report_epoch(label: str, entry: dict, lanes: int, verbose: bool,
                  slowest: dict[str, int] | None = None, hint: str = "") -> None:
    """Say why an epoch was slow: logged at INFO always, printed when verbose
    and the epoch was long.  ``slowest``: worker -> steps in which its lane
    computed longest; ``hint``: what helps (:meth:`StepProgram.slow_hint`),
    added when the lanes were busy less than half the epoch."""
    idle = entry["seconds"] - entry["compute_seconds"] / lanes
    rate = entry["rows"] / max(entry["seconds"], 1e-9)
    straggler = ""
    if slowest:
        worker, count = max(slowest.items(), key=lambda kv: kv[1])
        straggler = (f", {entry['straggler_seconds']:.1f} s waiting for each step's slowest "
                     f"lane (most often {worker or 'one lane'}: {count} of "
                     f"{sum(slowest.values())} steps)")
    text = (f"{label} epoch {entry['epoch']}: {entry['seconds']:.1f} s, {rate:,.0f} rows/s; "
            f"lanes busy {100 * entry['busy']:.0f}% ({entry['compute_seconds']:.1f} s of compute "
            f"over {lanes} lane(s)); each lane idle {idle:.1f} s: the client's updates took "
            f"{entry['update_seconds']:.1f} s{straggler}, the rest went to chunk reads and "
            "scheduling")
    if hint and entry["busy"] < 0.5:
        text += f" ({hint} would help)"
    _log.info(text)
    if verbose and entry["busy"] < 0.8 and entry["seconds"] > 5:
        print(text, file=sys.stderr, flush=True)


_log = logging.getLogger("dkernel.engine")
