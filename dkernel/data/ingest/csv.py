"""Delimited text (CSV, TSV, whitespace; ``.gz`` or not): read line by line in
this process (:func:`ingest_csv`), or as byte ranges on the Dask workers
(:func:`ingest_csv_parallel`).

In parallel, byte ranges of the file are parsed by pandas' pyarrow engine
(``dask.dataframe.read_csv``), rechunked to ``chunk_rows`` rows, and each zarr
chunk is written by the worker that assembled it
(:func:`dkernel.data.store.write_arrays`); the client only plans.  Integer
target columns stay integers; feature columns are converted to ``dtype``
(float32 by default).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from dkernel._extras import require
from dkernel.data.ingest.common import (
    IngestError,
    PathLike,
    first_line,
    is_gzip,
    open_bytes,
    store_params,
    target_column,
)
from dkernel.data.ingest.parallel import as_dtype, gather_counted, on_cluster, table_columns
from dkernel.data.ingest.writer import Source, label_dtype, write_stores
from dkernel.data.store import check_out, default_chunk_rows, write_arrays
from dkernel.files import expands_user

# A CSV partition is one byte range of the file; 64 MB keeps tasks coarse
# (scheduling costs ~ms) yet each worker's memory at a few hundred MB.
_CSV_BLOCK = 64 * 2**20


@expands_user("path", "out")
@store_params
def ingest_csv(path: PathLike, out: PathLike, *, target: int | str | None = -1,
               header: bool | None = None, delimiter: str | None = "auto", dtype: Any = "float32",
               y_dtype: Any = "auto", chunk_rows: int | None = None,
               overwrite: bool = False, progress: Any = None) -> str:
    """Ingest a delimited text file (``.gz`` or not), read line by line.

    Parameters
    ----------
    path : str or os.PathLike
        CSV / TSV file; blank lines are skipped.
    out : str or os.PathLike
        Output store.
    target : int, str or None, default -1
        The column stored as ``y``: a header name or a (possibly negative)
        index; the last column by default; None stores no ``y``.
    header : bool, optional
        Whether the first line names the columns.  Default: detected (a first
        line with a field that is not a number is a header, unless those
        fields are all missing values such as "" or "?", or the line is
        ``0,1,...,k`` (k >= 2) as pandas numbers unnamed columns: such a line
        could be data or names, and is refused).  A UTF-8 byte-order mark is skipped.
    delimiter : str or None, default "auto"
        Field separator; "auto" picks ``,``, tab or ``;`` from the first line,
        else whitespace; None means runs of whitespace.
    dtype : str or numpy.dtype, default "float32"
        dtype of ``X``.
    y_dtype : str or numpy.dtype, default "auto"
        dtype of ``y``; "auto": integer labels stay integers (int32, or int64
        when they need it), any other target is float64 (float32 would round
        a target such as 1e8 + x to multiples of 8).
    {store params}
    """
    check_out(out, overwrite)
    auto = isinstance(y_dtype, str) and y_dtype == "auto"
    src = _csv_source(path, target, header, delimiter,
                      np.dtype("float64") if auto else np.dtype(y_dtype))
    src.y_auto = auto and src.y_dtype is not None
    write_stores({out: src}, chunk_rows, dtype, overwrite, progress)
    return os.fspath(out)


def _csv_source(path: PathLike, target: int | str | None, header: bool | None,
                delimiter: str | None, y_dtype: np.dtype) -> Source:
    path = os.fspath(path)
    first, delimiter, fields, header = _first_row(path, header, delimiter)
    n_cols = len(fields)
    names = fields if header else None
    t = target_column(names, target, n_cols, path)

    def diagnose(lines: list[str], numbers: list[int], exc: Exception) -> IngestError:
        for lineno, line in zip(numbers, lines, strict=True):
            vals = _split(line, delimiter)
            if len(vals) != n_cols:
                return IngestError(f"{path}:{lineno}: {len(vals)} values but {n_cols} columns "
                                   f"(line {first}); every row needs the same number "
                                   "(ragged rows)")
            for j, v in enumerate(vals):
                if not _is_number(v):
                    col = f"column {j + 1}" + (f" ({names[j]!r})" if names else "")
                    what = "empty value" if v == "" else f"non-numeric value {v!r}"
                    return IngestError(f"{path}:{lineno}: {what} in {col}; encode or impute it "
                                       "before ingesting")
        return IngestError(f"{path}:{numbers[0]}-{numbers[-1]}: cannot parse these rows ({exc})")

    def parse(lines: list[str], numbers: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
        try:
            A = np.loadtxt(lines, delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None,
                           quotechar='"')
        except ValueError as exc:
            raise diagnose(lines, numbers, exc) from None
        if A.shape[1] != n_cols:  # loadtxt only sees ragged rows within one chunk
            raise diagnose(lines, numbers, ValueError(f"{A.shape[1]} columns"))
        if t is None:
            return A, None
        return np.delete(A, t, axis=1), A[:, t].astype(y_dtype)

    def blocks(chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        lines: list[str] = []
        numbers: list[int] = []
        with _open_text(path) as f:
            raw = f.buffer  # the file's bytes read so far (a gzip's compressed ones)
            read[0] = lambda: (getattr(raw, "fileobj", None) or raw).tell()
            for lineno, line in _numbered_lines(path, f):
                if header and lineno == first:
                    continue
                lines.append(line)
                numbers.append(lineno)
                if len(lines) == chunk_rows:
                    yield parse(lines, numbers)
                    lines, numbers = [], []
        read[0] = lambda: size  # all of it (and the file is closed)
        if lines:
            yield parse(lines, numbers)

    attrs: dict = {"source": path, "format": "csv"}
    if names is not None:
        attrs["columns"] = [v for j, v in enumerate(names) if j != t]
    if t is not None:
        attrs["target"] = names[t] if names is not None else t
    read = [lambda: 0]
    size = max(1, os.path.getsize(path))
    return Source(n_cols - (t is not None), blocks, None if t is None else y_dtype, (), attrs,
                  total=-(-size // 2**20), unit="MB",
                  position=lambda: min(read[0](), size) // 2**20 if read[0]() < size
                  else -(-size // 2**20))


def _first_row(path: str, header: bool | None,
               delimiter: str | None) -> tuple[int, str | None, list[str], bool]:
    """(line number, delimiter, fields, whether it is a header) of the first
    non-blank line; a delimiter of "auto" and a header of None are detected."""
    with _open_text(path) as f:
        first = next(_numbered_lines(path, f), None)
    if first is None:
        raise IngestError(f"{path}: no data rows; nothing to ingest")
    if delimiter == "auto":  # the first of these the line holds; else runs of whitespace
        delimiter = next((d for d in (",", "\t", ";") if d in first[1]), None)
    fields = _split(first[1], delimiter)
    if header is None:
        names = [v for v in fields if not _is_number(v)]
        if names and len(names) < len(fields) and all(v.lower() in _MISSING for v in names):
            # a data row with a missing value was read as a header, and dropped
            # without a word
            raise IngestError(
                f"{path}: line {first[0]} is numbers with missing values "
                f"({', '.join(map(repr, fields[:6]))}{', ...' if len(fields) > 6 else ''}), "
                "not column names; impute them, or pass --header or --no-header "
                "(header=True / False) to say what the line is")
        if len(fields) > 2 and fields == [str(j) for j in range(len(fields))]:
            # pandas' default column names (DataFrame(array).to_csv(index=False)),
            # or a data row: stored as data it would add a row and a label (two
            # fields "0,1" are too often a binary data row to refuse)
            raise IngestError(
                f"{path}: line {first[0]} reads {','.join(fields[:6])}"
                f"{',...' if len(fields) > 6 else ''}: column names 0..{len(fields) - 1} "
                "(as pandas writes them) or a data row? pass --header or --no-header "
                "(header=True / False) to say what the line is")
        header = bool(names)
    return first[0], delimiter, fields, header


#: Fields that stand for a missing value, not a column name.
_MISSING = ("", "?", "na", "n/a", "null", "none", "-", ".")


def _split(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return line.split()
    return [v.strip() for v in next(csv.reader([line], delimiter=delimiter, quotechar='"'))]


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _open_text(path: PathLike) -> IO[str]:
    # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not part of the
    # first field, which it would turn into a column name
    return io.TextIOWrapper(open_bytes(path), encoding="utf-8-sig")


def _numbered_lines(path: PathLike, f: IO[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines, with decoding errors named."""
    lineno = 0
    try:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, line.rstrip("\r\n")
    except UnicodeDecodeError:
        raise IngestError(f"{os.fspath(path)}: not UTF-8 text near line {lineno + 1}; is this "
                          "a binary file? pass --format if the name misleads") from None
    except (OSError, EOFError) as exc:  # corrupt or truncated gzip
        raise IngestError(f"{os.fspath(path)}: cannot read past line {lineno}: {exc}") from None


