"""dkernel make-store: a synthetic dataset store of any size, written by the
cluster's workers in parallel (one chunk per task; memory per worker is one
chunk), for out-of-core and throughput runs."""

from __future__ import annotations

import argparse
import math
import time

from dkernel.cli import common


def register(sub: argparse._SubParsersAction) -> None:
    p = common.add_command(sub, "make-store",
                           "write a synthetic store of any size on the workers",
                           " ".join(__doc__.split()))
    p.add_argument("out", help="store to create (path or URL)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--rows", type=int, help="number of rows")
    size.add_argument("--gb", type=float, help="size of X in GB (10^9 bytes; rows follow from it)")
    p.add_argument("--inputs", type=int, default=32, help="input columns d")
    p.add_argument("--task", choices=["regression", "classification"], default="regression",
                   help="Dai et al.'s ridge target, or non-linear 3-class labels")
    p.add_argument("--chunk-rows", type=int, default=65536, help="rows per chunk")
    p.add_argument("--seed", type=int, default=0, help="random_state")
    common.cluster_job(p, run)


def run(args: argparse.Namespace) -> int:
    from dkernel.datasets import make_store

    for flag, value, least in (("--rows", args.rows, 1), ("--inputs", args.inputs, 1),
                               ("--chunk-rows", args.chunk_rows, 1), ("--seed", args.seed, 0)):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
    if args.gb is not None and not (math.isfinite(args.gb) and args.gb > 0):
        raise ValueError(f"--gb must be a positive number of gigabytes, got {args.gb}")
    rows = args.rows if args.rows is not None else int(args.gb * 1e9 // (4 * args.inputs))
    if rows < 1:
        raise ValueError(f"--gb {args.gb} is less than one row of {args.inputs} float32 inputs")
    common.check_output(args.out, args.overwrite, flag="OUT", store=True)
    t0 = time.perf_counter()
    with common.connect_cluster(args) as client:
        make_store(args.out, rows, args.inputs, chunk_rows=args.chunk_rows, kind=args.task,
                   random_state=args.seed, overwrite=args.overwrite, client=client,
                   progress=not args.quiet)
    seconds = time.perf_counter() - t0
    nbytes = rows * args.inputs * 4
    result = {"store": args.out, "rows": rows, "inputs": args.inputs, "x_bytes": nbytes,
              "seconds": round(seconds, 2), "mb_per_s": round(nbytes / 1e6 / seconds, 1)}
    common.emit(args, result, [f"wrote {args.out}: {rows:,} rows x {args.inputs} inputs "
                               f"({nbytes / 1e9:.2f} GB of X) in {seconds:.1f} s, "
                               f"{result['mb_per_s']} MB/s"])
    return 0
