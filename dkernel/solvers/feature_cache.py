r"""Feature blocks \Phi_j(X_c) kept on the worker that made them (``feature_cache``).

An epoch of a feature solver regenerates every block of every row: X W + b
and a cosine, 2 d flops a feature a row, where the step itself needs 2 c
(c outputs).  When a worker's share of the blocks fits its cache budget
(:mod:`dkernel.engine.cache`), the first epoch keeps them and the later ones
only read them.  Storage modes (:data:`MODES`):

- ``float32``: the blocks as computed; a fit is the same as without the
  cache up to float32 rounding (a tile's product summed in another order);
- ``fixed16``: phi = sqrt(2) cos(.) in [-sqrt 2, sqrt 2] as
  round(phi 32767 / sqrt 2) in an int16, absolute error <= sqrt(2) / 65534
  = 2.2e-5 a feature -- half the memory.  The Monte-Carlo error of a
  D-feature kernel estimate is ~1 / sqrt(D) (1.1e-2 at D = 8192), 500x more;
- ``off``: nothing kept, every step regenerates its rows' blocks.

Entries are keyed by (chunk, feature map, block, mode), so a fit never reads
blocks stored in another mode, and a block the budget declines is computed
for the task's rows alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dkernel.backend import namespace
from dkernel.engine import cache
from dkernel.engine.program import Chunk
from dkernel.features import FeatureMap

MODES = ("float32", "fixed16", "off")
_FIXED16_SCALE = 32767.0 / math.sqrt(2.0)


def mode_of(payload: dict) -> str:
    """The payload's cache mode (``"cache"``: a mode; True / False as before modes)."""
    value = payload.get("cache", "float32")
    if value is True:
        return "float32"
    if value is False or value is None:
        return "off"
    return str(value)


def bytes_per_value(mode: str) -> int:
    return {"float32": 4, "fixed16": 2, "off": 0}[mode]


def stored_block(features: FeatureMap, chunk: Chunk, block_id: int, mode: str) -> Any | None:
    """Block ``block_id`` of the whole chunk as stored in ``mode`` (filled on
    first use), or None: ``off``, or the budget declined it."""
    if mode == "off":
        return None
    nbytes = chunk.X.shape[0] * features.block_size * bytes_per_value(mode)
    return cache.lookup_or_fill((chunk.key, features, block_id, mode),
                                lambda: _fill(features, chunk.X, block_id, mode), nbytes,
                                owner=chunk.run)


def _fill(features: FeatureMap, X: Any, block_id: int, mode: str) -> Any:
    Z = features.block(X, block_id)
    if mode == "float32":
        return Z
    xp = namespace(Z)
    Z *= np.float32(_FIXED16_SCALE)
    return xp.rint(Z, out=Z).astype(np.int16)


def decode_rows(stored: Any, rows: Any, out: Any, mode: str) -> Any:
    """out = the float32 features of ``stored[rows]`` (``rows`` a slice or indices)."""
    xp = namespace(out)
    if mode == "float32":
        if isinstance(rows, slice):
            out[...] = stored[rows]
        else:  # valid row indices: "clip" skips take's bounds copy
            xp.take(stored, rows, axis=0, out=out, mode="clip")
        return out
    xp.multiply(stored[rows], out.dtype.type(1.0 / _FIXED16_SCALE), out=out)
    return out


def block_rows(features: FeatureMap, chunk: Chunk, block_id: int, mode: str = "float32") -> Any:
    """phi_{w_j}(X_c)[rows] in float32: from the worker cache (filled for the
    whole chunk on first use), or regenerated for the rows alone when the
    cache is off or the block does not fit."""
    stored = stored_block(features, chunk, block_id, mode)
    if stored is None:
        return features.block(chunk.X_rows, block_id)
    if mode == "float32":
        return stored if chunk.rows is None else stored[chunk.rows]
    n = stored.shape[0] if chunk.rows is None else len(chunk.rows)
    out = namespace(chunk.X).empty((n, stored.shape[1]), dtype=np.dtype(features.dtype))
    return decode_rows(stored, slice(None) if chunk.rows is None else chunk.rows, out, mode)
