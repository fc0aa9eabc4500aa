"""``Engine.scan``: one pass threading a small state through the chunks in order.

A state-independent ``prepare`` per chunk runs ahead on the workers, in
parallel, while the cheap ``fold`` is chained chunk after chunk (the blocked
exact updates of Oja's rule and of spherical SGD).  A chunk larger than the
caller's ``max_rows`` is prepared and folded in pieces: a prepared result can
be many times its chunk (Oja's features and Gram blocks: 12 kB a row at 2048
features, 800 MB for a 65 536-row chunk of 32 inputs, and four chunks ahead
killed 600 MB workers).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from distributed import Future

from dkernel.data.dataset import Dataset
from dkernel.data.plan import ChunkPlan
from dkernel.engine.checkpoint import Checkpointer
from dkernel.engine.chunks import _ChunkSource
from dkernel.engine.progress import Progress
from dkernel.engine.reduce import _run_fold, _run_partial
from dkernel.engine.stall import result, ship, wait_running

#: Bytes of a prepared piece that :func:`piece_rows` aims at: with the scan's
#: window of pieces ahead (2 per worker thread) a few hundred MB a worker.
PIECE_BYTES = 64 << 20


def piece_rows(bytes_per_row: float, block: int) -> int:
    """Rows of a piece whose prepared result is about :data:`PIECE_BYTES`, a
    multiple of the fold's ``block``, so its blocks stay where they were in the
    chunk (the same model: bit for bit for SphereRegressor and uncentred Oja;
    centred Oja splits its running mean between prepare and fold otherwise,
    2.5e-8 apart)."""
    return max(block, int(PIECE_BYTES // max(1.0, bytes_per_row)) // block * block)


def pieces(n: int, max_rows: int | None) -> list[tuple[int, int]]:
    """A chunk of ``n`` rows as (start, stop) pieces of at most ``max_rows``."""
    step = n if not max_rows else max(1, int(max_rows))
    return [(lo, min(n, lo + step)) for lo in range(0, max(n, 1), step)]


def scan(engine: Any, data: Dataset, prepare: Callable, fold: Callable, state: Any,
         payload: Any = None, *, n_epochs: int = 1, shuffle: bool = False,
         random_state: int = 0, fingerprint: dict | None = None, label: str = "scan",
         window: int | None = None, pass_start: bool = False,
         max_rows: int | None = None) -> Any:
    """Thread ``state`` through every chunk of ``data`` on ``engine``:
    ``state = fold(state, prepare(payload, X, y), payload)``.

    ``prepare`` must not depend on the state, so it runs ahead for up to
    ``window`` pieces in parallel while the folds run in row order (the state
    moves between workers; it should be O(model)).  A fold runs on aligned
    copies of whatever arrived misaligned (``_run_fold``), so the result does
    not depend on where each fold ran.  With ``shuffle`` the chunk order is
    permuted per epoch.  The state is checkpointed every ``checkpoint_every``
    chunks (at the chunk's last piece) and a resumed scan skips the pieces
    already folded.  With
    ``pass_start`` prepare is called as ``prepare(payload, X, y, start=r)``, r
    the number of rows the scan folds before this piece (over all epochs), for
    per-row schedules such as step sizes eta_n or truncation levels L_n.
    ``max_rows``: chunks are cut into pieces of at most that many rows
    (:func:`piece_rows`); a piece is a chunk where none is larger.

    Memory does not depend on the number of chunks: at most ``window`` pieces
    and their prepared results are alive at once (``engine.peak_live`` records
    the most seen), plus the state, which moves between workers.
    """
    opts = engine.options
    plan = ChunkPlan(data.row_chunks, 1, 1, int(random_state), shuffle=shuffle)
    cut = bool(max_rows) and max(plan.row_chunks) > int(max_rows)
    ckpt = Checkpointer(opts.checkpoint, opts.checkpoint_every,
                        {**(fingerprint or {}), **engine._data_identity(data),
                         "n_rows": data.n_rows, "n_inputs": data.n_inputs,
                         "row_chunks": list(plan.row_chunks), "n_epochs": n_epochs,
                         "shuffle": shuffle, "random_state": int(random_state), "scan": label,
                         # (only where it cuts: uncut scans resume checkpoints of before)
                         **({"piece_rows": int(max_rows)} if cut else {})})
    start = 0
    if not opts.resume:
        ckpt.starting_over()
    if opts.resume:
        loaded = ckpt.resume()
        if loaded is not None:
            arrays, start = loaded
            state = arrays["state"] if set(arrays) == {"state"} else arrays
    full_order = [(int(c), lo, hi) for e in range(n_epochs) for c in plan.chunk_order(e)
                  for lo, hi in pieces(plan.row_chunks[c], max_rows if cut else None)]
    rows_before = np.concatenate([[0], np.cumsum([hi - lo for _, lo, hi in full_order])])
    chunks_before = np.concatenate([[0], np.cumsum([hi == plan.row_chunks[c]
                                                    for c, _, hi in full_order])])
    order = full_order[start:]
    source = _ChunkSource(engine.client, data, opts.dtype, engine._scattered)
    payload = ship(engine.client, payload)
    window = window or max(2, 2 * engine.n_threads())
    progress = Progress(start + len(order), label, opts.progress, start=start)
    current: Any = state
    pending: list[Future] = []
    engine.peak_live = 0
    held = None  # (the chunk's read, kept while its pieces are submitted: one read a chunk)
    for k, (c, lo, hi) in enumerate(order):
        if held is None or held[0] != c:
            held = (c, source.get((c,))[c])
        chunk = held[1]
        fn = partial(prepare, start=int(rows_before[start + k])) if pass_start else prepare
        prepared = engine.client.submit(_run_partial, fn, payload, chunk,
                                        slice(lo, hi) if cut else None, pure=False)
        current = engine.client.submit(_run_fold, fold, current, prepared, payload, pure=False)
        pending.append(current)
        engine.peak_live = max(engine.peak_live, len(pending))
        if len(pending) >= window:  # bound the pieces alive at once
            wait_running(engine.client, [pending.pop(0)], label)
        done = start + k + 1
        # every checkpoint_every chunks, as before pieces (at a chunk's last piece)
        if hi == plan.row_chunks[c] and ckpt.due(chunks_before[start + k] + 1):
            value = result(engine.client, current, label)
            ckpt.save(value if isinstance(value, dict) else {"state": value}, done)
        progress.update(1)
    final = result(engine.client, current, label) if isinstance(current, Future) else current
    progress.close()
    return final
