"""Parquet files (one, a folder or a glob of them; local or a URL), read on the
Dask workers.

The client reads the footers (row-group sizes, schema) and plans tasks of
whole zarr chunks, ~64 MB each; a task reads the row groups holding its rows
with pyarrow and writes its chunks (no pandas, no shuffle) into a temporary
store that is moved into place when every chunk is in
(:func:`dkernel.data.store.run_writes` stops every task on a failure first).
Integer (and boolean) target columns stay integers; feature columns are
converted to ``dtype`` (float32 by default).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dkernel._extras import require
from dkernel.data.ingest.common import IngestError, cast_finite, first_line
from dkernel.data.ingest.parallel import on_cluster, refuse_missing, table_columns
from dkernel.data.store import (
    atomic_store,
    check_out,
    create_array,
    default_chunk_rows,
    require_shared,
    run_writes,
)
from dkernel.files import expands_user

#: Bytes of ``X`` one task reads and writes.
_PARQUET_BLOCK = 64 * 2**20


@expands_user("path", "out")
def ingest_parquet(path: str | os.PathLike, out: str | os.PathLike, *,
                   target: int | str | None = -1, dtype: Any = "float32",
                   chunk_rows: int | None = None, overwrite: bool = False,
                   client: Any = None, scheduler: str | None = None,
                   blocksize: int = _PARQUET_BLOCK, progress: Any = None) -> str:
    """Ingest a Parquet file (or a folder / glob of them, or a URL) on the workers.

    Parameters
    ----------
    path : str or os.PathLike
        Parquet file, folder of Parquet files, glob, or fsspec URL (``s3://``).
    out : str or os.PathLike
        Output store.
    target : int, str or None, default -1
        The column stored as ``y``: a name or a (possibly negative) index;
        the last column by default; None stores no ``y``.
    dtype : str or numpy.dtype, default "float32"
        dtype of ``X``.
    chunk_rows : int, optional
        Rows per chunk (default: at most 8192 rows and ~32 MB).
    overwrite : bool, default False
        Replace an existing store at ``out``.
    client : distributed.Client, optional
        The cluster that reads and writes (default: the current client);
        ``dkernel ingest`` connects as its cluster flags say and passes it.
    scheduler : str, optional
        Instead of ``client``: the address of a scheduler to connect to for
        this call (a plain ``distributed.Client``, TLS from the dask config).
    blocksize : int, default 64 MB
        Bytes of ``X`` one task reads and writes (whole chunks; the row
        groups holding them are read once, those cut by a task's edge twice).
    progress : callable, optional
        A progress bar's factory: ``progress(n_tasks, unit="tasks")`` returns an object whose
        ``update()`` is called as each task's rows are written, then ``close()``.

    Returns
    -------
    str
        The output path.
    """
    require("Parquet ingest", "ingest", "pyarrow.parquet")
    path = os.fspath(path)
    if "://" not in path and not os.path.exists(path) and not any(c in path for c in "*?["):
        raise FileNotFoundError(f"{path}: no such Parquet file or folder")
    check_out(out, overwrite)
    parts = _parquet_parts(path)
    schema = parts[0].schema
    # pandas stores its index as columns (``__index_level_0__`` after a sample or
    # a filter, the name given to set_index): a row id, not a feature, and never
    # the default target; it is read only when named as the target.
    index = _pandas_index(schema)
    columns = [c for c in schema.names if c not in index or c == target]
    t, x_cols, attrs = table_columns(columns, target, path, "parquet")
    if index - set(columns):
        attrs["dropped_index_columns"] = sorted(index - set(columns))
    for c in columns:
        if not _arrow_numeric(schema.field(c).type):
            raise IngestError(f"{path}: column {c!r} is {schema.field(c).type}, not numeric; "
                              "encode or drop it before ingesting")
    for part in parts[1:]:
        if part.schema.names != schema.names or any(
                part.schema.field(c).type != schema.field(c).type for c in columns):
            raise IngestError(f"{part.name}: its columns differ from {parts[0].name}'s "
                              f"({_schema_text(part.schema)} vs {_schema_text(schema)})")
    dtype = np.dtype(dtype)
    chunk_rows = default_chunk_rows(len(x_cols), dtype, chunk_rows)
    n = sum(part.n_rows for part in parts)
    if n == 0:
        raise IngestError(f"{path}: no data rows; nothing to ingest")
    y_dtype = None if t is None else _label_dtype(schema.field(t).type)
    # A task writes whole chunks, ~64 MB of X, so row groups are read about once.
    per_task = chunk_rows * max(1, blocksize // (chunk_rows * len(x_cols) * dtype.itemsize))
    spans = [(a, min(n, a + per_task)) for a in range(0, n, per_task)]
    with on_cluster(client, "ingest_parquet", scheduler) as c, \
            atomic_store(out, overwrite) as group:
        require_shared(c, group, out)
        X = create_array(group, "X", (n, len(x_cols)), dtype, chunk_rows)
        y = None if t is None else create_array(group, "y", (n,), y_dtype, chunk_rows)
        futures = c.map(_write_span, spans, parts=parts, x_cols=x_cols, target=t, X=X, y=y,
                        path=path, pure=False)
        bar = progress(len(futures), unit="tasks") if progress is not None else None
        try:
            written = sum(run_writes(c, futures, each=bar and (lambda _: bar.update()),
                                     label=f"ingesting into {os.fspath(out)!r}"))
        finally:
            if bar is not None:
                bar.close()
        if written != n:  # a file changed between planning and reading
            raise IngestError(f"{path}: read {written} rows but the metadata says {n}; "
                              "was it modified during the ingest?")
        group.attrs.update(attrs)
    return os.fspath(out)


class _ParquetPart:
    """One Parquet file: where it is, its schema and its row groups' sizes."""

    def __init__(self, name: str, schema: Any, group_rows: list[int]) -> None:
        self.name, self.schema, self.group_rows = name, schema, group_rows
        self.n_rows = sum(group_rows)

    def open(self) -> Any:
        import fsspec
        import pyarrow.parquet as pq

        return pq.ParquetFile(fsspec.open(self.name, "rb").open())


def _parquet_parts(path: str) -> list[_ParquetPart]:
    """The Parquet files under ``path`` (a file, a folder, a glob; local or a URL)
    in name order (numbers compared as numbers), with their row-group sizes from the footers."""
    import fsspec
    import pyarrow.parquet as pq

    fs, root = fsspec.core.url_to_fs(path if "://" in path else os.path.abspath(path))
    if any(ch in root for ch in "*?["):
        names = sorted(fs.glob(root), key=_natural_key)
    elif fs.isdir(root):
        names = sorted((f for f in fs.find(root) if f.endswith((".parquet", ".pq"))
                        and not os.path.basename(f).startswith((".", "_"))), key=_natural_key)
    else:
        names = [root]
    if not names:
        raise IngestError(f"{path}: no .parquet files found")
    parts = []
    for name in names:
        url = fs.unstrip_protocol(name) if "://" in path else name
        try:
            with fs.open(name, "rb") as f:
                meta = pq.ParquetFile(f).metadata
                schema = meta.schema.to_arrow_schema()
        except Exception as exc:
            raise IngestError(f"{url}: cannot read as Parquet ({first_line(exc)})") from None
        parts.append(_ParquetPart(url, schema, [meta.row_group(i).num_rows
                                                for i in range(meta.num_row_groups)]))
    return parts


def _pandas_index(schema: Any) -> set[str]:
    """The columns pandas wrote for a DataFrame's index (its 'pandas' schema
    metadata; a RangeIndex is stored as metadata only and has none)."""
    import json

    raw = (schema.metadata or {}).get(b"pandas")
    try:
        names = json.loads(raw)["index_columns"] if raw else []
    except (ValueError, KeyError, TypeError):
        return set()
    return {c for c in names if isinstance(c, str)}


def _natural_key(name: str) -> list:
    """``part.2`` before ``part.10``: the order the writer numbered its parts in
    (dask's and Spark's part names are not zero-padded)."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _arrow_numeric(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _label_dtype(t: Any) -> np.dtype:
    """Integer (and boolean) labels stay integers; floating ones keep their width."""
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return np.dtype("int8")
    return np.dtype(t.to_pandas_dtype())


def _schema_text(schema: Any) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _write_span(span: tuple[int, int], parts: list[_ParquetPart], x_cols: list[str],
                target: str | None, X: Any, y: Any, path: str = "") -> int:
    """On a worker: read rows [a, b) from the row groups holding them (pyarrow),
    and write them to the zarr arrays (whole chunks, so tasks never share one)."""
    import pyarrow as pa

    a, b = span
    tables, first, offset = [], None, 0
    for part in parts:
        if offset >= b:
            break
        if offset + part.n_rows <= a:
            offset += part.n_rows
            continue
        groups, start = [], offset
        for i, rows in enumerate(part.group_rows):
            if start < b and start + rows > a:
                groups.append(i)
                first = start if first is None else first
            start += rows
        if groups:
            tables.append(part.open().read_row_groups(groups, columns=[*x_cols] +
                                                       ([target] if target else [])))
        offset += part.n_rows
    table = pa.concat_tables(tables).slice(a - first, b - a)
    Xb = np.empty((table.num_rows, len(x_cols)), dtype=X.dtype)
    for j, name in enumerate(x_cols):
        Xb[:, j] = table.column(name).to_numpy(zero_copy_only=False)  # nulls become NaN
    refuse_missing(Xb, x_cols, a, path)
    X[a:a + table.num_rows] = Xb
    if target is not None:
        col = table.column(target)
        if col.null_count:
            raise IngestError(f"target column {target!r} has {col.null_count} missing value(s) "
                              f"in rows {a}-{b - 1}; drop or impute them before ingesting")
        y[a:a + table.num_rows] = cast_finite(col.to_numpy(zero_copy_only=False), y.dtype,
                                              lambda b: refuse_missing(b, [target], a, path))
    return table.num_rows