@expands_user("path", "out")
def ingest_csv_parallel(path: str | os.PathLike, out: str | os.PathLike, *,
                        target: int | str | None = -1, header: bool | None = None,
                        delimiter: str | None = "auto", dtype: Any = "float32",
                        chunk_rows: int | None = None, overwrite: bool = False,
                        client: Any = None, scheduler: str | None = None,
                        blocksize: int = _CSV_BLOCK, progress: Any = None) -> str:
    """Ingest a large CSV file on the workers, one byte range per task.

    Labels are typed as :func:`ingest_csv`'s "auto" types them.  Parameters
    are those of :func:`ingest_csv` (``header`` None: detected from
    the first line) plus ``client``, the ``distributed.Client`` of the cluster
    that reads and writes (default: the current client; or ``scheduler``, an
    address to connect to for this call), ``blocksize``, the bytes per
    task, and ``progress``, a progress bar's factory for the counting and
    the write pass (:func:`~dkernel.data.ingest.parallel.gather_counted`,
    :func:`~dkernel.data.store.write_arrays`).  Errors name the column (the
    serial :func:`ingest_csv` also names the line).  The file is parsed twice:
    once to count the rows of every byte range (chunks must start at known
    rows), once to write.
    """
    require("parallel CSV ingest", "ingest", "pyarrow", "dask.dataframe")
    import dask.dataframe as dd

    path = os.fspath(path)
    if "://" not in path and not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    check_out(out, overwrite)
    _, delimiter, fields, header = _first_row(path, header, delimiter)
    gz = is_gzip(path) if "://" not in path else path.endswith(".gz")
    kw: dict[str, Any] = {"header": 0 if header else None}
    if delimiter is None:
        kw["sep"] = r"\s+"
    else:
        kw["sep"] = delimiter
        kw["engine"] = "pyarrow"
    if not header:
        kw["names"] = [str(j) for j in range(len(fields))]
    if gz:
        kw["compression"] = "gzip"
    with on_cluster(client, "ingest_csv_parallel", scheduler) as c:
        kw["blocksize"] = None if gz else _fitting_block(c, blocksize)
        try:
            ddf = dd.read_csv(path, **kw)
        except Exception as exc:
            raise IngestError(f"{path}: cannot read as CSV ({first_line(exc)})") from None
        try:
            return _ingest_frame(ddf, path, out, target, dtype, chunk_rows, overwrite, c, progress)
        except _TypeChange as exc:
            if not exc.numeric:
                raise
            # Columns typed as integers from the file's first part meet an empty field
            # (NaN) or a fraction further down: read as float64, as the serial reader
            # does, and a missing value is then refused naming its row.
            ddf = dd.read_csv(path, dtype={c: "float64" for c in exc.numeric}, **kw)
            return _ingest_frame(ddf, path, out, target, dtype, chunk_rows, overwrite, c, progress)


