"""Parallel ingest of tables -- Parquet and large CSV files -- on the Dask workers.

The files are read by well-kept readers on the workers.  Parquet: the client
reads the footers (row-group sizes, schema) and plans tasks of whole zarr
chunks, ~64 MB each; a task reads the row groups holding its rows with
pyarrow and writes its chunks (no pandas, no shuffle).  CSV: byte ranges of
the file are parsed by pandas' pyarrow engine (``dask.dataframe.read_csv``),
rechunked to ``chunk_rows`` rows, and each zarr chunk is written by the
worker that assembled it.  The client only plans.  The store
is written under a temporary name and moved into place when every chunk is
in (:func:`dkernel.data.store.atomic_store`), so a failed or interrupted
ingest leaves no output.

Integer target columns stay integers (``y`` keeps the column's integer
dtype); feature columns are converted to ``dtype`` (float32 by default).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dkernel._extras import require
from dkernel.data.ingest import IngestError, cast_finite, first_nonfinite
from dkernel.data.store import atomic_store, create_array, default_chunk_rows, run_writes
from dkernel.data.store import check_out as _check_out

__all__ = ["ingest_parquet", "ingest_csv_parallel"]

# A CSV partition is one byte range of the file; 64 MB keeps tasks coarse
# (scheduling costs ~ms) yet each worker's memory at a few hundred MB.
_CSV_BLOCK = 64 * 2**20
_PARQUET_BLOCK = 64 * 2**20


def ingest_parquet(path: str | os.PathLike, out: str | os.PathLike, *,
                   target: int | str | None = -1, dtype: Any = "float32",
                   chunk_rows: int | None = None, overwrite: bool = False,
                   client: Any = None, scheduler: str | None = None,
                   blocksize: int = _PARQUET_BLOCK) -> str:
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
        Cluster to read and write on; default as for fits (``scheduler``,
        ``$DASK_SCHEDULER_ADDRESS``, the current client, a LocalCluster).
    scheduler : str, optional
        Scheduler address when no ``client`` is given.
    blocksize : int, default 64 MB
        Bytes of ``X`` one task reads and writes (whole chunks; the row
        groups holding them are read once, those cut by a task's edge twice).

    Returns
    -------
    str
        The output path.
    """
    from dkernel.data.validate import check_positive
    from dkernel.engine import connect

    require("Parquet ingest", "ingest", "pyarrow.parquet")
    path = os.fspath(path)
    if "://" not in path and not os.path.exists(path) and not any(c in path for c in "*?["):
        raise FileNotFoundError(f"{path}: no such Parquet file or folder")
    _check_out(out, overwrite)
    parts = _parquet_parts(path)
    schema = parts[0].schema
    columns = list(schema.names)
    t = _target_column(columns, target, path)
    x_cols = [c for c in columns if c != t]
    if not x_cols:
        raise IngestError(f"{path}: only the target column is present; there are no features "
                          "(use --no-target to store the column as X)")
    for c in columns:
        if not _arrow_numeric(schema.field(c).type):
            raise IngestError(f"{path}: column {c!r} is {schema.field(c).type}, not numeric; "
                              "encode or drop it before ingesting")
    for part in parts[1:]:
        if part.schema.names != columns or any(part.schema.field(c).type != schema.field(c).type
                                               for c in columns):
            raise IngestError(f"{part.name}: its columns differ from {parts[0].name}'s "
                              f"({_schema_text(part.schema)} vs {_schema_text(schema)})")
    dtype = np.dtype(dtype)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(len(x_cols), dtype)
    check_positive("chunk_rows", chunk_rows, integer=True)
    n = sum(part.n_rows for part in parts)
    if n == 0:
        raise IngestError(f"{path}: no data rows; nothing to ingest")
    y_dtype = None if t is None else _label_dtype(schema.field(t).type)
    # A task writes whole chunks, ~64 MB of X, so row groups are read about once.
    per_task = chunk_rows * max(1, blocksize // (chunk_rows * len(x_cols) * dtype.itemsize))
    spans = [(a, min(n, a + per_task)) for a in range(0, n, per_task)]
    attrs = {"source": path, "format": "parquet", "columns": x_cols}
    if t is not None:
        attrs["target"] = t
    with connect(client, scheduler=scheduler) as c, atomic_store(out, overwrite) as group:
        X = create_array(group, "X", (n, len(x_cols)), dtype, chunk_rows)
        y = None if t is None else create_array(group, "y", (n,), y_dtype, chunk_rows)
        futures = c.map(_write_span, spans, parts=parts, x_cols=x_cols, target=t, X=X, y=y,
                        path=path, pure=False)
        written = sum(run_writes(c, futures))
        if written != n:  # a file changed between planning and reading
            raise IngestError(f"{path}: read {written} rows but the metadata says {n}; "
                              "was it modified during the ingest?")
        group.attrs.update(attrs)
    return os.fspath(out)


def ingest_csv_parallel(path: str | os.PathLike, out: str | os.PathLike, *,
                        target: int | str | None = -1, header: bool | None = None,
                        delimiter: str | None = "auto", dtype: Any = "float32",
                        chunk_rows: int | None = None, overwrite: bool = False,
                        client: Any = None, scheduler: str | None = None,
                        blocksize: int = _CSV_BLOCK) -> str:
    """Ingest a large CSV file on the workers, one byte range per task.

    Parameters are those of :func:`dkernel.data.ingest.ingest_csv` (``header``
    None: detected from the first line) plus ``client`` / ``scheduler`` as in
    :func:`ingest_parquet` and ``blocksize``, the bytes per task.  Errors name
    the column (the serial :func:`~dkernel.data.ingest.ingest_csv` also names
    the line).  The file is parsed twice: once to count the rows of every
    byte range (chunks must start at known rows), once to write.
    """
    require("parallel CSV ingest", "ingest", "pyarrow", "dask.dataframe")
    import dask.dataframe as dd

    from dkernel.data.ingest import _is_number, _open_text

    path = os.fspath(path)
    if "://" not in path and not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    _check_out(out, overwrite)
    with _open_text(path) as f:
        first = f.readline().strip()
    if not first:
        raise IngestError(f"{path}: the first line is empty; nothing to ingest")
    if delimiter == "auto":
        delimiter = next((d for d in (",", "\t", ";") if d in first), None)
    fields = first.split(delimiter) if delimiter else first.split()
    if header is None:
        header = not all(_is_number(v.strip()) for v in fields)
    kw: dict[str, Any] = {"blocksize": None if path.endswith(".gz") else blocksize,
                          "header": 0 if header else None}
    if delimiter is None:
        kw["sep"] = r"\s+"
    else:
        kw["sep"] = delimiter
        kw["engine"] = "pyarrow"
    if not header:
        kw["names"] = [str(j) for j in range(len(fields))]
    if path.endswith(".gz"):
        kw["compression"] = "gzip"
    try:
        ddf = dd.read_csv(path, **kw)
    except Exception as exc:
        raise IngestError(f"{path}: cannot read as CSV ({_first_line(exc)})") from None
    try:
        return _ingest_frame(ddf, path, "csv", out, target, dtype, chunk_rows, overwrite,
                             client, scheduler)
    except _TypeChange as exc:
        if not exc.numeric:
            raise
        # Columns typed as integers from the file's first part meet an empty field
        # (NaN) or a fraction further down: read as float64, as the serial reader
        # does, and a missing value is then refused naming its row.
        ddf = dd.read_csv(path, dtype={c: "float64" for c in exc.numeric}, **kw)
        return _ingest_frame(ddf, path, "csv", out, target, dtype, chunk_rows, overwrite,
                             client, scheduler)


# ------------------------------------------------------------------ internals

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
    in name order, with their row-group sizes from the footers."""
    import fsspec
    import pyarrow.parquet as pq

    fs, root = fsspec.core.url_to_fs(path if "://" in path else os.path.abspath(path))
    if any(ch in root for ch in "*?["):
        names = sorted(fs.glob(root))
    elif fs.isdir(root):
        names = sorted(f for f in fs.find(root) if f.endswith((".parquet", ".pq"))
                       and not os.path.basename(f).startswith((".", "_")))
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
            raise IngestError(f"{url}: cannot read as Parquet ({_first_line(exc)})") from None
        parts.append(_ParquetPart(url, schema, [meta.row_group(i).num_rows
                                                for i in range(meta.num_row_groups)]))
    return parts


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
    _refuse_missing(Xb, x_cols, a, path)
    X[a:a + table.num_rows] = Xb
    if target is not None:
        col = table.column(target)
        if col.null_count:
            raise IngestError(f"target column {target!r} has {col.null_count} missing value(s) "
                              f"in rows {a}-{b - 1}; drop or impute them before ingesting")
        y[a:a + table.num_rows] = cast_finite(col.to_numpy(zero_copy_only=False), y.dtype,
                                              lambda b: _refuse_missing(b, [target], a, path))
    return table.num_rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _target_column(columns: list[str], target: int | str | None, path: str) -> str | None:
    if target is None:
        return None
    if isinstance(target, str) and target in columns:
        return target
    try:
        t = int(target)
    except (TypeError, ValueError):
        raise IngestError(f"{path}: no column named {target!r} (columns: "
                          f"{', '.join(columns[:20])}); pass a column name or index, "
                          "or --no-target") from None
    if not -len(columns) <= t < len(columns):
        raise IngestError(f"{path}: target index {t} is out of range for {len(columns)} columns")
    return columns[t]


def _ingest_frame(ddf: Any, path: str, fmt: str, out: str | os.PathLike, target: Any,
                  dtype: Any, chunk_rows: int | None, overwrite: bool, client: Any,
                  scheduler: str | None) -> str:
    import dask.array as da

    from dkernel.data.validate import check_positive
    from dkernel.engine import connect

    columns = [str(c) for c in ddf.columns]
    ddf.columns = columns
    t = _target_column(columns, target, path)
    x_cols = [c for c in columns if c != t]
    if not x_cols:
        raise IngestError(f"{path}: only the target column is present; there are no features "
                          "(use --no-target to store the column as X)")
    for c in columns:
        kind = np.dtype(ddf[c].dtype).kind if _is_numpy_dtype(ddf[c].dtype) else "O"
        if kind not in "biuf":
            if len(ddf.head(1, npartitions=1, compute=True)) == 0:  # header only: no values at all
                raise IngestError(f"{path}: no data rows; nothing to ingest")
            raise IngestError(f"{path}: column {c!r} is {ddf[c].dtype}, not numeric; encode or "
                              "drop it before ingesting")
    dtype = np.dtype(dtype)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(len(x_cols), dtype)
    check_positive("chunk_rows", chunk_rows, integer=True)
    attrs = {"source": path, "format": fmt, "columns": x_cols}
    if t is not None:
        attrs["target"] = t
    with connect(client, scheduler=scheduler) as c:
        # Row counts per partition (from Parquet metadata, or a parsing pass
        # for CSV): zarr chunks must start at known rows.
        try:
            lengths = tuple(int(v) for v in c.compute(ddf.map_partitions(len)).result())
        except ValueError as exc:
            raise _type_change(path, exc) from None
        X = ddf[x_cols].to_dask_array(lengths=lengths)
        n = int(sum(lengths))
        if n == 0:
            raise IngestError(f"{path}: no data rows; nothing to ingest")
        X = X.map_blocks(_as_dtype, dtype, path, x_cols, dtype=dtype).rechunk((chunk_rows, -1))
        y = None
        if t is not None:
            y_dtype = np.dtype(ddf[t].dtype)
            if y_dtype.kind == "b":
                y_dtype = np.dtype("int8")
            y = ddf[t].to_dask_array(lengths=lengths)
            y = y.map_blocks(_as_dtype, y_dtype, path, [t], dtype=y_dtype).rechunk((chunk_rows,))
        with atomic_store(out, overwrite) as group:
            targets, sources = [], []
            for name, a in (("X", X), ("y", y)):
                if a is None:
                    continue
                arr = create_array(group, name, tuple(int(s) for s in a.shape), a.dtype,
                                   chunk_rows)
                sources.append(a)
                targets.append(arr)
            # Each output chunk is assembled and written by one worker (the
            # chunks of X and y are aligned, so no two tasks touch one chunk).
            run_writes(c, da.store(sources, targets, lock=False, compute=False))
            group.attrs.update(attrs)
    return os.fspath(out)


class _TypeChange(IngestError):
    """dask's "Mismatched dtypes": a column typed from the file's first part
    meets other values further down.  ``numeric``: the columns whose later
    values are still numbers (an empty field or a fraction in an integer
    column), which a second read as float64 takes."""

    def __init__(self, message: str, numeric: list[str]) -> None:
        super().__init__(message)
        self.numeric = numeric


def _type_change(path: str, exc: ValueError) -> Exception:
    """A :class:`_TypeChange` for dask's "Mismatched dtypes", naming the columns;
    any other error as it was."""
    text = str(exc)
    if "Mismatched dtypes" not in text:
        return exc
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines()
            if ln.startswith("|")]
    found = {r[0]: r[1] for r in rows[1:] if len(r) >= 3}  # rows[0]: the table's header
    numeric = [c for c, t in found.items() if t.startswith(("float", "int"))]
    text_cols = [c for c in found if c not in numeric]
    what = (f"column(s) {', '.join(map(repr, text_cols))} hold text" if text_cols else
            f"column(s) {', '.join(map(repr, numeric)) or '?'} change type")
    return _TypeChange(f"{path}: {what} after the first part of the file; encode, drop or "
                       "impute those values before ingesting", numeric)


def _is_numpy_dtype(dt: Any) -> bool:
    try:
        np.dtype(dt)
    except TypeError:
        return False
    return True


def _as_dtype(block: np.ndarray, dtype: np.dtype, path: str, columns: list[str],
              block_info: dict | None = None) -> np.ndarray:
    """A partition as ``dtype`` (:func:`~dkernel.data.ingest.cast_finite`), refusing
    missing values (NaN, empty CSV fields, Parquet nulls) and infinities as the
    serial readers do: written into the store they would only stop a fit later,
    and turn predictions and scores into NaN."""
    start = block_info[0]["array-location"][0][0] if block_info else 0
    return cast_finite(np.asarray(block), dtype,
                       lambda b: _refuse_missing(b, columns, start, path))


def _refuse_missing(block: np.ndarray, columns: list[str], start: int, path: str) -> None:
    """IngestError naming the column and data row of the first NaN / infinity."""
    bad = first_nonfinite(block)
    if bad is not None:
        row, col, rows = bad
        raise IngestError(
            f"{path}: missing or non-finite value in column {columns[col]!r} at data row "
            f"{start + row} ({rows} such row(s) in its part); drop or impute missing values "
            "before ingesting")
