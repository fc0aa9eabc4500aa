"""Training history, the validation split and early stopping, shared by the
iterative estimators (DSG, EigenPro, KernelPCA / KSVD / KCCA).

Every fit keeps ``history_``: one dict per epoch with ``epoch`` (1-based),
``loss`` (mean mini-batch loss over the epoch, None where the solver has no
loss), ``steps``, ``rows``, ``seconds`` and where they went
(``compute_seconds``, ``busy``, ``update_seconds``, ``wait_seconds``,
``straggler_seconds``; from :attr:`Engine.history`),
plus ``validation_score`` when a validation split is held out and any
per-epoch objective the estimator adds.  The history is saved with the model
(JSON metadata), so ``dkernel plot MODEL`` draws it from the file.

Early stopping follows scikit-learn's SGD estimators: with
``early_stopping=True`` a ``validation_fraction`` of the rows is held out,
scored after every epoch (accuracy for classifiers, R^2 for regressors), and
the fit stops after ``n_iter_no_change`` epochs without a better score.
Unlike scikit-learn the model keeps the best epoch's coefficients
(``best_epoch_``), as EigenPro's authors do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dkernel.data.dataset import Dataset, open_dataset
from dkernel.engine import Engine

#: The keys every history entry has; plots draw the other numeric ones.
BOOKKEEPING = ("epoch", "steps", "rows", "seconds", "compute_seconds", "busy", "update_seconds",
               "wait_seconds", "straggler_seconds", "step_backoffs", "step_scale")


def subset_rows(data: Dataset, idx: np.ndarray) -> Dataset:
    """The rows ``idx`` (sorted) of a dataset, lazily for store / dask input."""
    if data.host is not None:
        Xh, yh = data.host
        return open_dataset(Xh[idx], None if yh is None else yh[idx])
    return open_dataset(data.X[idx], None if data.y is None else data.y[idx])


def split_validation(data: Dataset, fraction: float, random_state: int) -> tuple[Dataset, Dataset]:
    """(training rows, validation rows): a seeded random ``fraction`` of the rows
    held out, both in their original order.

    Rows in memory are drawn from all of them.  Out-of-core rows are drawn
    within each chunk, on the workers, as many in all as in memory, each
    chunk's share by its rows (:func:`_held`): a permutation of every row and
    dask's fancy indexing with it cost the client about 70 bytes a row (1.3 GB
    at 8M rows, 5 GB at 32M) and sent the indices through the scheduler."""
    if data.n_rows < 2:
        raise ValueError(
            f"early stopping needs at least 2 rows to hold some out, got {data.n_rows}"
        )
    seed = (int(random_state), 0xE16)
    n_val = min(data.n_rows - 1, max(1, int(round(fraction * data.n_rows))))
    if data.host is None:
        return _split_chunks(data, n_val, seed)
    perm = np.random.default_rng(seed).permutation(data.n_rows)
    return subset_rows(data, np.sort(perm[n_val:])), subset_rows(data, np.sort(perm[:n_val]))


def _held(n_val: int, n_rows: int, start: int, stop: int) -> int:
    """Rows held out of rows [start, stop): the chunks' shares of ``n_val`` sum
    to it exactly, each within one row of its proportion (rounding each
    chunk's own share held out 1 row of 4000 in 4-row chunks, 533 in 15-row
    ones).  A function of the chunk's place alone, so no task carries a list
    of every chunk's count."""
    return n_val * stop // n_rows - n_val * start // n_rows


