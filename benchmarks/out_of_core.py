"""Out of core: one epoch of DSG and of EigenPro-RF on a store larger than
the workers' memory, against the same fits on a store that fits in page cache.

The big store is written by the workers (``dkernel make-store``); the
workers run with a memory limit far below the data size.  While each fit
runs, every worker's RSS is sampled; afterwards its spilled bytes are read.
Prints, per solver: rows/s on the big and on the small store, their ratio
(big / small), peak worker RSS against the limit, and bytes spilled
(expected: none).  Each solver first fits the small store once, untimed: a
fresh worker's first fit pays one-time imports and page-ins (0.5-2 s in
benchmarks/throughput.py), which would otherwise land on whichever store is
timed first, and the small store is then in page cache, as the comparison
assumes.  ``--epochs`` applies to every timed fit.

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


def _rss(dask_worker=None) -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _spilled(dask_worker) -> int:
    total = getattr(dask_worker.data, "spilled_total", None)
    return int(getattr(total, "disk", 0) or 0) if total is not None else 0


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
    with RssSampler(client) as rss:
        t0 = time.perf_counter()
        est = cls(n_features=n_features, n_epochs=n_epochs, feature_cache=feature_cache,
                  client=client, verbose=verbose).fit(store)
        seconds = time.perf_counter() - t0
    return {"rows": n * n_epochs, "seconds": seconds, "rows_per_s": n * n_epochs / seconds,
            "feature_cache": est.feature_cache_,
            "peak_rss_bytes": max(rss.peak.values()) if rss.peak else None,
            "spilled_bytes": sum(client.run(_spilled).values())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", default="/tmp/dkernel-ooc")
    p.add_argument("--gb", type=float, default=36.0, help="size of the big store's X")
    p.add_argument("--small-gb", type=float, default=1.0, help="size of the page-cache store's X")
    p.add_argument("--inputs", type=int, default=32)
    p.add_argument("--chunk-mb", type=float, default=32.0, help="X bytes per chunk (MB)")
    p.add_argument("--features", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory-limit", default="2GiB")
    p.add_argument("--solvers", nargs="+", default=["dsg", "eigenpro"], choices=["dsg", "eigenpro"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--feature-cache", nargs="+", default=None, metavar="MODE",
                   help="fit the big store once per mode (auto, float32, fixed16, off) and "
                        "compare rows/s, instead of big against small")
    args = p.parse_args()

    from dask.utils import parse_bytes
    from distributed import Client

    from dkernel.datasets import make_store
    from dkernel.engine import local_cluster

    limit = parse_bytes(args.memory_limit)
    out = {"settings": vars(args), "memory_limit_bytes": limit}
    # the cluster dkernel starts itself: single-threaded workers, its malloc
    # settings (a chunk-sized buffer is reused, not mapped afresh per read)
    with local_cluster(args.workers, memory_limit=limit, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        stores = {}
        for name, gb in (("big", args.gb), ("small", args.small_gb)):
            path = os.path.join(args.data, f"{name}-{gb:g}gb-{args.inputs}.zarr")
            rows = int(gb * 1e9 // (4 * args.inputs))
            if not os.path.exists(path):
                t0 = time.perf_counter()
                chunk_rows = max(1024, int(args.chunk_mb * 2**20) // (4 * args.inputs))
                make_store(path, rows, args.inputs, chunk_rows=chunk_rows, kind="regression",
                           client=client, progress=True)
                seconds = time.perf_counter() - t0
                out[f"write_{name}_mb_per_s"] = rows * args.inputs * 4 / 1e6 / seconds
            stores[name] = path
        for kind in args.solvers:
            # warm-up, untimed (see the docstring)
            fit(kind, stores["small"], args.features, client, 1, verbose=False)
            if args.feature_cache:
                for mode in args.feature_cache:
                    r = fit(kind, stores["big"], args.features, client, args.epochs, mode)
                    out[f"{kind}_big_{mode}"] = r
                    print(f"{kind} on big, feature_cache={mode} (resolved {r['feature_cache']}): "
                          f"{r['rows_per_s']:,.0f} rows/s, peak worker RSS "
                          f"{r['peak_rss_bytes'] / 2**30:.2f} GiB of {limit / 2**30:.2f} GiB, "
                          f"spilled {r['spilled_bytes']} bytes", flush=True)
                continue
            for name in ("small", "big"):
                r = fit(kind, stores[name], args.features, client, args.epochs)
                out[f"{kind}_{name}"] = r
                print(f"{kind} on {name}: {r['rows_per_s']:,.0f} rows/s, peak worker RSS "
                      f"{r['peak_rss_bytes'] / 2**30:.2f} GiB of {limit / 2**30:.2f} GiB, "
                      f"spilled {r['spilled_bytes']} bytes", flush=True)
            ratio = out[f"{kind}_big"]["rows_per_s"] / out[f"{kind}_small"]["rows_per_s"]
            out[f"{kind}_ratio_big_over_small"] = ratio
            print(f"{kind}: rows/s big / small = {ratio:.2f}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
