"""No silent divergence: the engine watches every step's loss and state.

A step's partial results carry the mini-batch loss of the state the step
started from.  The first step's loss (the starting model: zero coefficients,
i.e. predicting the mean or the prior) is the reference (when batches are
smaller than ``POOL_ROWS``, the starting state's loss on ``PROBE_ROWS`` rows,
measured before the first step).  A step whose loss
is not finite, or larger than ``factor`` (4) times the reference (an R^2 of -3)
over the last ``POOL_ROWS`` rows at least, or a state
holding NaN/inf, means the iteration is blowing up: the guard puts back the
last state whose loss was no worse than the reference, halves ``state["step_scale"]`` (which every
program that ``supports_backoff`` multiplies into its step) and records it.
After ``max_backoffs`` halvings the fit stops with :class:`DivergenceError`,
one line naming the setting to change.

A fit can also go wrong slowly: a step somewhat too large raises the loss
without blowing up (EigenPro-RF at q = 1536 on 200k x 32 rows, a step ~1.5x
what its preconditioner's sample supports, ended 57% above its start:
issue 28).  So each epoch of a program that ``supports_backoff`` is judged
when it ends: if the mean loss of its steps after its first (each measured
on the state before its update, over rows not yet seen this epoch) is above
the reference by more than :func:`end_margin`, the epoch is replayed from
its starting state with the step scale halved, at most ``_MAX_REPLAYS``
times in a fit.  An epoch that still ends above keeps the lowest-loss state
seen in it (its starting state or one of its attempts) and the fit goes on,
warning at the end as before: a target that cannot be learned hovers at its
starting loss, and that is no error.  An epoch's end state is measured only
by the next epoch's first step, so the fit's last epoch is also judged by a
probe: the loss of its end state on the rows the reference was measured on
(the first batch), with no update (``Engine._probe_loss``).  Without it a one-epoch EigenPro fit
whose step grew too large by the epoch's end returned a model with held-out
R^2 -6.4 and no warning (tests/test_scale.py).

Everything the guard keeps lives in the state or in the checkpoint
(:meth:`DivergenceGuard.checkpoint_state`), so a resumed fit continues with
the same scale, reference and epoch snapshot, and ends with the same model.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np

from dkernel._stack import user_stacklevel


class DivergenceError(ArithmeticError):
    """An iterative fit diverged and halving its step did not recover it."""


class FitQualityWarning(UserWarning):
    """A fit ended no better than its starting model (the mean / the prior)."""


def _finite(state: dict[str, Any]) -> bool:
    for v in state.values():
        if isinstance(v, np.ndarray) and v.dtype.kind in "fc":
            if not np.isfinite(v).all():
                return False
        elif isinstance(v, float) and not math.isfinite(v):
            return False
    return True


def _copy_into(dst: dict[str, Any] | None, src: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``src``, reusing ``dst``'s arrays where shapes match: a fresh
    model-sized copy every step would page in new memory each time (docs/design.md §4)."""
    if dst is None or dst.keys() != src.keys():
        return copy.deepcopy(src)
    for k, v in src.items():
        d = dst[k]
        if isinstance(v, np.ndarray) and isinstance(d, np.ndarray) and d.shape == v.shape \
                and d.dtype == v.dtype:
            np.copyto(d, v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


class DivergenceGuard:
    """See module docstring; one per ``Engine.run_steps``."""

    def __init__(self, program: Any, factor: float = 4.0, max_backoffs: int = 10,
                 batch_size: int | None = None) -> None:
        self.program = program
        #: rows the ratio test pools (:meth:`_judged`); 0 where the plan's batch
        #: is ``POOL_ROWS`` or more: each step judged alone, as before pooling
        self.pool_rows = POOL_ROWS if batch_size is not None and batch_size < POOL_ROWS else 0
        self.factor = float(factor)
        self.max_backoffs = int(max_backoffs)
        self.snapshot: dict[str, Any] | None = None
        self.snapshot_loss: float | None = None
        #: updates applied to the state the fit goes on from (and to the snapshot)
        self.applied = 0
        self.snapshot_applied = 0
        #: one dict per halving: step, loss, reference, step_scale after it
        self.backoffs: list[dict[str, Any]] = []
        #: losses of the last healthy steps after the first (the fit's end state)
        self.recent: list[float] = []
        #: the current epoch: its starting state and what its steps measured
        #: (:meth:`begin_epoch`); None outside an epoch
        self.epoch: dict[str, Any] | None = None
        #: epochs replayed so far in this fit (at most ``_MAX_REPLAYS``)
        self.replays = 0
        #: loss of the state the fit ended with, where the probe after the last
        #: epoch measured it (:meth:`end_epoch`); :meth:`finish` judges by it
        self.end_loss: float | None = None
        #: (loss, rows) of the last steps the ratio test pools (:meth:`_judged`)
        self.pool: list[tuple[float, int]] = []
        #: (applied, recent) read back from a checkpoint inside an epoch (:meth:`resume`)
        self._resumed: tuple[int, list[float]] | None = None

    def start(self, state: dict[str, Any]) -> dict[str, Any]:
        # a resumed state already carries updates (and the reference loss)
        self.applied = self.snapshot_applied = int("guard_reference" in state)
        if self._resumed is not None:  # a checkpoint in the middle of an epoch
            self.applied, self.recent = self._resumed
            self.snapshot_applied = self.applied
        if getattr(self.program, "supports_backoff", False):
            state.setdefault("step_scale", 1.0)
        return state

    def before_update(self, state: dict[str, Any], total: dict[str, Any],
                      step: int) -> dict[str, Any] | None:
        """Called with the state a step's partials were computed on.  Returns
        None when healthy (the update goes ahead), else the state to continue
        from (the step's update is skipped)."""
        loss = judged = None
        if "loss" in total and total.get("count"):
            rows = int(total["count"])
            loss = float(np.sum(total["loss"])) / rows
            if math.isfinite(loss):
                judged = self._judged(state, loss, rows)
        ref = state.get("guard_reference") or None
        bad = not _finite(state) or (loss is not None and (
            not math.isfinite(loss) or (ref is not None and judged is not None
                                        and judged > self.factor * ref)))
        if not bad:
            # only a state no worse than the start is worth returning to: one
            # already drifting up (between 1x and 4x) would diverge again
            level = loss if judged is None else judged
            if level is None or ref is None or level <= ref:
                self.snapshot = _copy_into(self.snapshot, state)
                self.snapshot_loss = loss
                self.snapshot_applied = self.applied
            self.applied += 1  # the engine applies this step's update
            if loss is not None and step > 0:
                self.recent = (self.recent + [loss])[-_RECENT:]
            if loss is not None and self.epoch is not None:
                rows = int(total["count"])
                if self.epoch["first"] is None:
                    self.epoch["first"] = loss  # the loss of the epoch's starting state
                else:
                    self.epoch["loss"] += loss * rows
                    self.epoch["rows"] += rows
            return None
        label = getattr(self.program, "label", "fit")
        self.pool = []  # the state changes: the losses pooled so far describe another
        if judged is not None and ref is not None:
            what = f"loss {judged:.3g} against {ref:.3g} for the starting model"
        elif loss is not None and not math.isfinite(loss):
            what = f"loss {loss}"
        else:
            what = "its coefficients are no longer finite"
        hint = _advice(self.program, self.program.divergence_hint())
        if not getattr(self.program, "supports_backoff", False) or self.snapshot is None:
            raise DivergenceError(f"{label} diverged at step {step} ({what}); {hint}")
        if len(self.backoffs) >= self.max_backoffs:
            raise DivergenceError(
                f"{label} diverged at step {step} ({what}) even with its step halved "
                f"{len(self.backoffs)} times; {hint}")
        restored = copy.deepcopy(self.snapshot)
        # the fit goes on from the snapshot: its loss, not the undone steps', is
        # where the end-of-fit check starts (a fit whose last step is undone back
        # to the starting model must still warn)
        self.recent = [] if self.snapshot_loss is None else [self.snapshot_loss]
        self.applied = self.snapshot_applied
        restored["step_scale"] = float(restored.get("step_scale", 1.0)) * 0.5
        self.snapshot = copy.deepcopy(restored)
        self.backoffs.append({"step": int(step), "loss": loss, "reference": ref,
                              "step_scale": restored["step_scale"]})
        if self.epoch is not None:  # the epoch is judged by the steps after the restore
            self.epoch["loss"], self.epoch["rows"] = 0.0, 0
        return restored

    def _judged(self, state: dict[str, Any], loss: float, rows: int) -> float | None:
        """The loss the ratio test reads: with a batch under ``POOL_ROWS`` rows,
        the mean over the last steps that hold at least that many; else the
        step's own (every default batch is larger).  A mini-batch of 2 rows is no measure: its loss
        went past 4x a first batch's on a fit that could not move
        (``step_size=1e-6``).  The reference pools the first steps the same
        way; until it holds ``POOL_ROWS`` rows it is their mean, and no step is
        judged.  None: no ratio test for this step."""
        if not self.pool_rows:
            if "guard_reference" not in state:
                # a starting loss of ~0 (e.g. a one-class objective at f = 0) is no
                # scale to compare with: 0 disables the ratio test for this fit
                state["guard_reference"] = loss if loss > 1e-8 else 0.0
                state["guard_reference_rows"] = rows
                return None
            return loss
        ref_rows = int(state.get("guard_reference_rows", 0))
        if "guard_reference" not in state or ref_rows < self.pool_rows:
            ref = float(state.get("guard_reference", 0.0))
            total = ref * ref_rows + loss * rows
            # a starting loss of ~0 (e.g. a one-class objective at f = 0) is no
            # scale to compare with: 0 disables the ratio test for this fit
            mean = total / (ref_rows + rows) if ref_rows == 0 or ref > 0 else 0.0
            state["guard_reference"] = mean if mean > 1e-8 else 0.0
            state["guard_reference_rows"] = ref_rows + rows
            self.pool = [(loss, rows)]
            return None
        self.pool.append((loss, rows))
        while sum(r for _, r in self.pool[1:]) >= self.pool_rows:
            self.pool.pop(0)
        pooled = sum(r for _, r in self.pool)
        if pooled < self.pool_rows:
            return None
        return sum(v * r for v, r in self.pool) / pooled

    def set_reference(self, state: dict[str, Any], probe: tuple[float, int] | None) -> None:
        """A pooled fit's reference: the starting state's (loss, rows) on
        ``PROBE_ROWS`` rows, measured before its first step (none: the first
        steps' losses are pooled instead, :meth:`_judged`)."""
        if probe is not None:
            # a starting loss of ~0 (e.g. a one-class objective at f = 0) is no
            # scale to compare with: 0 disables the ratio test for this fit
            state["guard_reference"] = probe[0] if probe[0] > 1e-8 else 0.0
            state["guard_reference_rows"] = int(probe[1])

    def begin_epoch(self, state: dict[str, Any], epoch: int) -> None:
        """Keep the state an epoch starts from, to replay the epoch from it."""
        self.epoch = {"index": int(epoch), "state": copy.deepcopy(state), "applied": self.applied,
                      "recent": list(self.recent), "first": None, "loss": 0.0, "rows": 0,
                      "best": None}

    def end_epoch(self, state: dict[str, Any], step: int,
                  probe: tuple[float, int] | None = None) -> tuple[dict[str, Any], bool]:
        """Judge the epoch that just ended at ``step``.  Returns the state to go on
        from and whether to replay the epoch from it (then the state is the
        epoch's starting one with its step scale halved).  ``probe``: (loss,
        rows) of the end state itself, measured after the fit's last epoch,
        which is judged by the worse of it and its steps' mean."""
        if probe is not None and probe[1] < self.pool_rows and self.pool:
            # a probe of one small batch is no measure (_judged): pooled with the
            # last steps' losses, measured on states just before the end one
            pooled = [*self.pool, probe]
            rows = sum(r for _, r in pooled)
            probe = (sum(v * r for v, r in pooled) / rows, rows)
        ep, self.epoch = self.epoch, None
        ref = state.get("guard_reference")
        self.pool = []  # whatever follows starts from a state these losses did not see
        if probe is not None and not getattr(self.program, "supports_backoff", False):
            self.end_loss = probe[0]  # (a pooled fit's, on its reference's rows: finish)
        if (ep is None or not ref or not getattr(self.program, "supports_backoff", False)
                or not (ep["rows"] or probe)):
            return state, False
        judged = [(ep["loss"] / ep["rows"], ep["rows"])] if ep["rows"] else []
        if probe is not None:
            judged.append(probe)
            self.recent = (self.recent + [probe[0]])[-_RECENT:]
        end, rows = max(judged)
        margin = end_margin(int(state.get("guard_reference_rows", rows)), rows)
        self.end_loss = None
        if end <= ref * (1.0 + margin):
            self.end_loss = None if probe is None else probe[0]
            return state, False
        if ep["best"] is None or end < ep["best"]["loss"]:
            ep["best"] = {"loss": end, "state": copy.deepcopy(state), "applied": self.applied,
                          "recent": list(self.recent)}
        # the guard's own entries (the reference, the scale reached) go on
        own = {k: state[k] for k in _KEYS if k in state}
        if self.replays < _MAX_REPLAYS:
            self.replays += 1
            restored = {**copy.deepcopy(ep["state"]), **own,
                        "step_scale": float(state.get("step_scale", 1.0)) * 0.5}
            self.backoffs.append({"step": int(step), "epoch": ep["index"] + 1, "loss": end,
                                  "reference": ref, "margin": margin,
                                  "step_scale": restored["step_scale"],
                                  "reason": "the epoch ended above the starting loss"})
            self.applied, self.recent = ep["applied"], list(ep["recent"])
            self._resnapshot(restored, ep["first"], ref)
            self.epoch = {**ep, "state": {**ep["state"], **own}, "first": None, "loss": 0.0,
                          "rows": 0}
            return restored, True
        # no replays left: the lowest loss seen, at the smallest scale tried
        best = ep["best"]
        if ep["first"] is not None and ep["first"] <= best["loss"]:
            best = {"state": ep["state"], "applied": ep["applied"], "recent": ep["recent"]}
        kept = {**copy.deepcopy(best["state"]), **own}
        self.applied, self.recent = best["applied"], list(best["recent"])
        self._resnapshot(kept, ep["first"] if best["state"] is ep["state"] else best["loss"], ref)
        return kept, False

    def _resnapshot(self, state: dict[str, Any], loss: float | None, ref: float) -> None:
        """The divergence snapshot, after the fit went back to ``state``."""
        if loss is not None and loss <= ref:
            self.snapshot = copy.deepcopy(state)
            self.snapshot_loss = loss
            self.snapshot_applied = self.applied

    def checkpoint_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` plus what the guard needs to resume the epoch in progress
        exactly: its starting state (under ``guard_epoch.``), what its steps
        measured and its best attempt so far (``guard_best.``)."""
        out = {**state, "guard_replays": self.replays}
        if self.pool:  # a resumed fit judges its next steps as the uninterrupted one
            out["guard_pool_loss"] = [v for v, _ in self.pool]
            out["guard_pool_rows"] = [r for _, r in self.pool]
        ep = self.epoch
        if ep is None:
            return out
        out.update({"guard_epoch_index": ep["index"], "guard_epoch_applied": ep["applied"],
                    "guard_epoch_recent": list(ep["recent"]), "guard_epoch_first": ep["first"],
                    "guard_epoch_loss": ep["loss"], "guard_epoch_rows": ep["rows"],
                    "guard_applied": self.applied, "guard_recent": list(self.recent)})
        out.update({f"guard_epoch.{k}": v for k, v in ep["state"].items()})
        if ep["best"] is not None:
            b = ep["best"]
            out.update({"guard_best_loss": b["loss"], "guard_best_applied": b["applied"],
                        "guard_best_recent": list(b["recent"])})
            out.update({f"guard_best.{k}": v for k, v in b["state"].items()})
        return out

    def resume(self, loaded: dict[str, Any]) -> dict[str, Any]:
        """The program's state from a checkpoint written by :meth:`checkpoint_state`,
        restoring the guard's epoch in progress (None when the checkpoint is at an
        epoch's end)."""
        state: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {"guard_epoch.": {}, "guard_best.": {}}
        own: dict[str, Any] = {}
        for k, v in loaded.items():
            prefix = next((p for p in nested if k.startswith(p)), None)
            if prefix is not None:
                nested[prefix][k[len(prefix):]] = v
            elif k.startswith("guard_") and k not in _KEYS:
                own[k] = v
            else:
                state[k] = v
        self.replays = int(own.get("guard_replays", 0))
        self.pool = [(float(v), int(r)) for v, r in zip(own.get("guard_pool_loss", ()),
                                                        own.get("guard_pool_rows", ()))]
        if "guard_epoch_index" in own:
            best = None
            if "guard_best_loss" in own:
                best = {"loss": own["guard_best_loss"], "state": nested["guard_best."],
                        "applied": own["guard_best_applied"],
                        "recent": list(own["guard_best_recent"])}
            self.epoch = {"index": int(own["guard_epoch_index"]), "state": nested["guard_epoch."],
                          "applied": int(own["guard_epoch_applied"]),
                          "recent": list(own["guard_epoch_recent"]),
                          "first": own["guard_epoch_first"], "loss": float(own["guard_epoch_loss"]),
                          "rows": int(own["guard_epoch_rows"]), "best": best}
            self._resumed = (int(own["guard_applied"]), list(own["guard_recent"]))
        return state

    def carry(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """The updated state with the guard's own entries (reference loss, step
        scale) carried over, for programs whose update returns a fresh dict."""
        for k in _KEYS:
            if k in before and k not in after:
                after[k] = before[k]
        return after

    def finish(self, state: dict[str, Any]) -> None:
        """Warn when the last steps' loss is no better than the starting model's.

        Where the probe after the last epoch measured the state the fit ended
        with, that loss is the judge, and it must be ``_LEAST_GAIN`` below the
        reference, measured on the same rows.  Otherwise the mini-batch losses of the
        last ``_RECENT`` steps (each measured on the state before its update,
        over fresh rows) stand in for the final model's training loss; a fit of
        a single step has nothing to compare.
        """
        label = getattr(self.program, "label", "fit")
        if self.backoffs and self.applied == 0:
            warnings.warn(
                f"{label}: every update was undone by the divergence guard "
                f"({len(self.backoffs)} halvings), so the model is the starting one "
                f"(predicting the mean or the prior); "
                f"{_advice(self.program, self.program.divergence_hint())}",
                FitQualityWarning, stacklevel=user_stacklevel())
            return
        ref = state.get("guard_reference")
        if not ref:
            return
        if self.end_loss is not None:
            # the end state itself, measured by the probe: the steps' losses of a
            # replayed last epoch start from the state that blew up (a fit that
            # ended at training R^2 0.92 warned from their mean, 1.6x the start).
            # On the reference's own rows, so a gain under _LEAST_GAIN is no
            # better: DSG at step_size=0.05 ended at training R^2 0.0002
            last, what = self.end_loss, "the training loss of the model it ended with"
            bar = ref * (1.0 - _LEAST_GAIN)
        elif self.recent:
            # other rows than the reference's: only a loss above it is evidence
            last, what = float(np.mean(self.recent)), "the mean training loss of the last steps"
            bar = ref
        else:
            return
        if last >= bar:
            within = "" if bar == ref else f" to {100 * _LEAST_GAIN:g}%"
            warnings.warn(
                f"{label}: {what} {last:.4g} is no better than the starting model's "
                f"{ref:.4g} (predicting the mean or the prior){within}; "
                f"{_stall_hint(self.program)}", FitQualityWarning, stacklevel=user_stacklevel())


def _stall_hint(program: Any) -> str:
    """The program's advice for a fit no better than its start (``stall_hint``,
    else its ``divergence_hint``: a program need not be a StepProgram)."""
    hint = getattr(program, "stall_hint", None) or program.divergence_hint
    return _advice(program, hint())


def _advice(program: Any, hint: str) -> str:
    """``hint``, led by the order the rows are stored in where the fit found
    one (``program.ordered_by``, :mod:`dkernel.estimators.order`): steps on
    y-sorted chunks pull the model back and forth, and a smaller step, the
    usual advice, only slows that down."""
    ordered_by = getattr(program, "ordered_by", None)
    if not ordered_by:
        return hint
    return (f"first shuffle the rows, which are stored in an order of {ordered_by} (the "
            f"means of its chunks hold most of its variance); otherwise {hint}")


def end_margin(reference_rows: int, end_rows: int) -> float:
    """How far above the starting loss (a fraction of it) an epoch may end
    before it is replayed with a smaller step.

    The reference is the mean loss over ``reference_rows`` rows, the epoch's
    end the mean over ``end_rows`` other rows; for squared residuals of a
    Gaussian error each mean's relative standard deviation is sqrt(2 / rows),
    so a model no better and no worse than the start lands within three
    standard deviations of the difference, 3 sqrt(2 / n_0 + 2 / n_1), nearly
    always.  And at least ``_END_FLOOR``: a model whose loss is within 5% of
    the start's (an R^2 of -0.05) hovers there as a fit of an unlearnable
    target does, and a replay would cost a whole epoch for nothing.  The
    repro of issue 28 (EigenPro-RF on 200k x 32) ended 57% above.
    """
    noise = 3.0 * math.sqrt(2.0 / max(reference_rows, 1) + 2.0 / max(end_rows, 1))
    return max(_END_FLOOR, noise)


#: The guard's entries in a program's state (checkpointed with it).
_KEYS = ("guard_reference", "guard_reference_rows", "step_scale")
#: Rows the ratio test pools before it judges (:meth:`DivergenceGuard._judged`),
#: in fits whose batch is smaller: 2 rows' mean squared error passes 4x the
#: population's by chance (chi^2_2 / 2 > 4: probability 1.8%, once in 55
#: steps), 32 rows' practically never (chi^2_32 / 32 > 4: 2e-13).  Batches of
#: 32 rows or more are judged step by step, as before pooling.
POOL_ROWS = 32

#: Rows on which a pooled fit (batch under ``POOL_ROWS``) measures its starting
#: state before its first step (the reference) and its end state after its
#: last (the probe), the same rows both times (``Engine._probe_loss``): the
#: end was judged over the last ~32 pooled rows against the first ~32, each
#: mean 25% noise, and fits of R^2 0.01-0.19 (EigenPro at alpha >= 0.6, 2-row
#: batches) warned that they were no better than the start.  On the same 256
#: rows the two means share their rows' noise.
PROBE_ROWS = 256

#: Least gain on the starting loss (a fraction of it, on the same rows) a fit
#: must show not to be called no better than its starting model (:meth:`finish`).
_LEAST_GAIN = 0.01

#: Least margin above the starting loss that replays an epoch (:func:`end_margin`).
_END_FLOOR = 0.05

#: Epochs a fit may replay with a halved step (1/8 of the step after three):
#: each costs an epoch; a step more than 8x too large blows up, and is the
#: step-level guard's (loss above ``factor`` x the start).
_MAX_REPLAYS = 3

#: Steps whose mean loss stands in for the final model's training loss.
_RECENT = 8
