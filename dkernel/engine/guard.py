"""No silent divergence: the engine watches every step's loss and state.

A step's partial results carry the mini-batch loss of the state the step
started from.  The first step's loss (the starting model: zero coefficients,
i.e. predicting the mean or the prior) is the reference.  A step whose loss
is not finite, or larger than ``factor`` (4) times the reference (an R^2 of -3), or a state
holding NaN/inf, means the iteration is blowing up: the guard puts back the
last state whose loss was no worse than the reference, halves ``state["step_scale"]`` (which every
program that ``supports_backoff`` multiplies into its step) and records it.
After ``max_backoffs`` halvings the fit stops with :class:`DivergenceError`,
one line naming the setting to change.  Everything the guard keeps lives in
the state, so a resumed fit continues with the same scale and reference.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np


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
    model-sized copy every step would page in new memory each time (DESIGN 4)."""
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

    def __init__(self, program: Any, factor: float = 4.0, max_backoffs: int = 10) -> None:
        self.program = program
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

    def start(self, state: dict[str, Any]) -> dict[str, Any]:
        # a resumed state already carries updates (and the reference loss)
        self.applied = self.snapshot_applied = int("guard_reference" in state)
        if getattr(self.program, "supports_backoff", False):
            state.setdefault("step_scale", 1.0)
        return state

    def before_update(self, state: dict[str, Any], total: dict[str, Any],
                      step: int) -> dict[str, Any] | None:
        """Called with the state a step's partials were computed on.  Returns
        None when healthy (the update goes ahead), else the state to continue
        from (the step's update is skipped)."""
        loss = None
        if "loss" in total and total.get("count"):
            loss = float(np.sum(total["loss"])) / float(total["count"])
            if "guard_reference" not in state and math.isfinite(loss):
                # a starting loss of ~0 (e.g. a one-class objective at f = 0) is no
                # scale to compare with: 0 disables the ratio test for this fit
                state["guard_reference"] = loss if loss > 1e-8 else 0.0
        ref = state.get("guard_reference") or None
        bad = not _finite(state) or (loss is not None and (
            not math.isfinite(loss) or (ref is not None and loss > self.factor * ref)))
        if not bad:
            # only a state no worse than the start is worth returning to: one
            # already drifting up (between 1x and 4x) would diverge again
            if loss is None or ref is None or loss <= ref:
                self.snapshot = _copy_into(self.snapshot, state)
                self.snapshot_loss = loss
                self.snapshot_applied = self.applied
            self.applied += 1  # the engine applies this step's update
            if loss is not None and step > 0:
                self.recent = (self.recent + [loss])[-_RECENT:]
            return None
        label = getattr(self.program, "label", "fit")
        if loss is not None and ref is not None:
            what = f"loss {loss:.3g} against {ref:.3g} for the starting model"
        elif loss is not None and not math.isfinite(loss):
            what = f"loss {loss}"
        else:
            what = "its coefficients are no longer finite"
        hint = self.program.divergence_hint()
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
        return restored

    def carry(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """The updated state with the guard's own entries (reference loss, step
        scale) carried over, for programs whose update returns a fresh dict."""
        for k in _KEYS:
            if k in before and k not in after:
                after[k] = before[k]
        return after

    def finish(self, state: dict[str, Any]) -> None:
        """Warn when the last steps' loss is no better than the starting model's.

        The mini-batch losses of the last ``_RECENT`` steps (each measured on
        the state before its update, over fresh rows) stand in for the final
        model's training loss; a fit of a single step has nothing to compare.
        """
        label = getattr(self.program, "label", "fit")
        if self.backoffs and self.applied == 0:
            warnings.warn(
                f"{label}: every update was undone by the divergence guard "
                f"({len(self.backoffs)} halvings), so the model is the starting one "
                f"(predicting the mean or the prior); {self.program.divergence_hint()}",
                FitQualityWarning, stacklevel=3)
            return
        ref = state.get("guard_reference")
        if not self.recent or not ref:
            return
        last = float(np.mean(self.recent))
        if last >= ref:
            warnings.warn(
                f"{label}: the mean training loss of the last steps {last:.4g} is no better "
                f"than the starting model's {ref:.4g} (predicting the mean or the prior); "
                f"{self.program.divergence_hint()}", FitQualityWarning, stacklevel=3)


#: The guard's entries in a program's state (checkpointed with it).
_KEYS = ("guard_reference", "step_scale")

#: Steps whose mean loss stands in for the final model's training loss.
_RECENT = 8
