"""What the readers share: the error type, opening files (through gzip when
compressed), the target column, the refusal of NaN and infinity, and the
parameters every ingest function documents alike."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from typing import IO, Any

import numpy as np

PathLike = str | os.PathLike


class IngestError(ValueError):
    """Input that cannot be ingested; the message names the file (and line)."""


# ------------------------------------------------------------------ files

def open_bytes(path: PathLike) -> IO[bytes]:
    """Open a file for reading, through gzip when its first bytes say so."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(f"{path}: {what}")
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")  # type: ignore[return-value]


def is_gzip(path: PathLike) -> bool:
    """Whether the file's first bytes are gzip's magic number (whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (a reader's tracebacks run long)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- columns

def target_column(columns: list[str] | None, target: int | str | None, n_cols: int,
                  path: str) -> int | None:
    """The index of the column stored as ``y``: a name in ``columns`` (None: the
    file has no header) or a possibly negative index; None for no ``y``.  Refuses a
    target that leaves no feature column."""
    if target is None:
        return None
    if isinstance(target, str) and columns is not None and target in columns:
        t = columns.index(target)
    else:
        try:
            t = int(target)
        except (TypeError, ValueError):
            where = (f"columns: {', '.join(columns[:20])}" if columns else
                     "the file has no header")
            raise IngestError(f"{path}: no column named {target!r} ({where}); pass a column "
                              "name or index, or --no-target") from None
        if not -n_cols <= t < n_cols:
            raise IngestError(f"{path}: target index {t} is out of range for {n_cols} columns")
        t %= n_cols
    if n_cols < 2:
        raise IngestError(f"{path}: only the target column is present; there are no features "
                          "(use --no-target to store the column as X)")
    return t


# ------------------------------------------------------------ NaN and inf

def first_nonfinite(block: np.ndarray) -> tuple[int, int, int] | None:
    """(row, column, rows holding any) of the first NaN / infinity in a float
    block, None when there is none (or the block is not float)."""
    if block.dtype.kind != "f":
        return None
    bad = ~np.isfinite(block)
    if not bad.any():
        return None
    row, col = (np.argwhere(bad)[0].tolist() + [0])[:2]
    return row, col, int(bad.reshape(len(bad), -1).any(axis=1).sum())


def cast_finite(block: np.ndarray, dtype: Any, refuse: Callable[[np.ndarray], None]) -> np.ndarray:
    """``block`` as ``dtype``, ``refuse`` called on it before the cast (an integer
    cast would hide a NaN) and on the cast result (1e39 is finite, and infinite in
    float32): NaN or infinity written into a store would only stop a fit later."""
    refuse(block)
    with np.errstate(over="ignore", invalid="ignore"):  # refused just below
        out = block.astype(dtype, copy=False)
    if out is not block:
        refuse(out)
    return out


# ------------------------------------------------------------------- docs

_STORE_PARAMS = """\
chunk_rows : int, optional
    Rows per chunk (default: at most 8192 rows and ~32 MB).
overwrite : bool, default False
    Replace an existing store at ``out``.
progress : callable, optional
    A progress bar's factory: ``progress(total, unit=...)`` returns an object
    whose ``update(n)`` is called as rows are written (``dkernel ingest``
    passes :class:`dkernel.engine.progress.Progress`), then ``close()``.

Returns
-------
str
    The output path."""


def store_params(fn: Callable) -> Callable:
    """``fn`` with the ``{store params}`` line of its docstring replaced by the
    parameters and the Returns section that every function writing one store
    shares; a docstring without that line is an error at import."""
    if fn.__doc__ is None:  # python -OO drops docstrings
        return fn
    lines = fn.__doc__.splitlines()
    at = [i for i, line in enumerate(lines) if line.strip() == "{store params}"]
    if len(at) != 1:
        raise AssertionError(f"{fn.__qualname__}'s docstring needs one '{{store params}}' line")
    indent = lines[at[0]][: len(lines[at[0]]) - len(lines[at[0]].lstrip())]
    lines[at[0]:at[0] + 1] = [indent + t if t else t for t in _STORE_PARAMS.splitlines()]
    fn.__doc__ = "\n".join(lines)
    return fn
