"""libsvm / svmlight files, parsed by scikit-learn's reader, byte range by byte range.

A file is cut into byte ranges; ``sklearn.datasets.load_svmlight_file`` reads
each with its ``offset`` / ``length`` arguments, which give every line to
exactly one range (the line holding a range's first byte belongs to the
range before).  The ranges are parsed in this process
(:func:`ingest_libsvm`) or as tasks on the Dask workers, each writing whole
zarr chunks (:func:`ingest_libsvm_parallel`); either way
the file is read twice, once for the rows (and the width) of every range,
once to write.

scikit-learn's reader refuses two things our users' files do contain: a row
whose indices are not ascending (the libsvm tools write them sorted, other
writers do not) and, in its messages, any line number.  A range it refuses
is parsed again by the small reader below, which accepts unsorted indices
(the last value of a repeated index wins) and names the line of any real
error.  Gzipped files cannot be entered at an offset, so they are one range.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from dkernel.data.ingest.common import IngestError, PathLike, is_gzip, open_bytes, store_params
from dkernel.data.ingest.parallel import gather_counted, on_cluster
from dkernel.data.ingest.writer import Source, write_stores
from dkernel.data.store import check_out, default_chunk_rows, write_arrays
from dkernel.data.validate import check_positive
from dkernel.files import expands_user

if TYPE_CHECKING:  # imported where used: the CLI imports this module to list the formats
    import scipy.sparse

#: Bytes of text per range: a range's rows are densified in one task, so
#: this bounds a task's memory (16 MB of text is ~0.5M rows of a dense
#: 8-column file, 16 MB of float32 X).
_BLOCK = 16 * 2**20

Range = tuple[int, int]  # (offset, length); length -1: to the end


def byte_ranges(path: str, blocksize: int = _BLOCK) -> list[Range]:
    """Ranges of about ``blocksize`` bytes covering the file, cut at line starts;
    one range for a gzipped file.

    scikit-learn's reader drops the line holding its first byte and stops
    after the first *data* line that ends past ``offset + length`` (blank
    and comment lines do not stop it); a range that holds no line start, or
    ends in a comment, would read the next range's first lines again.  So
    each cut is moved to the start s of the line after a data line, and the
    range given as ``(s - 1, next s - s)``: the dropped "line" is the newline
    before s.
    """
    open_bytes(path).close()  # a missing file or a folder: its own error
    size = os.path.getsize(path)
    if is_gzip(path) or size <= blocksize:
        return [(0, -1)]
    starts = []
    with open(path, "rb") as f:
        for b in range(blocksize, size, blocksize):
            f.seek(b - 1)
            f.readline()  # to the first line start >= b
            while True:  # and past the next data line: the reader only stops after one
                line = f.readline()
                if not line or line.split(b"#", 1)[0].split():
                    break
            s = f.tell()
            if s < size and (not starts or s > starts[-1]) and s >= 2:
                starts.append(s)
    cuts = [1, *starts]  # range k reads the lines in [cuts[k], cuts[k + 1])
    ranges = [(c - 1, nxt - c) for c, nxt in zip(cuts[:-1], cuts[1:])]
    ranges.append((cuts[-1] - 1, -1))
    ranges[0] = (0, cuts[1] - 1 if len(cuts) > 1 else -1)
    return ranges


def read_range(path: str, rng: Range, n_features: int | None, zero_based: bool,
               dtype: Any = np.float32) -> tuple[scipy.sparse.csr_matrix, np.ndarray]:
    """(X as CSR, y float64) of the lines of one range; ``n_features`` None: the
    width is one more than the largest index seen."""
    from sklearn.datasets import load_svmlight_file

    offset, length = rng
    try:
        with open_bytes(path) as f:
            X, y = load_svmlight_file(f, n_features=n_features, dtype=dtype, zero_based=zero_based,
                                      offset=offset, length=length)
        return X.tocsr(), np.asarray(y, dtype=np.float64)
    except (ValueError, IndexError, UnicodeDecodeError, OverflowError):
        # unsorted indices (accepted below) or a real error (named with its line)
        return _read_range_python(path, rng, n_features, zero_based, dtype)


def _read_range_python(path: str, rng: Range, n_features: int | None, zero_based: bool,
                       dtype: Any) -> tuple[scipy.sparse.csr_matrix, np.ndarray]:
    import scipy.sparse

    offset, length = rng
    end = offset + length if length > 0 else -1
    base = 0 if zero_based else 1
    indptr, indices, values, labels = [0], [], [], []
    with open_bytes(path) as f:
        if offset > 0:  # the same line assignment as scikit-learn's reader
            f.seek(offset)
            f.readline()
        while True:
            start = f.tell()
            raw = f.readline()
            if not raw:
                break
            tokens = raw.decode("utf-8", errors="replace").split("#", 1)[0].split()
            if tokens:
                row = _parse_line(tokens, base, n_features,
                                  lambda at=start: f"{path}:{_line_number(path, at)}")
                labels.append(row[0])
                indices.extend(row[1])
                values.extend(row[1].values())
                indptr.append(len(indices))
            if end != -1 and f.tell() > end:
                break
    width = n_features if n_features is not None else (max(indices) + 1 if indices else 0)
    X = scipy.sparse.csr_matrix((np.asarray(values, dtype=dtype),
                                 np.asarray(indices, dtype=np.int64),
                                 np.asarray(indptr, dtype=np.int64)), shape=(len(labels), width))
    return X, np.asarray(labels, dtype=np.float64)


def _parse_line(tokens: list[str], base: int, n_features: int | None,
                where: Any) -> tuple[float, dict[int, float]]:
    try:
        label = float(tokens[0])
    except ValueError:
        multi = "; multi-label rows are not supported" if "," in tokens[0] else ""
        raise IngestError(f"{where()}: non-numeric label {tokens[0]!r}{multi}") from None
    row: dict[int, float] = {}
    for tok in tokens[1:]:
        i, sep, v = tok.partition(":")
        if i == "qid":
            continue
        if not sep or not i.isdigit():
            raise IngestError(f"{where()}: cannot read {tok!r} as index:value")
        idx = int(i) - base
        if idx < 0:
            hint = ("libsvm indices start at 1; pass zero_based=True (--zero-based) "
                    "for files counting from 0") if base else "indices must be >= 0"
            raise IngestError(f"{where()}: feature index {i}; {hint}")
        if n_features is not None and idx >= n_features:
            raise IngestError(f"{where()}: feature index {i} is beyond n_features={n_features}; "
                              "pass a larger --n-inputs or omit it")
        try:
            row.pop(idx, None)  # a repeated index: the last value wins, in its place
            row[idx] = float(v)
        except ValueError:
            raise IngestError(f"{where()}: non-numeric value {v!r}") from None
    return label, dict(sorted(row.items()))


def _line_number(path: str, pos: int) -> int:
    """1-based number of the line starting at byte ``pos`` (error messages only)."""
    count, done = 0, 0
    with open_bytes(path) as f:
        while done < pos:
            block = f.read(min(1 << 20, pos - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count + 1


def scan_range(path: str, rng: Range, zero_based: bool,
               n_features: int | None = None) -> tuple[int, int]:
    """(rows, width) of one range: the first of the two passes.  With
    ``n_features`` known only the data lines are counted (no number is
    parsed; errors surface in the second pass, still named by line)."""
    if n_features is None:
        X, y = read_range(path, rng, None, zero_based)
        return len(y), X.shape[1]
    offset, length = rng
    start = 0 if offset == 0 else offset + 1  # the ranges are cut at line starts
    end = offset + length + 1 if length > 0 else None
    rows, tail = 0, b""
    with open_bytes(path) as f:
        if start:
            f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            block = f.read(1 << 24 if left is None else min(1 << 24, left))
            if not block:
                break
            if left is not None:
                left -= len(block)
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            rows += sum(1 for line in lines if line.split(b"#", 1)[0].strip())
    if tail.split(b"#", 1)[0].strip():
        rows += 1
    return rows, int(n_features)


def dense_range(path: str, rng: Range, n_features: int, zero_based: bool, dtype: Any,
                y_dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    X, y = read_range(path, rng, n_features, zero_based, dtype)
    return X.toarray().astype(dtype, copy=False), labels_as(y, y_dtype, path)


def labels_as(y: np.ndarray, y_dtype: np.dtype, path: str) -> np.ndarray:
    """``y`` in ``y_dtype``, refusing a whole-number label that the cast would
    change: float32 holds integers exactly only up to 2**24, so a class id
    16777217 would silently become 16777216."""
    out = y.astype(y_dtype)
    # an integer dtype must hold every label; a float one every whole-number label
    # (a real-valued target rounds as any float does)
    lost = (out != y) if np.dtype(y_dtype).kind in "iu" else (y == np.round(y)) & (out != y)
    if lost.any():
        raise IngestError(f"{path}: label {y[lost][0]:.10g} is not exact in "
                          f"{np.dtype(y_dtype)}; pass y_dtype='float64'")
    return out


def width(path: str, scans: list[tuple[int, int]], n_features: int | None,
          dtype: Any = np.float32) -> int:
    """The store's number of columns: ``n_features``, or the widest range's."""
    if n_features is not None:
        return int(n_features)
    d = max((w for _, w in scans), default=0)
    if d == 0:
        raise IngestError(f"{path}: no feature values found; pass n_features (--n-inputs)")
    if d > _WIDEST:  # (a 20-byte file with index 300000000 took 1.7 GB to ingest)
        raise IngestError(
            f"{path}: its largest feature index makes {d} columns, "
            f"{np.dtype(dtype).itemsize * d / 2**30:.1f} GB a dense {np.dtype(dtype)} row "
            "(dkernel stores dense rows); if that is meant, pass "
            "n_features (--n-inputs) to confirm the width")
    return d


#: Columns beyond which a width read from the file's indices is refused unless
#: given: 2^24, 64 MB a float32 row (a damaged or sparse-only file).
_WIDEST = 1 << 24


@expands_user("path", "out")
@store_params
def ingest_libsvm(path: PathLike, out: PathLike, *, n_features: int | None = None,
                  zero_based: bool = False, dtype: Any = "float32", y_dtype: Any = "float64",
                  chunk_rows: int | None = None, overwrite: bool = False,
                  progress: Any = None) -> str:
    """Ingest a libsvm / svmlight text file; sparse rows are densified per chunk.

    Lines read ``label index:value index:value ... [# comment]``; ``qid:``
    fields are ignored.

    Parameters
    ----------
    path : str or os.PathLike
        libsvm file (``.gz`` or not).
    out : str or os.PathLike
        Output store.
    n_features : int, optional
        Number of columns.  Default: one more than the largest index, found
        by an extra pass over the file.
    zero_based : bool, default False
        Whether indices start at 0 (libsvm's own files start at 1).
    dtype : str or numpy.dtype, default "float32"
        dtype of ``X``.
    y_dtype : str or numpy.dtype, default "float64"
        dtype of ``y``: float64 keeps every whole-number label exact (float32
        only up to 2**24); a label the dtype would change is refused.
    {store params}
    """
    check_out(out, overwrite)  # before the extra pass over a possibly large file
    src = _libsvm_source(path, n_features, zero_based, np.dtype(dtype), np.dtype(y_dtype))
    write_stores({out: src}, chunk_rows, dtype, overwrite, progress)
    return os.fspath(out)


def _libsvm_source(path: PathLike, n_features: int | None, zero_based: bool,
                   dtype: np.dtype, y_dtype: np.dtype) -> Source:
    """scikit-learn's reader over byte ranges of the file (:func:`read_range`),
    re-blocked into chunks of ``chunk_rows`` dense rows."""
    path = os.fspath(path)
    open_bytes(path).close()  # missing file: fail before any pass
    ranges = byte_ranges(path)
    if n_features is None:  # the width must be known before the first dense chunk
        n_features = width(path, [scan_range(path, r, zero_based) for r in ranges],
                           None, dtype)
    check_positive("n_features", n_features, integer=True)
    size = max(1, os.path.getsize(path))

    def blocks(chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        # Reused for every chunk (the writer stores each block before the next).
        X = np.empty((chunk_rows, n_features), dtype=dtype)
        y = np.empty(chunk_rows, dtype=y_dtype)
        k = 0
        for rng in ranges:
            Xr, yr = read_range(path, rng, n_features, zero_based, dtype)
            read[0] = size if rng[1] < 0 else rng[0] + rng[1]
            a = 0
            while a < len(yr):
                take = min(chunk_rows - k, len(yr) - a)
                X[k : k + take] = Xr[a : a + take].toarray()
                y[k : k + take] = labels_as(yr[a : a + take], y_dtype, path)
                a, k = a + take, k + take
                if k == chunk_rows:
                    yield X, y
                    k = 0
        if k:
            yield X[:k], y[:k]

    read = [0]  # bytes of the file read (a gzip is one range: read at its end)
    return Source(n_features, blocks, y_dtype, (), {"source": path, "format": "libsvm"},
                  total=-(-size // 2**20), unit="MB",
                  position=lambda: read[0] // 2**20 if read[0] < size else -(-size // 2**20))


@expands_user("path", "out")
def ingest_libsvm_parallel(path: str | os.PathLike, out: str | os.PathLike, *,
                           n_features: int | None = None, zero_based: bool = False,
                           dtype: Any = "float32", y_dtype: Any = "float64",
                           chunk_rows: int | None = None, overwrite: bool = False,
                           client: Any = None, scheduler: str | None = None,
                           blocksize: int = _BLOCK, progress: Any = None) -> str:
    """Ingest a libsvm / svmlight file on the Dask workers, one byte range per task.

    Parameters are those of :func:`ingest_libsvm` plus ``client``, the
    ``distributed.Client`` of the cluster that reads and writes (default: the
    current client; or ``scheduler``, an address to connect to for this call),
    ``blocksize``, the bytes of text per task, and ``progress``, a progress
    bar's factory for the counting and the write pass
    (:func:`~dkernel.data.ingest.parallel.gather_counted`,
    :func:`~dkernel.data.store.write_arrays`).  Every worker
    must see the file under ``path``.  The store appears under ``out`` only when
    every chunk is written; errors name the line.
    """
    import dask
    import dask.array as da

    path = os.fspath(path)
    open_bytes(path).close()  # a missing file fails here, before any task
    check_out(out, overwrite)
    dtype, y_dtype = np.dtype(dtype), np.dtype(y_dtype)
    ranges = byte_ranges(path, blocksize)
    with on_cluster(client, "ingest_libsvm_parallel", scheduler) as c:
        scans = gather_counted(c, c.map(scan_range, [path] * len(ranges), ranges,
                                        zero_based=zero_based, n_features=n_features,
                                        pure=False), progress, "parts counted")
        d = width(path, scans, n_features, dtype)
        n = sum(r for r, _ in scans)
        if n == 0:
            raise IngestError(f"{path}: no data rows; nothing to ingest")
        chunk_rows = default_chunk_rows(d, dtype, chunk_rows)
        read = dask.delayed(dense_range, nout=2, pure=False)
        parts = [read(path, rng, d, zero_based, dtype, y_dtype)
                 for rng, (rows, _) in zip(ranges, scans) if rows]
        rows = [r for r, _ in scans if r]
        X = da.concatenate([da.from_delayed(p[0], (r, d), dtype) for p, r in zip(parts, rows)])
        y = da.concatenate([da.from_delayed(p[1], (r,), y_dtype) for p, r in zip(parts, rows)])
        return write_arrays(c, out, {"X": X, "y": y}, chunk_rows, overwrite=overwrite,
                            attrs={"source": path, "format": "libsvm"}, progress=progress)
