"""The coordinator loop (docs/design.md §1), written once for every solver.

``run_steps``   synchronous data-parallel mini-batch steps: each step's rows
                are spread over ``lanes`` chunks; workers compute partial
                results on rows they hold; the coordinator sums them in a
                fixed order and applies the solver's update.
``map_reduce``  one pass over every chunk summing a state-free partial result
                (moments, Gram matrices, randomized-SVD products).
``scan``        one pass threading a small state through the chunks in order:
                a state-independent ``prepare`` per chunk runs in parallel on
                the workers, the cheap ``fold`` is chained chunk after chunk
                (blocked exact updates of Oja's rule and spherical SGD).

Chunks are loaded once per group (a chunk is read once per epoch; once per
fit when the caller already holds them on their homes), the next
group is prefetched while the current one trains, and in-memory input is
scattered to the workers once per fit.  Checkpoints are atomic and a resumed
fit replays the same plan, so it ends with the same model.
"""

from __future__ import annotations

import re
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from distributed import Client, Future

from dkernel._stack import user_stacklevel
from dkernel.backend import on_one_blas_thread
from dkernel.data.dataset import Dataset
from dkernel.data.plan import ChunkPlan, chunk_bundles
from dkernel.engine.checkpoint import CACHE, DATA, Checkpointer, data_identity
from dkernel.engine.chunks import _BundleSource, _ChunkSource, _KeptSource
from dkernel.engine.guard import PROBE_ROWS, DivergenceGuard
from dkernel.engine.program import StepProgram
from dkernel.engine.progress import Progress, report_epoch, time_budget
from dkernel.engine.reduce import (
    _CounterTree,
    _run_partial,
    _run_step_partial,
    tree_sum,
)
from dkernel.engine.scan import scan
from dkernel.engine.stall import ship, wait_running


@dataclass
class EngineOptions:
    """Every tuning knob of the coordinator loop, with its default.

    lanes : int or "auto"
        Chunks that share one mini-batch (the parallel width of a step).  The
        model depends on it, not on the worker count; more lanes let more
        workers share a step.  "auto" is one lane per worker thread of the
        cluster at the start of the run (:meth:`Engine.resolve_lanes`).
    checkpoint : str, optional
        Checkpoint file (``.npz``); None disables checkpointing.
    checkpoint_every : int
        Steps between checkpoints (0: never).
    resume : bool
        Continue from ``checkpoint`` if it exists.
    progress : bool
        Print a progress line on stderr.
    dtype : str
        Dtype X chunks are converted to on the workers.
    """

    lanes: int | str = "auto"
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    progress: bool = False
    dtype: str = "float32"


#: Checkpoint keys of the epoch history and of the ``on_epoch`` callback's own state
#: (its ``checkpoint_state()``, e.g. early stopping's best epoch and model).
_HISTORY_KEY = "engine_history"
#: Mid-epoch checkpoints: the epoch's running totals so far (its history
#: entry, once resumed, counts the steps before the checkpoint too).
_EPOCH_KEY = "engine_epoch"
_CALLBACK = "on_epoch."


def _callback_state(on_epoch: Any) -> dict[str, Any]:
    saver = getattr(on_epoch, "checkpoint_state", None)
    return {} if saver is None else {_CALLBACK + k: v for k, v in saver().items()}


