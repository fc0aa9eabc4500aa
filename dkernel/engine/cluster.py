"""Which Dask cluster to run on: the given client, a scheduler address, the
current client, or (the embedded default) a new LocalCluster."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator

from distributed import Client, LocalCluster


@contextmanager
def connect(client: Client | None = None, scheduler: str | None = None,
            n_workers: int | None = None) -> Iterator[Client]:
    """Yield a client; anything created here is closed on exit.

    Order: ``client`` if given; else ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``);
    else the current default client; else a LocalCluster with one
    single-threaded worker process per core.
    """
    if client is not None:
        yield client
        return
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address:
        try:
            c = Client(address, timeout="20s")
        except OSError as exc:
            raise ConnectionError(
                f"cannot reach a Dask scheduler at {address!r} ({exc}); start one with "
                "'dask scheduler' (see deploy/) or omit --scheduler to use a local cluster"
            ) from None
        try:
            yield c
        finally:
            c.close()
        return
    try:
        from distributed import get_client

        current = get_client()
    except ValueError:
        current = None
    if current is not None:
        yield current
        return
    # Worker-side failures (bad input found on a worker) reach the caller as
    # exceptions; the workers' own log lines would only repeat them.
    cluster = LocalCluster(n_workers=n_workers or os.cpu_count() or 1, threads_per_worker=1,
                           processes=True, dashboard_address=":0", silence_logs=logging.CRITICAL)
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()
