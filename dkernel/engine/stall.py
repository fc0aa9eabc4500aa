"""Waiting on the cluster without waiting for ever.

A Dask worker whose process memory passes its pause threshold (80% of its
memory limit, ``distributed.worker.memory.pause``) runs no task until the
memory falls again.  Spilling frees only what Dask manages; what the
interpreter, BLAS and the chunk being read hold stays, so a worker paused by
them stays paused, and a fit waiting on its tasks used to wait silently for
ever (2 workers with a 400 MiB limit: both paused at ~330 MiB before the first
DSG step, with every task queued).

:func:`wait_running` waits like ``distributed.wait``, and every
``_CHECK_SECONDS`` asks the scheduler which workers are paused: a worker
paused ``_WARN_SECONDS`` is warned about once, with its memory and limit; when
every worker has been paused ``_FAIL_SECONDS`` and none of the awaited tasks
finished, :class:`WorkersPaused` says what to change instead of hanging.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import dask
import numpy as np
from dask.base import get_scheduler
from distributed import Client, Future, wait

from dkernel._stack import user_stacklevel
from dkernel._workers import NoWorkersWatch, workers_or_none
from dkernel.engine.cluster import require_workers

_log = logging.getLogger("dkernel.engine")

#: seconds between checks of the workers' status while tasks are pending
_CHECK_SECONDS = 5.0
#: seconds a gather of finished results may take before their workers are checked
_GATHER_SECONDS = 30.0
#: a worker paused this long is reported (once per wait)
_WARN_SECONDS = 15.0
#: every worker paused this long, with no awaited task finishing: give up
_FAIL_SECONDS = 60.0


class WorkersPaused(RuntimeError):
    """Every worker has been paused by Dask's memory guard with the fit's tasks
    waiting on them."""


def wait_on(client: Client, futures: Iterable[Any], **kwargs: Any) -> Any:
    """``distributed.wait`` on ``client``: it runs on the *default* client,
    which the fit's client need not be, and a thread of the fit (the sample
    read beside a pass over y) sees no ``as_current`` of the caller: "No
    clients found" for a client made with ``set_as_default=False``."""
    with client.as_current():
        return wait(futures, **kwargs)


def wait_running(client: Client, futures: Iterable[Any], label: str = "the fit",
                 on_done: Callable[[int], Any] | None = None) -> None:
    """Wait until every future in ``futures`` is done (finished, erred or
    cancelled: the caller's gather/result raises the error), checking that the
    cluster can still run them (module docstring).  Non-futures are ignored.
    ``on_done(k)`` is told of every ``k`` futures finished (a progress line);
    with it the wait ends at the first error."""
    pending = [f for f in futures if isinstance(f, Future)]
    if not pending:
        return
    watch = PauseWatch(client, label)
    when = "ALL_COMPLETED" if on_done is None else "FIRST_COMPLETED"
    while True:
        try:
            wait_on(client, pending, timeout=_CHECK_SECONDS, return_when=when)
            timed_out = False
        except TimeoutError:
            timed_out = True
        left = [f for f in pending if not f.done()]
        if on_done is not None:  # (those that finished as the wait timed out count too)
            on_done(len(pending) - len(left))
            if any(f.status == "error" for f in pending):
                return
        if not left or (not timed_out and on_done is None):
            return
        if timed_out:
            watch.check(len(left), [f.key for f in left])
        pending = left


def gather(client: Client, futures: list, label: str = "the fit") -> list:
    """``client.gather(futures)`` after :func:`wait_running`, waiting again when
    their results are lost with their workers: distributed then recomputes
    them, and a plain gather waited for ever when no worker was left (all of a
    fit's workers killed at once: "Couldn't gather 2 keys, rescheduling", then
    nothing).  Each wait checks the cluster, so an empty one stops the fit.

    On an error the futures are cancelled before it is raised: the client
    keeps a task's error, whose traceback holds the frames that hold the
    futures, so a failed fit's futures -- and the worker memory of their
    finished siblings -- stayed for the session (27 MB of X each time a kernel
    EigenPro fit met a NaN chunk)."""
    try:
        while True:
            if not any(f.status in ("error", "cancelled") for f in futures):
                # (a wait that ended at an error, wait_running's on_done, raises it now)
                wait_running(client, futures, label)
            if any(f.status in ("error", "cancelled") for f in futures):
                return client.gather(futures)  # raises the task's own error
            try:
                return client.sync(client._gather, futures, callback_timeout=_GATHER_SECONDS)
            except TimeoutError:
                if any(f.status in ("error", "cancelled") for f in futures):
                    return client.gather(futures)  # a task's own error (its TimeoutError too)
                if all(f.status == "finished" for f in futures):  # slow transfer, not a loss
                    return client.gather(futures)
    except BaseException:
        release(client, futures)
        raise


