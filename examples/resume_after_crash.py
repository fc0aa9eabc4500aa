"""
Resuming a fit after a crash
============================

A fit with ``checkpoint_every=N`` (``dkernel fit --checkpoint-every N``)
writes its state every N steps, atomically, to ``MODEL.ckpt.npz``; if the
process dies, the same command with ``--resume`` (``resume=True``) continues
from the last checkpoint and ends with the same model as a fit that was
never interrupted.  A failed fit never leaves a model file.

Here ``dkernel fit`` is killed with SIGKILL (no chance to clean up) once it
has checkpointed, resumed, and compared with an uninterrupted fit.

``DKERNEL_EXAMPLE_SMALL=1`` uses a smaller store.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from _fashion import check, size

from dkernel import load_model
from dkernel.datasets import make_store
from dkernel.io import read_npz

# Dai et al.'s block steps (--preconditioner none): a resumed fit replays the
# very same steps, so the model is bit-identical
FIT = ["--task", "classification", "--bandwidth", "2", "--n-features", "512", "--block-size", "64",
       "--batch-size", "32", "--lanes", "2", "--n-epochs", "3", "--random-state", "0",
       "--preconditioner", "none", "--quiet"]


def dkernel(*args, **kwargs):
    """``python -m dkernel ARGS`` in its own process group: a SIGKILL to the
    group also takes down a LocalCluster it started."""
    return subprocess.Popen([sys.executable, "-m", "dkernel", *args], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def checkpoint_step(path):
    try:
        return int(read_npz(path)[1]["step"])
    except (FileNotFoundError, OSError, ValueError):
        return 0  # not written yet (or being renamed into place)


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # stores, models (and keys)
    store = make_store(os.path.join(folder, "train.zarr"), size(20000, 2000), 8,
                       chunk_rows=size(2500, 250), kind="classification")
    out, ckpt = os.path.join(folder, "model.npz"), os.path.join(folder, "model.npz.ckpt.npz")

    # %%
    # The fit to be killed: a checkpoint every 10 steps.
    fit = dkernel("fit", store, *FIT, "--checkpoint-every", "10", "--out", out)
    while checkpoint_step(ckpt) < 30:
        if fit.poll() is not None:
            raise RuntimeError(f"the fit ended (rc {fit.returncode}) before it was killed; "
                               f"give it more steps:\n{fit.stdout.read()}")
        time.sleep(0.05)
    os.killpg(fit.pid, signal.SIGKILL)
    fit.wait()
    step = checkpoint_step(ckpt)
    print(f"killed with SIGKILL; last checkpoint at step {step}; "
          f"model file written: {os.path.exists(out)}")
    check(not os.path.exists(out), "a killed fit must not leave a model file")

    # %%
    # The same command with --resume, and an uninterrupted fit for reference.
    resumed = dkernel("fit", store, *FIT, "--checkpoint-every", "10", "--resume", "--out", out)
    reference = dkernel("fit", store, *FIT, "--out", os.path.join(folder, "reference.npz"))
    for proc in (resumed, reference):
        output, _ = proc.communicate()
        check(proc.returncode == 0, f"dkernel fit failed:\n{output}")
    a, b = load_model(out), load_model(os.path.join(folder, "reference.npz"))
    same = np.array_equal(a.coef_, b.coef_)
    print(f"resumed from step {step}: the same model as the uninterrupted fit: {same}; "
          f"checkpoint removed: {not os.path.exists(ckpt)}")
    check(same, "the resumed model differs from the uninterrupted one")
