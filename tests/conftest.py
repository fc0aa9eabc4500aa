"""Shared fixtures: one real LocalCluster (two single-threaded worker
processes) for the whole session; tests that need their own cluster start one."""

from __future__ import annotations

import logging
import shutil

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


@pytest.fixture
def resume_mid_fit(monkeypatch, tmp_path):
    """``run(make, *fit_args)``: fit ``make(checkpoint=..., checkpoint_every=1)``,
    keeping a copy of every checkpoint it writes; then put back the one from
    the middle of the fit and resume ``make(checkpoint=..., resume=True)`` from
    it.  Returns (uninterrupted model, resumed model, the step resumed from).
    The copies are taken by wrapping :meth:`Checkpointer.save`: a finished fit
    leaves its last checkpoint, so resuming from that one replays nothing."""
    from dkernel.engine.checkpoint import Checkpointer

    def run(make, *fit_args):
        path = tmp_path / "mid.ckpt.npz"
        kept: dict[int, str] = {}
        save = Checkpointer.save

        def save_and_keep(self, state, step):
            save(self, state, step)
            kept[step] = str(tmp_path / f"kept-{step}.npz")
            shutil.copyfile(self.path, kept[step])

        with monkeypatch.context() as m:
            m.setattr(Checkpointer, "save", save_and_keep)
            full = make(checkpoint=str(path), checkpoint_every=1).fit(*fit_args)
        steps = sorted(kept)
        assert len(steps) >= 3, f"too few steps to resume mid-way: {steps}"
        middle = steps[len(steps) // 2]
        shutil.copyfile(kept[middle], path)
        resumed = make(checkpoint=str(path), resume=True).fit(*fit_args)
        return full, resumed, middle

    return run
