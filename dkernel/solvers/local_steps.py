r"""Rounds of local preconditioned steps, for the whole-pool feature solvers
(DSG's preconditioned steps, EigenPro-RF).

Local SGD (Stich 2019, "Local SGD converges fast and communicates little";
Lin et al. 2020, "Don't use large mini-batches, use local SGD").  A
synchronous step's fixed cost -- a round trip and one task a lane through one
scheduler -- grows with the lanes (~2.5 ms a lane, docs/scaling.md) while a
lane's rows a step do not.  In a round each lane starts from the same
coefficients a, takes k steps

    a <- a - \gamma_t P ( g_b(a) / (m s) + \nu a ),    P = I - E diag(shrink) E^T

on b-row slices of its own rows (P, the schedule and the ridge term on the
worker), and the coordinator averages the lanes' final coefficients weighted
by their rows.  With one lane, or k = 1, this is the synchronous step.

For the squared loss the average of the lanes' steps from one point is the
synchronous step on their union taken at the step size of b rows: below the
critical batch m* that is a shorter step than the union's, so the solvers
choose q and gamma for b rows, and a round moves about as far as k
sequential steps of b rows.  What the rounds save is coordination: k steps
for one round trip and ``lanes`` tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dkernel.backend import asarray_like
from dkernel.engine.program import Chunk
from dkernel.solvers.eigenpro import step_size as eigenpro_step

#: "auto" local steps: synchronous steps up to this many lanes.  A step's fixed
#: cost is ~8 ms + 2.5 ms a lane (benchmarks/step_overhead.py, docs/scaling.md)
#: against ~290 ms of a lane's compute at the default batch (65536 rows, D = 2048,
#: d = 32): 16 lanes keep it near 15%; past them each 16 lanes add a local step.
SYNC_LANES = 16
#: ... but an epoch keeps at least this many rounds (as the pool estimators do).
MIN_ROUNDS = 8


def local_steps(given: int | None, lanes: int, n_rows: int, batch: int) -> int:
    """k, the local steps of a round: ``given``, else 1 up to SYNC_LANES lanes
    and ceil(lanes / SYNC_LANES) beyond, at most what leaves MIN_ROUNDS rounds
    of k synchronous ``batch``-row steps in an epoch of ``n_rows``."""
    if given is not None:
        return int(given)
    k = math.ceil(int(lanes) / SYNC_LANES)
    return max(1, min(k, int(n_rows) // (MIN_ROUNDS * max(int(batch), 1))))


def round_constants(P: Any) -> dict[str, np.ndarray]:
    """What every lane needs of a :class:`FeaturePreconditioner`, shipped once a
    fit (:meth:`StepProgram.constants`): E and 1 - tau lambda_{q+1} / lambda_i."""
    return {"pre_vectors": P.vectors, "pre_shrink": 1.0 - P.tau * P.tail / P.values[: P.q]}


def round_payload(coef: np.ndarray, t: float, *, gamma0: float | np.ndarray,
                  step_decay: float, ridge: float, grad_scale: float, step_rows: int,
                  beta: float, new_top: float, short_steps: bool) -> dict[str, Any]:
    """A round's settings for :func:`local_round`: the coefficients (float64), the
    schedule's count t of steps so far, gamma_0 (back-offs included; an array of
    one per output broadcasts over the coefficients' columns), the rows
    b of a local step and, with ``short_steps``, the EigenPro step ratio
    eta(m) / eta(b) for a short last slice."""
    gamma0 = np.asarray(gamma0, dtype=np.float64) if np.ndim(gamma0) else float(gamma0)
    return {"round_coef": coef, "t": float(t), "gamma0": gamma0,
            "step_decay": float(step_decay), "ridge": float(ridge),
            "grad_scale": float(grad_scale), "step_rows": int(step_rows), "beta": float(beta),
            "new_top": float(new_top), "short_steps": bool(short_steps)}


def local_round(payload: dict, chunk: Chunk, gradient: Callable[[dict, Chunk, Any], dict],
                ) -> dict[str, Any]:
    """Worker side of one round: local steps over the lane's rows in slices of
    ``payload["step_rows"]``, the i-th at gamma_{t+i} (module docstring).
    ``gradient(payload, sub_chunk, coef)`` returns the solver's ``grad``
    (float64, the shape of coef), ``loss`` and ``count`` at ``coef``.  Returns
    the final coefficients times the rows seen (the engine sums the lanes, the
    coordinator divides), the loss, the rows and the local steps taken."""
    E, shrink = np.asarray(payload["pre_vectors"]), np.asarray(payload["pre_shrink"])
    coef = np.array(payload["round_coef"], dtype=np.float64)
    b, t = int(payload["step_rows"]), float(payload["t"])
    beta, top = payload["beta"], payload["new_top"]
    rows = np.arange(chunk.X.shape[0]) if chunk.rows is None else np.asarray(chunk.rows)
    loss, count, steps = 0.0, 0, 0
    for start in range(0, len(rows), b):
        sub = Chunk(chunk.X, chunk.y, rows[start:start + b], chunk.key, chunk.run)
        part = gradient(payload, sub, asarray_like(coef, chunk.X))
        m = int(part["count"])
        gamma = payload["gamma0"] / (1.0 + payload["step_decay"] * t)
        if payload["short_steps"] and m != b:
            gamma *= eigenpro_step(m, beta, top) / eigenpro_step(b, beta, top)
        g = part["grad"] / (m * payload["grad_scale"]) + payload["ridge"] * coef
        coef -= gamma * (g - E @ (shrink[:, None] * (E.T @ g)))  # P g
        loss += float(part["loss"])
        count += m
        steps += 1
        t += 1.0
    return {"coef": count * coef, "loss": loss, "count": count, "local_steps": steps, "lanes": 1}


def round_update(state: dict[str, Any], total: dict[str, Any], key: str) -> dict[str, Any]:
    """The coordinator's side: ``state[key]`` becomes the lanes' coefficients
    weighted by their rows, and the step count ``t`` moves by the lanes' mean
    number of local steps."""
    m = max(int(total["count"]), 1)
    t = float(state["t"]) + float(total["local_steps"]) / max(int(total["lanes"]), 1)
    return {**state, key: total["coef"] / m, "t": t}
