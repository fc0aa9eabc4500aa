"""Target encodings shipped to workers: labels become +-1 or one-hot rows there,
so only the (small) class list travels, never an encoded copy of y."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace


@dataclass(frozen=True)
class TargetEncoding:
    """``kind``: "regression" (subtract ``offset``), "binary" (+-1 column),
    "ovr" (+-1 per class) or "onehot" (0/1 per class)."""

    kind: str
    classes: tuple = ()
    offset: tuple = ()

    @property
    def n_outputs(self) -> int:
        if self.kind == "regression":
            return max(1, len(self.offset))
        return 1 if self.kind == "binary" else len(self.classes)

    def encode(self, y: Any, dtype: Any) -> Any:
        xp = namespace(y)
        if self.kind == "regression":
            # centred in float64 before the cast: y = 1e8 + O(1) in float32 keeps no O(1) part
            y = y.astype(np.float64, copy=False)
            y = y.reshape(-1, 1) if y.ndim == 1 else y
            return (y - asarray_like(np.asarray(self.offset, dtype=np.float64), y)).astype(dtype)
        idx = xp.searchsorted(asarray_like(np.asarray(self.classes), y), y.reshape(-1))
        if self.kind == "binary":
            return (2 * idx - 1).astype(dtype).reshape(-1, 1)
        onehot = (idx[:, None] == xp.arange(len(self.classes))[None, :]).astype(dtype)
        return onehot if self.kind == "onehot" else 2 * onehot - 1
