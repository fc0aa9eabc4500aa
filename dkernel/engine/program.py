"""What a solver hands the engine: the per-chunk math and the update rule."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A partial-result function runs on a worker: ``partial(payload, X, y)``
#: returns a dict of arrays/numbers that the engine sums over the step's
#: chunks.  It must be a pure, module-level function (picklable, retry-safe)
#: and report the number of rows it saw under ``"count"``.
PartialFn = Callable[[Any, Any, Any], dict[str, Any]]


@dataclass
class Chunk:
    """A whole data chunk plus the rows one task uses; given to partials of
    programs with ``wants_chunk = True`` so they can cache per-chunk blocks.

    ``key`` identifies the chunk's data across epochs and tasks (dataset
    token, chunk index); ``rows`` are indices into the chunk (None: all);
    ``run`` identifies the engine run, the owner of the blocks it caches
    (:func:`dkernel.engine.cache.lookup_or_fill`).
    """

    X: Any
    y: Any
    rows: Any
    key: Hashable
    run: Hashable = None

    @property
    def X_rows(self) -> Any:
        return self.X if self.rows is None else self.X[self.rows]

    @property
    def y_rows(self) -> Any:
        if self.y is None or self.rows is None:
            return self.y
        return self.y[self.rows]


class StepProgram:
    """One iterative algorithm as the engine sees it.

    Subclasses set :attr:`partial` and implement :meth:`init_state`,
    :meth:`payload` and :meth:`update`.  ``state`` is a flat dict of NumPy
    arrays and JSON scalars so that it checkpoints without pickle.
    """

    partial: PartialFn
    label: str = "fit"
    #: When True the engine calls ``partial(payload, chunk: Chunk)`` instead of
    #: ``partial(payload, X_rows, y_rows)``.
    wants_chunk: bool = False
    #: When True a lane may read several small store chunks as one
    #: (:func:`dkernel.data.plan.chunk_bundles`): for programs whose partials
    #: keep nothing per store chunk beyond what the chunk key names.
    bundles_chunks: bool = False
    #: Set (e.g. by an early-stopping callback) to end the fit after this epoch.
    stop: bool = False

    def init_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def payload(self, state: dict[str, Any], step: int) -> Any:
        """What every task of ``step`` receives (coefficients, seeds...)."""
        raise NotImplementedError

    def constants(self) -> dict[str, Any] | None:
        """Large step-independent arrays (e.g. kernel centers) that every task
        needs: the engine broadcasts them once per run and merges them into
        each step's payload on the worker.  None (the default): nothing."""
        return None

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        """Coordinator update from the summed partial results of one step."""
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able settings that a checkpoint must match to be resumed."""
        return {}

    def metrics(self, total: dict[str, Any]) -> dict[str, float]:
        """Numbers shown on the progress line (e.g. the mini-batch loss)."""
        if "loss" in total and total.get("count"):
            return {"loss": float(np.sum(total["loss"]) / total["count"])}
        return {}

    #: True when :meth:`update` multiplies its step by ``state["step_scale"]``,
    #: so the engine's divergence guard can halve it (:mod:`dkernel.engine.guard`).
    supports_backoff: bool = False

    def divergence_hint(self) -> str:
        """What the user should change when the fit diverges (one clause)."""
        return "use a smaller step_size or a larger bandwidth"

    def stall_hint(self) -> str:
        """What the user should change when the fit ends no better than its
        starting model (one clause); by default :meth:`divergence_hint`'s."""
        return self.divergence_hint()

    def slow_hint(self) -> str:
        """What helps when the lanes sit idle most of an epoch (one clause):
        the engine adds it to the epoch's report."""
        return "fewer, wider steps (a larger batch_size) or chunks on faster storage"

    def should_stop(self, state: dict[str, Any], epoch: int) -> bool:
        """Called after each epoch; True ends the fit early (e.g. early stopping)."""
        return bool(self.stop)
