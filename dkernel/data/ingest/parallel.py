"""What the readers that run on the Dask workers share: the client they are
handed, and the refusal of missing values in a partition.

They write through :func:`dkernel.data.store.write_arrays` (CSV, libsvm) or
:func:`~dkernel.data.store.run_writes` (Parquet): the store is written under a
unique temporary name and moved into place when every chunk is in; on any
failure the outstanding tasks are cancelled and the running ones waited for
before the temporary store is removed, so a failed or interrupted ingest
leaves no output.

The data layer is handed its client and never connects: ``dkernel ingest``
connects with :func:`dkernel.engine.connect` and passes the client; a Python
caller passes one, or makes one current.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from dkernel.data.ingest.common import IngestError, cast_finite, first_nonfinite, target_column


@contextmanager
def on_cluster(client: Any, what: str, scheduler: str | None = None) -> Iterator[Any]:
    """``client`` (default: the current ``distributed.Client``) as the current
    client while it runs ``what``; refuses to run without one, saying how to get one.

    ``scheduler`` (an address, as earlier versions took it) opens a plain
    ``distributed.Client`` to it for the call, with the TLS settings of the dask
    config; :func:`dkernel.engine.connect` adds the worker-version check."""
    if scheduler is not None:
        if client is not None:
            raise ValueError(f"{what}: pass client= or scheduler=, not both")
        from distributed import Client

        with Client(scheduler, set_as_default=False) as own, own.as_current():
            yield own
        return
    if client is None:
        from distributed import get_client

        try:
            client = get_client()
        except ValueError:
            raise ValueError(
                f"{what} reads and writes on Dask workers, and no Dask client is running: pass "
                "client= (for instance from 'with dkernel.engine.connect() as client:'), or run "
                "'dkernel ingest', which connects to a cluster itself") from None
    with client.as_current():
        yield client


def gather_counted(client: Any, futures: list, progress: Any, unit: str) -> list:
    """The results of ``futures`` in order, counting them on ``progress(len(futures),
    unit=unit)`` (a progress bar's factory; None: silent) as they finish: the
    readers' first pass over a large file (the rows of every byte range) said
    nothing, for as long as the write pass that follows it.  The first failed
    future raises its error (counted, the others are cancelled then)."""
    if progress is None:
        return client.gather(futures)
    from distributed import as_completed

    bar = progress(len(futures), unit=unit)
    try:
        # on this client's loop: as_completed would ask for the default client
        for fut in as_completed(futures, loop=client.loop):
            if fut.status != "finished":
                fut.result()  # raises the part's error
            bar.update(1)
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        bar.close()
    return client.gather(futures)


def table_columns(columns: list[str], target: int | str | None, path: str,
                  fmt: str) -> tuple[str | None, list[str], dict]:
    """The target column (None: no ``y``), the feature columns and the store's
    attributes of a table read on the workers."""
    t = target_column(columns, target, len(columns), path)
    t = None if t is None else columns[t]
    x_cols = [c for c in columns if c != t]
    attrs = {"source": path, "format": fmt, "columns": x_cols}
    return t, x_cols, attrs if t is None else {**attrs, "target": t}


def as_dtype(block: np.ndarray, dtype: np.dtype, path: str, columns: list[str],
             block_info: dict | None = None) -> np.ndarray:
    """A partition as ``dtype`` (:func:`~dkernel.data.ingest.common.cast_finite`),
    refusing missing values (NaN, empty CSV fields, Parquet nulls) and infinities
    as the serial readers do: written into the store they would only stop a fit
    later, and turn predictions and scores into NaN."""
    start = block_info[0]["array-location"][0][0] if block_info else 0
    return cast_finite(np.asarray(block), dtype,
                       lambda b: refuse_missing(b, columns, start, path))


def refuse_missing(block: np.ndarray, columns: list[str], start: int, path: str) -> None:
    """IngestError naming the column and data row of the first NaN / infinity."""
    bad = first_nonfinite(block)
    if bad is not None:
        row, col, rows = bad
        raise IngestError(
            f"{path}: missing or non-finite value in column {columns[col]!r} at data row "
            f"{start + row} ({rows} such row(s) in its part); drop or impute missing values "
            "before ingesting")
