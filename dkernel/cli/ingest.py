"""``dkernel ingest FILE|fashion-mnist --out PATH``: convert files into dataset stores."""

from __future__ import annotations

import argparse
import functools
import os
import time
from typing import Any

from dkernel.cli import common
from dkernel.data import ingest as ing

# Options that only make sense for some formats: given for another, they are an error
# rather than silently ignored.
_FORMAT_OPTIONS = {
    "labels": ("idx", "npy"), "no_scale": ("idx",), "target": ("csv", "parquet"),
    "no_target": ("csv", "parquet"), "parallel": ("csv", "libsvm"), "header": ("csv",),
    "delimiter": ("csv",), "n_inputs": ("libsvm",), "zero_based": ("libsvm",),
}
_DELIMITERS = {"tab": "\t", "\\t": "\t", "space": None, "whitespace": None, "comma": ",",
               "semicolon": ";"}


def register(sub: argparse._SubParsersAction) -> None:
    p = common.add_command(
        sub, "ingest", "convert idx / npy / CSV / libsvm / Parquet files into a dataset store",
        "Convert a file into a row-chunked, compressed zarr dataset store holding X (and y), "
        "streaming one chunk at a time. 'dkernel ingest fashion-mnist --out DIR' writes "
        "DIR/train.zarr and DIR/test.zarr.")
    p.add_argument("input", metavar="FILE|fashion-mnist",
                   help="input file, or 'fashion-mnist' for the packaged Fashion-MNIST idx files")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="output store (a folder for fashion-mnist)")
    p.add_argument("--format", choices=(*ing.FORMATS, "svmlight"),
                   help="input format (default: guessed from the file name)")
    p.add_argument("--chunk-rows", type=int, metavar="N",
                   help="rows per chunk (default: at most 8192 rows and ~32 MB)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="dtype of X")
    p.add_argument("--source", metavar="DIR", help="fashion-mnist: folder with the idx files "
                   f"(default {ing.FASHION_MNIST_DIR})")
    p.add_argument("--labels", metavar="FILE", help="idx / npy: labels file paired with FILE (y)")
    p.add_argument("--no-scale", action="store_true",
                   help="idx: keep byte values instead of scaling them to [0, 1]")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--target", metavar="NAME|INDEX",
                   help="csv: the column stored as y (default: the last column)")
    t.add_argument("--no-target", action="store_true", help="csv: store every column in X, no y")
    h = p.add_mutually_exclusive_group()
    h.add_argument("--header", action="store_true", default=None,
                   help="csv: the first line names the columns (default: detected; a "
                        "first line of numbers with empty or '?' fields, or pandas' 0,1,...,k, "
                        "is refused)")
    h.add_argument("--no-header", dest="header", action="store_false", default=None,
                   help="csv: the first line is data")
    p.add_argument("--delimiter", metavar="D",
                   help="csv: field separator, e.g. ',' or 'tab' or 'whitespace' "
                        "(default: detected)")
    p.add_argument("--n-inputs", type=int, metavar="N",
                   help="libsvm: number of input columns d of X "
                        "(default: largest index, by an extra pass)")
    p.add_argument("--zero-based", action="store_true", help="libsvm: indices start at 0, not 1")
    p.add_argument("--parallel", action="store_true",
                   help="csv, libsvm: parse byte ranges of the file on the Dask workers "
                        "(the default for uncompressed files over 64 MB; parquet is always "
                        "read on the workers)")
    common.cluster_job(p, run)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    for flag in ("n_inputs", "chunk_rows"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.input == "fashion-mnist" and not os.path.exists(args.input):
        _check_options(args, "fashion-mnist")
        _refuse_cluster_flags(args, "fashion-mnist")
        if args.format is not None:
            raise ValueError(f"--format {args.format} applies to FILE input; fashion-mnist is read "
                             "from its idx files: drop --format")
        if args.dtype != "float32":
            raise ValueError(f"--dtype {args.dtype}: fashion-mnist is written as float32 "
                             "(pixels / 255); drop --dtype")
        for name in ("train.zarr", "test.zarr"):
            common.check_output(os.path.join(args.out, name), args.overwrite, store=True)
        out = ing.ingest_fashion_mnist(args.out, args.source, chunk_rows=args.chunk_rows,
                                       overwrite=args.overwrite, progress=_progress(args))
        outputs = [os.path.join(out, "train.zarr"), os.path.join(out, "test.zarr")]
    else:
        if args.source is not None:
            raise ValueError("--source names the Fashion-MNIST folder; give a FILE without it")
        fmt = args.format or ing.guess_format(args.input)
        fmt = "libsvm" if fmt == "svmlight" else fmt
        _check_options(args, fmt)
        common.check_output(args.out, args.overwrite, store=True)
        parallel = (fmt == "parquet" or args.parallel
                    or (fmt in ("csv", "libsvm") and _large(args.input)))
        if not parallel:
            _refuse_cluster_flags(args, f"this {fmt} input")
        read, options = _reader(args, fmt, parallel)
        options.update(dtype=args.dtype, chunk_rows=args.chunk_rows, overwrite=args.overwrite)
        options["progress"] = _progress(args)
        if parallel:  # read and written on the Dask workers
            with common.connect_cluster(args) as client:
                read(args.input, args.out, client=client, **options)
        else:
            read(args.input, args.out, **options)
        outputs = [args.out]
    seconds = time.perf_counter() - start
    common.emit(args, {"outputs": [_shapes(p) for p in outputs], "seconds": seconds},
                [f"wrote {path}: {_describe(path)}" for path in outputs])
    common.status(args, f"ingest took {seconds:.1f} s")
    return 0


def _progress(args: argparse.Namespace) -> Any:
    """The readers' progress bar factory (None with --quiet): a large file said
    nothing until it was written."""
    from dkernel.engine.progress import Progress

    return None if args.quiet else functools.partial(Progress, label="ingest", enabled=True)


def _reader(args: argparse.Namespace, fmt: str, parallel: bool) -> tuple[Any, dict]:
    """The ingest function for ``fmt`` and the options its flags give."""
    target = None if args.no_target else (-1 if args.target is None else args.target)
    csv = {"target": target, "header": args.header, "delimiter": _delimiter(args.delimiter)}
    libsvm = {"n_features": args.n_inputs, "zero_based": args.zero_based}
    return {"idx": (ing.ingest_idx, {"labels": args.labels, "scale": not args.no_scale}),
            "npy": (ing.ingest_npy, {"labels": args.labels}),
            "csv": (ing.ingest_csv_parallel if parallel else ing.ingest_csv, csv),
            "libsvm": (ing.ingest_libsvm_parallel if parallel else ing.ingest_libsvm, libsvm),
            "parquet": (ing.ingest_parquet, {"target": target})}[fmt]


def _refuse_cluster_flags(args: argparse.Namespace, what: str) -> None:
    """The cluster flags where ingest reads and writes in this process: refused,
    not silently ignored."""
    given = common.given_cluster_flags(args)
    if given:
        raise ValueError(
            f"{', '.join(given)}: {what} is read and written in this process, not on Dask "
            "workers (that takes --parallel with CSV / libsvm, Parquet, or a CSV / libsvm file "
            "over 64 MB): drop them")


def _check_options(args: argparse.Namespace, fmt: str) -> None:
    for name, formats in _FORMAT_OPTIONS.items():
        value = getattr(args, name)
        if value not in (None, False) and fmt not in formats:
            flag = "--" + name.replace("_", "-")
            if name == "header":
                flag = "--header" if value else "--no-header"
            raise ValueError(f"{flag} applies to {' / '.join(formats)} input, not {fmt}")


def _large(path: str) -> bool:
    """Worth parsing on the workers: an uncompressed file over 64 MB (a gzip
    stream cannot be entered at an offset, so it is read in one piece anyway)."""
    return (os.path.isfile(path) and not ing.is_gzip(path)
            and os.path.getsize(path) > _PARALLEL_BYTES)


#: Files above this size are parsed on the workers (one byte range per task).
_PARALLEL_BYTES = 64 * 2**20


def _delimiter(text: str | None) -> str | None:
    if text is None:
        return "auto"
    return _DELIMITERS.get(text.lower(), text)


def _shapes(path: str) -> dict:
    import zarr

    group = zarr.open_group(path, mode="r")
    return {"path": path, **{k: {"shape": list(group[k].shape), "dtype": str(group[k].dtype)}
                             for k in ("X", "y") if k in group}}


def _describe(path: str) -> str:
    import zarr

    group = zarr.open_group(path, mode="r")
    X = group["X"]
    parts = [f"X {X.shape[0]} x {X.shape[1]} {X.dtype}"]
    if "y" in group:
        parts.append(f"y {tuple(group['y'].shape)} {group['y'].dtype}")
    # (a zarr chunk may be longer than the rows it holds: 2000 rows in one of 8192)
    parts.append(f"{-(-X.shape[0] // X.chunks[0])} chunk(s) of {min(X.chunks[0], X.shape[0])} rows")
    return ", ".join(parts)
