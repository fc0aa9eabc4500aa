"""The serial writer: a reader's row blocks appended, one chunk at a time, to
row-chunked zarr arrays ``X`` and ``y`` that grow as blocks arrive (the row
count of a text file is not known up front), under a temporary name renamed
into place when complete (:func:`dkernel.data.store.atomic_store`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dkernel.data.ingest.common import IngestError, PathLike, cast_finite, first_nonfinite
from dkernel.data.store import atomic_store, create_array, default_chunk_rows


@dataclass
class Source:
    """What a reader found in the headers, and the row blocks it will yield.

    ``blocks(chunk_rows)`` yields (X, y) blocks of ``chunk_rows`` rows (the last
    may be shorter); a reader may reuse a block's memory once the next is asked for.
    """

    n_inputs: int
    blocks: Callable[[int], Iterator[tuple[np.ndarray, np.ndarray | None]]]
    y_dtype: np.dtype | None = None
    y_tail: tuple[int, ...] = ()
    attrs: dict = field(default_factory=dict)
    #: y's dtype is decided once every label is seen: integers if all are
    #: whole numbers (int32, or int64 if they need it), else float64 (as the
    #: parallel readers keep it: float32 turned 1e8 + 3 x into 3 distinct values).
    y_auto: bool = False
    #: For progress: the work in ``unit``s (rows, or MB of a text file whose
    #: rows are not known up front) and ``position()``, the units read so far
    #: (None: the rows written).
    total: int = 0
    unit: str = "rows"
    position: Callable[[], int] | None = None


def write_stores(sources: dict[PathLike, Source], chunk_rows: int | None, dtype: Any,
                 overwrite: bool, progress: Any = None) -> None:
    """Write each source as the store at its path: all of them or, on any failure,
    none (nor the parent folders created for them).  ``progress``: a progress
    bar's factory, ``progress(total, unit=...)``, one bar a source."""
    created = _missing_parents(os.fspath(next(iter(sources))))
    try:
        with ExitStack() as stack:  # renamed into place only once every store is written
            for out, src in sources.items():
                bar = None if progress is None else progress(src.total, unit=src.unit)
                try:
                    _write_blocks(stack.enter_context(atomic_store(out, overwrite)), src,
                                  chunk_rows, dtype, bar)
                finally:
                    if bar is not None:
                        bar.close()
    except BaseException:
        _remove_empty(created)
        raise


def _finite(block: np.ndarray, dtype: Any, start: int, name: str, src: Source) -> np.ndarray:
    """``block`` as ``dtype`` (:func:`cast_finite`), naming the row of a NaN or infinity."""
    def refuse(b: np.ndarray) -> None:
        bad = first_nonfinite(b)
        if bad is not None:
            where = f", column {bad[1] + 1}" if b.ndim == 2 and name == "X" else ""
            raise IngestError(
                f"{src.attrs.get('source')}: NaN or infinity in {name} at data row "
                f"{start + bad[0]}{where} (as {np.dtype(dtype)}); drop or impute missing values, "
                "or rescale values beyond the stored type, before ingesting")
    return cast_finite(block, dtype, refuse)


def _trainable(y: np.ndarray, start: int, src: Source) -> None:
    """Refuse a target beyond float32's range: stored as float64 it would pass,
    and the fit (float32 targets) stop with "diverged at step 0"."""
    big = np.flatnonzero(np.abs(y.reshape(len(y), -1)).max(axis=1) > np.finfo(np.float32).max)
    if big.size:
        raise IngestError(f"{src.attrs.get('source')}: y at data row {start + int(big[0])} is "
                          "beyond float32's range, which fits compute in; rescale the target "
                          "before ingesting")


def _write_blocks(group: Any, src: Source, chunk_rows: int | None, dtype: Any,
                  bar: Any = None) -> int:
    """Append the source's blocks to growing X / y arrays; returns the row count."""
    dtype = np.dtype(dtype)
    if src.n_inputs == 0:
        raise IngestError(f"{src.attrs.get('source')}: rows have no columns; nothing to ingest")
    chunk_rows = default_chunk_rows(src.n_inputs, dtype, chunk_rows)
    X = create_array(group, "X", (chunk_rows, src.n_inputs), dtype, chunk_rows)
    # y_auto: labels go to a float64 side array first (exact for integers up
    # to 2**53) and are copied, chunk by chunk, into y once their type is known.
    y_name = "_y_float64" if src.y_auto else "y"
    y = None if src.y_dtype is None else create_array(group, y_name, (chunk_rows, *src.y_tail),
                                                      src.y_dtype, chunk_rows)
    whole, lo, hi = True, 0.0, 0.0
    n = reported = 0
    for Xb, yb in src.blocks(chunk_rows):
        k = Xb.shape[0]
        # Blocks are whole chunks (all but the last), so every write is chunk-aligned.
        X.resize((n + k, src.n_inputs))
        X[n:n + k] = _finite(Xb, dtype, n, "X", src)
        if y is not None:
            y.resize((n + k, *src.y_tail))
            y[n:n + k] = _finite(yb, src.y_dtype, n, "y", src)
            if src.y_auto and k:
                with np.errstate(invalid="ignore"):
                    whole = whole and bool(np.all(np.isfinite(yb) & (yb == np.round(yb))))
                lo, hi = min(lo, float(yb.min())), max(hi, float(yb.max()))
        n += k
        if bar is not None:
            now = n if src.position is None else src.position()
            bar.update(now - reported)
            reported = now
    if n == 0:
        raise IngestError(f"{src.attrs.get('source')}: no data rows; nothing to ingest")
    if y is not None and src.y_auto:
        final = label_dtype(whole, lo, hi)
        out = create_array(group, "y", (n, *src.y_tail), final, chunk_rows)
        for a in range(0, n, chunk_rows):
            block = _finite(y[a:a + chunk_rows], final, a, "y", src)
            if final.kind == "f":
                _trainable(block, a, src)
            out[a:a + chunk_rows] = block
        del group[y_name]
    group.attrs.update(src.attrs)
    return n


def _missing_parents(path: str) -> list[str]:
    """Ancestors of ``path`` that do not exist yet, deepest first (to clean up on failure)."""
    if "://" in path:
        return []
    missing, parent = [], os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


def _remove_empty(folders: list[str]) -> None:
    for d in folders:
        try:
            os.rmdir(d)
        except OSError:
            return


def label_dtype(whole: bool, lo: float, hi: float) -> np.dtype:
    """The dtype of labels read as text: int32 when every one is a whole number
    within int32 (``lo`` / ``hi``: the least and greatest), int64 within int64,
    else float64 -- for the serial and the parallel CSV reader alike (the
    parallel one stored "0.000000" labels as float64 and "0" as int64, so one
    file gave two kinds of model by a speed flag)."""
    info = np.iinfo(np.int32)
    return (np.dtype("float64") if not (whole and -2.0**63 <= lo and hi < 2.0**63) else
            np.dtype("int32") if info.min <= lo and hi <= info.max else np.dtype("int64"))
