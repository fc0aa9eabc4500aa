"""Shared fixtures: one real LocalCluster (two single-threaded worker
processes) for the whole session; tests that need their own cluster start one."""

from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="session")
def client():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0", silence_logs=logging.ERROR)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()
