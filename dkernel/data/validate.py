"""Input checks that run before (or, for NaN/inf, during the first pass of) any work.

Every message names the offending input and says how to fix it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dkernel.backend import namespace, to_numpy


def check_numeric_dtype(dtype: np.dtype, name: str) -> None:
    if np.dtype(dtype) == np.dtype(bool):
        return
    if not np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.complexfloating):
        if name == "y" and np.dtype(dtype).kind in "USO":
            # a classifier takes string labels in memory, where it encodes them itself
            raise TypeError(
                f"y has dtype {dtype}: a classifier takes labels that are not numbers in "
                "memory (NumPy, a list, pandas); a dask or stored y must hold numbers: encode "
                "the classes as integers (sklearn.preprocessing.LabelEncoder) or pass y in memory"
            )
        raise TypeError(
            f"{name} has dtype {dtype}, which is not real numeric; convert it to "
            "float32 (e.g. encode categorical columns) before fitting"
        )


def check_finite_chunk(block: Any, name: str, row_offset: int | None,
                       action: str = "fitting") -> None:
    """Raise if a chunk holds NaN or infinity, naming the first bad global row
    (the message ends "drop or impute those rows before ``action``"); with
    ``row_offset`` None (rows of unknown count before it) the row within the chunk."""
    xp = namespace(block)
    if block.dtype.kind != "f":
        return
    finite = xp.isfinite(block)
    if finite.all():
        return
    rows = to_numpy(~finite.reshape(block.shape[0], -1).all(axis=1)).nonzero()[0]
    where = (f"the chunk starting at row {row_offset} (first bad row: "
             f"{row_offset + int(rows[0])})" if row_offset is not None else
             f"a chunk (first bad row: its row {int(rows[0])})")
    raise ValueError(
        f"{name} contains NaN or infinity in {rows.size} row(s) of {where}; "
        f"drop or impute those rows before {action}"
    )


def check_positive(name: str, value: Any, *, integer: bool = False,
                   allow_zero: bool = False) -> None:
    """Hyper-parameter check with a message that names the parameter."""
    ok_type = isinstance(value, (int, np.integer)) if integer else isinstance(
        value, (int, float, np.integer, np.floating))
    if isinstance(value, bool) or not ok_type:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def memory_root(store: Any) -> str | None:
    """The path of a zarr store on fsspec's ``memory://`` file system, else None.
    Such a store lives in the process that wrote it: a worker process that
    reads it finds nothing and zarr returns fill values (a fit on
    ``memory://`` rows over a process cluster trained on zeros, and scored 1.0)."""
    fs = getattr(store, "fs", None)
    protocol = getattr(fs, "protocol", ())
    protocol = protocol if isinstance(protocol, tuple) else (protocol,)
    return str(store.path) if "memory" in protocol else None


def check_memory_visible(block: Any, root: str) -> Any:
    """Raise unless this process's ``memory://`` file system holds ``root``."""
    import fsspec

    if not fsspec.filesystem("memory").exists(root):
        raise FileNotFoundError(
            f"the store memory://{root.lstrip('/')} lives in the process that wrote it, and this "
            "worker runs in another: use a file path or s3://, or a cluster of threads "
            "(Client(processes=False))")
    return block