def compute(*collections: Any, label: str = "scoring") -> tuple:
    """``dask.compute(*collections)``, waiting as :func:`gather` does when the
    current scheduler is a distributed client: a score whose workers were all
    lost waited for ever, where a fit stops after ``$DKERNEL_WORKER_TIMEOUT``."""
    client = current_client(collections)
    if client is None:
        return dask.compute(*collections)
    return tuple(gather(client, client.compute(list(collections)), label))


def current_client(collections: tuple = ()) -> Client | None:
    """The distributed client dask's current scheduler is, or None (a local scheduler)."""
    client = getattr(get_scheduler(collections=list(collections)), "__self__", None)
    return client if isinstance(client, Client) else None


def release(client: Client, futures: Iterable[Any]) -> None:
    """Cancel ``futures`` (the non-futures among them are ignored), quietly: on
    the way out of a failed fit (:func:`gather`)."""
    try:
        client.cancel([f for f in futures if isinstance(f, Future)])
    except Exception:  # (a client already closed: nothing is held then)
        pass


def result(client: Client, future: Future, label: str = "the fit") -> Any:
    """``future.result()``, as :func:`gather` waits for it."""
    return gather(client, [future], label)[0]


def scatter(client: Client, data: Any, label: str = "the fit", **kwargs: Any) -> Any:
    """``client.scatter``, saying why when it fails because every worker is paused
    (the scheduler sends data only to running workers, and after its connect
    timeout raises "No valid workers found"), and waiting for a worker when the
    cluster has none."""
    for attempt in range(_SCATTER_TRIES):
        try:
            return client.scatter(data, **kwargs)
        except (TimeoutError, OSError) as err:
            workers = workers_or_none(client)
            if workers is None:  # (the scheduler busy or gone: not a cluster without workers)
                raise
            if workers:
                paused = {a: w for a, w in workers.items() if w.get("status") == "paused"}
                if not paused:
                    raise
                first = min(paused)
                raise WorkersPaused(
                    f"{_where(label)} stopped: no running worker could take its data "
                    f"({len(paused)} of {len(workers)} paused by Dask's memory guard; {first}: "
                    f"{_held(paused[first])}). {_ADVICE}") from err
            if attempt + 1 == _SCATTER_TRIES:
                raise RuntimeError(
                    f"{_where(label)} stopped: the cluster's workers left while its data was "
                    f"sent to them ({type(err).__name__}: {err}); an adaptive cluster must keep "
                    "a worker while a fit holds data on it: cluster.adapt(minimum=1, ...)"
                ) from err
            # no worker: an adaptive cluster scaled to zero, which a scatter (no task)
            # does not scale up ("No valid workers found" every time); a pending task does
            require_workers(client)
    raise AssertionError("unreachable")  # (the last try returns or raises)


#: Tries of a scatter that found no worker, each after waiting for one.
_SCATTER_TRIES = 3


# Payloads up to this size travel inside the tasks: measured on Fashion-MNIST
# DSG steps (330 kB of coefficients, 4 tasks), embedding took 34 ms a step
# against 71 ms for a broadcast scatter's extra round trips.
_SCATTER_BYTES = 8 << 20


def ship(client: Client, payload: Any) -> Any:
    """Broadcast a large payload to every worker once instead of embedding it in
    each task (wrapped in a list: scatter would split a dict into keys)."""
    if _nbytes(payload) <= _SCATTER_BYTES:
        return payload
    return scatter(client, [payload], broadcast=True, hash=False)[0]


def _nbytes(obj: Any) -> int:
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


