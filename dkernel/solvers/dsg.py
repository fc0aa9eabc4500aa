r"""Doubly stochastic functional gradients (Dai et al. 2014, Alg. 1-2).

Model:  f(x) = s \sum_j \phi_{w_j}(x)^T a_j   over a pool of feature blocks
(seeds j = 0..P-1), with one global scale factor ``s``.

Iteration t (Dai et al. Alg. 1, with mini-batches and blocks of width B):

    data mini-batch {(x_b, y_b)} (spread over the engine's lanes)
    block  i = t mod P       -- a new seed while t < P, afterwards an existing
                                seed is revisited (block-coordinate SGD on a
                                fixed pool, as Xie et al. 4.2 do)
    \xi     = mean_b l'(f(x_b), y_b) \phi_{w_i}(x_b)          (workers, summed)
    s      <- (1 - \gamma_t \nu) s                            (old blocks shrink)
    a_i    <- a_i - (\gamma_t / B) \xi / s                     (1/B: block average)
    \gamma_t = \theta_0 / (1 + \theta_1 t)

Evaluating f on the batch uses every active block, so a step costs
O(m P B d); the pool cap ``n_features = P B`` bounds it.  Workers keep the
blocks Phi_j(X_c) of the chunks they hold in the engine's bounded cache
(:mod:`dkernel.engine.cache`), so once the pool is built and cached an
epoch costs O(n P B c) instead of O(n P B d); when the cache is full the
rows' blocks are regenerated from their seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace
from dkernel.engine import cache
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.losses import get_loss
from dkernel.solvers.targets import TargetEncoding

# Feature tiles of this many columns keep the (rows x tile) slab in cache-ish
# memory instead of materialising rows x D at once (DESIGN 4: fresh pages are slow).
_TILE_COLUMNS = 2048


def decision(features: FeatureMap, coef: Any, X: Any) -> Any:
    """f(X) = Phi(X) coef over ``coef.shape[0] // B`` blocks, tile by tile."""
    xp = namespace(X)
    B = features.block_size
    n_blocks = coef.shape[0] // B
    f = xp.zeros((X.shape[0], coef.shape[1]), dtype=np.dtype(features.dtype))
    per_tile = max(1, _TILE_COLUMNS // B)
    for start in range(0, n_blocks, per_tile):
        ids = list(range(start, min(n_blocks, start + per_tile)))
        f += features.blocks(X, ids) @ coef[start * B : (start + len(ids)) * B]
    return f


def block_rows(features: FeatureMap, chunk: Chunk, block_id: int) -> Any:
    """phi_{w_j}(X_c)[rows]: from the worker cache (filled for the whole chunk
    on first use), or regenerated for the rows alone when it does not fit."""
    nbytes = chunk.X.shape[0] * features.block_size * np.dtype(features.dtype).itemsize
    full = cache.lookup_or_fill((chunk.key, features, block_id),
                                lambda: features.block(chunk.X, block_id), nbytes,
                                owner=chunk.run)
    if full is None:
        return features.block(chunk.X_rows, block_id)
    return full if chunk.rows is None else full[chunk.rows]


def chunk_decision(features: FeatureMap, chunk: Chunk, coef: Any) -> Any:
    """f = Phi(X_c[rows]) coef over ``coef.shape[0] // B`` blocks, from the worker
    cache where the blocks are held (:func:`block_rows`)."""
    B = features.block_size
    n = chunk.X.shape[0] if chunk.rows is None else len(chunk.rows)
    f = namespace(chunk.X).zeros((n, coef.shape[1]), dtype=np.dtype(features.dtype))
    for j in range(coef.shape[0] // B):
        f += block_rows(features, chunk, j) @ coef[j * B : (j + 1) * B]
    return f


def dsg_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side of one step: f on the rows, loss derivative, block gradient."""
    features: FeatureMap = payload["features"]
    encoding: TargetEncoding = payload["encoding"]
    dt = np.dtype(features.dtype)
    X = chunk.X_rows
    xp = namespace(X)
    coef = asarray_like(payload["coef"], X)
    block = payload["block"]
    Y = encoding.encode(chunk.y_rows, dt)
    f = chunk_decision(features, chunk, coef)  # f(x_b) over every active block
    value, dl = get_loss(payload["loss"])(f, Y)
    phi = block_rows(features, chunk, block)
    return {"grad": (phi.T @ dl).astype(np.float64), "loss": float(xp.sum(value)),
            "count": X.shape[0]}


@dataclass
class DSGProgram(StepProgram):
    """Engine program for Dai et al. Alg. 1; state = pool coefficients + scale."""

    features: FeatureMap
    loss: str | dict  # a losses.LossSpec: the name, or name + parameters (loss_spec)
    encoding: TargetEncoding
    n_blocks: int
    alpha: float
    step_size: float
    step_decay: float
    label: str = "dsg"

    partial = staticmethod(dsg_partial)
    wants_chunk = True

    def init_state(self) -> dict[str, Any]:
        D = self.n_blocks * self.features.block_size
        return {"coef": np.zeros((D, self.encoding.n_outputs)), "scale": 1.0}

    def payload(self, state: dict[str, Any], step: int) -> dict:
        B = self.features.block_size
        active = min(step, self.n_blocks)  # blocks that already carry weight
        coef = (state["coef"][: active * B] * state["scale"]).astype(self.features.dtype)
        return {"features": self.features, "encoding": self.encoding, "loss": self.loss,
                "coef": coef, "block": step % self.n_blocks}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        B = self.features.block_size
        gamma = self.step_size / (1.0 + self.step_decay * step)
        scale = state["scale"] * (1.0 - gamma * self.alpha)
        coef = state["coef"]
        i = step % self.n_blocks
        coef[i * B : (i + 1) * B] -= (gamma / B) * (total["grad"] / total["count"]) / scale
        if scale < 1e-30:  # fold the scale in before it underflows; O(D) and rare
            coef *= scale
            scale = 1.0
        return {"coef": coef, "scale": scale}

    def fingerprint(self) -> dict[str, Any]:
        return {"solver": "dsg", "features": self.features.to_dict(), "loss": self.loss,
                "encoding": [self.encoding.kind, list(map(_plain, self.encoding.classes)),
                             list(map(float, self.encoding.offset))],
                "n_blocks": self.n_blocks, "alpha": self.alpha, "step_size": self.step_size,
                "step_decay": self.step_decay}


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