def _fitting_block(client: Any, blocksize: int) -> int:
    """``blocksize``, or less where the smallest worker's memory limit is under
    32 blocks: parsing a block holds several times its bytes, and 64 MB blocks
    on 500 MB workers had them killed 8 times over, then the ingest failed
    with Dask's "all those workers died"."""
    limits = [w.get("memory_limit") or 0 for w in client.scheduler_info()["workers"].values()]
    smallest = min((m for m in limits if m > 0), default=0)
    return int(blocksize if not smallest else max(2**20, min(blocksize, smallest // 32)))


def _ingest_frame(ddf: Any, path: str, out: str | os.PathLike, target: Any, dtype: Any,
                  chunk_rows: int | None, overwrite: bool, client: Any, progress: Any) -> str:
    import dask

    # names as the serial reader takes them ("a, b, label": 'label', not ' label')
    columns = [str(c).strip() for c in ddf.columns]
    ddf.columns = columns
    t, x_cols, attrs = table_columns(columns, target, path, "csv")
    for c in columns:
        kind = np.dtype(ddf[c].dtype).kind if _is_numpy_dtype(ddf[c].dtype) else "O"
        if kind not in "biuf":
            if len(ddf.head(1, npartitions=1, compute=True)) == 0:  # header only: no values at all
                raise IngestError(f"{path}: no data rows; nothing to ingest")
            raise IngestError(f"{path}: column {c!r} is {ddf[c].dtype}, not numeric; encode or "
                              "drop it before ingesting")
    dtype = np.dtype(dtype)
    chunk_rows = default_chunk_rows(len(x_cols), dtype, chunk_rows)
    # Row counts per partition (a parsing pass): zarr chunks must start at known rows;
    # the same pass types the labels as the serial reader does (label_dtype)
    try:
        counts = client.compute([dask.delayed(_rows_and_labels)(part, t)
                                 for part in ddf.to_delayed()])
        parts = gather_counted(client, counts, progress, "parts counted")
    except ValueError as exc:
        raise _type_change(path, exc) from None
    lengths = tuple(int(p[0]) for p in parts)
    n = int(sum(lengths))
    if n == 0:
        raise IngestError(f"{path}: no data rows; nothing to ingest")
    X = ddf[x_cols].to_dask_array(lengths=lengths)
    X = X.map_blocks(as_dtype, dtype, path, x_cols, dtype=dtype)
    y = None
    if t is not None:
        y_dtype = np.dtype(ddf[t].dtype)
        y_dtype = np.dtype("int8") if y_dtype.kind == "b" else label_dtype(
            all(p[1] for p in parts), min(p[2] for p in parts), max(p[3] for p in parts))
        y = ddf[t].to_dask_array(lengths=lengths)
        y = y.map_blocks(as_dtype, y_dtype, path, [t], dtype=y_dtype)
    return write_arrays(client, out, {"X": X, "y": y}, chunk_rows, overwrite=overwrite,
                        attrs=attrs, progress=progress)


def _rows_and_labels(part: Any, target: Any) -> tuple[int, bool, float, float]:
    """(rows, whether every label is a whole number, the least, the greatest) of a
    partition (0.0 for both when not every label is whole: they are not used)."""
    if target is None or len(part) == 0:
        return len(part), True, 0.0, 0.0
    y = np.asarray(part[target], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        whole = bool(np.all(np.isfinite(y) & (y == np.round(y))))
    return len(part), whole, float(y.min()) if whole else 0.0, float(y.max()) if whole else 0.0


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
    any other (a parser's "Expected 3 columns, got 2: 3,4") with the file named."""
    text = str(exc)
    if "Mismatched dtypes" not in text:
        return IngestError(f"{path}: {first_line(exc)}; fix that line (the serial reader, "
                           "without --parallel, names its line number)")
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