def _json_safe(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History entries with NumPy scalars as Python ones (checkpoint metadata is JSON)."""
    return [{k: v.item() if isinstance(v, np.generic) else v for k, v in e.items()}
            for e in entries]


class Engine:
    """Runs solver programs on a Dask cluster.  See module docstring."""

    def __init__(self, client: Client, options: EngineOptions | None = None) -> None:
        self.client = client
        self.options = options or EngineOptions()
        self._last_run: str | None = None
        self.runs: list[str] = []  # owners of blocks cached on the workers (new_run)
        #: in-memory chunks scattered by this engine's passes (:class:`_ChunkSource`)
        self._scattered: dict = {}
        #: Most chunk/partial futures alive at once in the last map_reduce or scan.
        self.peak_live = 0
        #: Step halvings of the last ``run_steps`` (:mod:`dkernel.engine.guard`).
        self.backoffs: list[dict[str, Any]] = []
        #: One dict per epoch of the last ``run_steps``: ``epoch`` (1-based),
        #: ``loss`` (mean mini-batch loss over the epoch's rows, where the
        #: program reports one), ``steps``, ``rows``, ``seconds`` and where the
        #: time went: ``compute_seconds`` (the step partials' own time, summed
        #: over lanes), ``busy`` (that / (lanes x seconds)), ``update_seconds``
        #: (the client's updates) and ``wait_seconds`` (the client waiting for
        #: results).  Each epoch is also logged on ``dkernel.engine`` at INFO.
        self.history: list[dict[str, Any]] = []

    def plan(self, data: Dataset, batch_size: int, random_state: int) -> ChunkPlan:
        lanes = self.resolve_lanes(data)
        return ChunkPlan(data.row_chunks, int(batch_size), lanes, int(random_state))

    @on_one_blas_thread
    def run_steps(self, data: Dataset, program: StepProgram, *, n_epochs: int,
                  batch_size: int, random_state: int,
                  on_epoch: Callable[[dict, int], None] | None = None,
                  resident: dict[int, Future] | None = None,
                  keep_chunks: bool = False) -> dict[str, Any]:
        """Run ``n_epochs`` of mini-batch steps and return the final state.

        ``resident``: futures of every chunk's (X, y) already on their homes
        (:meth:`resident_chunks`), used instead of reading each chunk again every
        epoch -- for data the caller holds in worker memory anyway (EigenPro's
        cached kernel rows are 76x larger than the Fashion-MNIST rows they come
        from).  Futures of store reads are recomputed by Dask if their worker
        is lost, so a lost worker costs a re-read, as without them.
        ``keep_chunks``: keep each chunk read in the first epoch on its home
        for the later ones (the caller checked that they fit)."""
        opts = self.options
        plan = self.plan(data, batch_size, random_state)
        source = _ChunkSource(self.client, data, opts.dtype, self._scattered)
        bundles = (chunk_bundles(plan.row_chunks, plan.lanes, plan.batch_size)
                   if program.bundles_chunks and resident is None else None)
        if bundles is not None:  # small chunks (a store's, or in-memory X's): a lane reads several
            offsets = data.row_offsets()
            plan = ChunkPlan(tuple(int(sum(offsets[c + 1] - offsets[c] for c in b))
                                   for b in bundles), plan.batch_size, plan.lanes,
                             plan.random_state)
            source = _BundleSource(source, bundles)
        fingerprint = {**program.fingerprint(), **self._data_identity(data),
                       "n_rows": data.n_rows, "n_inputs": data.n_inputs,
                       "row_chunks": list(plan.row_chunks), "batch_size": plan.batch_size,
                       "lanes": plan.lanes, "random_state": plan.random_state, "n_epochs": n_epochs,
                       "plan_version": ChunkPlan.VERSION,
                       # (a resume whose "auto" cache resolved otherwise ended 6.3e-5 away)
                       **({CACHE: cache} if (cache := _cache_mode(program)) else {})}
        ckpt = Checkpointer(opts.checkpoint, opts.checkpoint_every, fingerprint)
        state, start = program.init_state(), 0
        resumed_epoch: dict | None = None
        guard = DivergenceGuard(program, batch_size=plan.batch_size)
        history: list[dict[str, Any]] = []
        if not opts.resume:
            ckpt.starting_over()
        if opts.resume:
            loaded = ckpt.resume()
            if loaded is not None:
                saved = dict(loaded[0])
                history = list(saved.pop(_HISTORY_KEY, []))
                resumed_epoch = saved.pop(_EPOCH_KEY, None)
                callback = {k: saved.pop(k) for k in list(saved) if k.startswith(_CALLBACK)}
                state, start = guard.resume(saved), loaded[1]
                if callback and hasattr(on_epoch, "resume"):
                    on_epoch.resume({k[len(_CALLBACK):]: v for k, v in callback.items()})
        self.backoffs = guard.backoffs
        state = guard.start(state)
        per_epoch = [plan.steps_per_epoch(e) for e in range(n_epochs)]
        total = sum(per_epoch)
        if ckpt.path is not None and ckpt.every >= total > start:  # (silent before)
            every = per_epoch[0] if per_epoch[0] < total else max(1, total // 2)
            warnings.warn(f"checkpoint_every={ckpt.every} steps, but this fit takes {total} "
                          f"({per_epoch[0]} an epoch): no checkpoint is written before it ends; "
                          f"checkpoint_every={every} writes one every {every} steps",
                          UserWarning, stacklevel=user_stacklevel())
        progress = Progress(sum(per_epoch), program.label, opts.progress, start=start)
        if resident is not None and data.host is None:
            source.adopted = dict(resident)
        elif keep_chunks and data.host is None and n_epochs > 1:
            source = _KeptSource(source)
        constants = program.constants()
        extra = () if constants is None else (ship(self.client, constants),)
        run = self._last_run = self.new_run()  # owner of the blocks it caches on the workers
        if guard.pool_rows and "guard_reference" not in state:  # (guard.PROBE_ROWS)
            guard.set_reference(state, self._probe_loss(program, state, plan, source, data, 0,
                                                        0, extra, run, rows=PROBE_ROWS))
        self.history = history  # a resumed fit's epochs before the checkpoint, as they were

        def checkpoint(step: int, seen: dict | None = None) -> None:
            within = {} if seen is None else {_EPOCH_KEY: _json_safe(
                [{**{k: v for k, v in seen.items() if k != "t0"},
                  "elapsed": time.perf_counter() - seen["t0"]}])[0]}
            ckpt.save({**guard.checkpoint_state(state), **_callback_state(on_epoch),
                       _HISTORY_KEY: _json_safe(self.history), **within}, step)
        step = 0
        for epoch in range(n_epochs):
            if step + per_epoch[epoch] <= start:
                step += per_epoch[epoch]
                continue
            first = step
            if guard.epoch is None:  # (a checkpoint inside this epoch brought it back)
                guard.begin_epoch(state, epoch)
            backoffs_before = len(guard.backoffs)
            seen = {"loss": 0.0, "loss_rows": 0, "rows": 0, "steps": 0, "t0": time.perf_counter(),
                    "compute": 0.0, "wait": 0.0, "update": 0.0, "straggle": 0.0,
                    "slowest": {}}
            if resumed_epoch is not None and first < start:  # resumed inside this epoch
                seen.update({k: v for k, v in resumed_epoch.items() if k != "elapsed"},
                            t0=seen["t0"] - float(resumed_epoch.get("elapsed", 0.0)))
                resumed_epoch = None
            while True:  # an epoch replayed with a smaller step (guard.end_epoch)
                groups = [g for g in plan.groups(epoch)]
                todo, skipped = [], step
                for g in groups:  # groups fully before the resume point are not loaded
                    if skipped + plan.group_steps(g) <= start:
                        skipped += plan.group_steps(g)
                    else:
                        todo.append(g)
                step = skipped
                loaded = source.get(todo[0]) if todo else {}
                for gi, group in enumerate(todo):
                    current = loaded or source.get(group)
                    loaded, prefetch = {}, todo[gi + 1] if gi + 1 < len(todo) else None
                    n_slices = {c: plan.n_slices(c) for c in group}
                    for j in range(plan.group_steps(group)):
                        if step < start:
                            step += 1
                            continue
                        payload = ship(self.client, program.payload(state, step))
                        for attempt in range(_STEP_RETRIES + 1):
                            # named keys: the dashboard shows "<solver>-step" tasks,
                            # not _run_partial
                            tag = f"{_key_label(program.label)}-step-{run[:8]}-{step}"
                            futs = [self.client.submit(_run_step_partial, type(program).partial,
                                                       payload, current[c],
                                                       plan.row_slice(epoch, c, j),
                                                       source.key(data.X.name, c)
                                                       if program.wants_chunk
                                                       else None,
                                                       *extra, run=run, **source.placement(c),
                                                       key=f"{tag}-{c}-{attempt}",
                                                       # before the prefetch of the next
                                                       # chunks, which then runs while the
                                                       # client sums and updates
                                                       priority=1)
                                    for c in group if j < n_slices[c]]
                            if prefetch is not None:
                                # the next group's reads go out after this step's tasks, so
                                # a worker starts the step first and reads while the client
                                # sums and updates (a read sent first would make the step
                                # wait for it: 25-40 ms a step on 2M x 32)
                                loaded, prefetch = source.get(prefetch), None
                            try:
                                t_wait = time.perf_counter()
                                total = tree_sum(self.client, futs)
                                seen["wait"] += time.perf_counter() - t_wait
                                break
                            except CancelledError:
                                # A worker died holding data this step needs (Dask cannot
                                # recompute scattered data): send it again and redo the step,
                                # a pure function of the state, so the model does not change.
                                if attempt == _STEP_RETRIES:
                                    raise
                                source.refresh()
                                current, loaded = source.get(group), {}
                                payload = ship(self.client, program.payload(state, step))
                                extra = (() if constants is None
                                         else (ship(self.client, constants),))
                        lane_seconds = float(total.pop("_seconds", 0.0))
                        seen["compute"] += lane_seconds
                        slowest = total.pop("_slowest", None)
                        if slowest is not None and len(futs) > 1:
                            # the other lanes waited, on average, max - mean for this one
                            seen["straggle"] += slowest[0] - lane_seconds / len(futs)
                            seen["slowest"][slowest[1]] = seen["slowest"].get(slowest[1], 0) + 1
                        t_update = time.perf_counter()
                        restored = guard.before_update(state, total, step)
                        if restored is None:
                            state = guard.carry(state, program.update(state, total, step))
                        else:
                            state = restored
                        seen["update"] += time.perf_counter() - t_update
                        step += 1
                        seen["steps"] += 1
                        seen["rows"] += int(total.get("count", 0))
                        if "loss" in total:
                            seen["loss"] += float(np.sum(total["loss"]))
                            seen["loss_rows"] += int(total.get("count", 0))
                        if ckpt.due(step) and step < first + per_epoch[epoch]:
                            checkpoint(step, seen)
                        rate = seen["rows"] / max(time.perf_counter() - seen["t0"], 1e-9)
                        progress.update(1, epoch=epoch + 1, **{"rows/s": rate},
                                        **program.metrics(total))
                    del current
                probe = None
                if epoch == n_epochs - 1 and (guard.pool_rows or program.supports_backoff):
                    # the end state on the reference's rows: the two losses share
                    # those rows' noise (guard.finish)
                    probe = self._probe_loss(program, state, plan, source, data, 0, step, extra,
                                             run, rows=PROBE_ROWS if guard.pool_rows else 0)
                state, replay = guard.end_epoch(state, step, probe)
                if not replay:
                    break
                start = step = first
                progress.total += per_epoch[epoch]
                seen.update(loss=0.0, loss_rows=0, rows=0, steps=0)
            entry = {
                "epoch": epoch + 1, "steps": seen["steps"], "rows": seen["rows"],
                "loss": seen["loss"] / seen["loss_rows"] if seen["loss_rows"] else None,
                "seconds": time.perf_counter() - seen["t0"],
                # halvings in this epoch: steps undone, or the epoch replayed
                "step_backoffs": len(guard.backoffs) - backoffs_before}
            if getattr(program, "supports_backoff", False):
                entry["step_scale"] = float(state.get("step_scale", 1.0))
            entry.update(time_budget(seen, entry["seconds"], plan.lanes))
            self.history.append(entry)
            report_epoch(program.label, entry, plan.lanes, opts.progress, seen["slowest"],
                          program.slow_hint())
            if on_epoch is not None:
                on_epoch(state, epoch)
            if ckpt.due(step):
                # after the guard's judgement and the callback's (validation, the
                # best epoch so far): a resume repeats neither
                checkpoint(step)
            if program.should_stop(state, epoch):
                break
        progress.close()
        guard.finish(state)
        return state

    def _data_identity(self, data: Dataset) -> dict[str, str]:
        """The checkpoint's record of the data (reads three chunks), if checkpointing."""
        return {DATA: data_identity(self.client, data)} if self.options.checkpoint else {}

    def _probe_loss(self, program: StepProgram, state: dict[str, Any], plan: ChunkPlan,
                    source: Any, data: Dataset, epoch: int, step: int, extra: tuple,
                    run: str, rows: int = 0) -> tuple[float, int] | None:
        """(mean loss, rows) of ``state`` on the first batch of ``epoch``, with no
        update: after the last epoch the guard judges the fit's end state by it
        (guard.py), which no later step would measure.  ``rows``: at least that
        many rows of the epoch's first group (its first slices).  None where
        the program reports no loss or workers were lost at every retry (no
        judgement then)."""
        group = plan.groups(epoch)[0]
        slices = {c: plan.row_slice(epoch, c, 0) for c in group}
        if rows:
            for c, sl in slices.items():
                wide = min(sl.n, max(sl.per_lane, -(-rows // len(group))))
                slices[c] = replace(sl, per_lane=wide, n_slices=1 if wide >= sl.n else 2)
        for attempt in range(_STEP_RETRIES + 1):
            # a fresh key each call: a replayed last epoch probes again, and must
            # not find the first probe's futures whatever the scheduler still holds
            probe_id = uuid.uuid4().hex[:8]
            try:
                chunks = source.get(group)
                payload = ship(self.client, program.payload(state, step))
                futs = [self.client.submit(_run_step_partial, type(program).partial, payload,
                                           chunks[c], slices[c],
                                           source.key(data.X.name, c) if program.wants_chunk
                                           else None, *extra, run=run, **source.placement(c),
                                           key=f"{_key_label(program.label)}-probe-{probe_id}-{c}")
                        for c in group]
                total = tree_sum(self.client, futs)
                break
            except CancelledError:  # a lost worker held its chunks: as a step, again
                if attempt == _STEP_RETRIES:
                    return None
                source.refresh()
        if "loss" not in total or not total.get("count"):
            return None
        return float(np.sum(total["loss"])) / float(total["count"]), int(total["count"])

    def map_reduce(self, data: Dataset, fn: Callable, payload: Any = None, *,
                   label: str = "pass", window: int | None = None,
                   wants_chunk: bool = False) -> dict[str, Any]:
        """Sum ``fn(payload, X_chunk, y_chunk)`` over every chunk (one read each);
        with ``wants_chunk`` ``fn(payload, chunk)`` gets a :class:`Chunk` whose key
        finds the blocks a fit cached from the same chunk.

        Memory does not depend on the number of chunks: at most ``window``
        chunks (default two per worker thread) are read at once, and partial results
        are added on the workers as they arrive, pairwise in a binary-counter
        tree over the chunk index, so at most ``window + log2(n_chunks) + 1``
        partial results are alive (``self.peak_live`` records the most seen)
        and only the final sum reaches the client.  The pairing depends on the
        number of chunks alone, so the sum is the same floating-point number
        on any cluster.
        """
        source = _ChunkSource(self.client, data, self.options.dtype, self._scattered)
        payload = ship(self.client, payload)
        # a pass after a fit (its final moments) reads the fit's cached blocks as
        # their owner: it visits each once, and evicting unread ones to fill
        # blocks it will not read again would only turn later hits into misses
        run = self._last_run or self.new_run()
        n = data.n_chunks
        window = window or max(2, 2 * self.n_threads())
        progress = Progress(n, label, self.options.progress, unit="chunks")
        tree = _CounterTree(self.client)
        token = uuid.uuid4().hex[:12]
        inflight: list[Future] = []
        self.peak_live = 0
        for start in range(0, n, window):
            ids = tuple(range(start, min(n, start + window)))
            chunks = source.get(ids)
            batch = [self.client.submit(_run_partial, fn, payload, chunks[c], None,
                                        (data.X.name, c) if wants_chunk else None, run=run,
                                        # where the fit cached this chunk's blocks
                                        **(source.placement(c) if wants_chunk else {}),
                                        key=f"{_key_label(label)}-{token}-{c}")
                     for c in ids]
            del chunks
            # the previous window must finish before more chunks are read; its
            # partials join the tree (summed on the workers, never gathered here)
            wait_running(self.client, inflight, label)
            for f in inflight:
                tree.push(f)
                progress.update(1)
            inflight = batch
            self.peak_live = max(self.peak_live, len(inflight) + len(tree))
        wait_running(self.client, inflight, label)
        for f in inflight:
            tree.push(f)
            progress.update(1)
        progress.close()
        return tree.result(label)

    def resident_chunks(self, data: Dataset) -> tuple[dict[int, Future], list[str | None]]:
        """Futures of every chunk's (X, y), each read on its home -- the worker
        its steps run on -- and the homes: for a pre-pass that leaves per-chunk
        blocks in the worker cache (all chunks at once: for data that fits)."""
        source = _ChunkSource(self.client, data, self.options.dtype, self._scattered)
        futs = source.get(tuple(range(data.n_chunks)))
        return futs, [(source.home(c) or [None])[0] for c in range(data.n_chunks)]

    def new_run(self, prefix: str = "") -> str:
        """A fresh owner of blocks cached on the workers, retired by :meth:`retire`."""
        self.runs.append(f"{prefix}{uuid.uuid4().hex}")
        return self.runs[-1]

    def retire(self) -> None:
        """The fit is over (or failed): its runs' cached blocks may be evicted at
        once by another fit (:func:`dkernel.engine.cache.retire`).  Quiet."""
        from dkernel.engine import cache

        runs, self.runs = self.runs, []
        if not runs or self.client.status != "running":  # (a scheduler gone: nothing to tell)
            return
        try:  # bounded: an unanswered run waited 60 s before the fit's own error showed
            self.client.sync(self.client._run, cache.retire, runs, on_error="ignore",
                             callback_timeout=20)
        except Exception:
            pass

    def n_workers(self) -> int:
        """Workers the scheduler knows now (at least 1)."""
        return max(1, len(self.client.nthreads()))

    def n_threads(self) -> int:
        """Worker threads the scheduler knows now (at least 1): the tasks the
        cluster runs at once."""
        return max(1, sum(self.client.nthreads().values()))

    def resolve_lanes(self, data: Dataset) -> int:
        """``lanes="auto"``: one lane per worker thread, so a step's work grows
        with the cluster and fills every thread (Dask runs one task per thread,
        and its workers' BLAS is single-threaded); at most the number of
        chunks.  The resolved number is what the model depends on (record it
        to reproduce the fit elsewhere)."""
        lanes = self.options.lanes
        lanes = self.n_threads() if lanes == "auto" else int(lanes)
        return max(1, min(lanes, data.n_chunks))

    def pin_lanes(self, data: Dataset, lanes: int | str | None = None,
                  quiet: bool = False) -> int:
        """Resolve ``lanes`` (default: the options') for ``data`` and keep the
        number in the options, so every later pass of this engine runs at the
        width the model records as ``lanes_``.  A number above the chunks is
        cut to them with a warning (``quiet``: not the user's number)."""
        if lanes is not None:
            self.options.lanes = lanes
        asked = self.options.lanes
        self.options.lanes = self.resolve_lanes(data)
        if not quiet and asked != "auto" and int(asked) > self.options.lanes:  # (was silent)
            warnings.warn(f"lanes={asked} exceeds the data's {data.n_chunks} chunk(s); a lane "
                          f"takes whole chunks, so the fit runs {self.options.lanes} lane(s) "
                          "(lanes_): store smaller chunks for more", UserWarning,
                          stacklevel=user_stacklevel())
        return self.options.lanes

    def scan(self, data: Dataset, prepare: Callable, fold: Callable, state: Any,
             payload: Any = None, **kwargs: Any) -> Any:
        """One pass threading ``state`` through the chunks in order
        (:func:`dkernel.engine.scan.scan`, whose keywords it takes)."""
        return scan(self, data, prepare, fold, state, payload, **kwargs)


# Times a step is redone after losing a worker before the fit gives up.
_STEP_RETRIES = 3


def _cache_mode(program: Any) -> str | None:
    """Where the program keeps feature blocks (``cache_blocks``) or kernel
    rows (``cache_mode``) between epochs; None for a program with neither."""
    return getattr(program, "cache_blocks", None) or getattr(program, "cache_mode", None)


def _key_label(label: str) -> str:
    """A task-key prefix from a progress label ("kcca preconditioner" -> "kcca-preconditioner")."""
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-") or "pass"
