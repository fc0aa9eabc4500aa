"""
Fitting a store larger than memory
==================================

dkernel never loads a data set: a fit reads the store chunk by chunk on the
workers, one epoch being one read of each chunk, and the client holds only
coefficients and seeds.  A worker's memory is a few chunks plus its feature
cache, whatever the number of rows.

This example writes a synthetic store on the workers
(:func:`dkernel.datasets.make_store`, the same as ``dkernel make-store``),
starts workers whose memory limit is below the store's size, and fits
:class:`dkernel.DSGRegressor` on it for one epoch.  Then it prints the
store's size against the workers' limits and their peak memory.

Run it as ``python out_of_core.py [--gb 4] [--memory-limit 1GiB]`` (the
store needs that much free disk).  ``DKERNEL_EXAMPLE_SMALL=1`` writes a
store of a few MB and uses the cluster in ``$DASK_SCHEDULER_ADDRESS`` (or a
new one) as it is.
"""

import argparse
import os
import shutil
import time

import numpy as np
from _fashion import DATA, SMALL, check
from dask.utils import format_bytes, parse_bytes
from distributed import Client

from dkernel import DSGRegressor
from dkernel.data import open_dataset
from dkernel.datasets import make_store
from dkernel.engine import connect, local_cluster, workers_info

D = 32  # input columns


def peak_rss(dask_worker=None):
    """This worker process's peak resident memory in bytes (Linux: ru_maxrss is KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="fit a store larger than the workers' memory")
    parser.add_argument("--gb", type=float, default=4.0, help="size of X in GB (default 4)")
    parser.add_argument("--memory-limit", default="1GiB", help="per worker (default 1GiB)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    store = os.path.join(DATA, "big.zarr")
    rows = 20_000 if SMALL else int(args.gb * 1e9 / (4 * D))

    # %%
    # In small mode: whatever cluster connect() finds.  Otherwise: workers with
    # a memory limit well below the store.
    if SMALL:
        cluster_context = connect()
    else:
        cluster = local_cluster(args.workers, memory_limit=args.memory_limit)
        cluster_context = Client(cluster)
    with cluster_context as client:
        t0 = time.perf_counter()
        make_store(store, rows, D, chunk_rows=65536, kind="regression", overwrite=True,
                   client=client)
        print(f"wrote {rows:,} rows x {D} in {time.perf_counter() - t0:.1f} s")
        nbytes = open_dataset(store).X.nbytes
        limits = [w["memory_limit"] for w in workers_info(client).values()]

        t0 = time.perf_counter()
        model = DSGRegressor(bandwidth=2.0, n_features=2048, n_epochs=1,
                             client=client).fit(store)
        seconds = time.perf_counter() - t0
        peaks = list(client.run(peak_rss).values())
    print(f"store X: {format_bytes(nbytes)}; workers' memory limits: "
          f"{', '.join(format_bytes(m) for m in limits)} (sum {format_bytes(sum(limits))})")
    print(f"the fit (one epoch, with its sample and preconditioner): {seconds:.1f} s = "
          f"{rows / seconds:,.0f} rows/s; training loss "
          f"{model.history_[-1]['loss']:.4f}; workers' peak memory "
          f"{', '.join(format_bytes(p) for p in peaks)}")
    check(np.isfinite(model.history_[-1]["loss"]), "the fit's loss is not finite")
    if not SMALL:
        check(nbytes > sum(limits), f"the store ({format_bytes(nbytes)}) fits in the workers' "
              f"memory ({format_bytes(sum(limits))}); raise --gb")
        check(max(peaks) < parse_bytes(args.memory_limit),
              "a worker went over its memory limit")
        cluster.close()
    shutil.rmtree(store)