class PauseWatch:
    """Which workers are paused, since when; warns and raises (module docstring).
    ``check(pending)`` is called between timed-out waits with the number of
    awaited tasks still pending (fewer than last time: progress)."""

    def __init__(self, client: Client, label: str) -> None:
        self.client, self.label = client, label
        self.paused_since: dict[str, float] = {}
        self.warned: set[str] = set()
        self.pending: int | None = None
        self.progress_at = time.monotonic()
        self.lost = NoWorkersWatch(_where(label), _log)
        #: checks since the last progress, and in how many each worker was paused
        self.checks = 0
        self.paused_checks: dict[str, int] = {}

    def check(self, pending: int, keys: list | None = None) -> None:
        """``keys``: those of the awaited tasks still pending, where known (the
        rule for a cluster only partly paused, :meth:`_check_partly`)."""
        now = time.monotonic()
        if self.pending is None or pending < self.pending:
            self.pending, self.progress_at = pending, now
            self.checks, self.paused_checks = 0, {}
        workers = workers_or_none(self.client)
        if workers is None:
            return
        self.lost.check(workers, pending)
        paused = {a: w for a, w in workers.items() if w.get("status") == "paused"}
        self.checks += 1
        for a in paused:
            self.paused_checks[a] = self.paused_checks.get(a, 0) + 1
        self.paused_since = {a: self.paused_since.get(a, now) for a in paused}
        for a, w in paused.items():
            if a not in self.warned and now - self.paused_since[a] >= _WARN_SECONDS:
                self.warned.add(a)
                warnings.warn(f"{_where(self.label)}: worker {a} has been paused for "
                              f"{now - self.paused_since[a]:.0f} s at {_held(w)}; its tasks wait "
                              f"until its memory falls. {_ADVICE}", RuntimeWarning,
                              stacklevel=user_stacklevel())
        if keys:
            self._check_partly(workers, keys, pending, now)
        if not paused or len(paused) < len(workers):
            return
        since = max(self.progress_at, max(self.paused_since.values()))
        if now - since >= _FAIL_SECONDS:
            first = min(paused)
            raise WorkersPaused(
                f"{_where(self.label)} stopped: every worker has been paused by Dask's memory "
                f"guard for {now - since:.0f} s and none of its {pending} waiting tasks ran "
                f"({first}: {_held(paused[first])}). {_ADVICE}")

    def _check_partly(self, workers: dict, keys: list, pending: int, now: float) -> None:
        """Stop when no awaited task has finished for twice ``_FAIL_SECONDS``, a
        worker was paused in most checks since, every other worker is idle and
        the paused ones run nothing (the tasks wait on them, or on their data): one of two workers
        stayed paused (its interpreter alone near the limit) with the step's
        tasks queued on it, the other idle, and the fit waited for ever.
        (Twice: a task already running on a paused worker does finish.)  A
        worker's pause flickers, hence most checks."""
        if now - self.progress_at < 2 * _FAIL_SECONDS or not self.paused_checks:
            return
        try:
            processing = self.client.processing()
        except Exception:  # the scheduler busy or gone: the next check asks again
            return
        mostly = {w for w, n in self.paused_checks.items() if 2 * n >= self.checks}
        if not mostly or any(held for w, held in processing.items() if w not in mostly):
            return  # another worker is busy: the awaited tasks may wait on its work
        holders = [w for w in mostly if processing.get(w)]
        try:  # a paused worker still runs what it started: a long task finishes
            running = self.client.run(_executing, workers=holders) if holders else {}
        except Exception:
            return
        if any(running.values()):
            return
        first = min(mostly)
        raise WorkersPaused(
            f"{_where(self.label)} stopped: none of its {pending} waiting tasks ran for "
            f"{now - self.progress_at:.0f} s while {len(mostly)} of {len(workers)} workers were "
            f"paused by Dask's memory guard ({first}: {_held(workers.get(first, {}))}). "
            f"{_ADVICE}")


def _executing(dask_worker: Any) -> int:
    """Tasks a worker is running now (``client.run``)."""
    return int(dask_worker.state.executing_count)


_ADVICE = ("Dask pauses a worker above 80% of its memory limit "
           "(distributed.worker.memory.pause): give the workers a larger memory limit "
           "(dask worker --memory-limit, local_cluster(memory_limit=...)) or store the data "
           "in smaller chunks.")


def _where(label: str) -> str:
    """What a user reads first: the fit, then where in it (labels are the
    engine's pass names, such as "a step" or "dsg preconditioner"), or what
    ran outside a fit ("scoring", "predicting")."""
    return label if label in ("the fit", "scoring", "predicting") else f"the fit ({label})"


def _held(worker: dict) -> str:
    """'332 MiB of its 400 MiB memory limit' from the scheduler's worker info."""
    memory = (worker.get("metrics") or {}).get("memory")
    limit = worker.get("memory_limit")
    if not memory or not limit:
        return "its memory limit"
    return f"{memory / 2**20:.0f} MiB of its {limit / 2**20:.0f} MiB memory limit"