def _split_chunks(data: Dataset, n_val: int, seed: tuple) -> tuple[Dataset, Dataset]:
    import dask.array as da

    offsets = [int(v) for v in data.row_offsets()]
    held = [_held(n_val, data.n_rows, a, b) for a, b in zip(offsets[:-1], offsets[1:])]
    rows = np.diff(offsets)

    def part(a: Any, keep: bool) -> Any:
        sizes = tuple(int(r - h) if keep else h for r, h in zip(rows, held))
        out = a.map_blocks(_chunk_part, n_val=n_val, n_rows=data.n_rows, seed=seed, keep=keep,
                           chunks=(sizes, *a.chunks[1:]), dtype=a.dtype,
                           meta=np.empty((0,) * a.ndim, a.dtype))
        return da.concatenate([out.blocks[c] for c in range(len(sizes)) if sizes[c]])

    y = data.y
    return tuple(open_dataset(part(data.X, keep), None if y is None else part(y, keep))
                 for keep in (True, False))


def _chunk_part(block: Any, n_val: int, n_rows: int, seed: tuple, keep: bool,
                block_info: Any = None) -> Any:
    """The training (``keep``) or held-out rows of a row chunk: its :func:`_held`
    share drawn from a seed of (``seed``, chunk), the same for X and y."""
    c = block_info[0]["chunk-location"][0]
    start, stop = block_info[0]["array-location"][0]
    mask = np.zeros(block.shape[0], bool)
    pick = np.random.default_rng([*seed, c]).choice(
        block.shape[0], _held(n_val, n_rows, start, stop), replace=False)
    mask[pick] = True
    return block[~mask] if keep else block[mask]


def _validation_partial(payload: dict, X: Any, y: Any) -> dict:
    f = np.asarray(payload["decision"](X, payload["spec"]), dtype=np.float64).reshape(
        X.shape[0], -1
    )
    out: dict[str, Any] = {"count": X.shape[0]}
    if payload["task"] == "classification":
        out["correct"] = int(
            (scores_to_labels(f, payload["classes"]) == np.asarray(y).reshape(-1)).sum()
        )
        return out
    # y less the training mean (the predictions' offset): the sums below give
    # SS_tot = sum y^2 - (sum y)^2 / n, which cancels to noise when y's mean is
    # large against its spread (y + 1e8 read R^2 0.92 where y read 0.745)
    Y = np.asarray(y, dtype=np.float64).reshape(f.shape) - payload["offset"]
    out.update(sq=((f - Y) ** 2).sum(axis=0), y_sum=Y.sum(axis=0), y_sq=(Y * Y).sum(axis=0))
    return out


