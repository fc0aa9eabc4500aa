"""Out of core: one epoch of DSG and of EigenPro-RF on a store larger than
the workers' memory, against the same fits on a store that fits in page cache.

The big store is written by the workers (``dkernel make-store``); the
workers run with a memory limit far below the data size (the script warns
when the big store is not larger than the limits together).  While each fit
runs, every worker's RSS is sampled, and the bytes the workers wrote to
their spill directories during the fit are counted (distributed's
cumulative disk-write count, read before and after it; expected: none).
Each fit is measured against the compute ceiling of benchmarks/throughput.py
(the per-row arithmetic at the solver's D, no data loading), measured on the
same workers just before and after it.  Prints, per solver and store: the
epochs' rows/s (``history_``: the steps alone, without the sample, bandwidth
and preconditioner that every fit pays once) and their share of the
ceiling, the whole fit's rows/s, peak worker RSS against the limit and the
bytes spilled; then the epochs' rows/s big / small, the cost of reading out
of core.  The whole fit's big / small ratio is printed too, labelled: it
also spreads the fixed cost over the big store's rows, and is above 1 with
both stores in memory.  Each solver first fits the small store once,
untimed: a fresh worker's first fit pays one-time imports and page-ins
(0.5-2 s in benchmarks/throughput.py), which would otherwise land on
whichever store is timed first, and the small store is then in page cache,
as the comparison assumes.  ``--epochs`` applies to every timed fit.

    # 1.5x a 24 GB machine:
    python benchmarks/out_of_core.py --gb 36 --inputs 128 --memory-limit 2GiB
    python benchmarks/out_of_core.py --gb 4 --small-gb 0.5 --memory-limit 1GiB   # a quick run
    # the feature cache on "auto" against "off" on the big store, two epochs each:
    python benchmarks/out_of_core.py --gb 4 --memory-limit 1GiB --epochs 2 --solvers dsg \
        --feature-cache auto off

The first command writes 36 GB (about 40 GB free disk needed for both stores).
128 inputs keep the rows (70M) and so the epoch's arithmetic to minutes on
2 cores; the bytes, which are what out of core is about, do not change.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time

# the ceiling and the store checks of the throughput benchmark (this folder)
from throughput import (
    fitted_features,
    measure_ceiling,
    positive_int,
    store_chunking,
    store_mismatch,
)


def _rss(dask_worker=None) -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _disk_written(dask_worker) -> float | None:
    """Bytes this worker has spilled to disk since it started: its SpillBuffer's
    ever-increasing count (``spilled_total`` is what is on disk now, 0 again
    once a fit's keys are released); None for a worker that cannot spill."""
    metrics = getattr(dask_worker.data, "cumulative_metrics", None)
    return None if metrics is None else float(metrics.get(("disk-write", "bytes"), 0.0))


def spilled_during(client, before: dict) -> int | None:
    """Bytes the workers spilled since ``before`` (``client.run(_disk_written)``);
    None when a worker keeps no count or was not there before."""
    after = client.run(_disk_written)
    if any(after.get(w) is None or before.get(w) is None for w in after):
        return None
    return int(sum(after[w] - before[w] for w in after))


class RssSampler:
    """Peak RSS of every worker, sampled every ``interval`` seconds."""

    def __init__(self, client, interval: float = 0.5) -> None:
        self.client, self.interval, self.peak = client, interval, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for w, rss in self.client.run(_rss).items():
                    self.peak[w] = max(self.peak.get(w, 0), rss)
            except Exception:  # a sample lost while the cluster is busy is not fatal
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def fit(kind: str, store: str, n_features: int, client, n_epochs: int = 1,
        feature_cache: str = "auto", verbose: bool = True) -> dict:
    from dkernel import DSGRegressor, EigenProRegressor
    from dkernel.data import open_dataset

    cls = DSGRegressor if kind == "dsg" else EigenProRegressor
    n = open_dataset(store).n_rows
    D = fitted_features(kind, n_features)
    ceiling = measure_ceiling(client, open_dataset(store).n_inputs, D)
    written = client.run(_disk_written)
    with RssSampler(client) as rss:
        t0 = time.perf_counter()
        est = cls(n_features=n_features, n_epochs=n_epochs, feature_cache=feature_cache,
                  client=client, verbose=verbose).fit(store)
        seconds = time.perf_counter() - t0
    spilled = spilled_during(client, written)
    after = measure_ceiling(client, open_dataset(store).n_inputs, D)
    # the epochs alone: the steps over the store, without the sample, bandwidth
    # and preconditioner every fit pays once whatever the store's size
    epoch_rows = sum(int(h["rows"]) for h in est.history_)
    epoch_seconds = sum(float(h["seconds"]) for h in est.history_)
    out = {"rows": n * n_epochs, "seconds": seconds, "rows_per_s": n * n_epochs / seconds,
           "epoch_rows": epoch_rows, "epoch_seconds": epoch_seconds,
           "epoch_rows_per_s": epoch_rows / epoch_seconds,
           "ceiling_rows_per_s": (ceiling + after) / 2, "ceiling_before": ceiling,
           "ceiling_after": after, "ceiling_features": D,
           "feature_cache": est.feature_cache_,
           "peak_rss_bytes": max(rss.peak.values()) if rss.peak else None,
           "spilled_bytes_during_fit": spilled}
    out["epoch_percent_of_ceiling"] = 100 * out["epoch_rows_per_s"] / out["ceiling_rows_per_s"]
    return out


def describe(r: dict, limit: int) -> str:
    """A fit's line: the epochs against the ceiling, the whole fit, memory, spill."""
    rss = ("not sampled" if r["peak_rss_bytes"] is None
           else f"{r['peak_rss_bytes'] / 2**30:.2f} GiB of {limit / 2**30:.2f} GiB")
    spilled = ("not counted (a worker keeps no disk-write count, or joined during the fit)"
               if r["spilled_bytes_during_fit"] is None
               else f"{r['spilled_bytes_during_fit']:,} bytes")
    return (f"epochs {r['epoch_rows_per_s']:,.0f} rows/s ({r['epoch_rows']:,} rows in "
            f"{r['epoch_seconds']:.1f} s) = {r['epoch_percent_of_ceiling']:.1f}% of the ceiling "
            f"at D = {r['ceiling_features']} ({r['ceiling_before']:,.0f} before, "
            f"{r['ceiling_after']:,.0f} after); whole fit {r['rows_per_s']:,.0f} rows/s "
            f"({r['seconds']:.1f} s, sample, bandwidth and preconditioner included); peak "
            f"worker RSS {rss}; spilled during the fit {spilled}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", default="/tmp/dkernel-ooc")
    p.add_argument("--gb", type=float, default=36.0, help="size of the big store's X")
    p.add_argument("--small-gb", type=float, default=1.0, help="size of the page-cache store's X")
    p.add_argument("--inputs", type=positive_int, default=32)
    p.add_argument("--chunk-mb", type=float, default=32.0, help="X bytes per chunk (MB)")
    p.add_argument("--features", type=positive_int, default=2048)
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--memory-limit", default="2GiB")
    p.add_argument("--solvers", nargs="+", default=["dsg", "eigenpro"], choices=["dsg", "eigenpro"])
    p.add_argument("--epochs", type=positive_int, default=1)
    p.add_argument("--feature-cache", nargs="+", default=None, metavar="MODE",
                   help="fit the big store once per mode (auto, float32, fixed16, off) and "
                        "compare rows/s, instead of big against small")
    args = p.parse_args()

    from dask.utils import parse_bytes
    from distributed import Client

    from dkernel.datasets import make_store
    from dkernel.engine import local_cluster

    limit = parse_bytes(args.memory_limit)
    out = {"settings": vars(args), "memory_limit_bytes": limit, "stores": {}}
    chunk_rows = max(1024, int(args.chunk_mb * 2**20) // (4 * args.inputs))
    paths = {}
    for name, gb in (("big", args.gb), ("small", args.small_gb)):
        path = os.path.join(args.data, f"{name}-{gb:g}gb-{args.inputs}.zarr")
        rows = int(gb * 1e9 // (4 * args.inputs))
        # a store is reused by its name, which leaves out --chunk-mb
        wrong = os.path.exists(path) and store_mismatch(path, rows, args.inputs, chunk_rows)
        if wrong:
            p.error(wrong)
        paths[name] = path, rows
    if args.gb * 1e9 <= args.workers * limit:
        print(f"warning: the big store's X ({args.gb:g} GB) is not larger than the workers' "
              f"memory limits together ({args.workers} x {limit / 2**30:.2f} GiB): it can be "
              "held in memory, so this run does not measure out-of-core reading", flush=True)
    # the cluster dkernel starts itself: single-threaded workers, its malloc
    # settings (a chunk-sized buffer is reused, not mapped afresh per read)
    with local_cluster(args.workers, memory_limit=limit, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        stores = {}
        for name, (path, rows) in paths.items():
            if not os.path.exists(path):
                t0 = time.perf_counter()
                make_store(path, rows, args.inputs, chunk_rows=chunk_rows, kind="regression",
                           client=client, progress=True)
                seconds = time.perf_counter() - t0
                out[f"write_{name}_mb_per_s"] = rows * args.inputs * 4 / 1e6 / seconds
            stores[name] = path
            out["stores"][name] = {"path": path, **store_chunking(path)}
        for kind in args.solvers:
            # warm-up, untimed (see the docstring)
            fit(kind, stores["small"], args.features, client, 1, verbose=False)
            if args.feature_cache:
                for mode in args.feature_cache:
                    r = fit(kind, stores["big"], args.features, client, args.epochs, mode)
                    out[f"{kind}_big_{mode}"] = r
                    print(f"{kind} on big, feature_cache={mode} (resolved {r['feature_cache']}): "
                          f"{describe(r, limit)}", flush=True)
                continue
            for name in ("small", "big"):
                r = fit(kind, stores[name], args.features, client, args.epochs)
                out[f"{kind}_{name}"] = r
                print(f"{kind} on {name}: {describe(r, limit)}", flush=True)
            big, small = out[f"{kind}_big"], out[f"{kind}_small"]
            epochs = big["epoch_rows_per_s"] / small["epoch_rows_per_s"]
            share = big["epoch_percent_of_ceiling"] / small["epoch_percent_of_ceiling"]
            whole = big["rows_per_s"] / small["rows_per_s"]
            out[f"{kind}_epoch_ratio_big_over_small"] = epochs
            out[f"{kind}_epoch_share_ratio_big_over_small"] = share
            out[f"{kind}_whole_fit_ratio_big_over_small"] = whole
            print(f"{kind}: epochs' rows/s big / small = {epochs:.2f} (their shares of each "
                  f"fit's ceiling: {share:.2f}); whole fit's rows/s big / small = {whole:.2f}, "
                  "which also spreads the fixed cost over the big store's rows", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
