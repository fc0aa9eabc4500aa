"""What a step runs on the workers and how its partial results are summed.

A partial result is a dict of arrays and numbers; sums go in a fixed order
(:func:`tree_sum`, :class:`_CounterTree`) that depends only on the number of
parts, so the model is the same floating-point number on any cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from distributed import Client, Future, get_worker

from dkernel.backend import align_arrays, aligned, aligned_tree
from dkernel.data.plan import RowSlice
from dkernel.engine.program import Chunk
from dkernel.engine.stall import gather, result


def _run_partial(fn: Callable, payload: Any, chunk: tuple[Any, Any],
                 rows: np.ndarray | RowSlice | None, key: Any = None,
                 constants: dict | None = None, run: Any = None) -> dict:
    if isinstance(rows, RowSlice):  # the plan's slice, expanded here (data/plan.py)
        rows = rows.rows()
    # (in-memory chunks are realigned once when scattered, so this copies nothing there)
    X, y = aligned(chunk[0]), aligned(chunk[1])
    if isinstance(payload, dict):
        align_arrays(payload)
    if constants is not None:  # step-independent arrays shipped once (StepProgram.constants)
        payload = {**payload, **align_arrays(constants)}
    if key is not None:
        return fn(payload, Chunk(X, y, rows, key, run))
    if rows is not None:
        X = X[rows]
        y = None if y is None else y[rows]
    return fn(payload, X, y)


def _run_fold(fold: Callable, state: Any, prepared: Any, payload: Any) -> Any:
    """One fold of ``Engine.scan`` on aligned inputs.

    The scheduler mostly places a fold beside its prepared chunk, the state
    then coming from the previous fold's worker, but not always (2% of
    StreamingKernelPCA's folds on two workers ran on the other one).  What
    travelled arrives at any byte offset (seen: the state 14 bytes and Oja's
    rows 15 bytes off a 16-byte boundary), and a product on it rounds
    differently (``backend._ALIGNMENT``): two 2-worker fits came out 3e-8 apart,
    or with a component's sign flipped.  Aligned here, a fold computes the same
    bits wherever it runs, so a scan gives the same model on any cluster, as
    the sums do."""
    if isinstance(payload, dict):
        align_arrays(payload)
    return fold(aligned_tree(state), aligned_tree(prepared), payload)


def _run_step_partial(*args: Any, **kwargs: Any) -> dict:
    """A step's partial result plus the seconds it computed (``_seconds``, summed
    over the lanes like every entry) and (seconds, worker) of the slowest lane
    (``_slowest``, kept by max), so an epoch can say where its time went."""
    t0 = time.perf_counter()
    out = _run_partial(*args, **kwargs)
    seconds = time.perf_counter() - t0
    try:
        where = get_worker().address
    except ValueError:  # not on a worker
        where = ""
    return {**out, "_seconds": seconds, "_slowest": (seconds, where)}


def _add(a: dict, b: dict) -> dict:
    return {k: max(a[k], b[k]) if k == "_slowest" else a[k] + b[k] for k in a}


#: Partials one ``_add_all`` task sums, and the most the client gathers to sum
#: itself.  A tree over W lanes then takes about W / 7 tasks in log_8(W) levels;
#: a pairwise tree took W - 1 tasks in log_2(W) levels, and each task costs the
#: scheduler ~1.5 ms (docs/scaling.md): at 1000 lanes 1.5 s a step against 0.2 s.
_FAN_IN = 8


def _add_all(*parts: dict) -> dict:
    out = parts[0]
    for v in parts[1:]:
        out = _add(out, v)
    return out


def tree_sum(client: Client, parts: list[Future]) -> dict:
    """Sum dict-valued futures in groups of ``_FAN_IN`` on the workers until
    the client can gather what is left.  The grouping depends only on
    ``len(parts)`` (the recorded lanes), so the result is the same
    floating-point number on any cluster."""
    while len(parts) > _FAN_IN:
        parts = [client.submit(_add_all, *parts[i:i + _FAN_IN], pure=False)
                 if len(parts[i:i + _FAN_IN]) > 1 else parts[i]
                 for i in range(0, len(parts), _FAN_IN)]
    return _add_all(*gather(client, parts, "a step"))


class _CounterTree:
    """Running sum of futures pushed in a fixed order, added on the workers.

    Like a binary counter: the i-th push carries into ``log2`` levels, so at
    most ``log2(pushes) + 1`` partial sums are alive, and the pairing (hence
    the floating-point result) depends only on the number of pushes.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.levels: list[tuple[int, Future]] = []

    def __len__(self) -> int:
        return len(self.levels)

    def push(self, f: Future) -> None:
        level = 0
        while self.levels and self.levels[-1][0] == level:
            _, g = self.levels.pop()
            f = self.client.submit(_add, g, f, pure=False)
            level += 1
        self.levels.append((level, f))

    def result(self, label: str = "a pass") -> dict:
        if not self.levels:
            raise ValueError("nothing to sum: the dataset has no chunks")
        f = self.levels[-1][1]
        for _, g in reversed(self.levels[:-1]):
            f = self.client.submit(_add, g, f, pure=False)
        return result(self.client, f, label)