def scores_to_labels(f: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Labels from decision scores: the sign of one column, else the arg-max."""
    idx = (f[:, 0] > 0).astype(np.int64) if f.shape[1] == 1 else f.argmax(axis=1)
    return np.asarray(classes)[idx]


def validation_score(
    engine: Engine,
    val: Dataset,
    task: str,
    decision: Callable[[Any, dict], Any],
    spec: dict,
    classes: Any = None,
    offset: Any = 0.0,
) -> float:
    """Accuracy (classification) or R^2 (regression, averaged over outputs) of
    a model on the validation rows, one pass on the workers.

    ``decision(X, spec)`` is a module-level function giving the raw scores;
    ``spec`` holds the model's arrays (kept in a dict, so large ones are
    broadcast once instead of travelling in every task).  Classification
    scores become labels of ``classes`` (:func:`scores_to_labels`);
    regression predictions are the scores plus ``offset``.
    """
    payload = {
        "decision": decision,
        "spec": spec,
        "task": task,
        "classes": None if classes is None else np.asarray(classes),
        "offset": np.asarray(offset, dtype=np.float64),
    }
    # no progress line for this short pass: the fit's own line goes on
    quiet = Engine(engine.client, dataclasses.replace(engine.options, progress=False))
    total = quiet.map_reduce(val, _validation_partial, payload, label="validation")
    n = total["count"]
    if task == "classification":
        return float(total["correct"] / n)
    sst = total["y_sq"] - total["y_sum"] ** 2 / n
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = 1.0 - total["sq"] / sst
    # a constant validation target has no R^2; minus the mean squared error still ranks epochs
    return float(np.mean(r2)) if np.all(sst > 0) else -float(np.mean(total["sq"] / n))


class EpochMonitor:
    """The ``on_epoch`` callback of :meth:`Engine.run_steps`: completes the
    engine's per-epoch entry (validation score, objectives), stops the fit
    after ``n_iter_no_change`` epochs without improvement and keeps a copy of
    the best epoch's state.

    Parameters
    ----------
    engine : Engine
        The engine running the fit (its ``history`` gets the entries).
    program : StepProgram
        Its ``stop`` flag ends the fit (see :meth:`StepProgram.should_stop`).
    evaluate : callable, optional
        ``evaluate(state) -> float``, higher is better; None: no validation.
    n_iter_no_change : int
    extra : callable, optional
        ``extra(state) -> dict`` of more per-epoch numbers (e.g. an objective).
    """

    def __init__(self, engine: Engine, program: Any,
                 evaluate: Callable[[dict], float] | None = None, n_iter_no_change: int = 2,
                 extra: Callable[[dict], dict] | None = None) -> None:
        self.engine, self.program, self.evaluate = engine, program, evaluate
        self.n_iter_no_change = int(n_iter_no_change)
        self.extra = extra
        self.best: dict[str, Any] = {}

    def __call__(self, state: dict, epoch: int) -> None:
        entry = self.engine.history[-1] if self.engine.history else {"epoch": epoch + 1}
        if self.extra is not None:
            entry.update(self.extra(state))
        if self.evaluate is None:
            return
        score = float(self.evaluate(state))
        entry["validation_score"] = score
        if not self.best or score > self.best["score"]:
            self.best = {
                "score": score,
                "epoch": epoch,
                "state": {
                    k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in state.items()
                },
            }
        elif epoch - self.best["epoch"] >= self.n_iter_no_change:
            self.program.stop = True

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the monitor: the best epoch, its score and
        state (a fit resumed after it must still return to it)."""
        if not self.best:
            return {}
        return {"best_score": self.best["score"], "best_epoch": self.best["epoch"],
                **{f"best.{k}": v for k, v in self.best["state"].items()}}

    def resume(self, saved: dict[str, Any]) -> None:
        """The monitor as :meth:`checkpoint_state` left it."""
        if "best_score" in saved:
            self.best = {"score": float(saved["best_score"]), "epoch": int(saved["best_epoch"]),
                         "state": {k[5:]: v for k, v in saved.items() if k.startswith("best.")}}

    def final_state(self, state: dict) -> dict:
        """The best epoch's state when validation ran, else ``state``."""
        return self.best["state"] if self.best else state

    @property
    def best_epoch(self) -> int | None:
        """1-based epoch of the best validation score (None without validation)."""
        return self.best["epoch"] + 1 if self.best else None

    def history(self) -> list[dict]:
        return [clean_entry(e) for e in self.engine.history]


def clean_entry(entry: dict) -> dict:
    """A history entry as plain JSON numbers (NaN / inf become None)."""
    out: dict[str, Any] = {}
    for k, v in entry.items():
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def history_meta(est: Any) -> dict:
    """What a model file stores of the training history (JSON metadata)."""
    out: dict[str, Any] = {}
    if getattr(est, "history_", None) is not None:
        out["history"] = [clean_entry(e) for e in est.history_]
    if getattr(est, "best_epoch_", None) is not None:
        out["best_epoch"] = int(est.best_epoch_)
    return out


def set_history(est: Any, meta: dict) -> None:
    """Restore ``history_`` (and ``best_epoch_``, ``validation_scores_``) from
    a model file's metadata; files saved before histories existed have none."""
    if "history" in meta:
        est.history_ = [dict(e) for e in meta["history"]]
        scores = [e["validation_score"] for e in est.history_ if "validation_score" in e]
        if scores:
            est.validation_scores_ = scores
    if "best_epoch" in meta:
        est.best_epoch_ = int(meta["best_epoch"])
